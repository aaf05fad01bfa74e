"""The fused forward: logits at the loss positions of K stacked attention-only models at once.

The parameters of models with the same shape are stacked along a leading model axis ([K, ...]);
`fused_logits` computes only what the loss needs, the logits at the task's loss positions, each model
on its own batch. `headcoop.training.fast` trains through it; exact SkipPair measures evaluate through it.
It matches `HookedTransformer.forward` (tests/test_fast_train.py) on the models `check_supported` accepts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from headcoop.models.tl import HookedTransformer, HookedTransformerConfig

Params = dict[str, Tensor]

# Config fields that change the forward pass; the fused forward supports only these values.
_REQUIRED_CONFIG: dict[str, Any] = {
    "attn_only": True,
    "normalization_type": None,
    "positional_embedding_type": "standard",
    "attention_dir": "causal",
    "post_embedding_ln": False,
    "use_attention_sinks": False,
    "clip_qkv": None,
    "use_qk_norm": False,
    "n_key_value_heads": None,
    "use_local_attn": False,
    "load_in_4bit": False,
}
_ATTN_PARAMS = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")


def expected_parameter_names(n_layers: int) -> list[str]:
    """The parameter names of an attention-only, LayerNorm-free HookedTransformer."""
    names = ["embed.W_E", "pos_embed.W_pos"]
    names += [f"blocks.{layer}.attn.{p}" for layer in range(n_layers) for p in _ATTN_PARAMS]
    return names + ["unembed.W_U", "unembed.b_U"]


def check_supported(model: HookedTransformer) -> None:
    """ValueError unless `model` is an attention-only, LayerNorm-free, causal HookedTransformer
    with standard positional embeddings (what the fused forward computes)."""
    if not isinstance(model, HookedTransformer):
        raise TypeError(f"expected a HookedTransformer, got {type(model).__name__}")
    cfg = model.cfg
    wrong = [
        f"{key}={getattr(cfg, key, None)!r} (need {value!r})"
        for key, value in _REQUIRED_CONFIG.items()
        if getattr(cfg, key, value) != value
    ]
    for key in ("attn_scores_soft_cap", "output_logits_soft_cap"):
        if (getattr(cfg, key, -1.0) or -1.0) > 0:
            wrong.append(f"{key}={getattr(cfg, key)!r} (need none)")
    if cfg.d_vocab_out != cfg.d_vocab:
        wrong.append(f"d_vocab_out={cfg.d_vocab_out} (need d_vocab={cfg.d_vocab})")
    names = sorted(n for n, _ in model.named_parameters())
    if names != sorted(expected_parameter_names(cfg.n_layers)):
        extra = sorted(set(names) - set(expected_parameter_names(cfg.n_layers)))
        wrong.append(f"unexpected parameters {extra}")
    if wrong:
        raise ValueError(
            "train_many trains attention-only, LayerNorm-free causal models with standard positional "
            f"embeddings; this model has {', '.join(wrong)}. Use hc.train for it."
        )


def attn_scales(cfg: HookedTransformerConfig) -> list[float]:
    """The number each layer divides its attention scores by (as TransformerLens does)."""
    scale = cfg.attn_scale if cfg.use_attn_scale else 1.0
    if cfg.scale_attn_by_inverse_layer_idx:
        return [scale * (layer + 1) for layer in range(cfg.n_layers)]
    return [scale] * cfg.n_layers


# --- the fused forward -----------------------------------------------------------------


def stack_parameters(models: Sequence[HookedTransformer]) -> Params:
    """Each parameter of `models` (all of one shape) stacked along a new leading model axis: name -> [K, ...].

    The stacked tensors are fresh leaves that share no memory with the models.
    """
    named = [dict(m.named_parameters()) for m in models]
    return {name: torch.stack([n[name].detach() for n in named]).clone() for name in named[0]}


def _attend(
    resid_q: Float[Tensor, "model batch query d_model"],
    resid_k: Float[Tensor, "model batch pos d_model"],
    masked: Tensor,
    params: Params,
    layer: int,
    scale: float,
) -> Float[Tensor, "model batch query d_model"]:
    """Attention output (b_O included) for the queries `resid_q` over keys/values `resid_k`.

    `masked` ([query, pos] or [model, batch, query, pos], True where a key is hidden) follows the
    causal mask of the queries' positions.
    """
    W = {p: params[f"blocks.{layer}.attn.{p}"] for p in _ATTN_PARAMS}
    q = torch.einsum("kbqd,khde->kbhqe", resid_q, W["W_Q"]) + W["b_Q"][:, None, :, None]
    k = torch.einsum("kbpd,khde->kbhpe", resid_k, W["W_K"]) + W["b_K"][:, None, :, None]
    v = torch.einsum("kbpd,khde->kbhpe", resid_k, W["W_V"]) + W["b_V"][:, None, :, None]
    scores = torch.einsum("kbhqe,kbhpe->kbhqp", q, k) / scale
    if masked.ndim == 4:
        masked = masked[:, :, None]
    pattern = scores.masked_fill(masked, float("-inf")).softmax(-1)
    z = torch.einsum("kbhqp,kbhpe->kbhqe", pattern, v)
    return torch.einsum("kbhqe,khed->kbqd", z, W["W_O"]) + W["b_O"][:, None, None]


def _token_counts(tokens: Tensor, loss_pos: Tensor, vocab: int, dtype: torch.dtype) -> Float[Tensor, "model vocab row"]:
    """How often each token occurs at or before each loss position; row = (batch, n_loss)."""
    n_models, batch, n_pos = tokens.shape
    seen = (torch.arange(n_pos, device=tokens.device) <= loss_pos[..., None]).to(dtype)  # [K, B, n_loss, pos]
    counts = torch.zeros(*loss_pos.shape, vocab, dtype=dtype, device=tokens.device)
    counts.scatter_add_(-1, tokens[:, :, None, :].expand_as(seen), seen)
    return counts.permute(0, 3, 1, 2).reshape(n_models, vocab, -1)


def _first_layer_by_token(
    params: Params, tokens: Tensor, query_pos: Tensor, scale: float
) -> Float[Tensor, "model d_model row"]:
    """The residual stream after layer 0 at the positions `query_pos` [model, batch, query] of
    models without positional embedding, transposed to [model, d_model, row], row = (batch, query).

    Keys and values then depend on the token only, so attention over positions equals
    attention over the vocabulary with each token's score raised by log(its count among
    the visible keys): softmax_j(s[tok_j]) summed per token = softmax_v(s_v + log count_v).
    The key bias b_K adds the same score to every key of a query and so cancels in the softmax.
    Rows stay the innermost axis: softmax over a short vocabulary axis is slow when it is last.
    """
    W_E = params["embed.W_E"]
    W = {p: params[f"blocks.0.attn.{p}"] for p in _ATTN_PARAMS}
    (n_models, vocab, d_model), n_heads, d_head = W_E.shape, W["W_Q"].shape[1], W["W_Q"].shape[-1]
    log_counts = _token_counts(tokens, query_pos, vocab, W_E.dtype).log()[:, None]  # [K, 1, V, row]
    query_token = tokens.gather(2, query_pos).reshape(n_models, 1, -1)
    is_query_token = (torch.arange(vocab, device=tokens.device)[:, None] == query_token).to(W_E.dtype)
    resid = W_E.transpose(1, 2) @ is_query_token  # [K, d_model, row]
    W_Q = W["W_Q"].transpose(2, 3).reshape(n_models, n_heads * d_head, d_model)
    q = ((W_Q @ resid).view(n_models, n_heads, d_head, -1) + W["b_Q"][..., None]) / scale
    key_of_token = W_E[:, None] @ W["W_K"]  # [K, H, V, d_head]
    value_of_token = W_E[:, None] @ W["W_V"]
    pattern = (key_of_token @ q + log_counts).softmax(2)  # [K, H, V, row]
    z = value_of_token.transpose(2, 3) @ pattern + W["b_V"][..., None]  # [K, H, d_head, row]
    W_O = W["W_O"].reshape(n_models, n_heads * d_head, d_model).transpose(1, 2)
    return resid + W_O @ z.view(n_models, n_heads * d_head, -1) + W["b_O"][..., None]


def _one_layer_by_table(
    params: Params, tokens: Tensor, loss_pos: Tensor, scale: float
) -> Float[Tensor, "model batch n_loss d_model"]:
    """The residual stream at the loss rows of one-layer models with positional embedding.

    A key (value) is W_E[token] W_K + W_pos[pos] W_K (+ b_K): each query is scored once against
    the V token keys and the P position keys, and the token scores are then spread over positions;
    the values go the other way. b_K cancels in the softmax as above.
    """
    W_E, W_pos = params["embed.W_E"], params["pos_embed.W_pos"][:, : tokens.shape[-1]]
    W = {p: params[f"blocks.0.attn.{p}"] for p in _ATTN_PARAMS}
    (n_models, batch, n_pos), n_loss = tokens.shape, loss_pos.shape[-1]
    n_heads, d_head, vocab = W["W_Q"].shape[1], W["W_Q"].shape[-1], W_E.shape[1]
    rows = torch.arange(n_models, device=tokens.device)[:, None, None]
    resid = W_E[rows, tokens.gather(2, loss_pos)] + W_pos[rows, loss_pos]  # [K, B, n_loss, d_model]
    q = torch.einsum("kbnd,khde->khbne", resid, W["W_Q"]) + W["b_Q"][:, :, None, None]
    q = (q / scale).reshape(n_models * n_heads, batch * n_loss, d_head)
    tables = torch.cat([W_E, W_pos], 1)[:, None]  # [K, 1, V + P, d_model]
    keys = (tables @ W["W_K"]).flatten(0, 1).transpose(1, 2)  # [K*H, d_head, V + P]
    values = (tables @ W["W_V"]).flatten(0, 1)  # [K*H, V + P, d_head]
    by_token, by_pos = (q @ keys).view(n_models, n_heads, batch, n_loss, -1).split([vocab, n_pos], -1)
    index = tokens[:, None, :, None, :].expand(-1, n_heads, -1, n_loss, -1)  # [K, H, B, n_loss, P]
    hidden = torch.arange(n_pos, device=tokens.device) > loss_pos[:, None, :, :, None]
    scores = (by_token.gather(-1, index) + by_pos).masked_fill(hidden, float("-inf"))
    pattern = scores.softmax(-1)
    on_token = torch.zeros_like(by_token).scatter_add_(-1, index, pattern)
    attended = torch.cat([on_token, pattern], -1).view(n_models * n_heads, batch * n_loss, -1)
    z = (attended @ values).view(n_models, n_heads, batch * n_loss, d_head) + W["b_V"][:, :, None]
    z = z.permute(0, 2, 1, 3).reshape(n_models, batch * n_loss, n_heads * d_head)
    out = z @ W["W_O"].reshape(n_models, n_heads * d_head, -1) + W["b_O"][:, None]
    return resid + out.view(n_models, batch, n_loss, -1)


def fused_logits(
    params: Params,
    cfg: HookedTransformerConfig,
    tokens: Int[Tensor, "model batch pos"],
    loss_pos: Int[Tensor, "model batch n_loss"],
    positional: bool | None = None,
) -> Float[Tensor, "model batch n_loss vocab"]:
    """Logits at the loss positions of K stacked attention-only models, each on its own batch.

    params: name -> [K, ...] (see `stack_parameters`); cfg: the models' shared config.
    positional: whether W_pos enters (None: unless it is all zero and frozen). Without it layer 0
    attends over token counts; a one-layer model with it through per-token and per-position key
    and value tables. The last layer runs only at the loss rows, earlier ones at every position.
    """
    W_E, W_pos = params["embed.W_E"], params["pos_embed.W_pos"]
    n_pos, vocab = tokens.shape[-1], W_E.shape[1]
    if positional is None:
        positional = W_pos.requires_grad or bool(W_pos.any())
    scales = attn_scales(cfg)
    if cfg.n_layers == 1 and not positional:
        resid = _first_layer_by_token(params, tokens, loss_pos, scales[0])  # [K, d_model, row]
        logits = params["unembed.W_U"].transpose(1, 2) @ resid + params["unembed.b_U"][..., None]
        return logits.view(*logits.shape[:2], *loss_pos.shape[1:]).permute(0, 2, 3, 1)
    if cfg.n_layers == 1:
        resid_q = _one_layer_by_table(params, tokens, loss_pos, scales[0])
    else:
        positions = torch.arange(n_pos, device=tokens.device)
        causal = torch.ones(n_pos, n_pos, dtype=torch.bool, device=tokens.device).triu(1)
        if positional:
            resid = F.one_hot(tokens, vocab).to(W_E.dtype) @ W_E[:, None] + W_pos[:, None, :n_pos]
            resid = resid + _attend(resid, resid, causal, params, 0, scales[0])
        else:
            every = positions.expand_as(tokens)
            resid = (
                _first_layer_by_token(params, tokens, every, scales[0]).transpose(1, 2).unflatten(1, every.shape[1:])
            )
        for layer in range(1, cfg.n_layers - 1):
            resid = resid + _attend(resid, resid, causal, params, layer, scales[layer])
        resid_q = (positions == loss_pos[..., None]).to(W_E.dtype) @ resid  # [K, B, n_loss, d_model]
        hidden = positions > loss_pos[..., None]  # keys after each loss position
        last = cfg.n_layers - 1
        resid_q = resid_q + _attend(resid_q, resid, hidden, params, last, scales[last])
    return resid_q @ params["unembed.W_U"][:, None] + params["unembed.b_U"][:, None, None]
