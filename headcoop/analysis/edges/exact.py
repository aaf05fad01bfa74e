"""Exact edge patching: one specification and one reference, for `hc.edges(estimator="exact")`, the verification
of its estimates, `hc.path_patch` (its head-to-head view) and `hc.ablate_edges`.

**The specification.** An edge (w, r) is patched in the target run (corrupt for "denoise") by one change: the
reader r's input is computed from the target's residual stream at r plus the writer's change of output,
delta_w = out_w(replacement) - out_w(target), at every position, through r's norm with the target run's scale
frozen (so the patch stays an edge). Nothing else changes; r's new output flows through every later layer.
The replacement is the source run's output for `hc.edges` and `hc.path_patch`, a mean output for
`hc.ablate_edges`. A copy is keyed by what changes (`key`: a writer, a sender, or (sender, reference)), so one
writer under several replacements is several copies.

**The reference** (`canonical_logits`): canonical two-step path patching (Wang et al. 2022), extended from heads
to every writer and reader. (1) The target run with w's own activation replaced (a head's z, an MLP's output,
an embedding) and every other head's z and every MLP's output frozen at the target's: the residual stream
entering r then holds w's change as the model carries it, through any hook on the way (`step_one`). (2) The
target run with r's activation (q/k/v of one head or key/value head, an MLP's pre-activation, or the final
residual stream) set to what r computes from step one's residual stream with its norm scale held at the
target's, read after every hook at r (`step_two`). Without hooks the two steps equal the specification; with
any hook installed on the model the engine takes the reference (`route`), so a hook between writer and reader
acts on the writer's change as it does in the model, and a hook at the reader acts on its patched input.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import cast

import torch
from torch import Tensor
from transformer_lens.utilities import get_act_name

from headcoop.analysis.edges.graph import ATTN_READERS, Reader, Writer, has_mlp, qkv_weights
from headcoop.analysis.engine.copies import Copies, Hooks, Target
from headcoop.analysis.engine.norms import frozen_norm
from headcoop.models.tl import HookedTransformer

Key = Hashable  # what a copy changes: a writer (hc.edges), a sender (hc.path_patch), (sender, reference), ...
Replacement = Callable[[Key], tuple[Writer, Tensor]]  # key -> (its writer, the writer's replacing activation)


# --- writers' activations and changes ---------------------------------------------------------------------
def writer_activation(cache, writer: Writer) -> Tensor:
    """The activation step one replaces for `writer` in a cached run: a head's z [batch, pos, d_head], an MLP's
    output or the token embedding [batch, pos, d_model], the positional embedding [1 or batch, pos, d_model]."""
    if writer[0] == "head":
        return cache[get_act_name("z", writer[1])][:, :, writer[2]]
    if writer[0] == "mlp":
        return cache[get_act_name("mlp_out", writer[1])]
    return cache["hook_embed" if writer[0] == "embed" else "hook_pos_embed"]


def writer_outputs(model: HookedTransformer, cache, writers: list[Writer]) -> dict[Writer, Tensor]:
    """Each writer's output [batch, pos, d_model] in a cached run."""
    out = {}
    for w in writers:
        if w[0] == "embed":
            out[w] = cache["hook_embed"]
        elif w[0] == "pos_embed":
            out[w] = cache["hook_pos_embed"].expand_as(cache["hook_embed"])
        elif w[0] == "head":
            out[w] = cache[get_act_name("z", w[1])][:, :, w[2]] @ model.blocks[w[1]].attn.W_O[w[2]]
        else:
            out[w] = cache[get_act_name("mlp_out", w[1])]
    return out


def source_replacement(cache) -> Replacement:
    """Keys that are writers, each replaced by its activation in the cached source run."""

    def replace(key):
        return key, writer_activation(cache, key)

    return replace


def scale_of(cache, name: str) -> Tensor | None:
    """A norm's cached scale (None where the model has no such norm)."""
    return cache.cache_dict.get(name)


# --- the specification ------------------------------------------------------------------------------------
def reader_weights(model: HookedTransformer, reader: Reader) -> tuple[Tensor, Tensor]:
    """(W [d_model, d_head], b [d_head]) of a head reader's q, k or v (a Bridge's through `head_weight`)."""
    return qkv_weights(model, reader[1], reader[3], reader[2])


def reader_input(model: HookedTransformer, target: Target, reader: Reader, delta: Tensor) -> Tensor | tuple:
    """The reader's own activation when its residual input is the target's plus `delta` [*copy, batch, pos,
    d_model], through its norm at the target's scale: q/k/v [*copy, batch, pos, d_head] for a head, the
    pre-activation [*copy, batch, pos, d_mlp] for an MLP (a gated MLP: (gate, linear) pre-activations)."""
    cache, lay = target.cache, reader[1]
    block = model.blocks[lay]
    if reader[0] in ATTN_READERS:
        x = frozen_norm(getattr(block, "ln1", None), target.act("resid_pre", lay) + delta,
                        scale_of(cache, f"blocks.{lay}.ln1.hook_scale"))  # fmt: skip
        pos_embed = target.extras.get("shortformer_pos_embed")
        if reader[3] in ("q", "k") and pos_embed is not None:
            x = x + pos_embed
        W, b = reader_weights(model, reader)
        return x @ W + b
    x = frozen_norm(getattr(block, "ln2", None), target.act("resid_mid", lay) + delta,
                    scale_of(cache, f"blocks.{lay}.ln2.hook_scale"))  # fmt: skip
    if model.cfg.gated_mlp:  # TransformerLens's GatedMLP adds b_in after the product of the two
        return x @ block.mlp.W_gate, x @ block.mlp.W_in
    return x @ block.mlp.W_in + block.mlp.b_in


def reader_sites(model: HookedTransformer, reader: Reader) -> list[tuple[str, int | None]]:
    """The hook points holding a reader's activation, with the head index on their head axis (None for an MLP)."""
    if reader[0] in ATTN_READERS:
        return [(get_act_name(reader[3], reader[1]), reader[2])]
    sites: list[tuple[str, int | None]] = [(f"blocks.{reader[1]}.mlp.hook_pre", None)]
    return sites + [(f"blocks.{reader[1]}.mlp.hook_pre_linear", None)] if model.cfg.gated_mlp else sites


def edge_copies(model: HookedTransformer, edges: list[tuple[Key, Reader]], deltas: dict[Key, Tensor],
                target: Target, source, local: Callable | None = None) -> Copies:  # fmt: skip
    """The engine's specification of an edge-patching sweep: copy i is edge i = (key, reader), its first
    changed layer the reader's (n_layers for the logits); `edges` sorted by that layer. deltas[key]: the
    writer's change of output [batch, pos, d_model]. source: the cached source run (keys are writers), or a
    `Replacement` (key -> (writer, its replacing activation)) for the reference. local(layer, lo, hi): an
    optional shortcut for the copies lo..hi of a head-reader layer (`hc.path_patch`'s receiver-only one)."""
    replacement = source if callable(source) else source_replacement(source)
    n_layers = model.cfg.n_layers
    layers = [n_layers if r[0] == "logits" else r[1] for _, r in edges]
    final_scale = scale_of(target.cache, "ln_final.hook_scale")
    final = target.act("resid_post", n_layers - 1)

    def direct_logits(lo: int, hi: int) -> Tensor:  # only the direct paths: [n * batch, pos, vocab]
        x = torch.stack([final + deltas[k] for k, _ in edges[lo:hi]])
        if final_scale is not None:
            x = frozen_norm(model.ln_final, x, final_scale)
        return model.unembed(x.flatten(0, 1))

    def shortcut(layer: int, lo: int, hi: int):
        return direct_logits(lo, hi) if layer == n_layers else cast(Callable, local)(layer, lo, hi)

    def setter(lo: int, hi: int) -> list:
        """Hooks that set each copy's reader activation in a stack of hi - lo copies of the target batch."""
        n, batch = hi - lo, target.batch
        sites: dict[str, list[tuple[int, int | None, Tensor]]] = {}  # hook name -> (copy, head, value)
        for c, (key, r) in enumerate(edges[lo:hi]):
            value = reader_input(model, target, r, deltas[key])
            values = value if isinstance(value, tuple) else (value,)
            for (name, head), v in zip(reader_sites(model, r), values):
                sites.setdefault(name, []).append((c, head, v))

        def setting(entries):
            def hook(act, hook):
                act = act.view(n, batch, *act.shape[1:]).clone()
                for c, head, value in entries:
                    if head is None:
                        act[c] = value.to(act)
                    else:
                        act[c, :, :, head] = value.to(act)
                return act.view(n * batch, *act.shape[2:])

            return hook

        return [(name, setting(entries)) for name, entries in sites.items()]

    steps: OrderedDict = OrderedDict()  # key -> its step-one residual streams, the 16 latest kept

    def reference(i: int) -> Tensor:
        key, reader = edges[i]
        if key not in steps:
            steps[key] = step_one(model, target, *replacement(key))
            if len(steps) > 16:
                steps.popitem(last=False)
        return step_two(model, target, steps[key], reader)

    return Copies(layers=layers, setter=setter, reference=reference,
                  local=shortcut if local is not None else (lambda layer, lo, hi: direct_logits(lo, hi)))  # fmt: skip


# --- the reference: canonical two-step path patching ------------------------------------------------------
@torch.no_grad()
def step_one(model: HookedTransformer, target: Target, writer: Writer, value: Tensor) -> dict[str, Tensor]:
    """The target run with `writer`'s activation set to `value` (`writer_activation`'s shape), every head's z
    and every MLP's output otherwise frozen at the target's (hooks appended after any installed hook, so a hook
    on the path acts on the writer's change as in the model). Returns the residual streams a reader reads: each
    layer's resid_pre and resid_mid and the last resid_post ({hook name: [batch, pos, d_model]})."""
    cache, n_layers = target.cache, model.cfg.n_layers
    hooks: Hooks = []
    if writer[0] in ("embed", "pos_embed"):
        hooks.append(("hook_embed" if writer[0] == "embed" else "hook_pos_embed", lambda x, hook: value.to(x)))
    for lay in range(n_layers):
        z = cache[get_act_name("z", lay)]
        if writer[0] == "head" and writer[1] == lay:
            z = z.clone()
            z[:, :, writer[2]] = value
        hooks.append((get_act_name("z", lay), lambda x, hook, v=z: v.to(x)))
        mlp_name = get_act_name("mlp_out", lay)
        if mlp_name in cache.cache_dict:
            v = value if writer == ("mlp", lay) else cache[mlp_name]
            hooks.append((mlp_name, lambda x, hook, v=v: v.to(x)))
    wanted = [get_act_name("resid_pre", lay) for lay in range(n_layers)]
    wanted += [get_act_name("resid_mid", lay) for lay in range(n_layers) if has_mlp(model)]
    wanted.append(get_act_name("resid_post", n_layers - 1))
    captured: dict[str, Tensor] = {}
    for name in wanted:
        hooks.append(
            (name, lambda x, hook, name=name: captured.__setitem__(name, x.detach().clone()))
        )  # a Bridge's hook.name is its own
    model.run_with_hooks(target.tokens, fwd_hooks=hooks)
    return captured


@torch.no_grad()
def step_two(model: HookedTransformer, target: Target, resid: dict[str, Tensor], reader: Reader) -> Tensor:
    """Logits [batch, pos, vocab] of the target run with `reader`'s activation set to what it computes from step
    one's residual stream (`resid`), its norm scale held at the target's: one pass up to the reader's layer with
    its residual input set, reading the activation after every hook there, then one pass of the target tokens
    with it set. The logits reader: one pass with the last resid_post set and the final norm's scale held."""
    cache = target.cache
    if reader[0] == "logits":
        name = get_act_name("resid_post", model.cfg.n_layers - 1)
        hooks: Hooks = [(name, lambda x, hook: resid[name].to(x))]
        scale = scale_of(cache, "ln_final.hook_scale")
        if scale is not None:
            held: Tensor = scale
            hooks.append(("ln_final.hook_scale", lambda s, hook: held.to(s)))
        return model.run_with_hooks(target.tokens, fwd_hooks=hooks)
    lay, attn = reader[1], reader[0] in ATTN_READERS
    entry = get_act_name("resid_pre" if attn else "resid_mid", lay)
    hooks = [(entry, lambda x, hook: resid[entry].to(x))]
    scale = scale_of(cache, f"blocks.{lay}.{'ln1' if attn else 'ln2'}.hook_scale")
    if scale is not None:
        hooks.append((f"blocks.{lay}.{'ln1' if attn else 'ln2'}.hook_scale", lambda s, hook: scale.to(s)))
    read: dict[str, Tensor] = {}
    for name, head in reader_sites(model, reader):
        hooks.append((name, lambda x, hook, name=name, head=head: read.__setitem__(
            name, (x if head is None else x[:, :, head]).detach().clone())))  # fmt: skip
    model.run_with_hooks(target.tokens, fwd_hooks=hooks, stop_at_layer=lay + 1)

    def receive(x, name, head):
        if head is None:
            return read[name].to(x)
        x = x.clone()
        x[:, :, head] = read[name].to(x)
        return x

    sets = [
        (name, lambda x, hook, name=name, head=head: receive(x, name, head))
        for name, head in reader_sites(model, reader)
    ]
    return model.run_with_hooks(target.tokens, fwd_hooks=sets)


@contextlib.contextmanager
def split_inputs(model: HookedTransformer):
    """TransformerLens's own per-head q/k/v inputs and MLP input hook, switched on for a reference and back."""
    cfg = model.cfg
    was = (cfg.use_split_qkv_input, cfg.use_hook_mlp_in)
    model.set_use_split_qkv_input(True)
    if has_mlp(model):
        model.set_use_hook_mlp_in(True)
    try:
        yield
    finally:
        model.set_use_split_qkv_input(was[0])
        if has_mlp(model):
            model.set_use_hook_mlp_in(was[1])


@contextlib.contextmanager
def prepended(model: HookedTransformer, hooks: list[tuple[str, Callable]]):
    """Forward hooks run *before* every hook already installed at their points (TransformerLens's `prepend`),
    removed on exit without touching anyone else's hooks."""
    points = dict(model.hook_dict)
    added = []
    try:
        for name, fn in hooks:
            point = points[name]
            point.add_hook(fn, dir="fwd", prepend=True)
            added.append((point, point.fwd_hooks[0]))
    finally:
        try:
            yield
        finally:
            for point, handle in added:
                handle.hook.remove()
                point.fwd_hooks.remove(handle)


__all__ = [
    "edge_copies",
    "reader_input",
    "step_one",
    "step_two",
    "writer_activation",
    "writer_outputs",
    "source_replacement",
    "split_inputs",
    "prepended",
    "reader_sites",
]
