"""QK and OV circuits of one attention head, as tables over input tokens (and positions).

`qk(model, head)`: the pre-softmax attention score of a query input on a key input, exactly as the model
computes it (`hook_attn_scores`: the layer's ln1 on the residual input, biases b_Q, b_K, rotary rotation
of q and k at their positions, division by attn_scale, soft-capping).
`ov(model, head)`: the change in the logits when the head attends fully to one source input,
(ln1(x) W_V + b_V) W_O, through the final norm, then W_U; b_O is left out (it belongs to the layer, not
the head: see `dla`'s "L{l}.b_O").

Inputs are token embeddings, or (token, position) pairs when positions reach the circuit: a standard
positional embedding that is not all zero (QK and OV), a shortformer's (QK only: it joins q and k after
ln1) or rotary embeddings (QK only: rotary never touches V). Then the tables gain position axes.

Layer 0 tables are exact: a layer-0 head reads the embeddings themselves (checked against the cached
scores on every call). Layer > 0: a head there reads the residual stream, which also holds earlier layers'
outputs. These tables are the DIRECT PATH only (the head reading the embeddings, normalised by its ln1 as if
they were the whole residual stream), marked `direct_path=True` and stated in `assumptions`.
OV through a final LayerNorm / RMSNorm: centred (LN) and multiplied by its weight, the scale taken as 1
(every logit of one input is divided by the same scale, so the effects keep their order and ratios);
the final norm's bias is left out like b_U. Effects reach the logits directly: later layers (MLPs
included) that read the head's output are not counted, as in `dla`.
"""

from __future__ import annotations

import dataclasses
from typing import cast

import pandas as pd
import plotly.graph_objects as go
import torch
from jaxtyping import Float
from torch import Tensor
from transformer_lens import FactoredMatrix
from transformer_lens.utilities.activation_functions import apply_softcap

from headcoop.analysis.engine.inputs import check_decomposable, one_head, output_labels, vocab_labels
from headcoop.analysis.engine.norms import norm_kind
from headcoop.analysis.vocabulary import head_name
from headcoop.models.bridge import apply_rotary, attn_scale, head_weight, is_bridge, user_hooks, w_e, w_pos
from headcoop.models.tl import HookedTransformer
from headcoop.storage.results import Result
from headcoop.tasks.base import check_ids

MAX_TABLE_ENTRIES = 2**27  # a dense table beyond this (0.5 GB of float32) is refused


def _check_model(model: HookedTransformer, what: str) -> None:
    check_decomposable(model, what)
    cfg = model.cfg
    for flag, words in (("use_qk_norm", "normalises q and k per head"), ("clip_qkv", "clips q, k and v")):
        if getattr(cfg, flag, None):
            raise ValueError(f"{what}: this model {words} ({flag}), which the tables do not model")


def _use_pos(model: HookedTransformer, reaches: bool, positional: bool | None) -> bool:
    """Whether the table needs position axes: positions reach the circuit (rotary: always, for QK)."""
    kind = model.cfg.positional_embedding_type
    nonzero = kind == "rotary" or (kind in ("standard", "shortformer") and bool(w_pos(model).abs().max() > 0))
    if positional is None:
        return reaches and nonzero
    if positional and not reaches:
        raise ValueError("positional=True, but this model's positional embedding does not reach this circuit")
    if not positional and reaches and kind == "rotary":
        raise ValueError(
            "positional=False: a rotary model's scores depend on positions; a token table cannot hold them"
        )
    return bool(positional)


def _normed(model: HookedTransformer, layer: int, x: Float[Tensor, "n d_model"]) -> Float[Tensor, "n d_model"]:
    """`x` through the layer's ln1 (as the block applies it to its residual input), if it has one."""
    ln1 = getattr(model.blocks[layer], "ln1", None)
    if ln1 is None or isinstance(ln1, torch.nn.Identity):
        return x
    return ln1(x[None])[0]


def _attn_inputs(
    model: HookedTransformer, layer: int, with_pos: bool, circuit: str, ids: tuple[int, ...] | None = None
) -> Float[Tensor, "n d_model"]:
    """What a head of `layer` reads as query/key ("qk") or value ("v") input, one row per token, or per
    (token, position) token-major when with_pos: ln1 of the embedding (+ standard positional embedding),
    plus a shortformer's positional embedding after ln1 for q and k. `ids`: only these tokens' rows (the norm
    acts on each row alone, so they are those rows of the whole table)."""
    W_E, n_ctx = w_e(model), model.cfg.n_ctx
    if ids is not None:
        W_E = W_E[torch.tensor(ids, device=W_E.device)]
    kind = model.cfg.positional_embedding_type
    if with_pos and kind == "standard":
        return _normed(model, layer, (W_E[:, None, :] + w_pos(model)[None, :, :]).flatten(0, 1))
    x = _normed(model, layer, W_E)
    if not with_pos:
        return x
    x = x[:, None, :].expand(-1, n_ctx, -1)
    if kind == "shortformer" and circuit == "qk":
        x = x + w_pos(model)[None, :, :]
    return x.flatten(0, 1)


def _check_size(what: str, *sizes: int) -> None:
    entries = 1
    for size in sizes:
        entries *= size
    if entries > MAX_TABLE_ENTRIES:
        raise ValueError(
            f"{what}: the dense table would hold {entries:,} entries ({' x '.join(map(str, sizes))}), more than "
            f"{MAX_TABLE_ENTRIES:,}; for a model of this size use hc.dla or hc.patch on your inputs instead"
        )


def _name(layer: int, head: int) -> str:
    return head_name(layer, head)


def _table_ids(tokens, d_vocab: int) -> Tensor:
    """[batch, pos] ids from [pos] or [batch, pos] integer ids; errors name a bad id or shape."""
    ids = check_ids(tokens, d_vocab, "tokens")
    ids = ids[None] if ids.ndim == 1 else ids
    if ids.ndim != 2 or ids.shape[1] == 0:
        raise ValueError(f"tokens must be [pos] or [batch, pos] ids, got shape {tuple(ids.shape)}")
    return ids


def _id_range(token_ids: tuple[int, ...] | None, n_rows: int) -> int:
    return n_rows if token_ids is None else max(token_ids) + 1


def _rows(ids: Tensor, token_ids: tuple[int, ...] | None) -> Tensor:
    """Vocabulary ids as rows of a table built with tokens= (ValueError naming an id it does not hold)."""
    if token_ids is None:
        return ids
    where = torch.full((max(token_ids) + 1,), -1, dtype=torch.long)
    where[torch.tensor(token_ids)] = torch.arange(len(token_ids))
    rows = where[ids]
    if (rows < 0).any():
        missing = sorted(set(ids[rows < 0].tolist()))
        raise ValueError(f"token ids {missing[:8]} are not in this table (built with tokens= of {len(token_ids)} ids)")
    return rows


def _subset(model: HookedTransformer, tokens, what: str) -> tuple[int, ...] | None:
    """The distinct ids of `tokens` (any int sequence or tensor), in order, or None for the whole vocabulary."""
    if isinstance(tokens, (str, bytes, bool)) or isinstance(tokens, (int, float)):
        raise TypeError(f"{what}: tokens must be a list or tensor of token ids, got {tokens!r}")
    if isinstance(tokens, (list, tuple)) and any(isinstance(t, (list, tuple)) for t in tokens):
        if len({len(t) if isinstance(t, (list, tuple)) else -1 for t in tokens}) != 1:
            raise ValueError(f"{what}: tokens is ragged (rows of different lengths); give one flat list of token ids")
    if tokens is None:
        return None
    if not isinstance(tokens, Tensor) and len(tokens) == 0 or isinstance(tokens, Tensor) and tokens.numel() == 0:
        raise ValueError(f"{what}: tokens is empty; give the token ids whose rows the table should hold")
    ids = check_ids(torch.as_tensor(tokens).flatten() if not isinstance(tokens, Tensor) else tokens.flatten(),
                    model.cfg.d_vocab, f"{what}: tokens")  # fmt: skip
    return tuple(dict.fromkeys(ids.tolist()))


@dataclasses.dataclass(frozen=True)
class QKTable(Result):
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
    assumptions: tuple[str, ...] = ()
    token_ids: tuple[int, ...] | None = None  # the vocabulary ids of the token axes when built with tokens=

    @property
    def name(self) -> str:
        return _name(self.layer, self.head)

    def __repr__(self) -> str:
        held = f"; {'; '.join(self.assumptions)}" if self.assumptions else ""
        return f"QKTable({self.name}, scores {tuple(self.scores.shape)}{held})"

    def scores_for(self, tokens) -> Float[Tensor, "batch q_pos k_pos"]:
        """The table looked up for [batch, pos] token ids: the scores this head assigns in that sequence
        (causally masked with -inf, like hook_attn_scores). Direct path only when `direct_path`."""
        ids = _rows(_table_ids(tokens, _id_range(self.token_ids, self.scores.shape[0])), self.token_ids)
        ids = ids.to(self.scores.device)
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
        from headcoop.display.plot import heatmap

        held = "<br><sup>" + "; ".join(self.assumptions) + "</sup>" if self.assumptions else ""
        title = title or f"QK scores of {self.name}{held}"
        s = self.scores.detach().cpu()
        if not self.positional:
            return heatmap(s, self.vocab, self.vocab, title, xlabel="key token", ylabel="query token")
        if (q_pos is None) != (k_pos is None):
            raise ValueError("give both q_pos and k_pos (or neither)")
        if q_pos is not None:
            n_pos = s.shape[1]
            for what, p in (("q_pos", q_pos), ("k_pos", cast(int, k_pos))):  # both given (checked above)
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
class OVTable(Result):
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
    assumptions: tuple[str, ...] = ()
    token_ids: tuple[int, ...] | None = None  # the vocabulary ids of the source axis when built with tokens=

    @property
    def name(self) -> str:
        return _name(self.layer, self.head)

    def __repr__(self) -> str:
        held = f"; {'; '.join(self.assumptions)}" if self.assumptions else ""
        return f"OVTable({self.name}, effects {tuple(self.effects.shape)}{held})"

    def effects_for(self, tokens) -> Float[Tensor, "batch pos vocab"]:
        """The effect of each source position of [batch, pos] token ids on the logits, [batch, pos, vocab]."""
        ids = _rows(_table_ids(tokens, _id_range(self.token_ids, self.effects.shape[0])), self.token_ids)
        ids = ids.to(self.effects.device)
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
        from headcoop.display.plot import heatmap

        df = self.to_dataframe()
        held = "<br><sup>" + "; ".join(self.assumptions) + "</sup>" if self.assumptions else ""
        return heatmap(
            df.values, self.out_vocab, list(df.index), title or f"OV effects of {self.name}{held}",
            xlabel="output logit", ylabel="attended source",
        )  # fmt: skip


@torch.no_grad()
def qk(
    model: HookedTransformer,
    head: int | str | tuple[int, int],
    layer: int | None = None,
    positional: bool | None = None,
    tokens=None,
) -> QKTable:
    """Pre-softmax attention scores of one head for every query input x key input (module docstring).

    head, layer: an int head in `layer` (layer None: the model's only layer; in a deeper model pass layer=),
    (layer, head) or "L1H3". ValueError when they name several heads.

    Token-only table [q_tok, k_tok] when no position reaches Q/K (no, or an all-zero, positional embedding:
    Count01 default, SkipPair); else [q_tok, q_pos, k_tok, k_pos] (standard, shortformer, rotary).
    `positional` forces the choice. `tokens`: only these token ids as queries and keys (e.g. the tokens of your
    prompts, for a vocabulary too large for the whole table; `token_ids` records them). Layer 0 reproduces hook_attn_scores exactly at causal positions (checked
    on a sample of inputs on every call: ValueError if this model's attention does something the table does
    not model); layer > 0 is the direct path (embeddings only). Grouped-query heads use their shared K.
    ValueError when the dense table would exceed MAX_TABLE_ENTRIES. IndexError for a head/layer out of range.
    """
    _check_model(model, "qk")
    layer, head = one_head(model, head, layer)
    use_pos = _use_pos(model, True, positional)
    attn = model.blocks[layer].attn
    n_pos = model.cfg.n_ctx if use_pos else 1
    ids = _subset(model, tokens, "qk")
    n_tok = model.cfg.d_vocab if ids is None else len(ids)
    _check_size("qk", n_tok * n_pos, n_tok * n_pos)
    x = _attn_inputs(model, layer, use_pos, "qk", ids)
    w = lambda name: head_weight(attn, name, model.cfg)[head]  # noqa: E731
    q_lin, k_lin = x @ w("W_Q"), x @ w("W_K")  # [n, d_head], without biases
    q, k = q_lin + w("b_Q"), k_lin + w("b_K")
    if model.cfg.positional_embedding_type == "rotary" and use_pos:  # rotation is linear: rotate both parts
        rotate = attn.apply_rotary if hasattr(attn, "apply_rotary") else lambda t: apply_rotary(model, t)  # a Bridge
        q_lin, k_lin, q, k = (rotate(t.view(-1, n_pos, 1, t.shape[-1])).flatten(0, 2)
                              for t in (q_lin, k_lin, q, k))  # fmt: skip
    scale = attn_scale(model, layer)
    matrix = FactoredMatrix(q_lin / scale, k_lin.T)
    scores = apply_softcap(q @ k.T / scale, model.cfg.attn_scores_soft_cap)
    if use_pos:
        scores = scores.unflatten(0, (-1, n_pos)).unflatten(2, (-1, n_pos))
    assumptions: tuple[str, ...] = (_DIRECT_QK,) if layer > 0 else ()
    no_pos = not use_pos and _use_pos(model, True, None)  # positions reach Q and K, and positional=False left them out
    if no_pos:
        assumptions += (_NO_POS_QK,)
    labels = vocab_labels(model)
    table = QKTable(
        scores=scores, matrix=matrix, layer=layer, head=head, vocab=labels if ids is None else [labels[i] for i in ids],
        positional=use_pos, direct_path=layer > 0, causal=model.cfg.attention_dir == "causal", assumptions=assumptions,
        token_ids=ids,
    )  # fmt: skip
    if layer == 0 and not no_pos:  # a table without the positions the model adds cannot match its cache
        _check_against_cache(model, table)
    elif (
        layer > 0 and not no_pos and is_bridge(model)
    ):  # a Bridge wraps Hugging Face code the table reimplements: check the method on layer 0
        try:
            qk(model, head=head, layer=0, positional=positional, tokens=tokens)
        except ValueError as err:
            raise ValueError(f"qk on a TransformerBridge checks its reading of the architecture on layer 0 first, "
                             f"and it fails there: {err}") from None  # fmt: skip
    return table


_DIRECT_QK = "direct path: the head reading the embeddings alone (earlier layers' outputs left out)"
_NO_POS_QK = "positions left out (positional=False on a model whose positions reach Q and K): tokens alone"


def _check_against_cache(model: HookedTransformer, table: QKTable) -> None:
    """ValueError unless the table reproduces the cached layer-0 scores on a few inputs."""
    cfg = model.cfg
    width = min(cfg.n_ctx, 12)
    pool = torch.arange(cfg.d_vocab) if table.token_ids is None else torch.tensor(table.token_ids)
    ids = pool[torch.randint(0, len(pool), (4, width), generator=torch.Generator().manual_seed(0))].to(
        table.scores.device
    )
    name = f"blocks.{table.layer}.attn.hook_attn_scores"
    _, cache = model.run_with_cache(ids, names_filter=lambda n: n == name)
    cached = cache[name][:, table.head]
    looked_up = table.scores_for(ids)
    keep = torch.isfinite(cached) & torch.isfinite(looked_up)
    gap = float((cached[keep] - looked_up[keep]).abs().max()) if keep.any() else 0.0
    tol = (1e-4 if cached.dtype != torch.float64 else 1e-9) * max(1.0, float(cached[keep].abs().max()))
    if gap > tol:
        hooks = user_hooks(model)
        why = (f"hooks installed at {', '.join(hooks[:4])} change the forward pass the table is read from the "
               "weights of; remove them (model.reset_hooks()) to read the QK table") if hooks else (
               "this model's attention computes its scores in a way the table does not model")  # fmt: skip
        raise ValueError(f"qk: the table misses the cached scores of {table.name} by {gap:.3g}: {why}")


@torch.no_grad()
def ov(
    model: HookedTransformer,
    head: int | str | tuple[int, int],
    layer: int | None = None,
    positional: bool | None = None,
    tokens=None,
) -> OVTable:
    """Logit effect of one head attending fully to each source input (module docstring):
    (ln1(x) W_V + b_V) W_O, through the final norm (scale taken as 1), then W_U.

    [src_tok, vocab], or [src_tok, src_pos, vocab] when a non-zero standard positional embedding reaches
    V (a shortformer's or rotary positions do not). b_O (per layer), the final norm's bias and b_U are
    excluded. The direct path to the logits (later layers and MLPs left out; layer > 0: embeddings only).
    Combined with the head's pattern, sum_k pattern[q, k] * effects[x_k] is the head's DLA component
    (exactly, in a layer-0 head of a model without a final norm). Grouped-query heads use their shared V.
    `tokens`: only these token ids as sources (every output logit is kept; `token_ids` records them).
    """
    _check_model(model, "ov")
    layer, head = one_head(model, head, layer)
    use_pos = _use_pos(model, model.cfg.positional_embedding_type == "standard", positional)
    attn = model.blocks[layer].attn
    n_pos = model.cfg.n_ctx if use_pos else 1
    ids = _subset(model, tokens, "ov")
    _check_size("ov", (model.cfg.d_vocab if ids is None else len(ids)) * n_pos, model.cfg.d_vocab_out)
    x = _attn_inputs(model, layer, use_pos, "v", ids)
    final = getattr(model, "ln_final", None)
    kind = norm_kind(final)
    W_O = attn.W_O[head]  # [d_head, d_model]
    if kind in ("LN", "LNPre"):
        W_O = W_O - W_O.mean(-1, keepdim=True)
    if kind in ("LN", "RMS") and final is not None:
        W_O = W_O * final.w
    out = W_O @ model.W_U  # [d_head, vocab]
    v = x @ head_weight(attn, "W_V", model.cfg)[head]
    matrix = FactoredMatrix(v, out)
    effects = (v + head_weight(attn, "b_V", model.cfg)[head]) @ out
    if use_pos:
        effects = effects.unflatten(0, (-1, n_pos))
    assumptions = []
    if layer > 0:
        assumptions.append("direct path: the head reading the embeddings alone (earlier layers' outputs left out)")
    if kind is not None:
        done = {"LN": "centred and weighted", "LNPre": "centred", "RMS": "weighted", "RMSPre": "nothing else"}[kind]
        assumptions.append(f"final {kind} scale taken as 1 ({done})")
    if not model.cfg.attn_only or model.cfg.n_layers > layer + 1:
        assumptions.append("direct effect on the logits (later layers reading the head's output left out)")
    labels = vocab_labels(model)
    return OVTable(
        effects=effects, matrix=matrix, layer=layer, head=head, vocab=labels if ids is None else [labels[i] for i in ids],
        out_vocab=output_labels(model), positional=use_pos, direct_path=layer > 0, assumptions=tuple(assumptions),
        token_ids=ids,
    )  # fmt: skip
