"""Path patching: the effect of one sender head's output on one receiver head's query, key or value input,
with every other path left as in the target run: the head-to-head view of exact edge patching
(`edges/exact.py`, one specification and one reference shared with `hc.edges` and `hc.ablate_edges`).

For a sender A (layer a) and a receiver B (layer b > a) the target run is repeated with one change: B's
`via` input (q, k or v) is computed from the target's residual stream entering layer b plus A's change of
output, delta_A = (z_A(source) - z_A(target)) W_O[A], at every position. The receiver's norm uses the
target run's scale, frozen (so the patch stays a path: the scale would otherwise carry every head's
change). A shortformer's positional embedding joins q and k after the norm, as in the block. A sender's direct
path to the logits (receiver "logits") adds delta_A to the final residual stream, through the final norm
with its target scale frozen.

Directions as `hc.patch`: "denoise" runs the corrupt input with clean sender outputs, "noise" the reverse.
Edges of one receiver layer run stacked (one pass over many copies of the target batch, started at that
layer); where `kernels.supported` holds, each copy recomputes only its receiver head (`_receiver_local`). The
slow reference (`method="reference"`, and whenever any hook is installed on the model) is canonical two-step
path patching (Wang et al. 2022): `exact.step_one`, `exact.step_two`; `method` names the hooks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Literal, cast

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
from torch import Tensor
from transformer_lens.utilities import get_act_name

from headcoop.analysis.edges.exact import edge_copies
from headcoop.analysis.edges.scores import CANONICAL
from headcoop.analysis.engine import kernels
from headcoop.analysis.engine.copies import Copies, Rows, Target, clean_corrupt, route, target_run
from headcoop.analysis.engine.inputs import check_choice, parse_heads, require_model
from headcoop.analysis.engine.norms import frozen_norm
from headcoop.analysis.vocabulary import DIRECTIONS, PATH_METHODS, VIAS, Direction, PathMethod, head_name
from headcoop.checks import check_finite
from headcoop.display.progress import with_progress
from headcoop.models.bridge import is_bridge
from headcoop.models.tl import HookedTransformer
from headcoop.storage.results import Result


@dataclasses.dataclass(frozen=True, repr=False)
class PathPatchResult(Result):
    """values: {(sender, receiver, via): metric} with receiver "logits" and via "direct" for each sender's
    direct path; clean_value / corrupt_value as in PatchResult; direction; assumptions."""

    values: dict
    clean_value: float
    corrupt_value: float
    direction: str
    assumptions: tuple[str, ...] = ()
    method: str = "stacked"

    def to_dataframe(self) -> pd.DataFrame:
        """One row per edge: sender, receiver, via, value (the metric), normalized ((value - corrupt) /
        (clean - corrupt))."""
        gap = self.clean_value - self.corrupt_value
        rows = [dict(sender=s, receiver=r, via=v, value=x, normalized=(x - self.corrupt_value) / gap if gap else float("nan"))
                for (s, r, v), x in self.values.items()]  # fmt: skip
        return pd.DataFrame(rows, columns=["sender", "receiver", "via", "value", "normalized"])

    def plot(self, title: str | None = None) -> go.Figure:
        """One heatmap per via (senders x receivers, normalized), the direct paths as a column "logits"."""
        from plotly.subplots import make_subplots

        from headcoop.display.plot import TEMPLATE

        frame = self.to_dataframe()
        vias = [v for v in (*VIAS, "direct") if v in set(frame.via)]
        fig = make_subplots(rows=1, cols=len(vias), subplot_titles=[f"via {v}" for v in vias])
        bound = float(np.nanmax(np.abs(frame.normalized.to_numpy()), initial=0.0)) or 1.0
        for col, via in enumerate(vias, 1):  # one colour scale for every panel: equal colours, equal values
            part = frame[frame.via == via].pivot(index="sender", columns="receiver", values="normalized")
            fig.add_heatmap(z=part.to_numpy(), x=list(part.columns), y=list(part.index), coloraxis="coloraxis",
                            row=1, col=col)  # fmt: skip
            fig.update_yaxes(autorange="reversed", row=1, col=col)
        fig.update_layout(coloraxis=dict(colorscale="RdBu", reversescale=True, cmin=-bound, cmax=bound,
                                         colorbar=dict(title="share of gap")))  # fmt: skip
        held = "<br><sup>" + "; ".join(self.assumptions) + "</sup>" if self.assumptions else ""
        fig.update_layout(title=(title or f"Path patching ({self.direction}): share of the gap restored") + held,
                          template=TEMPLATE)  # fmt: skip
        return fig

    def __repr__(self) -> str:
        frame = self.to_dataframe()
        top = frame.reindex(frame.normalized.abs().sort_values(ascending=False).index).head(3)
        shown = "; ".join(f"{r.sender}->{r.receiver} ({r.via}) {r.normalized:.3f}" for _, r in top.iterrows())
        return (f"PathPatchResult({len(frame)} edges, {self.direction}, clean={self.clean_value:.4g}, "
                f"corrupt={self.corrupt_value:.4g}; strongest: {shown}; method: {self.method})")  # fmt: skip


def _receiver_local(model, layer, chunk, deltas, target: Target) -> Rows | Tensor:
    """n edges into receivers of `layer`: each copy recomputes only its receiver head (its q, k or v moved by
    the sender's change through the frozen ln1) and adds the head's change of output to the target's
    resid_mid (`Rows` for the engine, which runs the block's MLP and the later layers row-wise); in the last
    layer, logits [n * batch, pos, vocab] computed at the rows the metric reads only."""
    target_cache = target.cache
    block, attn = model.blocks[layer], model.blocks[layer].attn
    act = lambda kind: target_cache[get_act_name(kind, layer)]  # noqa: E731
    scale = target_cache.cache_dict.get(f"blocks.{layer}.ln1.hook_scale")
    n = len(chunk)
    batch, n_pos = act("z").shape[:2]
    heads = torch.tensor([r[1] for _, r, _ in chunk])
    qkv = {name: act(name)[:, :, heads].permute(2, 0, 1, 3).clone() for name in ("q", "k", "v")}  # [n, batch, pos, d]
    moved = {}
    for sender in {s for s, _, _ in chunk}:  # the frozen norm is linear in the change: centre, divide, weigh
        moved[sender] = frozen_norm(getattr(block, "ln1", None), deltas[sender], scale, bias=False)
    for via in ("q", "k", "v"):
        idx = [c for c, e in enumerate(chunk) if e[2] == via]
        if idx:
            x = torch.stack([moved[chunk[c][0]] for c in idx])  # [k, batch, pos, d_model]
            W = getattr(attn, f"W_{via.upper()}")[heads[idx]]  # [k, d_model, d_head]
            qkv[via][idx] += torch.einsum("kbpm,kmd->kbpd", x, W)
    q, k, v = qkv["q"], qkv["k"], qkv["v"]
    if layer == model.cfg.n_layers - 1 and target.needed is not None:  # only the rows the metric reads
        return _last_layer_rows(model, layer, q, k, v, heads, target_cache, target.logits, target.needed)
    flat = lambda x: x.reshape(n * batch, n_pos, 1, -1)  # noqa: E731
    pattern = kernels.pattern_of(model, attn, flat(q), flat(k)).view(n, batch, n_pos, n_pos).to(model.cfg.dtype)
    z = pattern @ v  # [n, batch, pos, d_head]
    change = kernels.head_change(attn, z, act("z")[:, :, heads].permute(2, 0, 1, 3), heads)  # [n, batch, pos, d_model]
    resid_mid = act("resid_pre") + act("attn_out") + change
    return Rows(layer + 1, resid_mid, torch.zeros(n, dtype=torch.long, device=resid_mid.device), finish=layer)


def _last_layer_rows(model, layer, q, k, v, heads, target_cache, target_logits, needed) -> Tensor:
    """As `_receiver_local` for receivers in the last layer, computing only the query rows `needed`."""
    attn = model.blocks[layer].attn
    act = lambda kind: target_cache[get_act_name(kind, layer)]  # noqa: E731
    n, batch, n_pos, _ = q.shape
    rows = needed.to(q.device)
    pattern = kernels.pattern_at_rows(model, attn, q[:, :, rows].reshape(n * batch, len(rows), 1, -1),
                                      k.reshape(n * batch, n_pos, 1, -1), rows).view(n, batch, len(rows), n_pos)  # fmt: skip
    z = pattern @ v  # [n, batch, row, d_head]
    change = kernels.head_change(attn, z, act("z")[:, rows][:, :, heads].permute(2, 0, 1, 3), heads)
    resid = kernels.finish_block(model, layer, (act("resid_pre") + act("attn_out"))[:, rows] + change)
    logits = kernels.unembed(model, resid.reshape(n * batch, len(rows), -1))
    out = target_logits[None].repeat(n, 1, 1, 1)
    out[:, :, rows] = logits.view(n, batch, len(rows), -1)
    return out.view(n * batch, n_pos, -1)


def _stacked_supported(model: HookedTransformer) -> bool:
    """Whether the stacked path models this block layout (causal attention, attention then MLP, no norm after
    a block's outputs; rotary and Bridges included). Other layouts take the reference, which runs the
    model's own forward pass with hooks and needs none of this."""
    return kernels.supported(model) or model.cfg.positional_embedding_type == "rotary" or is_bridge(model)


def check_path_model(model: HookedTransformer) -> None:
    cfg = model.cfg
    if cfg.n_key_value_heads is not None and cfg.n_key_value_heads != cfg.n_heads:
        raise ValueError("path_patch does not support grouped-query attention yet: a k or v input is shared by heads")


@with_progress("hc.path_patch", cheaper="fewer senders= / receivers= is cheaper")
@torch.no_grad()
def path_patch(
    model: HookedTransformer,
    clean=None,
    corrupt=None,
    metric=None,
    senders=None,
    receivers=None,
    via: tuple[str, ...] = VIAS,
    direction: Direction = "denoise",
    direct: bool = True,
    memory_budget_mb: float = 256,
    method: PathMethod = "auto",
    progress: bool | None = None,
) -> PathPatchResult:
    """Path patching of every sender -> receiver edge through q, k and v, and each sender's direct path to
    the logits (module docstring).

    senders, receivers: heads in any form `hc.ablate` takes (default every head); only pairs with the
    receiver in a later layer are edges (ValueError when the heads given make none). via: one or more of
    "q", "k", "v". clean, corrupt, metric, direction: as `hc.patch`. method: "auto" (stacked, or the
    reference whenever a hook is installed on the model), "stacked" or "reference" (one forward pass per
    edge, `reference_edge`). Returns a PathPatchResult (`.to_dataframe()`: sender, receiver, via, value;
    `.method`: the path taken).
    progress: as `hc.patch` (one bar over the call's runs, and the estimate before a long call).
    """
    require_model(model, "path_patch")
    check_finite(model, "hc.path_patch")
    check_path_model(model)
    check_choice("direction", direction, DIRECTIONS)
    check_choice("method", method, PATH_METHODS)
    via = (via,) if isinstance(via, str) else tuple(via)
    if not via:
        raise ValueError(
            'via is empty: give one or more of "q", "k", "v" (each sender\'s direct path needs direct=True)'
        )
    for v in via:
        check_choice("via", v, VIAS)
    cfg = model.cfg
    all_heads = [(lay, h) for lay in range(cfg.n_layers) for h in range(cfg.n_heads)]
    senders = all_heads if senders is None else parse_heads(model, senders)
    receivers = all_heads if receivers is None else parse_heads(model, receivers)
    clean_tokens, corrupt_tokens, score = clean_corrupt(model, clean, corrupt, metric)
    source_tokens, target_tokens = (
        (clean_tokens, corrupt_tokens) if direction == "denoise" else (corrupt_tokens, clean_tokens)
    )
    names = {get_act_name("z", lay) for lay in {lay for lay, _ in senders}}
    source_logits, source_cache = model.run_with_cache(source_tokens, names_filter=lambda n: n in names)
    if method == "stacked" and not _stacked_supported(model):
        raise ValueError(
            "path_patch's stacked path supports standard TransformerLens blocks (causal attention, sequential "
            "attention then MLP, no norm after a block's outputs); this model has another block layout: use "
            "method='auto' or 'reference'"
        )
    fast: Literal["local", "stacked"] = "local" if _receiver_only(model) else "stacked"
    chosen = route(model, method, fast, "stacked copies from the receiver's layer" + (
        " (receiver head only)" if fast == "local" else ""), "edge", reference=CANONICAL,
        no_fast=None if _stacked_supported(model) else "this block layout has no stacked path")  # fmt: skip
    path = chosen.path
    target = target_run(model, target_tokens, score, lambda n: True, rows=path == "local")
    values_sc = float(score.one(source_logits)), cast(float, target.value)  # scored: a scalar metric
    clean_value, corrupt_value = values_sc if direction == "denoise" else values_sc[::-1]

    def delta(lay: int, head: int) -> Tensor:  # [batch, pos, d_model]: what the sender's patch adds
        name = get_act_name("z", lay)
        change = source_cache[name][:, :, head] - target.cache[name][:, :, head]
        return change @ model.blocks[lay].attn.W_O[head]

    deltas = {s: delta(*s) for s in senders}
    edges: list[tuple] = sorted(
        [(s, r, v) for r in receivers for s in senders if s[0] < r[0] for v in via], key=lambda e: e[1][0]
    )
    if not edges and (cfg.n_layers > 1 or not direct):
        last_sender, first_receiver = max(lay for lay, _ in senders), min(lay for lay, _ in receivers)
        raise ValueError(
            f"no edge to patch: every receiver (first in layer {first_receiver}) must sit in a later layer than a "
            f"sender (last in layer {last_sender}); a head cannot path-patch a head of its own or an earlier layer"
        )
    edges += [(s, "logits", "direct") for s in senders] if direct else []
    replace = lambda s: (("head", *s), source_cache[get_act_name("z", s[0])][:, :, s[1]])  # noqa: E731
    copies = path_copies(model, edges, deltas, target, replace, shortcut=path == "local")
    values = chosen.evaluate(target, copies, memory_budget_mb).tolist()
    out = {(head_name(*s), r if r == "logits" else head_name(*r), v): x for (s, r, v), x in zip(edges, values)}
    return PathPatchResult(values=out, clean_value=clean_value, corrupt_value=corrupt_value, direction=direction,
                           assumptions=_assumptions(cfg), method=chosen.label)  # fmt: skip


def _receiver_only(model: HookedTransformer) -> bool:
    """Whether the receiver-only shortcut applies: it scores from the cached q and k, which a rotary model
    rotates afterwards, and runs later layers row-wise (`kernels.supported`)."""
    return kernels.supported(model) and model.cfg.positional_embedding_type != "rotary"


def path_copies(model, edges: list, deltas: dict, target: Target, replacement: Callable, shortcut: bool) -> Copies:
    """Path-patching edges (key, receiver (layer, head) or "logits", via) as the one edge engine's copies
    (`exact.edge_copies`), sorted by the receiver's layer. deltas[key]: the sender's change of output [batch,
    pos, d_model]; replacement(key): (the sender as a writer, its replacing z) for the reference; shortcut:
    recompute only the receiver head (`_receiver_local`) on the "local" path."""
    as_edges = [(key, ("logits",) if r == "logits" else ("head", r[0], r[1], v)) for key, r, v in edges]

    def local(layer: int, lo: int, hi: int):
        return _receiver_local(model, layer, edges[lo:hi], deltas, target)

    return edge_copies(model, as_edges, deltas, target, replacement, local=local if shortcut else None)


def _assumptions(cfg) -> tuple[str, ...]:
    return ("receiver and final norm scales frozen at the target run's",) if cfg.normalization_type else ()


__all__ = ["path_patch", "PathPatchResult", "path_copies"]
