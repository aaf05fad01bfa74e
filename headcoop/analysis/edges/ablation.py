"""Mean-ablating edges between heads, over a family of mean references in one engine call: the receiver's q,
k or v input sees the sender's output replaced by its mean over a reference batch (per position), every other
path as in the run; each (edge, reference) is one copy with its own replacement value. A specification on the
engine: the one edge engine (`exact.edge_copies`, through `path_copies`), keyed by (sender, reference), so that a verdict over many references
(issue 37) reads them side by side instead of looping.
"""

from __future__ import annotations

import pandas as pd
import torch
from transformer_lens.utilities import get_act_name

from headcoop.analysis.engine.inputs import as_tokens, parse_heads
from headcoop.analysis.engine.copies import Score, evaluate, route, target_run
from headcoop.analysis.edges.path_patching import check_path_model, path_copies
from headcoop.analysis.vocabulary import head_name


@torch.no_grad()
def ablate_edges(model, tokens, edges, references, metric, memory_budget_mb: float = 256) -> pd.DataFrame:
    """The metric with each edge mean-ablated under each reference: one row per (sender, receiver, via,
    reference): value, and `unablated` (the metric of the run). edges: (sender, receiver, via) with heads in
    any form `hc.ablate` takes ("L0H1") and via "q", "k" or "v"; references: token batches of the inputs'
    width (the sender's mean z over each, per position); metric: logits [batch, pos, vocab] -> scalar."""
    check_path_model(model)
    target_tokens = as_tokens(model, tokens)
    parsed = [(parse_heads(model, s)[0], parse_heads(model, r)[0], v) for s, r, v in edges]
    names = {get_act_name("z", s[0]) for s, _, _ in parsed}
    means = []
    for ref in references:  # per reference: each sender layer's z averaged over the batch, per position
        ref_tokens = as_tokens(model, ref)
        if ref_tokens.shape[1] != target_tokens.shape[1]:
            raise ValueError(f"a reference has width {ref_tokens.shape[1]}; the inputs have {target_tokens.shape[1]}")
        _, cache = model.run_with_cache(ref_tokens, names_filter=lambda n: n in names)
        means.append({n: cache[n].mean(0, keepdim=True).expand(len(target_tokens), -1, -1, -1) for n in names})
    target = target_run(model, target_tokens, Score(metric), lambda n: True)
    copies = sorted([((s, r), rec, v) for s, rec, v in parsed for r in range(len(means))], key=lambda e: e[1][0])
    z = lambda key: target.cache[get_act_name("z", key[0][0])][:, :, key[0][1]]  # noqa: E731
    deltas = {key: (means[key[1]][get_act_name("z", key[0][0])][:, :, key[0][1]] - z(key))
              @ model.blocks[key[0][0]].attn.W_O[key[0][1]] for key, _, _ in copies}  # fmt: skip
    chosen = route(model, "auto", "stacked", "stacked copies from the receiver's layer", "edge")
    replace = lambda key: (("head", *key[0]), means[key[1]][get_act_name("z", key[0][0])][:, :, key[0][1]])  # noqa: E731
    spec = path_copies(model, copies, deltas, target, replace, shortcut=False)
    values = evaluate(target, spec, chosen.path, memory_budget_mb).tolist()
    rows = [dict(sender=head_name(*s), receiver=head_name(*rec), via=v, reference=r, value=x, unablated=target.value)
            for ((s, r), rec, v), x in zip(copies, values)]  # fmt: skip
    frame = pd.DataFrame(rows).sort_values(["sender", "receiver", "via", "reference"], ignore_index=True)
    frame.attrs["method"] = chosen.label  # which path ran (the reference whenever a hook is installed)
    return frame


__all__ = ["ablate_edges"]
