"""Head ablation: zero, mean, resample or scale chosen heads' outputs for the length of a `with` block.

    with hc.ablate(model, heads=[3, 5], how="mean"):
        logits = model(tokens)

The hooks sit on `blocks.{layer}.attn.hook_z` (a head's z, before W_O), so in every forward pass inside
the block -- plain calls, `run_with_cache`, `run_with_hooks`, other headcoop analyses -- the chosen heads
write the replaced z. They are added as TransformerLens *permanent* hooks so that `model.reset_hooks()`
or `run_with_hooks` inside the block cannot silently undo them, and exactly these hooks are removed when
the block ends, also on an exception.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import cast

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens.utilities import get_act_name

from headcoop.analysis.engine.inputs import as_tokens, check_choice, parse_heads, require_task
from headcoop.analysis.vocabulary import HOWS, How
from headcoop.models.tl import HookedTransformer
from headcoop.tasks.base import generator


@contextlib.contextmanager
def hooks_added(model: HookedTransformer, hooks: list[tuple[str, Callable]]) -> Iterator[HookedTransformer]:
    """Add forward hooks (name, fn(activation, hook)) for the length of a `with` block.

    They are permanent TransformerLens hooks (surviving `reset_hooks()` and `run_with_hooks`); on exit,
    also after an exception, exactly these hooks are removed and others are left alone.
    """
    added: list[tuple[object, Callable]] = []
    try:
        for name, fn in hooks:
            point = model.hook_dict[name]
            point.add_hook(fn, dir="fwd", is_permanent=True)
            added.append((point, fn))
        yield model
    finally:
        for point, fn in reversed(added):
            for handle in [h for h in point.fwd_hooks if h.user_hook is fn]:
                handle.hook.remove()
                point.fwd_hooks.remove(handle)


def z_hooks(values: dict) -> list[tuple[str, Callable]]:
    """Hooks (name, fn) that make each (layer, head) of `values` write its given z ([batch, pos, d_head];
    longer values are cut to the run's positions): what `hc.cooperation`'s readings and a coalition game's
    caller-given replacements set, with `hooks_added`."""

    def hook_for(layer: int):
        def hook(z: Tensor, hook=None) -> Tensor:
            z = z.clone()
            for (lay, head), value in values.items():
                if lay == layer:
                    z[:, :, head] = value[:, : z.shape[1]].to(device=z.device, dtype=z.dtype)
            return z

        return hook

    return [(get_act_name("z", lay), hook_for(lay)) for lay in sorted({lay for lay, _ in values})]


@torch.no_grad()
def reference_z(
    model: HookedTransformer, reference, layers: set[int]
) -> dict[int, Float[Tensor, "ref pos head d_head"]]:
    """The z of every head of `layers` on the reference inputs, as the model runs now (any installed hook
    included): {layer: [ref, pos, head, d_head]}."""
    names = {get_act_name("z", lay): lay for lay in layers}
    _, cache = model.run_with_cache(as_tokens(model, reference), names_filter=lambda n: n in names)
    return {lay: cache[name] for name, lay in names.items()}


def resample_order(n_ref: int, seed: int) -> Int[Tensor, " ref"]:
    """The permutation of reference examples that "resample" draws from: example i of any batch takes
    reference example order[i % n_ref]."""
    return torch.randperm(n_ref, generator=generator(seed))


def shifted_order(n_ref: int) -> Int[Tensor, " ref"]:
    """The resample order that pairs example i with reference example i - 1 (the batch rolled by one): where the
    reference is the paired corrupt batch (`hc.faithfulness`), no example takes its own pair. ValueError for a
    single reference example (it would take itself)."""
    if n_ref < 2:
        raise ValueError(
            f"resample needs at least 2 reference inputs (one input would take its own values); got {n_ref}"
        )
    return torch.arange(n_ref).roll(1)


def replacement(ref: Float[Tensor, "ref ref_pos *rest"], how: str, batch: int, n_pos: int,
                order: Tensor | None = None) -> Float[Tensor, "batch pos *rest"]:  # fmt: skip
    """What an ablated activation becomes, for inputs of [batch, n_pos], from the same activation on reference
    inputs `ref` (a head's z, a writer's output, ...): the one definition `hc.ablate`, the coalition games,
    `hc.cooperation`, `hc.faithfulness` and `hc.ablate_edges` share (`ABLATIONS`, `describe_ablation`):
    "zero": 0; "mean": at position p the mean over the reference examples at p; "resample": example i takes
    reference example order[i % n_ref] (`resample_order`, `shifted_order`); "corrupt": example i takes
    reference example i (the paired corrupt input). ValueError when the inputs are longer than the reference."""
    n_ref, ref_pos = ref.shape[:2]
    if n_pos > ref_pos:
        raise ValueError(f"inputs of length {n_pos} are longer than the {how}-ablation reference ({ref_pos} positions)")
    rest = ref.shape[2:]
    if how == "zero":
        return ref.new_zeros(batch, n_pos, *rest)
    if how == "mean":
        return ref[:, :n_pos].mean(0).expand(batch, n_pos, *rest)
    if how == "resample":
        if order is None:
            raise ValueError('how="resample" needs the resample order (resample_order(n_ref, seed)), got order=None')
        pick = order[torch.arange(batch) % n_ref]
        return ref[pick.to(ref.device), :n_pos]
    if how == "corrupt":
        if n_ref != batch:
            raise ValueError(
                f"corrupt ablation pairs each input with its corrupt input: {batch} inputs, {n_ref} corrupt"
            )
        return ref[:, :n_pos]
    raise ValueError(f"replacement() takes how 'zero', 'mean', 'resample' or 'corrupt', got {how!r}")


def describe_ablation(how: str, n_ref: int | str = 0, reference: str = "reference", order: str = "seeded") -> str:
    """The definition that ran, in words, for a result's repr and title (`replacement`); n_ref: how many reference
    inputs (a count, or a range such as "8-16" over several references)."""
    if how == "zero":
        return "zero: the output set to 0"
    if how == "mean":
        return f"mean: the output's mean over {n_ref} {reference} inputs, per position"
    if how == "resample":
        drawn = "the batch rolled by one" if order == "shifted" else "a seeded permutation"
        return f"resample: another {reference} input's output ({drawn} of {n_ref})"
    if how == "corrupt":
        return "corrupt: the paired corrupt input's output"
    return f"{how}"


@contextlib.contextmanager
def ablate(
    model: HookedTransformer,
    heads,
    how: How = "zero",
    layer: int | None = None,
    reference=None,
    seed: int = 0,
    factor: float | None = None,
) -> Iterator[HookedTransformer]:
    """Replace the z ([batch, pos, d_head] per head, before W_O) of `heads` inside a `with` block.

    heads:     ints (that head in `layer`, or in every layer for layer=None), (layer, head) tuples or
               names "L0H3", alone or in a list.
    how:       "zero"     z = 0: the head writes nothing (b_O, shared by all heads, stays);
               "mean"     z at position p = the mean of the head's z at p over the reference examples;
               "resample" z = the head's z on a reference example: example i of the batch gets
                          reference example perm[i % n_ref], perm a permutation seeded by `seed`
                          (the same in every forward pass);
               "scale"    z = factor * z (factor > 1 amplifies the head, 0 < factor < 1 attenuates it).
    reference: tokens (any form `as_tokens` takes) for "mean" / "resample"; default: the model's task
               sample `task.sample(512, seed=0)`. Their z is computed once on entering the block, by the
               model as it runs then (so inside an enclosing ablation, that ablation applies). Inputs
               may be shorter than the reference (position p uses reference position p), not longer.
    Yields the model; hooks are removed on exit, also after an exception.
    """
    check_choice("how", how, HOWS)
    pairs = parse_heads(model, heads, layer)
    if how == "scale":
        if factor is None or isinstance(factor, bool) or not isinstance(factor, (int, float)):
            raise ValueError(f'how="scale" needs a numeric factor=, e.g. factor=2.0; got {factor!r}')
        if not math.isfinite(factor):
            raise ValueError(
                f'how="scale" needs a finite factor=, got {factor!r} (it would make every output NaN or inf)'
            )
    elif factor is not None:
        raise ValueError(f'factor= only applies to how="scale", not how={how!r}')
    if how in ("zero", "scale") and reference is not None:
        raise ValueError(f'reference= only applies to how="mean" or "resample", not how={how!r}')

    by_layer: dict[int, list[int]] = {}
    for lay, head in pairs:
        by_layer.setdefault(lay, []).append(head)

    ref_z = {}
    if how in ("mean", "resample"):
        if reference is None:
            reference = require_task(model, f'the reference of how="{how}"').sample(512, seed=0)
        ref_z = reference_z(model, reference, set(by_layer))
    n_ref = next(iter(ref_z.values())).shape[0] if ref_z else 0
    order = resample_order(n_ref, seed) if how == "resample" else None

    def make_hook(lay: int, hs: list[int]):
        index = torch.tensor(hs)
        source = ref_z[lay][:, :, index] if ref_z else None  # [ref, pos, n_sel, d_head]

        def hook(z: Float[Tensor, "batch pos head d_head"], hook) -> Tensor:
            z = z.clone()
            if how == "zero":
                z[:, :, index] = 0.0
            elif how == "scale":
                z[:, :, index] = z[:, :, index] * cast(float, factor)  # checked above: how="scale" takes a factor
            else:
                z[:, :, index] = replacement(cast(Tensor, source), how, z.shape[0], z.shape[1], order).to(z)
            return z

        return hook

    hooks = [(get_act_name("z", lay), make_hook(lay, hs)) for lay, hs in sorted(by_layer.items())]
    with hooks_added(model, hooks):
        yield model
