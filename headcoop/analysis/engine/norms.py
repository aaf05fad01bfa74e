"""LayerNorm and RMSNorm as linear maps with a frozen scale: how a sum of residual-stream components passes
through a TransformerLens norm exactly, given the scale the norm computed in the same forward pass.

    LN(x)  = (x - mean(x)) / scale * w + b        LNPre:  (x - mean(x)) / scale
    RMS(x) =  x / scale * w                       RMSPre:  x / scale

With `scale` held at its cached value (`<norm>.hook_scale`), each is linear in x up to the bias b, so
components c_i with sum x map to parts whose sum, plus b, is the norm's output: TransformerLens's
`apply_ln_to_stack`. The scale itself depends on every component: it is frozen, not attributed.
"""

from __future__ import annotations

from typing import cast

import torch
from jaxtyping import Float
from torch import Tensor

try:
    from transformer_lens.components import LayerNorm, LayerNormPre, RMSNorm, RMSNormPre

    TL_NORMS: tuple = ((LayerNormPre, "LNPre"), (LayerNorm, "LN"), (RMSNormPre, "RMSPre"), (RMSNorm, "RMS"))
except ImportError:  # TransformerLens 4.x: only a Bridge's norms exist
    TL_NORMS = ()

from headcoop.analysis.vocabulary import NormKind


def norm_kind(module: torch.nn.Module | None) -> NormKind | None:
    """The kind of a TransformerLens norm module (None for no norm); ValueError for an unknown module."""
    if module is None or isinstance(module, torch.nn.Identity):
        return None
    for cls, kind in TL_NORMS:
        if type(module) is cls:
            return kind
    # a TransformerBridge's norms wrap the Hugging Face module (its weights folded in compatibility mode)
    bridge_kinds = {"NormalizationBridge": "LN", "RMSNormalizationBridge": "RMS"}
    if type(module).__name__ in bridge_kinds:
        kind = bridge_kinds[type(module).__name__]
        weight, bias = norm_weights(module)
        folded = (weight is None or bool((weight == 1).all())) and (bias is None or not bool(bias.any()))
        return cast(
            NormKind, kind + "Pre" if folded else kind
        )  # weights folded into the next layer: as TransformerLens's LNPre
    raise ValueError(f"cannot linearise a norm of type {type(module).__name__}; supported: LN, LNPre, RMS, RMSPre")


def frozen_norm(module: torch.nn.Module | None, x: Float[Tensor, "*rows d_model"], scale: Tensor | None,
                bias: bool = True) -> Float[Tensor, "*rows d_model"]:  # fmt: skip
    """`module` (a TransformerLens norm, or a TransformerBridge's, `norm_kind`) applied to x with its scale held
    at `scale` (broadcast against x's leading dims, [..., 1]): centre (LN), divide, weigh (LN, RMS), add the
    bias (LN, unless bias=False). The one frozen-norm step every analysis uses; without a norm, x itself."""
    kind = norm_kind(module)
    if kind is None or module is None:
        return x
    if scale is None:
        raise ValueError(f"frozen_norm: a {kind} norm is held at a scale, and none was given (scale=None)")
    if kind in ("LN", "LNPre"):
        x = x - x.mean(-1, keepdim=True)
    x = x / scale.to(x.dtype)
    weight, b = norm_weights(module)
    if kind in ("LN", "RMS") and weight is not None:
        x = x * weight
    return x + b if bias and kind == "LN" and b is not None else x


def through_norm(
    parts: Float[Tensor, "batch component d_model"],
    module: torch.nn.Module | None,
    scale: Float[Tensor, "batch 1"] | None,
) -> tuple[Float[Tensor, "batch component d_model"], Float[Tensor, " d_model"] | None]:
    """Each component through `module` with the frozen `scale`, and the norm's bias (None if it has none):
    parts.sum(1) + bias equals the norm of the summed input."""
    kind = norm_kind(module)
    if kind is None or module is None:
        return parts, None
    if scale is None:
        raise ValueError(f"through_norm: a {kind} norm is held at a scale, and none was given (scale=None)")
    return frozen_norm(module, parts, scale[:, None], bias=False), (norm_weights(module)[1] if kind == "LN" else None)


def norm_weights(module: torch.nn.Module) -> tuple[Tensor | None, Tensor | None]:
    """(weight, bias) of a norm: TransformerLens's `w`/`b`, or the wrapped Hugging Face module's
    `weight`/`bias` on a TransformerBridge (None where it has none), with Gemma's offset (the norm scales by
    1 + weight) added in."""
    inner = getattr(module, "_original_component", None)
    if inner is None:  # a TransformerLens norm
        return getattr(module, "w", None), getattr(module, "b", None)
    weight, bias = getattr(inner, "weight", None), getattr(inner, "bias", None)
    if weight is not None and getattr(getattr(module, "config", None), "rmsnorm_uses_offset", False):
        weight = 1 + weight  # Gemma's RMSNorm scales by (1 + weight)
    return weight, bias


def describe(kind: NormKind | None, where: str) -> str | None:
    """The assumption a decomposition through this norm makes, in words (None without a norm)."""
    if kind is None:
        return None
    centred = "centred, " if kind in ("LN", "LNPre") else ""
    return f"{where} {kind} scale frozen at its value in this forward pass ({centred}divided by it)"
