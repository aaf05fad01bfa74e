"""Direct logit attribution: the logits at one position split exactly into per-component parts.

In an attention-only transformer without LayerNorm the logits are linear in the residual stream:

    logits = (embed + pos_embed + sum_L (sum_H z[L,H] @ W_O[L,H] + b_O[L])) @ W_U + b_U

so every term, pushed through W_U, is that component's contribution, and the contributions sum to the
logits exactly. Components, in this order: "embed", "pos_embed" (standard positional embedding only),
for each layer its heads "L{l}H{h}" then its output bias "L{l}.b_O", and finally "b_U".

In a model with several layers a head's component is its DIRECT path (its output read straight by
W_U); what it contributes through later heads is counted in those heads' components.
"""

from __future__ import annotations

import dataclasses

import pandas as pd
import plotly.graph_objects as go
import torch
from einops import einsum
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer
from transformer_lens.utilities import get_act_name

from headcoop.plot import Displayed
from headcoop.analysis.common import (
    as_tokens, check_choice, check_positions, head_names, require_model, require_task, vocab_labels,
)
from headcoop.checks import check_finite, installed_hooks
from headcoop.tasks.base import Batch


def check_decomposable(model: HookedTransformer, what: str) -> None:
    """ValueError unless `model` is attention-only, without LayerNorm and without output soft-capping,
    the conditions under which the residual stream (and so the logits) splits exactly into components."""
    cfg = require_model(model, what).cfg
    if cfg.normalization_type is not None:
        raise ValueError(
            f"{what} needs a model without LayerNorm (normalization_type=None), got normalization_type="
            f"{cfg.normalization_type!r}: the decomposition would not be exact"
        )
    if not cfg.attn_only:
        raise ValueError(f"{what} needs an attention-only model (cfg.attn_only=True): MLP outputs are not attributed")
    if cfg.output_logits_soft_cap is not None and cfg.output_logits_soft_cap > 0:
        raise ValueError(f"{what} needs linear logits, but this model soft-caps them (output_logits_soft_cap)")


def output_labels(model: HookedTransformer) -> list[str]:
    """One label per output logit: the task's token strings when the vocabularies match, else the ids."""
    if model.cfg.d_vocab_out == model.cfg.d_vocab:
        return vocab_labels(model)
    return [str(i) for i in range(model.cfg.d_vocab_out)]


def component_names(model: HookedTransformer) -> list[str]:
    """The DLA components of `model`, in the order of `DLAResult.values`' component axis."""
    names = ["embed"]
    if model.cfg.positional_embedding_type == "standard":
        names.append("pos_embed")
    heads = head_names(model)
    n = model.cfg.n_heads
    for layer in range(model.cfg.n_layers):
        names += heads[layer * n : (layer + 1) * n] + [f"L{layer}.b_O"]
    return names + ["b_U"]


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


def positions(pos, n: int, width: int) -> Int[Tensor, " batch"]:
    """A [n] LongTensor of positions (on the CPU) from an int or a per-example [n] tensor; see `check_positions`."""
    return check_positions(pos, n, width).cpu()


@dataclasses.dataclass(frozen=True)
class DLAResult(Displayed):
    """Per-component contributions to the logits at one position per example.

    values:     [batch, component, vocab]  contribution of each component to each logit
    components: [component]                names ("embed", "pos_embed", "L0H3", "L0.b_O", "b_U")
    vocab:      [vocab]                    labels of the logits
    tokens:     [batch, pos]               the inputs
    pos:        [batch]                    the position attributed in each example
    logits:     [batch, vocab]             the model's own logits there (values.sum(1) reproduces them)
    answer, wrong: [batch] or None         default tokens for `logit_diff` (from the Batch, if one was given)
    """

    values: Float[Tensor, "batch component vocab"]
    components: list[str]
    vocab: list[str]
    tokens: Int[Tensor, "batch pos"]
    pos: Int[Tensor, " batch"]
    logits: Float[Tensor, "batch vocab"]
    answer: Int[Tensor, " batch"] | None = None
    wrong: Int[Tensor, " batch"] | None = None

    def __repr__(self) -> str:
        b, c, v = self.values.shape
        return f"DLAResult(batch={b}, components={c}, vocab={v}: {self.components})"

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
        ids = token_ids(self.vocab, token, self.values.shape[0], "token").to(self.values.device)
        return self.values.gather(2, ids[:, None, None].expand(-1, self.values.shape[1], 1)).squeeze(2)

    def logit_diff(self, answer=None, wrong=None) -> Float[Tensor, "batch component"]:
        """Per component and example: contribution to logit(answer) - logit(wrong), [batch, component].

        answer/wrong: token strings, ids, or per-example [batch] ids; default the Batch's answer/wrong.
        """
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
        if self.answer is not None and self.wrong is not None:
            diff = self.logit_diff()
            df["logit_diff"] = diff.mean(0).cpu().numpy()
            df["logit_diff_std"] = diff.std(0, unbiased=False).cpu().numpy()
        return df

    def plot(self, token=None, title: str | None = None) -> go.Figure:
        """Bar chart over components of the mean logit difference (answer - wrong), or, with `token`
        (string or id), of the mean contribution to that token's logit; error bars: std over examples."""
        from headcoop.plot import bar

        if token is None:
            y, what = self.logit_diff(), "logit difference (answer - wrong)"
        else:
            y = self.logit(token)
            what = f"logit of {self.vocab[int(token_ids(self.vocab, token, 1, 'token')[0])]!r}"
        return bar(
            y.mean(0), self.components, title=title or f"Direct logit attribution: {what}",
            ylabel=what, xlabel="component", error=y.std(0, unbiased=False),
        )  # fmt: skip


def _check_sums_to_logits(model: HookedTransformer, values: Tensor, logits: Tensor) -> None:
    """ValueError when hooks on the model change the forward pass after the heads' z (resid, attn_out,
    logits...): the decomposition from the cached z would then not sum to the logits it claims to explain."""
    hooks = installed_hooks(model)
    if not hooks:
        return
    gap = float((values.sum(1) - logits).abs().max())
    scale = max(1.0, float(logits.abs().max()))
    if gap > 1e-4 * scale:
        raise ValueError(
            f"dla decomposes the cached z of every head, but hooks installed at {hooks[:4]} change the forward "
            f"pass elsewhere: the components miss the logits by up to {gap:.3g}. Remove those hooks (hooks "
            "on z, q, k, v or the pattern, as in hc.ablate and hc.set_attention, are fine)."
        )


def _default_tokens(model: HookedTransformer) -> Batch:
    return require_task(model, "tokens").patching_inputs()[0]


@torch.no_grad()
def dla(model: HookedTransformer, tokens=None, pos=None, answer=None, wrong=None) -> DLAResult:
    """Direct logit attribution of every component at one position per example.

    tokens: a Batch, text(s), or [batch, pos] / [pos] ids; default the task's clean patching batch
            (`task.patching_inputs()[0]`: task.sample(256, seed=0), signal-only for SkipPair).
    pos:    an int (negative counts from the end) or per-example [batch] positions; default the Batch's
            `answer_pos`, else the last position.
    answer, wrong: defaults for `.logit_diff()` (token strings, ids or [batch] ids); default the Batch's.
    Returns a DLAResult whose `values` [batch, component, vocab] sum over components to the logits.
    """
    check_decomposable(model, "dla")
    check_finite(model, "hc.dla")
    if tokens is None:
        tokens = _default_tokens(model)
    batch = tokens if isinstance(tokens, Batch) else None
    ids = as_tokens(model, tokens)
    n, width = ids.shape
    if pos is None:
        pos = batch.answer_pos if batch is not None else -1
    pos = positions(pos, n, width)
    labels = output_labels(model)
    if answer is None and batch is not None:
        answer = batch.answer
    if wrong is None and batch is not None:
        wrong = batch.wrong
    answer = None if answer is None else token_ids(labels, answer, n, "answer")
    wrong = None if wrong is None else token_ids(labels, wrong, n, "wrong")

    cfg = model.cfg
    standard_pos = cfg.positional_embedding_type == "standard"
    wanted = {"hook_embed", "hook_pos_embed"} | {get_act_name("z", layer) for layer in range(cfg.n_layers)}
    logits, cache = model.run_with_cache(ids, names_filter=lambda name: name in wanted)
    device = logits.device
    rows, at = torch.arange(n, device=device), pos.to(device)

    parts = [cache["hook_embed"][rows, at][:, None]]  # each [batch, k, d_model]
    if standard_pos:
        parts.append(cache["hook_pos_embed"][rows, at][:, None])
    for layer in range(cfg.n_layers):
        attn = model.blocks[layer].attn
        z = cache[get_act_name("z", layer)][rows, at]  # [batch, head, d_head]
        parts.append(einsum(z, attn.W_O, "batch head d_head, head d_head d_model -> batch head d_model"))
        parts.append(attn.b_O.expand(n, 1, -1))
    resid = torch.cat(parts, 1)  # [batch, component - 1, d_model]
    values = torch.cat([resid @ model.W_U, model.b_U.expand(n, 1, -1)], 1)
    _check_sums_to_logits(model, values, logits[rows, at])
    return DLAResult(
        values=values,
        components=component_names(model),
        vocab=labels,
        tokens=ids,
        pos=pos,
        logits=logits[rows, at],
        answer=answer,
        wrong=wrong,
    )
