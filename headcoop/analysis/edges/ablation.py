"""Mean-ablating edges between heads, over a family of mean references in one engine call: the receiver's q,
k or v input sees the sender's output replaced by its mean over a reference batch (per position, by the one
ablation `engine.ablation.replacement`), every other path as in the run, the receiver's norm scale frozen at
the run's (the edge definition of `edges/exact.py`); each (edge, reference) is one copy with its own replacement
value, keyed by (sender, reference), so that a verdict over many references (issue 37) reads them side by side.

`hc.faithfulness(how="mean")` ablates edges by another definition (norms recomputed on each reader's rebuilt
input, the mean over the corrupt inputs unless `reference=` is given): the two differ on a model with norms, and
each result says which ran.
"""

from __future__ import annotations

import dataclasses

import pandas as pd
import plotly.graph_objects as go
import torch
from transformer_lens.utilities import get_act_name

from headcoop.analysis.edges.path_patching import check_path_model, path_copies
from headcoop.analysis.engine.ablation import describe_ablation, replacement
from headcoop.analysis.engine.copies import Score, route, target_run
from headcoop.analysis.engine.inputs import as_tokens, parse_heads
from headcoop.analysis.vocabulary import head_name
from headcoop.storage.results import Result

DEFINITION = "the receiver's norm scale frozen at the run's, every other path as in the run"


@dataclasses.dataclass(frozen=True, repr=False)
class EdgeAblationResult(Result):
    """frame: one row per (sender, receiver, via, reference): value (the metric with that edge mean-ablated under
    that reference) and unablated (the metric of the run); ablation: the definition that ran, in words; method:
    the engine's path."""

    frame: pd.DataFrame
    ablation: str
    method: str

    def to_dataframe(self) -> pd.DataFrame:
        return self.frame.copy()

    def __repr__(self) -> str:
        n = self.frame.groupby(["sender", "receiver", "via"]).ngroups
        return (
            f"EdgeAblationResult({n} edges x {self.frame.reference.nunique()} references, unablated "
            f"{float(self.frame.unablated.iloc[0]):.4g}; {self.ablation}; {DEFINITION}; {self.method})"
        )

    def plot(self) -> go.Figure:
        """The metric per edge under each reference, beside the unablated run."""
        f = self.frame.assign(edge=self.frame.sender + "->" + self.frame.receiver + " (" + self.frame.via + ")")
        fig = go.Figure([go.Bar(x=g.edge, y=g.value, name=f"reference {r}") for r, g in f.groupby("reference")])
        fig.add_hline(y=float(f.unablated.iloc[0]), line_dash="dot", annotation_text="unablated")
        fig.update_layout(barmode="group", yaxis_title="metric",
                          title=f"Edges mean-ablated<br><sup>{self.ablation}; {DEFINITION}</sup>")  # fmt: skip
        return fig


@torch.no_grad()
def ablate_edges(model, tokens, edges, references, metric, memory_budget_mb: float = 256) -> EdgeAblationResult:
    """The metric with each edge mean-ablated under each reference (module docstring): an EdgeAblationResult,
    one row per (sender, receiver, via, reference) in `.to_dataframe()`. edges: (sender, receiver, via) with heads
    in any form `hc.ablate` takes ("L0H1") and via "q", "k" or "v"; references: token batches of the inputs'
    width (the sender's mean z over each, per position); metric: logits [batch, pos, vocab] -> scalar."""
    check_path_model(model)
    target_tokens = as_tokens(model, tokens)
    batch, n_pos = target_tokens.shape
    parsed = [(parse_heads(model, s)[0], parse_heads(model, r)[0], v) for s, r, v in edges]
    names = {get_act_name("z", s[0]) for s, _, _ in parsed}
    means, sizes = [], []
    for ref in references:  # per reference: each sender layer's z averaged over the batch, per position
        ref_tokens = as_tokens(model, ref)
        if ref_tokens.shape[1] != n_pos:
            raise ValueError(f"a reference has width {ref_tokens.shape[1]}; the inputs have {n_pos}")
        _, cache = model.run_with_cache(ref_tokens, names_filter=lambda n: n in names)
        means.append({n: replacement(cache[n], "mean", batch, n_pos) for n in names})
        sizes.append(len(ref_tokens))
    target = target_run(model, target_tokens, Score(metric), lambda n: True)
    copies = sorted([((s, r), rec, v) for s, rec, v in parsed for r in range(len(means))], key=lambda e: e[1][0])
    z = lambda key: target.cache[get_act_name("z", key[0][0])][:, :, key[0][1]]  # noqa: E731
    deltas = {key: (means[key[1]][get_act_name("z", key[0][0])][:, :, key[0][1]] - z(key))
              @ model.blocks[key[0][0]].attn.W_O[key[0][1]] for key, _, _ in copies}  # fmt: skip
    chosen = route(model, "auto", "stacked", "stacked copies from the receiver's layer", "edge")
    replace = lambda key: (("head", *key[0]), means[key[1]][get_act_name("z", key[0][0])][:, :, key[0][1]])  # noqa: E731
    spec = path_copies(model, copies, deltas, target, replace, shortcut=False)
    values = chosen.evaluate(target, spec, memory_budget_mb).tolist()
    rows = [dict(sender=head_name(*s), receiver=head_name(*rec), via=v, reference=r, value=x, unablated=target.value)
            for ((s, r), rec, v), x in zip(copies, values)]  # fmt: skip
    frame = pd.DataFrame(rows).sort_values(["sender", "receiver", "via", "reference"], ignore_index=True)
    shown = f"{sizes[0]}" if len(set(sizes)) == 1 else f"{min(sizes)}-{max(sizes)}"
    return EdgeAblationResult(frame=frame, ablation=describe_ablation("mean", shown, "reference"), method=chosen.label)


__all__ = ["ablate_edges", "EdgeAblationResult"]
