"""Circuits and their faithfulness: a circuit is a set of edges of the residual graph (`hc.edges`' writers and
readers); the model runs the clean input with every edge *outside* the circuit ablated.

**The ablated run** (exact, on the stacked-copies engine): one forward pass of the clean input in which every
reader's input is rebuilt from its edges: reader r reads its residual stream minus, for each writer w whose
edge to r is outside the circuit, w's output in this run minus w's output in the reference (`how`):

    input_r = resid_r - sum_{(w, r) not in circuit} (out_w(this run) - out_w(reference))

so the circuit's edges carry the writers' values in this run, every other edge the reference's. Writers'
outputs change with their own inputs, so the circuit computes as a circuit. Norms are recomputed on each
reader's rebuilt input (no scale is frozen). The reference (`how`): "corrupt" (the paired corrupt input's
outputs), "mean" (each writer's output averaged over the corrupt inputs, per position), "zero" (0) or
"resample" (the outputs on another corrupt input: the batch rolled by one). With the whole graph as the
circuit the run is the clean run; with no edge and how="corrupt" it is the corrupt run.

Many circuits run stacked, one copy each (a faithfulness curve is one engine call); the slow reference beside it
(`reference_run`) rebuilds the readers' inputs at TransformerLens's own split inputs (`use_split_qkv_input`,
`use_hook_mlp_in`) in one plain forward pass per circuit, and is the path taken whenever a hook is installed.

**Faithfulness** of a circuit C (as MIB, Mueller et al. 2025): (m(C) - m(empty)) / (m(model) - m(empty)), 1 when
the circuit recovers the whole model's metric, 0 when it does no better than ablating everything. Over circuit
sizes (the top k edges of an `EdgeResult`) it draws the faithfulness curve beside random circuits of the same
sizes (seeded), and MIB's two summaries: the area under the curve (CPR, higher is better) and the area between
the curve and 1 (CMD, lower is better), over the fraction of edges kept.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
from torch import Tensor
from transformer_lens.utilities import get_act_name

from headcoop.analysis.edges.exact import split_inputs, writer_outputs
from headcoop.analysis.edges.graph import (
    Reader,
    Writer,
    check_edge_model,
    graph,
    has_mlp,
    kv_kind,
    qkv_weights,
    reader_name,
    writer_name,
)  # fmt: skip
from headcoop.analysis.edges.scores import EdgeResult
from headcoop.analysis.engine.ablation import describe_ablation, replacement, shifted_order
from headcoop.analysis.engine.copies import Copies, Hooks, Target, clean_corrupt, route, target_run
from headcoop.analysis.engine.inputs import as_tokens, check_choice, require_model
from headcoop.analysis.vocabulary import ABLATIONS, Ablation
from headcoop.checks import check_finite, check_float, check_int, check_memory_budget, check_seed
from headcoop.display.progress import with_progress
from headcoop.models.tl import HookedTransformer
from headcoop.storage.results import Result

EdgeName = tuple[str, str, str]  # (writer, reader, via): ("L0H1", "L1H2", "q"), ("MLP0", "logits", "direct")


@dataclasses.dataclass(frozen=True, repr=False)
class Circuit(Result):
    """A set of edges (writer, reader, via) by name, and the nodes they touch."""

    edges: frozenset

    @property
    def nodes(self) -> list[str]:
        return sorted({w for w, _, _ in self.edges} | {r for _, r, _ in self.edges})

    def to_dataframe(self) -> pd.DataFrame:
        return pd.DataFrame(sorted(self.edges), columns=["writer", "reader", "via"])

    def __repr__(self) -> str:
        return f"Circuit({len(self.edges)} edges, {len(self.nodes)} nodes: {', '.join(self.nodes[:8])}{' ...' if len(self.nodes) > 8 else ''})"

    def plot(self) -> go.Figure:
        frame = self.to_dataframe().assign(score=1.0, exact=np.nan, top=False, sampled=False)
        return EdgeResult(frame, 0.0, 0.0, 0.0, "denoise", "circuit", "", {}, {}).plot(k=len(frame))


def circuit(edges: EdgeResult | list, k: int | None = None, threshold: float | None = None) -> Circuit:
    """The circuit an `EdgeResult` picks: its k edges with the largest |score| (the exact value where verified),
    or every edge with |score| >= threshold; or a circuit from a list of (writer, reader, via) names."""
    if not isinstance(edges, (EdgeResult, list, tuple, set, frozenset)):
        raise TypeError(f"hc.circuit takes an EdgeResult (hc.edges) or a list of (writer, reader, via) names, got "
                        f"{type(edges).__name__}")  # fmt: skip
    if not isinstance(edges, EdgeResult):
        if any(not isinstance(e, (list, tuple)) for e in edges):
            raise ValueError(f"a circuit's edges are (writer, reader, via) names, got {list(edges)[:3]}")
        names = [tuple(e) for e in edges]
        bad = [e for e in names if len(e) != 3]
        if bad:
            raise ValueError(f"a circuit's edges are (writer, reader, via) names, got {bad[:3]}")
        return Circuit(frozenset(names))
    if (k is None) == (threshold is None):
        raise ValueError("give exactly one of k= (the top k edges) and threshold= (every edge with |score| >= it)")
    frame = edges.to_dataframe()
    value = frame.exact.where(frame.exact.notna(), frame.score).abs()
    if k is not None:
        k = check_int("k", k, 0, len(frame))
        picked = frame.loc[value.sort_values(ascending=False, kind="stable").index[:k]]
    else:
        picked = frame[value >= check_float("threshold", threshold, 0)]
    return Circuit(frozenset(zip(picked.writer, picked.reader, picked.via)))


# --- the ablated run ------------------------------------------------------------------------------------
def _reference_outputs(
    model, writers: list[Writer], ref_cache, how: str, batch: int, n_pos: int
) -> dict[Writer, Tensor]:
    """Each writer's output in the reference [batch, pos, d_model], by the one ablation (`replacement`) from its
    outputs on the reference inputs; resample pairs input i with reference input i - 1 (`shifted_order`)."""
    outs = writer_outputs(model, ref_cache, writers)
    order = shifted_order(len(next(iter(outs.values())))) if how == "resample" else None
    return {w: replacement(o, how, batch, n_pos, order) for w, o in outs.items()}


def circuit_copies(model: HookedTransformer, target: Target, masks: Tensor, writers: list[Writer],
                   readers: list[Reader], reference: dict[Writer, Tensor]) -> Copies:  # fmt: skip
    """The engine's specification of n ablated runs of the clean target: masks [n, writer, reader] bool, True
    where the edge is in copy n's circuit (module docstring).
    Long: the engine's setter is a closure over the stacked copies' state (writers' changes per copy), as the other specifications are.
    """
    n_layers, cfg = model.cfg.n_layers, model.cfg
    w_index = {w: i for i, w in enumerate(writers)}
    r_index = {r: i for i, r in enumerate(readers)}
    embeds = {w: writer_outputs(model, target.cache, [w])[w] for w in writers if w[0] in ("embed", "pos_embed")}

    def setter(lo: int, hi: int) -> list:
        """Hooks that rebuild every reader's input in copies lo..hi from the edges each copy keeps.
        Long: one hook per reader kind (q/k/v, MLP input, logits) over the same per-copy state; split apart they
        would pass that state around."""
        n, batch = hi - lo, target.batch
        keep = masks[lo:hi].to(target.logits.device)
        state: dict = {"changes": {w: (embeds[w] - reference[w])[None].expand(n, *embeds[w].shape) for w in embeds}}

        def stacked(x):
            return x.view(n, batch, *x.shape[1:])

        def norm(module, x):  # a norm applied inside a hook: on a Bridge its own hook points (resid_mid is
            state["inside"] = True  # ln2's input there) fire again, and must pass the value through untouched
            try:
                return module(x)
            finally:
                state["inside"] = False

        def quiet(hook_fn):  # every hook of this setter, passing values through while a norm runs inside one
            return lambda x, hook, **kw: x if state.get("inside") else hook_fn(x, hook, **kw)

        def drop(reader: Reader) -> Tensor:  # [n, batch, pos, d_model]: what the edges outside remove
            out: Any = 0  # a tensor once an edge outside adds its change
            for w, change in state["changes"].items():
                off = ~keep[:, w_index[w], r_index[reader]]
                if bool(off.any()):
                    out = out + off.to(change.dtype)[:, None, None, None] * change
            return out

        def capture_resid(x, hook, layer):
            state[("resid_pre", layer)] = stacked(x)
            return x

        def capture_z(x, hook, layer):
            z = stacked(x)
            for h in range(cfg.n_heads):
                out = z[:, :, :, h] @ model.blocks[layer].attn.W_O[h]
                state["changes"][("head", layer, h)] = out - reference[("head", layer, h)]
            return x

        def capture_mid(x, hook, layer):
            state[("resid_mid", layer)] = stacked(x)
            return x

        def capture_mlp(x, hook, layer):
            state["changes"][("mlp", layer)] = stacked(x) - reference[("mlp", layer)]
            return x

        def set_qkv(x, hook, layer, via):
            x = stacked(x).clone()
            block = model.blocks[layer]
            kind = "head" if via == "q" else kv_kind(model)
            for h in range(x.shape[3]):
                removed = drop((kind, layer, h, via))
                if isinstance(removed, int):
                    continue
                inp = (
                    norm(block.ln1, state[("resid_pre", layer)] - removed)
                    if hasattr(block, "ln1")
                    else state[("resid_pre", layer)] - removed
                )
                pos_embed = target.extras.get("shortformer_pos_embed")
                if via in ("q", "k") and pos_embed is not None:
                    inp = inp + pos_embed
                W, b = qkv_weights(model, layer, via, h)
                x[:, :, :, h] = inp @ W + b
            return x.view(n * batch, *x.shape[2:])

        def set_mlp(x, hook, layer, which):
            removed = drop(("mlp", layer))
            if isinstance(removed, int):
                return x
            block = model.blocks[layer]
            inp = state[("resid_mid", layer)] - removed
            inp = norm(block.ln2, inp) if hasattr(block, "ln2") else inp
            if cfg.gated_mlp:
                value = inp @ (block.mlp.W_gate if which == "pre" else block.mlp.W_in)
            else:
                value = inp @ block.mlp.W_in + block.mlp.b_in
            return value.view(n * batch, *value.shape[2:]).to(x)

        def set_final(x, hook):
            removed = drop(("logits",))
            return x if isinstance(removed, int) else (stacked(x) - removed).view(n * batch, *x.shape[1:])

        hooks: Hooks = []
        for lay in range(n_layers):
            hooks.append((get_act_name("resid_pre", lay), lambda x, hook, lay=lay: capture_resid(x, hook, lay)))
            for via in ("q", "k", "v"):
                hooks.append((get_act_name(via, lay), lambda x, hook, lay=lay, via=via: set_qkv(x, hook, lay, via)))
            hooks.append((get_act_name("z", lay), lambda x, hook, lay=lay: capture_z(x, hook, lay)))
            if has_mlp(model):
                hooks.append((get_act_name("resid_mid", lay), lambda x, hook, lay=lay: capture_mid(x, hook, lay)))
                hooks.append((f"blocks.{lay}.mlp.hook_pre", lambda x, hook, lay=lay: set_mlp(x, hook, lay, "pre")))
                if cfg.gated_mlp:
                    hooks.append(
                        (f"blocks.{lay}.mlp.hook_pre_linear", lambda x, hook, lay=lay: set_mlp(x, hook, lay, "linear"))
                    )
                hooks.append((get_act_name("mlp_out", lay), lambda x, hook, lay=lay: capture_mlp(x, hook, lay)))
        hooks.append((get_act_name("resid_post", n_layers - 1), set_final))
        return [(name, quiet(fn)) for name, fn in hooks]

    def reference_logits(i: int) -> Tensor:
        return reference_run(model, target.tokens, masks[i], writers, readers, reference)

    return Copies(layers=[0] * len(masks), setter=setter, reference=reference_logits)


@torch.no_grad()
def reference_run(model: HookedTransformer, tokens: Tensor, mask: Tensor, writers: list[Writer],
                  readers: list[Reader], reference: dict[Writer, Tensor]) -> Tensor:  # fmt: skip
    """The slow, obviously-correct ablated run: one plain forward pass of `tokens` with TransformerLens's split
    q/k/v inputs and MLP input, each rebuilt from the writers captured so far; logits [batch, pos, vocab]."""
    return ablated_run(model, tokens, mask, writers, readers, reference)


def ablated_run(model: HookedTransformer, tokens: Tensor, mask: Tensor, writers: list[Writer],
                readers: list[Reader], reference: dict[Writer, Tensor]) -> Tensor:  # fmt: skip
    """`reference_run` with autograd on (a loss can be taken through it, as training for a circuit does):
    mask[writer, reader] True keeps the edge, False makes it carry `reference[writer]`."""
    outs: dict[Writer, Tensor] = {}
    w_index = {w: i for i, w in enumerate(writers)}
    r_index = {r: i for i, r in enumerate(readers)}

    def removed(reader: Reader) -> Tensor | int:
        return sum(outs[w] - reference[w] for w in outs if not bool(mask[w_index[w], r_index[reader]]))

    def capture(x, hook, writer):
        outs[writer] = x.expand(tokens.shape[0], *x.shape[1:]) if writer == ("pos_embed",) else x
        return x

    def capture_z(x, hook, layer):
        for h in range(model.cfg.n_heads):
            outs[("head", layer, h)] = x[:, :, h] @ model.blocks[layer].attn.W_O[h]
        return x

    def split(x, hook, layer, via):
        x = x.clone()
        kind = "head" if via == "q" else kv_kind(model)
        for h in range(x.shape[2]):
            x[:, :, h] = x[:, :, h] - removed((kind, layer, h, via))
        return x

    hooks: Hooks = [("hook_embed", lambda x, hook: capture(x, hook, ("embed",)))]
    if ("pos_embed",) in w_index:
        hooks.append(("hook_pos_embed", lambda x, hook: capture(x, hook, ("pos_embed",))))
    for lay in range(model.cfg.n_layers):
        for via in ("q", "k", "v"):
            hooks.append((f"blocks.{lay}.hook_{via}_input", lambda x, hook, lay=lay, via=via: split(x, hook, lay, via)))
        hooks.append((get_act_name("z", lay), lambda x, hook, lay=lay: capture_z(x, hook, lay)))
        if has_mlp(model):
            hooks.append((f"blocks.{lay}.hook_mlp_in", lambda x, hook, lay=lay: x - removed(("mlp", lay))))
            hooks.append((get_act_name("mlp_out", lay), lambda x, hook, lay=lay: capture(x, hook, ("mlp", lay))))
    hooks.append((get_act_name("resid_post", model.cfg.n_layers - 1), lambda x, hook: x - removed(("logits",))))
    with split_inputs(model):
        return model.run_with_hooks(tokens, fwd_hooks=hooks)


# --- faithfulness -----------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, repr=False)
class FaithfulnessResult(Result):
    """frame: one row per circuit size (edges, fraction of the graph, metric, faithfulness, and the random
    circuits' mean and standard deviation of faithfulness); full / empty: the metric of the whole model and of
    the empty circuit; cpr / cmd: MIB's area under the curve and area between the curve and 1 (over the
    fraction of edges); random_cpr likewise for the random circuits; how: the ablation; method: the path taken."""

    frame: pd.DataFrame
    full: float
    empty: float
    cpr: float
    cmd: float
    random_cpr: float
    how: str
    method: str
    n_edges: int
    ablation: str = ""  # the definition that ran (`describe_ablation`)

    def to_dataframe(self) -> pd.DataFrame:
        return self.frame.copy()

    def why_nan(self) -> str:
        """Why CPR and CMD are NaN, in words ("" where they are numbers): an area needs two circuit sizes, and a
        faithfulness needs the full model and the empty circuit to differ."""
        if self.full == self.empty:
            return (f" (NaN: the full model and the empty circuit give the same metric, {self.full:.4g}, so there is "
                    "no gap to recover)")  # fmt: skip
        if len(self.frame) < 2:
            return (" (NaN: one circuit has no curve to take the area of: CPR and CMD summarise an EdgeResult over "
                    "two or more circuit sizes; here the faithfulness below is the number)")  # fmt: skip
        return ""

    def __repr__(self) -> str:
        last = self.frame.iloc[-1]
        return (f"FaithfulnessResult({len(self.frame)} circuit sizes of {self.n_edges} edges, {self.how} ablation: "
                f"CPR {self.cpr:.3f} (random {self.random_cpr:.3f}), CMD {self.cmd:.3f}{self.why_nan()}; at {int(last.edges)} edges "
                f"faithfulness {last.faithfulness:.3f}; model {self.full:.4g}, empty {self.empty:.4g}; "
                f"{self.ablation or self.how}; norms recomputed; {self.method})")  # fmt: skip

    def plot(self) -> go.Figure:
        f = self.frame
        fig = go.Figure()
        fig.add_trace(go.Scatter(x=f.fraction, y=f.faithfulness, mode="lines+markers", name="circuit (top edges)"))
        if "random_mean" in f and f.random_mean.notna().any():
            fig.add_trace(go.Scatter(x=f.fraction, y=f.random_mean, mode="lines", name="random circuits (mean)",
                                     error_y=dict(array=f.random_std, visible=True), line=dict(dash="dash")))  # fmt: skip
        fig.add_hline(y=1.0, line_dash="dot", line_color="grey")
        fig.update_layout(title=f"Faithfulness ({self.how} ablation): CPR {self.cpr:.3f}, CMD {self.cmd:.3f}"
                                + (f"<br><sup>{self.ablation}; norms recomputed</sup>" if self.ablation else ""),
                          xaxis_title="fraction of edges kept", yaxis_title="faithfulness")  # fmt: skip
        return fig


def _area(x: np.ndarray, y: np.ndarray) -> float:
    order = np.argsort(x)
    x, y = x[order], y[order]
    return float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2))


@with_progress("hc.faithfulness", cheaper="fewer sizes= is cheaper")
def faithfulness(
    model: HookedTransformer,
    circuit_or_edges: Circuit | EdgeResult,
    clean=None,
    corrupt=None,
    metric=None,
    how: Ablation = "corrupt",
    reference=None,
    sizes: list[int] | None = None,
    random: int = 3,
    seed: int = 0,
    memory_budget_mb: float = 256,
    progress: bool | None = None,
) -> FaithfulnessResult:
    """The metric recovered by a circuit with every other edge ablated (module docstring). A `Circuit` gives one
    point; an `EdgeResult` gives the curve over `sizes` (default: 0, 1, 2, 4, ... edges up to the whole graph),
    the circuit of each size its top edges, beside `random` random circuits per size (seeded). clean, corrupt,
    metric: as `hc.patch`. how: what an edge outside the circuit carries, by the one ablation
    (`engine.ablation.replacement`): "corrupt" (the paired corrupt input's writer output), "mean" (its mean over
    the reference inputs, per position), "resample" (reference input i - 1's), "zero"; reference: the inputs
    "mean" and "resample" take their values from (default: the corrupt inputs). Returns a FaithfulnessResult (`.plot()`: the curve; `.cpr`, `.cmd`: MIB's summaries).
    progress: as `hc.patch` (one bar over the call's runs, and the estimate before a long call).
    Long: the docstring documents each argument; the body is 71 lines (one curve, its random circuits, MIB's summaries).
    """
    require_model(model, "faithfulness")
    check_finite(model, "hc.faithfulness")
    check_edge_model(model)
    check_choice("how", how, ABLATIONS)
    random, seed = check_int("random", random, 0), check_seed(seed)
    memory_budget_mb = check_memory_budget(memory_budget_mb)
    writers, readers, all_edges = graph(model)
    names = [(writer_name(w), *reader_name(r)) for w, r in all_edges]
    index = {name: i for i, name in enumerate(names)}
    clean_tokens, corrupt_tokens, score = clean_corrupt(model, clean, corrupt, metric)
    if reference is not None and how not in ("mean", "resample"):
        raise ValueError(f'reference= only applies to how="mean" or "resample", not how={how!r}')
    ref_tokens = corrupt_tokens if reference is None else as_tokens(model, reference)
    with torch.no_grad():
        _, ref_cache = model.run_with_cache(ref_tokens)
    with torch.no_grad():
        target = target_run(model, clean_tokens, score, lambda n: True)
    reference = _reference_outputs(model, writers, ref_cache, how, *clean_tokens.shape)
    ablation = describe_ablation(how, len(ref_tokens), "corrupt" if ref_tokens is corrupt_tokens else "reference",
                                 order="shifted")  # fmt: skip
    w_index = {w: i for i, w in enumerate(writers)}
    r_index = {r: i for i, r in enumerate(readers)}

    def mask_of(chosen: list[int]) -> Tensor:
        m = torch.zeros(len(writers), len(readers), dtype=torch.bool)
        for i in chosen:
            w, r = all_edges[i]
            m[w_index[w], r_index[r]] = True
        return m

    if isinstance(circuit_or_edges, Circuit):
        unknown = [e for e in circuit_or_edges.edges if e not in index]
        if unknown:
            raise ValueError(f"edges not in this model's graph: {sorted(unknown)[:3]} (writer, reader, via names as "
                             "hc.edges gives them)")  # fmt: skip
        circuits = [[index[e] for e in circuit_or_edges.edges]]
        sizes_used = [len(circuits[0])]
        random = 0
    elif isinstance(circuit_or_edges, EdgeResult):
        frame = circuit_or_edges.to_dataframe()
        if set(zip(frame.writer, frame.reader, frame.via)) != set(index):
            raise ValueError(f"the EdgeResult is not of this model's graph ({len(frame)} edges against this model's "
                             f"{len(index)}, or other names): compute it with hc.edges on this model")  # fmt: skip
        value = frame.exact.where(frame.exact.notna(), frame.score).abs()
        ranked = [
            index[(r.writer, r.reader, r.via)]
            for _, r in frame.loc[value.sort_values(ascending=False, kind="stable").index].iterrows()
        ]
        if len(ranked) != len(names):
            raise ValueError("the EdgeResult is not of this model's graph: compute it with hc.edges on this model")
        if sizes is not None:
            if isinstance(sizes, (str, bytes)) or not isinstance(sizes, (list, tuple, range)):
                raise TypeError(f"sizes must be a list of edge counts, got {sizes!r}")
            sizes = [check_int(f"sizes[{i}]", s, 0) for i, s in enumerate(sizes)]
        sizes_used = sorted(
            {0, len(names), *(sizes if sizes is not None else [2**i for i in range(int(np.log2(len(names))) + 1)])}
        )
        bad = [s for s in sizes_used if not 0 <= s <= len(names)]
        if bad:
            raise ValueError(f"sizes must lie in 0..{len(names)} (the graph's edges), got {bad}")
        circuits = [ranked[:s] for s in sizes_used]
    else:
        raise TypeError(
            f"faithfulness takes a Circuit (hc.circuit) or an EdgeResult (hc.edges), got {type(circuit_or_edges).__name__}"
        )
    rng = np.random.default_rng(seed)
    randoms = [[rng.choice(len(names), size=s, replace=False).tolist() for _ in range(random)] for s in sizes_used]
    all_circuits = [[], list(range(len(names)))] + circuits + [c for per in randoms for c in per]
    masks = torch.stack([mask_of(c) for c in all_circuits])
    chosen = route(model, "auto", "stacked", "stacked copies of the clean run", "circuit",
                   reference="one forward pass per circuit at TransformerLens's split inputs")  # fmt: skip
    values = chosen.evaluate(target, circuit_copies(model, target, masks, writers, readers, reference),
                      memory_budget_mb).double().cpu().numpy()  # fmt: skip
    empty, full = float(values[0]), float(values[1])
    span = full - empty
    if abs(span) <= 1e-6 * max(1.0, abs(full), abs(empty)):  # float noise: no gap for a ratio to measure
        import warnings

        warnings.warn(f"hc.faithfulness: the whole model ({full:.6g}) and the empty circuit ({empty:.6g}) give the same "
                      f"metric under {how} ablation (clean and reference inputs alike?): faithfulness, CPR and CMD are "
                      "NaN, as there is nothing for a circuit to recover", stacklevel=3)  # fmt: skip
        span = 0.0
    faith = (values - empty) / span if span != 0 else np.full_like(values, np.nan)
    k = len(circuits)
    rand = faith[2 + k :].reshape(len(sizes_used), random) if random else np.full((len(sizes_used), 0), np.nan)
    table = pd.DataFrame(dict(edges=sizes_used, fraction=np.array(sizes_used) / len(names), metric=values[2:2 + k],
                              faithfulness=faith[2:2 + k],
                              random_mean=rand.mean(1) if random else np.nan, random_std=rand.std(1) if random else np.nan))  # fmt: skip
    x = table.fraction.to_numpy()
    cpr = _area(x, table.faithfulness.to_numpy()) if len(table) > 1 else float("nan")
    cmd = _area(x, np.abs(1 - table.faithfulness.to_numpy())) if len(table) > 1 else float("nan")
    random_cpr = _area(x, table.random_mean.to_numpy()) if random and len(table) > 1 else float("nan")
    return FaithfulnessResult(table, full, empty, cpr, cmd, random_cpr, how, chosen.label, len(names), ablation)


__all__ = ["circuit", "Circuit", "faithfulness", "FaithfulnessResult", "circuit_copies", "reference_run", "ablated_run"]
