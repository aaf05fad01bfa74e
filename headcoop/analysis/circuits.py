"""QK and OV circuits of one attention head, as tables over input tokens (and positions).

`qk(model, head)`: the pre-softmax attention score of a query input on a key input, exactly as the model
computes it (`hook_attn_scores`: biases b_Q, b_K included, divided by attn_scale).
`ov(model, head)`: the change in the logits when the head attends fully to one source input,
(x W_V + b_V) W_O W_U; b_O is left out (it belongs to the layer, not the head: see `dla`'s "L{l}.b_O").

Inputs are token embeddings, or token + position embeddings when the model's positional embedding
reaches that circuit and is not all zero; then the tables gain position axes.

Layer > 0: a head there reads the residual stream, which also holds earlier layers' outputs. These tables
are the DIRECT PATH only (the head reading the embeddings themselves), marked `direct_path=True` in the
result. They equal the model's scores / effects exactly when earlier attention outputs are zero.
"""

from __future__ import annotations

import dataclasses

import pandas as pd
import plotly.graph_objects as go
import torch
from jaxtyping import Float
from torch import Tensor
from transformer_lens import FactoredMatrix, HookedTransformer
from transformer_lens.utilities.activation_functions import apply_softcap

from headcoop.plot import Displayed
from headcoop.analysis.common import one_head, vocab_labels
from headcoop.analysis.dla import check_decomposable, output_labels
from headcoop.tasks.base import check_ids

SUPPORTED_POSITIONAL = ("standard", "shortformer")


def _check_model(model: HookedTransformer, what: str) -> None:
    check_decomposable(model, what)
    kind = model.cfg.positional_embedding_type
    if kind not in SUPPORTED_POSITIONAL:
        raise ValueError(
            f"{what} supports positional_embedding_type in {list(SUPPORTED_POSITIONAL)}, got {kind!r}: "
            "the scores would depend on relative positions that a (token, position) table does not hold"
        )


def _inputs(model: HookedTransformer, with_pos: bool) -> Float[Tensor, "n_inputs d_model"]:
    """Residual inputs, one row per token (or per (token, position), token-major, if with_pos)."""
    W_E = model.W_E
    if not with_pos:
        return W_E
    return (W_E[:, None, :] + model.W_pos[None, :, :]).flatten(0, 1)


def _use_pos(model: HookedTransformer, reaches: bool, positional: bool | None) -> bool:
    """Whether the table needs position axes: the embedding reaches the circuit and is not all zero."""
    if positional is None:
        return reaches and bool(model.W_pos.abs().max() > 0)
    if positional and not reaches:
        raise ValueError("positional=True, but this model's positional embedding does not reach this circuit")
    return bool(positional)


def _name(layer: int, head: int) -> str:
    return f"L{layer}H{head}"


def _table_ids(tokens, d_vocab: int) -> Tensor:
    """[batch, pos] ids from [pos] or [batch, pos] integer ids; errors name a bad id or shape."""
    ids = check_ids(tokens, d_vocab, "tokens")
    ids = ids[None] if ids.ndim == 1 else ids
    if ids.ndim != 2 or ids.shape[1] == 0:
        raise ValueError(f"tokens must be [pos] or [batch, pos] ids, got shape {tuple(ids.shape)}")
    return ids


@dataclasses.dataclass(frozen=True)
class QKTable(Displayed):
    """Pre-softmax attention scores of one head over query and key inputs.

    scores: [q_tok, k_tok], or [q_tok, q_pos, k_tok, k_pos] when positional. Entries with k_pos > q_pos
            are kept (unmasked) although a causal model never uses them.
    matrix: FactoredMatrix [n_q, n_k] of the bilinear part (x_q W_Q W_K^T x_k^T / attn_scale) over the
            same inputs flattened token-major; scores = matrix.AB + the b_Q / b_K terms (then soft-capping
            if the model uses it).
    vocab:  labels of the token axes; direct_path: True for layer > 0 (embeddings-only inputs).
    """

    scores: Tensor
    matrix: FactoredMatrix
    layer: int
    head: int
    vocab: list[str]
    positional: bool
    direct_path: bool
    causal: bool

    @property
    def name(self) -> str:
        return _name(self.layer, self.head)

    def __repr__(self) -> str:
        path = ", direct path (embeddings only)" if self.direct_path else ""
        return f"QKTable({self.name}, scores {tuple(self.scores.shape)}{path})"

    def scores_for(self, tokens) -> Float[Tensor, "batch q_pos k_pos"]:
        """The table looked up for [batch, pos] token ids: the scores this head assigns in that sequence
        (causally masked with -inf, like hook_attn_scores). Direct path only when `direct_path`."""
        ids = _table_ids(tokens, self.scores.shape[0]).to(self.scores.device)
        width = ids.shape[1]
        q, k = ids[:, :, None], ids[:, None, :]
        if self.positional:
            if width > self.scores.shape[1]:
                raise ValueError(f"sequence length {width} exceeds the table's {self.scores.shape[1]} positions")
            p = torch.arange(width, device=ids.device)
            out = self.scores[q, p[:, None], k, p[None, :]]
        else:
            out = self.scores[q, k]
        if self.causal:
            mask = torch.ones(width, width, dtype=torch.bool, device=ids.device).triu(1)
            out = out.masked_fill(mask, float("-inf"))
        return out

    def to_dataframe(self) -> pd.DataFrame:
        """Token-only: a query-token x key-token table. Positional: long format, one row per
        (q_tok, q_pos, k_tok, k_pos) with k_pos <= q_pos when causal, column 'score'."""
        s = self.scores.detach().cpu()
        if not self.positional:
            return pd.DataFrame(
                s.numpy(), index=pd.Index(self.vocab, name="query"), columns=pd.Index(self.vocab, name="key")
            )
        n_tok, n_pos = s.shape[:2]
        qt, qp, kt, kp = torch.meshgrid(*(torch.arange(d) for d in s.shape), indexing="ij")
        df = pd.DataFrame({
            "q_tok": [self.vocab[i] for i in qt.flatten()], "q_pos": qp.flatten().numpy(),
            "k_tok": [self.vocab[i] for i in kt.flatten()], "k_pos": kp.flatten().numpy(),
            "score": s.flatten().numpy(),
        })  # fmt: skip
        return df[df.k_pos <= df.q_pos].reset_index(drop=True) if self.causal else df

    def plot(self, q_pos: int | None = None, k_pos: int | None = None, title: str | None = None) -> go.Figure:
        """Heatmap of query (rows) x key (columns) scores. Positional tables: the token x token slice at
        (q_pos, k_pos) when both are given, else every 'tok@pos' pair (non-causal entries blank)."""
        from headcoop.plot import heatmap

        path = " (direct path)" if self.direct_path else ""
        title = title or f"QK scores of {self.name}{path}"
        s = self.scores.detach().cpu()
        if not self.positional:
            return heatmap(s, self.vocab, self.vocab, title, xlabel="key token", ylabel="query token")
        if (q_pos is None) != (k_pos is None):
            raise ValueError("give both q_pos and k_pos (or neither)")
        if q_pos is not None:
            n_pos = s.shape[1]
            for what, p in (("q_pos", q_pos), ("k_pos", k_pos)):
                if not -n_pos <= p < n_pos:
                    raise IndexError(f"{what} {p} is out of range 0..{n_pos - 1}")
            return heatmap(
                s[:, q_pos, :, k_pos], self.vocab, self.vocab, f"{title}, query at {q_pos}, key at {k_pos}",
                xlabel="key token", ylabel="query token",
            )  # fmt: skip
        n_tok, n_pos = s.shape[:2]
        flat = s.flatten(0, 1).flatten(1, 2).clone()
        if self.causal:
            pos = torch.arange(n_pos).repeat(n_tok)
            flat[pos[None, :] > pos[:, None]] = float("nan")
        labels = [f"{t}@{p}" for t in self.vocab for p in range(n_pos)]
        return heatmap(flat, labels, labels, title, xlabel="key token@position", ylabel="query token@position")


@dataclasses.dataclass(frozen=True)
class OVTable(Displayed):
    """Effect on the logits of one head attending fully to one source input (b_O excluded).

    effects: [src_tok, vocab], or [src_tok, src_pos, vocab] when positional.
    matrix:  FactoredMatrix [n_src, vocab] of x W_V W_O W_U over the same inputs flattened token-major;
             effects = matrix.AB + b_V W_O W_U.
    vocab:   labels of the source tokens; out_vocab: labels of the logits; direct_path as in QKTable.
    """

    effects: Tensor
    matrix: FactoredMatrix
    layer: int
    head: int
    vocab: list[str]
    out_vocab: list[str]
    positional: bool
    direct_path: bool

    @property
    def name(self) -> str:
        return _name(self.layer, self.head)

    def __repr__(self) -> str:
        path = ", direct path (embeddings only)" if self.direct_path else ""
        return f"OVTable({self.name}, effects {tuple(self.effects.shape)}{path})"

    def effects_for(self, tokens) -> Float[Tensor, "batch pos vocab"]:
        """The effect of each source position of [batch, pos] token ids on the logits, [batch, pos, vocab]."""
        ids = _table_ids(tokens, self.effects.shape[0]).to(self.effects.device)
        if not self.positional:
            return self.effects[ids]
        width = ids.shape[1]
        if width > self.effects.shape[1]:
            raise ValueError(f"sequence length {width} exceeds the table's {self.effects.shape[1]} positions")
        return self.effects[ids, torch.arange(width, device=ids.device)]

    def to_dataframe(self) -> pd.DataFrame:
        """Source (rows; 'tok@pos' when positional) x output logit (columns)."""
        e = self.effects.detach().cpu()
        rows = self.vocab if not self.positional else [f"{t}@{p}" for t in self.vocab for p in range(e.shape[1])]
        return pd.DataFrame(
            e.reshape(len(rows), -1).numpy(), index=pd.Index(rows, name="source"), columns=self.out_vocab
        )

    def plot(self, title: str | None = None) -> go.Figure:
        """Heatmap of source input (rows) x output logit (columns)."""
        from headcoop.plot import heatmap

        df = self.to_dataframe()
        path = " (direct path)" if self.direct_path else ""
        return heatmap(
            df.values, self.out_vocab, list(df.index), title or f"OV effects of {self.name}{path}",
            xlabel="output logit", ylabel="attended source",
        )  # fmt: skip


@torch.no_grad()
def qk(model: HookedTransformer, head: int | str | tuple[int, int], layer: int | None = None, positional: bool | None = None) -> QKTable:
    """Pre-softmax attention scores of one head for every query input x key input.

    head, layer: an int head in `layer` (layer None: the model's only layer; in a deeper model pass layer=),
    (layer, head) or "L1H3". ValueError when they name several heads.

    Token-only table [q_tok, k_tok] when the positional embedding does not reach Q/K or is all zero
    (e.g. Count01 default, SkipPair); else [q_tok, q_pos, k_tok, k_pos]. `positional` forces the choice.
    Reproduces hook_attn_scores exactly at causal positions for layer 0; for layer > 0 it is the direct
    path (embeddings only). IndexError for a head/layer out of range.
    """
    _check_model(model, "qk")
    layer, head = one_head(model, head, layer)
    use_pos = _use_pos(model, True, positional)  # standard and shortformer both feed positions to Q/K
    attn = model.blocks[layer].attn
    x = _inputs(model, use_pos)
    q = x @ attn.W_Q[head]  # [n, d_head]
    k = x @ attn.W_K[head]
    scale = attn.attn_scale
    matrix = FactoredMatrix(q / scale, k.T)
    scores = apply_softcap((q + attn.b_Q[head]) @ (k + attn.b_K[head]).T / scale, model.cfg.attn_scores_soft_cap)
    if use_pos:
        n_pos = model.cfg.n_ctx
        scores = scores.unflatten(0, (-1, n_pos)).unflatten(2, (-1, n_pos))
    return QKTable(
        scores=scores,
        matrix=matrix,
        layer=layer,
        head=head,
        vocab=vocab_labels(model),
        positional=use_pos,
        direct_path=layer > 0,
        causal=model.cfg.attention_dir == "causal",
    )


@torch.no_grad()
def ov(model: HookedTransformer, head: int | str | tuple[int, int], layer: int | None = None, positional: bool | None = None) -> OVTable:
    """Logit effect of `head` in `layer` attending fully to each source input: (x W_V + b_V) W_O W_U.

    [src_tok, vocab], or [src_tok, src_pos, vocab] when a non-zero standard positional embedding reaches
    V (a shortformer's does not). b_O (per layer) and b_U are excluded. Layer > 0: direct path only.
    Combined with the head's pattern, sum_k pattern[q, k] * effects[x_k] is the head's DLA component.
    """
    _check_model(model, "ov")
    layer, head = one_head(model, head, layer)
    use_pos = _use_pos(model, model.cfg.positional_embedding_type == "standard", positional)
    attn = model.blocks[layer].attn
    x = _inputs(model, use_pos)
    out = attn.W_O[head] @ model.W_U  # [d_head, vocab]
    matrix = FactoredMatrix(x @ attn.W_V[head], out)
    effects = (x @ attn.W_V[head] + attn.b_V[head]) @ out
    if use_pos:
        effects = effects.unflatten(0, (-1, model.cfg.n_ctx))
    return OVTable(
        effects=effects,
        matrix=matrix,
        layer=layer,
        head=head,
        vocab=vocab_labels(model),
        out_vocab=output_labels(model),
        positional=use_pos,
        direct_path=layer > 0,
    )
