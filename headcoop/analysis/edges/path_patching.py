"""Path patching: the effect of one sender head's output on one receiver head's query, key or value input,
with every other path left as in the target run.

For a sender A (layer a) and a receiver B (layer b > a) the target run is repeated with one change: B's
`via` input (q, k or v) is computed from the target's residual stream entering layer b plus A's change of
output, delta_A = (z_A(source) - z_A(target)) W_O[A], at every position. The receiver's LayerNorm uses the
target run's scale, frozen (so the patch stays a path: the scale would otherwise carry every head's
change). A shortformer's positional embedding joins q and k after the norm, as in the block. Nothing else
in layers a..b changes; B's new output then flows through every later layer as usual. A sender's direct
path to the logits (receiver "logits") adds delta_A to the final residual stream, through the final norm
with its target scale frozen.

Directions as `hc.patch`: "denoise" runs the corrupt input with clean sender outputs, "noise" the reverse.
Edges of one receiver layer run stacked (one pass over many copies of the target batch, started at that
layer). The slow reference beside it (`method="reference"`: `reference_edge`, `reference_direct`) is
canonical two-step path patching (Wang et al. 2022): the target run with the sender patched and every other
head and MLP frozen at the target, then the receiver's q, k or v from that run's residual stream (ln1 at the
target's scale). Without hooks the two agree (the residual stream entering layer b is then exactly the
target's plus delta_A). Whenever any hook is installed on the model (the user's own, `hc.ablate`'s, ...) the
reference is the path taken: a hook between sender and receiver (a scaled attn_out, a steering vector on the
residual stream) then acts on the sender's change as it does in the model, and a hook on the receiver's
ln1, q, k or v acts on its patched input; `method` names the hooks.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
from torch import Tensor
from headcoop.progress import with_progress
from headcoop.tl import HookedTransformer
from transformer_lens.utilities import get_act_name

from headcoop.analysis.engine import kernels
from headcoop.analysis.engine.inputs import check_choice, parse_heads, require_model
from headcoop.analysis.engine.norms import frozen_norm
from headcoop.analysis.vocabulary import DIRECTIONS, PATH_METHODS, VIAS, Direction, PathMethod, Via, head_name
from headcoop.analysis.engine.copies import (
    Copies, Rows, Target, clean_corrupt, evaluate, route, target_run,
)  # fmt: skip
from headcoop.bridge import head_weight, is_bridge
from headcoop.checks import check_finite, check_metric_value
from headcoop.results import Result


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

        from headcoop.plot import TEMPLATE

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


@torch.no_grad()
def reference_edge(model: HookedTransformer, target_tokens, target_cache, source_cache, sender, receiver, via: str,
                   metric) -> float:  # fmt: skip
    """The slow, obviously-correct value of one edge by canonical two-step path patching, every installed
    hook acting as in any forward pass: (1) the target run with the sender's z from the source and every
    other head's z and every MLP's output frozen at the target's (`sender_run`); (2) the target run with
    the receiver head's `via` activation set to what that head computes from step 1's residual stream
    entering its layer, through ln1 with the target run's scale (`_edge_logits`). Without hooks this equals
    the module docstring's definition (the target's resid_pre plus the sender's change)."""
    logits = _edge_logits(model, target_tokens, target_cache, sender_run(model, target_tokens, target_cache,
                                                                          source_cache, sender), receiver, via)  # fmt: skip
    return float(check_metric_value(metric(logits), "metric"))


@torch.no_grad()
def sender_run(model, target_tokens, target_cache, source_cache, sender) -> dict[str, Tensor]:
    """Step one of canonical path patching: the target run with sender (layer, head)'s z from `source_cache`,
    every other head's z and every MLP's output held at `target_cache`'s (hooks appended after any installed
    hook, so a hook on the path acts on the sender's change as in the model). Returns the residual stream
    entering every later layer and leaving the last ({hook name: [batch, pos, d_model]})."""
    a, i = sender
    n_layers = model.cfg.n_layers
    hooks = []
    for lay in range(n_layers):
        z_name = get_act_name("z", lay)
        frozen_z = target_cache[z_name].clone()
        if lay == a:
            frozen_z[:, :, i] = source_cache[z_name][:, :, i]
        hooks.append((z_name, lambda x, hook, v=frozen_z: v.to(x)))
        mlp_name = get_act_name("mlp_out", lay)
        if mlp_name in target_cache.cache_dict:
            hooks.append((mlp_name, lambda x, hook, v=target_cache[mlp_name]: v.to(x)))
    wanted = [get_act_name("resid_pre", lay) for lay in range(a + 1, n_layers)] + [get_act_name("resid_post", n_layers - 1)]
    captured: dict[str, Tensor] = {}
    for name in wanted:
        hooks.append((name, lambda x, hook, name=name: captured.__setitem__(name, x.detach().clone())))
    model.run_with_hooks(target_tokens, fwd_hooks=hooks)
    return captured


def _edge_logits(model, target_tokens, target_cache, resid: dict, receiver, via) -> Tensor:
    """Step two of canonical path patching, logits [batch, pos, vocab]: one pass of the target tokens up to
    the receiver's layer with its resid_pre set to step one's (`resid`, from `sender_run`) and ln1's scale at
    the target's, reading the receiver head's `via` activation after every hook there; then one pass of the
    target tokens with that head's `via` activation set to it. The same on a HookedTransformer and a
    TransformerBridge (whose q/k/v inputs are shared by all heads), and every hook on ln1, q, k or v acts."""
    layer, head = receiver
    name = get_act_name(via, layer)
    resid_name = get_act_name("resid_pre", layer)
    read: dict[str, Tensor] = {}
    hooks = [(resid_name, lambda x, hook: resid[resid_name].to(x))]
    scale = target_cache.cache_dict.get(f"blocks.{layer}.ln1.hook_scale")
    if scale is not None:
        hooks.append((f"blocks.{layer}.ln1.hook_scale", lambda s, hook: scale.to(s)))
    hooks.append((name, lambda x, hook: read.__setitem__("value", x[:, :, head].detach().clone())))
    model.run_with_hooks(target_tokens, fwd_hooks=hooks, stop_at_layer=layer + 1)

    def receive(x, hook):
        x = x.clone()
        x[:, :, head] = read["value"].to(x)
        return x

    return model.run_with_hooks(target_tokens, fwd_hooks=[(name, receive)])


@torch.no_grad()
def reference_direct(model: HookedTransformer, target_tokens, target_cache, source_cache, sender, metric) -> float:
    """The slow value of a sender's direct path by canonical path patching: step one as `reference_edge`,
    then the target run with the last layer's output set to step one's and the final norm's scale held at
    the target run's."""
    logits = _direct_logits(model, target_tokens, target_cache, sender_run(model, target_tokens, target_cache,
                                                                            source_cache, sender))  # fmt: skip
    return float(check_metric_value(metric(logits), "metric"))


def _direct_logits(model, target_tokens, target_cache, resid: dict) -> Tensor:
    """The logits [batch, pos, vocab] of `reference_direct`'s second pass."""
    name = get_act_name("resid_post", model.cfg.n_layers - 1)
    hooks = [(name, lambda x, hook: resid[name].to(x))]
    scale = target_cache.cache_dict.get("ln_final.hook_scale")
    if scale is not None:
        hooks.append(("ln_final.hook_scale", lambda s, hook: scale.to(s)))
    return model.run_with_hooks(target_tokens, fwd_hooks=hooks)


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
    via: tuple[Via, ...] = VIAS,
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
        raise ValueError('via is empty: give one or more of "q", "k", "v" (each sender\'s direct path needs direct=True)')
    for v in via:
        check_choice("via", v, VIAS)
    cfg = model.cfg
    all_heads = [(lay, h) for lay in range(cfg.n_layers) for h in range(cfg.n_heads)]
    senders = all_heads if senders is None else parse_heads(model, senders)
    receivers = all_heads if receivers is None else parse_heads(model, receivers)
    clean_tokens, corrupt_tokens, score = clean_corrupt(model, clean, corrupt, metric)
    source_tokens, target_tokens = (clean_tokens, corrupt_tokens) if direction == "denoise" else (corrupt_tokens, clean_tokens)
    names = {get_act_name("z", lay) for lay in {lay for lay, _ in senders}}
    source_logits, source_cache = model.run_with_cache(source_tokens, names_filter=lambda n: n in names)
    if method == "stacked" and not _stacked_supported(model):
        raise ValueError(
            "path_patch's stacked path supports standard TransformerLens blocks (causal attention, sequential "
            "attention then MLP, no norm after a block's outputs); this model has another block layout: use "
            "method='auto' or 'reference'"
        )
    fast = "local" if _receiver_only(model) else "stacked"
    chosen = route(model, method, fast, "stacked copies from the receiver's layer" + (
        " (receiver head only)" if fast == "local" else ""), "edge", reference=CANONICAL,
        no_fast=None if _stacked_supported(model) else "this block layout has no stacked path")  # fmt: skip
    path = chosen.path
    target = target_run(model, target_tokens, score, lambda n: True, rows=path == "local")
    values_sc = float(score.one(source_logits)), target.value
    clean_value, corrupt_value = values_sc if direction == "denoise" else values_sc[::-1]

    def delta(lay: int, head: int) -> Tensor:  # [batch, pos, d_model]: what the sender's patch adds
        name = get_act_name("z", lay)
        change = source_cache[name][:, :, head] - target.cache[name][:, :, head]
        return change @ model.blocks[lay].attn.W_O[head]

    deltas = {s: delta(*s) for s in senders}
    edges = sorted([(s, r, v) for r in receivers for s in senders if s[0] < r[0] for v in via], key=lambda e: e[1][0])
    if not edges and (cfg.n_layers > 1 or not direct):
        last_sender, first_receiver = max(lay for lay, _ in senders), min(lay for lay, _ in receivers)
        raise ValueError(
            f"no edge to patch: every receiver (first in layer {first_receiver}) must sit in a later layer than a "
            f"sender (last in layer {last_sender}); a head cannot path-patch a head of its own or an earlier layer"
        )
    edges += [(s, "logits", "direct") for s in senders] if direct else []
    values = evaluate(target, path_copies(model, edges, deltas, target, lambda sender: (source_cache, sender)), path, memory_budget_mb).tolist()
    out = {(head_name(*s), r if r == "logits" else head_name(*r), v): x for (s, r, v), x in zip(edges, values)}
    return PathPatchResult(values=out, clean_value=clean_value, corrupt_value=corrupt_value, direction=direction,
                           assumptions=_assumptions(cfg), method=chosen.label)  # fmt: skip


CANONICAL = "canonical two-step path patching per edge (sender patched, other heads and MLPs frozen; then the receiver)"


def _receiver_only(model: HookedTransformer) -> bool:
    """Whether the receiver-only shortcut applies: it scores from the cached q and k, which a rotary model
    rotates afterwards, and runs later layers row-wise (`kernels.supported`)."""
    return kernels.supported(model) and model.cfg.positional_embedding_type != "rotary"


def path_copies(model, edges: list, deltas: dict, target: Target, sources: Callable) -> Copies:
    """The specification of a path-patching sweep for the engine: copy i is edge i (key, receiver, via), the
    first layer it changes the receiver's (n_layers for a direct path); edges sorted by that layer. `key` names
    the copy's change: deltas[key] [batch, pos, d_model] is what the sender's output adds (its own value per
    copy: one sender under several replacements is several keys), and sources(key) = (a cache holding the
    sender's replacement z, the sender (layer, head)) for the canonical reference. `hc.path_patch` keys by
    sender; `ablate_edges` by (sender, reference)."""
    n_layers = model.cfg.n_layers
    layers = [n_layers if r == "logits" else r[0] for _, r, _ in edges]
    final = target.act("resid_post", n_layers - 1)
    final_scale = target.cache.cache_dict.get("ln_final.hook_scale")

    def direct_logits(lo: int, hi: int) -> Tensor:  # [n * batch, pos, vocab]
        x = torch.stack([final + deltas[s] for s, _, _ in edges[lo:hi]])
        if final_scale is not None:
            x = frozen_norm(model.ln_final, x, final_scale)
        return model.unembed(x.flatten(0, 1))

    def local(layer: int, lo: int, hi: int):
        if layer == n_layers:
            return direct_logits(lo, hi)
        return _receiver_local(model, layer, edges[lo:hi], deltas, target)

    def setter(lo: int, hi: int) -> list:
        """Hooks on the receivers' q/k/v in a stack of hi - lo copies: each copy's receiver input recomputed
        from the target's resid_pre plus its sender's change, through ln1 with the target's scale."""
        chunk, n, batch = edges[lo:hi], hi - lo, target.batch
        lay = chunk[0][1][0]
        block = model.blocks[lay]
        resid = target.act("resid_pre", lay)
        scale = target.cache.cache_dict.get(f"blocks.{lay}.ln1.hook_scale")
        pos_embed = target.extras["shortformer_pos_embed"]
        hooks = []
        for v in VIAS:
            idx = [i for i, e in enumerate(chunk) if e[2] == v]
            if not idx:
                continue
            new_inputs = []
            for i in idx:
                sender, (_, head), _ = chunk[i]
                x = frozen_norm(block.ln1, resid + deltas[sender], scale) if scale is not None else resid + deltas[sender]
                if v in ("q", "k") and pos_embed is not None:
                    x = x + pos_embed
                W, b = (head_weight(block.attn, f"{kind}_{v.upper()}", model.cfg)[head] for kind in ("W", "b"))
                new_inputs.append(x @ W + b)  # [batch, pos, d_head]
            heads, values, copies = torch.tensor([chunk[i][1][1] for i in idx]), torch.stack(new_inputs), torch.tensor(idx)

            def hook(act, hook, heads=heads, values=values, copies=copies):
                act = act.view(n, batch, *act.shape[1:]).clone()
                act[copies, :, :, heads] = values.to(act)
                return act.view(n * batch, *act.shape[2:])

            hooks.append((get_act_name(v, lay), hook))
        return hooks

    step_one: OrderedDict = OrderedDict()  # key -> its step-one residual streams, the 16 latest kept

    def reference(i: int) -> Tensor:
        key, receiver, v = edges[i]
        if key not in step_one:
            step_one[key] = sender_run(model, target.tokens, target.cache, *sources(key))
            if len(step_one) > 16:
                step_one.popitem(last=False)
        if receiver == "logits":
            return _direct_logits(model, target.tokens, target.cache, step_one[key])
        return _edge_logits(model, target.tokens, target.cache, step_one[key], receiver, v)

    return Copies(layers=layers, setter=setter, reference=reference, local=local)


def _assumptions(cfg) -> tuple[str, ...]:
    return ("receiver and final norm scales frozen at the target run's",) if cfg.normalization_type else ()


__all__ = ["path_patch", "PathPatchResult", "path_copies", "reference_edge", "reference_direct", "sender_run"]
