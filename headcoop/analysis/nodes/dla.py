"""Direct logit attribution: the logits at one position split exactly into per-component parts.

The residual stream at the last layer is a sum of what every component wrote:

    resid = embed + pos_embed + sum_L (sum_H z[L,H] @ W_O[L,H] + b_O[L] + mlp_out[L])

and the logits are `ln_final(resid) @ W_U + b_U`. Without a final norm every term, pushed through W_U, is
that component's contribution. With a final LayerNorm / RMSNorm each term is centred (LN) and divided
by the norm's scale cached from the same forward pass (`headcoop.analysis.engine.norms`, as TransformerLens's
`apply_ln_to_stack`); the norm's bias is a component of its own. Either way the contributions sum to
the logits exactly (checked on every call); with a norm, the frozen scale is an assumption the result
states in its repr and plot title.

Components, in this order: "embed", "pos_embed" (standard positional embedding only), for each layer its
heads "L{l}H{h}", its output bias "L{l}.b_O" and, unless the model is attention-only, "L{l}.mlp"; then
"ln_final.b" (a final LayerNorm with a bias) and "b_U".

In a model with several layers a head's component is its DIRECT path (its output read straight by
W_U); what it contributes through later layers is counted in those layers' components.

`at=(layer, "q" | "k" | "v")` decomposes the input of that layer's attention instead (what writes into a
head's query, key or value input, through the layer's ln1 with its frozen scale; a shortformer's
positional embedding joins the query and key inputs after the norm): the components of the layers below.
"""

from __future__ import annotations

import dataclasses

import pandas as pd
import plotly.graph_objects as go
import torch
from einops import einsum
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens.utilities import get_act_name

from headcoop.analysis.engine.inputs import (
    as_tokens,
    check_choice,
    check_decomposable,
    check_layer,
    head_names,
    output_labels,
    read_positions,
    require_task,
)
from headcoop.analysis.engine.norms import describe, norm_kind, through_norm
from headcoop.analysis.vocabulary import layer_name
from headcoop.checks import check_finite
from headcoop.models.bridge import out_bias, user_hooks
from headcoop.models.tl import HookedTransformer
from headcoop.storage.results import Result
from headcoop.tasks.base import Batch


def component_names(model: HookedTransformer, upto: int | None = None) -> list[str]:
    """The residual-stream components of `model` written below layer `upto` (None: every layer), in the
    order of `DLAResult.values`' component axis (without the final norm's bias and b_U)."""
    names = ["embed"]
    if model.cfg.positional_embedding_type == "standard":
        names.append("pos_embed")
    heads = head_names(model)
    n = model.cfg.n_heads
    for layer in range(model.cfg.n_layers if upto is None else upto):
        names += heads[layer * n : (layer + 1) * n] + [f"{layer_name(layer)}.b_O"]
        if not model.cfg.attn_only:
            names.append(f"{layer_name(layer)}.mlp")
    return names


def token_ids(labels: list[str], value, n: int, what: str) -> Int[Tensor, " batch"]:
    """A [n] LongTensor of token ids from a token string, an id, or a per-example sequence / tensor of ids."""
    if isinstance(value, str):
        if value not in labels:
            raise ValueError(f"unknown {what} {value!r}; valid tokens are {labels}")
        value = labels.index(value)
    if isinstance(value, (list, tuple)):
        value = [token_ids(labels, v, 1, what)[0].item() if isinstance(v, str) else v for v in value]
    ids = torch.as_tensor(value)
    if ids.is_floating_point() or ids.dtype == torch.bool:
        raise ValueError(f"{what} must be token ids or token strings, got dtype {ids.dtype}")
    if ids.ndim == 0:
        ids = ids.expand(n)
    if ids.shape != (n,):
        raise ValueError(f"{what} must be one token or one per example ({n}), got shape {tuple(ids.shape)}")
    if ids.numel() and (ids.min() < 0 or ids.max() >= len(labels)):
        raise ValueError(f"{what} id {ids[(ids < 0) | (ids >= len(labels))][0].item()} is outside 0..{len(labels) - 1}")
    return ids.long().cpu()


@dataclasses.dataclass(frozen=True)
class DLAResult(Result):
    """Per-component contributions to the logits (or, with `at=`, to a layer's attention input) at one
    position per example.

    values:     [batch, component, vocab]  contribution of each component to each logit (or input dimension)
    components: [component]                names ("embed", "pos_embed", "L0H3", "L0.b_O", "L0.mlp", "b_U")
    vocab:      [vocab]                    labels of the logits (or "d0".."d{d_model-1}")
    tokens:     [batch, pos]               the inputs
    pos:        [batch]                    the position attributed in each example
    logits:     [batch, vocab]             what is decomposed, from the model's own forward pass (the logits,
                                           or the attention input): values.sum(1) reproduces it
    answer, wrong: [batch] or None         default tokens for `logit_diff` (from the Batch, if one was given)
    target:     "logits", or e.g. "L1 q input"
    assumptions: what the decomposition holds fixed (a norm's frozen scale), in words; empty when exact
    """

    values: Float[Tensor, "batch component vocab"]
    components: list[str]
    vocab: list[str]
    tokens: Int[Tensor, "batch pos"]
    pos: Int[Tensor, " batch"]
    logits: Float[Tensor, "batch vocab"]
    answer: Int[Tensor, " batch"] | None = None
    wrong: Int[Tensor, " batch"] | None = None
    target: str = "logits"
    assumptions: tuple[str, ...] = ()

    def __repr__(self) -> str:
        b, c, v = self.values.shape
        shown = self.components if c <= 12 else [*self.components[:6], "...", *self.components[-3:]]
        held = f"; assumes {'; '.join(self.assumptions)}" if self.assumptions else ""
        return f"DLAResult({self.target}: batch={b}, components={c}, vocab={v}: {shown}{held})"

    def _require_logits(self, what: str) -> None:
        if self.target != "logits":
            raise ValueError(f"{what} reads logits, but this DLAResult decomposes the {self.target}")

    def __getitem__(self, component: str) -> Float[Tensor, "batch vocab"]:
        """One component's contribution, [batch, vocab]; ValueError listing the names if unknown."""
        check_choice("component", component, self.components)
        return self.values[:, self.components.index(component)]

    def total(self) -> Float[Tensor, "batch vocab"]:
        """Sum over components: the logits, [batch, vocab]."""
        return self.values.sum(1)

    def mean(self) -> Float[Tensor, "component vocab"]:
        """Mean contribution over examples, [component, vocab]."""
        return self.values.mean(0)

    def heads(self) -> Float[Tensor, "batch layer head vocab"]:
        """Just the heads' direct contributions, [batch, layer, head, vocab]."""
        names = [n for n in self.components if n.startswith("L") and "." not in n]
        idx = [self.components.index(n) for n in names]
        n_layers = 1 + max(int(n[1:].split("H")[0]) for n in names)
        return self.values[:, idx].unflatten(1, (n_layers, len(idx) // n_layers))

    def logit(self, token) -> Float[Tensor, "batch component"]:
        """Each component's contribution to one token's logit (a token string or id, or one per example)."""
        self._require_logits("logit")
        ids = token_ids(self.vocab, token, self.values.shape[0], "token").to(self.values.device)
        return self.values.gather(2, ids[:, None, None].expand(-1, self.values.shape[1], 1)).squeeze(2)

    def logit_diff(self, answer=None, wrong=None) -> Float[Tensor, "batch component"]:
        """Per component and example: contribution to logit(answer) - logit(wrong), [batch, component].

        answer/wrong: token strings, ids, or per-example [batch] ids; default the Batch's answer/wrong.
        """
        self._require_logits("logit_diff")
        answer = self.answer if answer is None else answer
        wrong = self.wrong if wrong is None else wrong
        if answer is None or wrong is None:
            raise ValueError("logit_diff needs answer and wrong tokens: pass them, or compute dla on a Batch")
        return self.logit(answer) - self.logit(wrong)

    def to_dataframe(self) -> pd.DataFrame:
        """One row per component: the mean contribution to every logit (columns: vocab labels), plus
        'logit_diff' and 'logit_diff_std' (over examples) when answer/wrong are known."""
        index = pd.Index(self.components, name="component")
        df = pd.DataFrame(self.mean().cpu().numpy(), index=index, columns=self.vocab)
        if self.answer is not None and self.wrong is not None and self.target == "logits":
            diff = self.logit_diff()
            df["logit_diff"] = diff.mean(0).cpu().numpy()
            df["logit_diff_std"] = diff.std(0, unbiased=False).cpu().numpy()
        return df

    def plot(self, token=None, title: str | None = None) -> go.Figure:
        """Bar chart over components of the mean logit difference (answer - wrong); with `token` (string or
        id), of the mean contribution to that token's logit; without answer/wrong tokens, of the contribution
        to each example's predicted token; for an attention input (`at=`), of each component's mean norm.
        Error bars: std over examples."""
        from headcoop.display.plot import bar

        if self.target != "logits":
            y, what = self.values.norm(dim=-1), f"norm of the contribution to the {self.target}"
        elif token is not None:
            y = self.logit(token)
            what = f"logit of {self.vocab[int(token_ids(self.vocab, token, 1, 'token')[0])]!r}"
        elif self.answer is not None and self.wrong is not None:
            y, what = self.logit_diff(), "logit difference (answer - wrong)"
        else:
            y, what = self.logit(self.logits.argmax(-1)), "logit of each example's predicted token"
        if title is None:
            title = f"Direct attribution: {what}"
            if self.assumptions:
                title += "<br><sup>" + "; ".join(self.assumptions) + "</sup>"
        return bar(
            y.mean(0), self.components, title=title, ylabel=what, xlabel="component", error=y.std(0, unbiased=False)
        )


def _check_sums(model: HookedTransformer, values: Tensor, reference: Tensor, target: str) -> None:
    """ValueError when the components do not sum to what the forward pass computed (hooks that change the
    pass after the cached activations, or an architecture the decomposition misreads): never approximate."""
    gap = float((values.sum(1) - reference).abs().max())
    tol = (1e-4 if values.dtype != torch.float64 else 1e-9) * max(1.0, float(reference.abs().max()))
    if gap > tol:
        hooks = user_hooks(model)
        why = (f"hooks installed at {hooks[:4]} change the forward pass elsewhere (hooks on z, q, k, v or the "
               "pattern, as in hc.ablate and hc.set_attention, are fine)") if hooks else (
               "this model's forward pass is not the sum the decomposition assumes")  # fmt: skip
        raise ValueError(f"dla: the components miss the {target} by up to {gap:.3g}: {why}")


def _default_tokens(model: HookedTransformer) -> Batch:
    return require_task(model, "tokens").patching_inputs()[0]


@torch.no_grad()
def dla(model: HookedTransformer, tokens=None, pos=None, answer=None, wrong=None, at=None) -> DLAResult:
    """Direct logit attribution of every component at one position per example (module docstring).

    tokens: a Batch, text(s), or [batch, pos] / [pos] ids; default the task's clean patching batch
            (`task.patching_inputs()[0]`: task.sample(256, seed=0), signal-only for SkipPair).
    pos:    an int (negative counts from the end) or per-example [batch] positions; default the Batch's
            `answer_pos`, else the last position.
    answer, wrong: defaults for `.logit_diff()` (token strings, ids or [batch] ids); default the Batch's.
    at:     None (the logits), or (layer, "q" | "k" | "v"): decompose that layer's attention input instead.
    With a LayerNorm / RMSNorm the norm's scale is frozen at its value in this forward pass (the result's
    `assumptions` say so). Returns a DLAResult whose `values` [batch, component, vocab] sum over
    components to the logits (or the attention input) within 1e-4 (float32) or 1e-9 (float64), relative
    to their largest entry; ValueError otherwise.
    Long: the decomposition's components are collected in forward order in one pass over the cache.
    """
    check_decomposable(model, "dla")
    check_finite(model, "hc.dla")
    cfg = model.cfg
    layer, site = _check_at(model, at)
    if tokens is None:
        tokens = _default_tokens(model)
    batch = tokens if isinstance(tokens, Batch) else None
    ids = as_tokens(model, tokens)
    n, width = ids.shape
    pos = read_positions(tokens, ids, pos).cpu()
    labels = output_labels(model) if layer is None else [f"d{i}" for i in range(cfg.d_model)]
    if layer is None:
        if answer is None and batch is not None:
            answer = batch.answer
        if wrong is None and batch is not None:
            wrong = batch.wrong
        answer = None if answer is None else token_ids(labels, answer, n, "answer")
        wrong = None if wrong is None else token_ids(labels, wrong, n, "wrong")
    elif answer is not None or wrong is not None:
        raise ValueError(
            f"dla: answer= and wrong= choose logits, but at={at!r} decomposes layer {layer}'s {site} input, which has "
            "no tokens to compare; leave them out (or drop at= to decompose the logits)"
        )
    else:
        answer = wrong = None

    upto = cfg.n_layers if layer is None else layer
    norm = getattr(model, "ln_final", None) if layer is None else getattr(model.blocks[layer], "ln1", None)
    norm_name = "ln_final" if layer is None else f"blocks.{layer}.ln1"
    wanted = {"hook_embed", "hook_pos_embed", f"{norm_name}.hook_scale", get_act_name("resid_pre", upto)
              if upto < cfg.n_layers else get_act_name("resid_post", cfg.n_layers - 1)}  # fmt: skip
    wanted |= {get_act_name("z", lay) for lay in range(upto)}
    wanted |= {get_act_name("mlp_out", lay) for lay in range(upto) if not cfg.attn_only}
    logits, cache = model.run_with_cache(ids, names_filter=lambda name: name in wanted)
    device = logits.device
    rows, at_pos = torch.arange(n, device=device), pos.to(device)

    parts = [cache["hook_embed"][rows, at_pos][:, None]]  # each [batch, k, d_model]
    if cfg.positional_embedding_type == "standard":
        parts.append(cache["hook_pos_embed"][rows, at_pos][:, None])
    for lay in range(upto):
        attn = model.blocks[lay].attn
        z = cache[get_act_name("z", lay)][rows, at_pos]  # [batch, head, d_head]
        parts.append(einsum(z, attn.W_O, "batch head d_head, head d_head d_model -> batch head d_model"))
        parts.append(out_bias(attn, cfg.d_model, z).expand(n, 1, -1))
        if not cfg.attn_only:
            parts.append(cache[get_act_name("mlp_out", lay)][rows, at_pos][:, None])
    resid = torch.cat(parts, 1)  # [batch, component, d_model]
    names = component_names(model, upto)
    scale = cache[f"{norm_name}.hook_scale"][rows, at_pos] if norm_kind(norm) is not None else None
    normed, bias = through_norm(resid, norm, scale)
    extra_names, extra = [], []
    if bias is not None:
        extra_names.append(f"{norm_name.removeprefix('blocks.')}.b")
        extra.append(bias.expand(n, 1, -1))
    where = "the final norm's" if layer is None else f"layer {layer}'s ln1"
    assumptions = tuple(a for a in [describe(norm_kind(norm), where)] if a)

    if layer is None:
        values = torch.cat([torch.cat([normed, *extra], 1) @ model.W_U, model.b_U.expand(n, 1, -1)], 1)
        names = names + extra_names + ["b_U"]
        reference, target = logits[rows, at_pos], "logits"
    else:
        if site in ("q", "k") and cfg.positional_embedding_type == "shortformer":
            extra_names.append("pos_embed")
            extra.append(cache["hook_pos_embed"][rows, at_pos][:, None])
        values = torch.cat([normed, *extra], 1)
        names = names + extra_names
        resid_pre = cache[get_act_name("resid_pre", layer)][rows, at_pos]
        reference = resid_pre if norm is None or norm_kind(norm) is None else norm(resid_pre[:, None])[:, 0]
        if "pos_embed" in extra_names:
            reference = reference + cache["hook_pos_embed"][rows, at_pos]
        target = f"L{layer} {site} input"
    _check_sums(model, values, reference, target)
    return DLAResult(
        values=values, components=names, vocab=labels, tokens=ids, pos=pos, logits=reference,
        answer=answer, wrong=wrong, target=target, assumptions=assumptions,
    )  # fmt: skip


def _check_at(model: HookedTransformer, at) -> tuple[int | None, str | None]:
    """(layer, "q" | "k" | "v") from `at`, or (None, None) for the logits."""
    if at is None:
        return None, None
    if not (isinstance(at, tuple) and len(at) == 2 and isinstance(at[1], str)):
        raise TypeError(f'at must be None or (layer, "q" | "k" | "v"), got {at!r}')
    check_choice("at site", at[1], ("q", "k", "v"))
    return check_layer(model, at[0]), at[1]
