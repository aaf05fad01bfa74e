"""Attention interventions: impose a head's attention pattern for the length of a `with` block.

    # attention to '2' zeroed, a '0' key weighted w01 times a '1' key, every other key 0, renormalised
    with hc.set_attention(model, head=3, tokens={"2": 0.0, "0": w01, "1": 1.0}):
        logits = model(batch.tokens)

The hook sits on `blocks.{layer}.attn.hook_pattern` ([batch, head, query, key], after the softmax), so
the head's z -- and everything downstream -- is computed from the imposed pattern. Two ways to say
what the pattern is (exactly one per call):

weights=  explicit relative weights: [key] (the same for every query), [query, key] or
          [batch, query, key]. Each row is masked to its allowed (causal, key <= query) keys and
          renormalised to sum 1.
tokens=   relative weights by the token at each key: {token: weight} with tokens as the task's
          strings ("2", "[BOS]") or ids. Keys whose token is not listed get `others`:
          - a number (default 0.0): a relative weight in the same units as the listed ones; the row is
            then renormalised over the allowed keys. So key k gets w(token_k) / sum_allowed w.
          - "model": those keys keep the model's own attention probability; the listed keys share
            the model's total probability on listed keys in proportion to their weights (key k gets
            M * w(token_k) / sum_listed w, M = the model's mass on the listed keys of that row). If
            the listed weights of a row are all 0, that mass is dropped and the row renormalised
            over the unlisted keys.
          In both cases the ratio of the weights on any two listed keys is the ratio of their
          tokens' weights: {"0": w01, "1": 1.0} gives weight(0-key) / weight(1-key) = w01.

A row whose imposed weights sum to 0 over its allowed keys becomes all-zero: the head reads nothing at
that query. `query_pos` restricts the intervention to one query position (an int, or a [batch] tensor
of positions); other rows keep the model's own pattern.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any, cast

import torch
from jaxtyping import Float
from torch import Tensor
from transformer_lens.utilities import get_act_name

from headcoop.analysis.engine.ablation import hooks_added
from headcoop.analysis.engine.inputs import check_positions, parse_heads, vocab_labels
from headcoop.models.tl import HookedTransformer

OTHERS = ("model",)


def _token_weights(model: HookedTransformer, tokens: dict) -> tuple[Tensor, Tensor]:
    """Per-vocabulary relative weights [d_vocab] and the mask [d_vocab] of listed tokens."""
    if not isinstance(tokens, dict) or not tokens:
        raise ValueError(f"tokens must be a non-empty dict {{token: relative weight}}, got {tokens!r}")
    labels = vocab_labels(model)
    weight = torch.zeros(model.cfg.d_vocab, dtype=torch.float64)
    listed = torch.zeros(model.cfg.d_vocab, dtype=torch.bool)
    for key, value in tokens.items():
        if isinstance(key, str):
            if key not in labels:
                raise ValueError(f"unknown token {key!r}; this model's tokens are {labels}")
            tid = labels.index(key)
        elif isinstance(key, int) and not isinstance(key, bool):
            if not 0 <= key < model.cfg.d_vocab:
                raise ValueError(f"unknown token id {key}; this model's ids are 0..{model.cfg.d_vocab - 1}")
            tid = key
        else:
            raise ValueError(f"token keys must be token strings or ids, got {key!r}")
        value = _weight_value(value, f"the weight of token {key!r}")
        if listed[tid] and weight[tid] != value:
            raise ValueError(f"token {labels[tid]!r} is given two different weights")
        weight[tid], listed[tid] = value, True
    return weight, listed


def _weight_value(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} must be a finite number >= 0, got {value!r}")
    return float(value)


def _normalise(rows: Float[Tensor, "... k"]) -> Float[Tensor, "... k"]:
    total = rows.sum(-1, keepdim=True)
    return torch.where(total > 0, rows / torch.where(total > 0, total, 1.0), 0.0)


def impose(
    pattern: Float[Tensor, "batch query key"],
    weights: Tensor | None = None,
    key_tokens: Tensor | None = None,
    token_weight: Tensor | None = None,
    token_listed: Tensor | None = None,
    others: float | str = 0.0,
) -> Float[Tensor, "batch query key"]:
    """The imposed pattern of one head (every query row; see the module docstring for the rules).

    pattern:    [batch, q, k] the model's own pattern (used by others="model")
    weights:    explicit relative weights broadcastable to [batch, q, k]
    key_tokens: [batch, k] token ids of the keys, with token_weight / token_listed [d_vocab]
    """
    batch, n_q, n_k = pattern.shape
    allowed = torch.ones(n_q, n_k, dtype=torch.bool, device=pattern.device).tril()
    if weights is not None:
        return _normalise(torch.where(allowed, weights.to(pattern).expand(batch, n_q, n_k), 0.0))
    if key_tokens is None or token_weight is None or token_listed is None:
        raise ValueError("impose needs weights=, or key_tokens= with token_weight= and token_listed=")
    w = token_weight.to(pattern)[key_tokens][:, None, :].expand(batch, n_q, n_k)  # [batch, q, k]
    listed = (token_listed.to(pattern.device)[key_tokens][:, None, :] & allowed).expand(batch, n_q, n_k)
    if others == "model":
        own = torch.where(allowed, pattern, 0.0)
        mass = torch.where(listed, own, 0.0).sum(-1, keepdim=True)
        share = _normalise(torch.where(listed, w, 0.0))
        return _normalise(torch.where(listed, mass * share, own))
    return _normalise(torch.where(allowed, torch.where(listed, w, float(others)), 0.0))


@contextlib.contextmanager
def set_attention(
    model: HookedTransformer,
    head,
    layer: int | None = None,
    weights=None,
    tokens: dict | None = None,
    others: float | str = 0.0,
    query_pos=None,
) -> Iterator[HookedTransformer]:
    """Impose the attention pattern of `head` (an int: that head in `layer`, or in every layer for layer=None;
    (layer, head); "L0H3"; or a list) in a block.

    weights:   [key], [query, key] or [batch, query, key] relative weights (>= 0); shapes are checked
               against the inputs in each forward pass (ValueError naming the expected shapes).
    tokens:    {token: relative weight} by key token; unlisted keys get `others` (a number, default 0,
               or "model"). Exactly one of weights / tokens.
    query_pos: None (every query row), an int, or a [batch] tensor of one query position per example.
    After the rules (module docstring) every changed row sums to 1 over its allowed keys, or is
    all-zero when its imposed weights sum to 0. Yields the model; hooks removed on exit.
    Long: the docstring documents the three ways of naming weights; the body is one hook and its checks.
    """
    pairs = parse_heads(model, head, layer)
    if (weights is None) == (tokens is None):
        raise ValueError("pass exactly one of weights= (a tensor) or tokens= (a {token: weight} dict)")
    if weights is not None:
        if others != 0.0:
            raise ValueError("others= only applies with tokens=")
        if isinstance(weights, (str, bytes, dict)):
            raise TypeError(f"weights must be a tensor of relative weights ([key], [query, key] or [batch, query, key]), "
                            f"got {weights!r:.40}; for uniform attention pass torch.ones(n_keys)")  # fmt: skip
        try:
            weights = torch.as_tensor(weights, dtype=torch.float32)
        except (TypeError, ValueError, RuntimeError) as err:
            raise TypeError(
                f"weights must be a tensor of relative weights, got {type(weights).__name__} ({err})"
            ) from None
        if weights.ndim not in (1, 2, 3):
            raise ValueError(
                f"weights must have shape [key], [query, key] or [batch, query, key], got {tuple(weights.shape)}"
            )
        if not torch.isfinite(weights).all() or (weights < 0).any():
            raise ValueError("weights must be finite and >= 0")
        token_weight = token_listed = None
    else:
        token_weight, token_listed = _token_weights(model, cast(dict, tokens))  # checked: a dict of weights
        if others != "model":
            if isinstance(others, str):
                raise ValueError(f"unknown others {others!r}; valid values are a number >= 0 or {list(OTHERS)}")
            others = _weight_value(others, "others")
    seen: dict[str, Tensor] = {}

    def record_tokens(module, args):
        seen["tokens"] = args[0]

    def row_mask(batch: int, n_q: int, device) -> Tensor:
        if query_pos is None:
            return torch.ones(batch, n_q, dtype=torch.bool, device=device)
        qp = check_positions(query_pos, batch, n_q, "query_pos").to(device)
        return torch.nn.functional.one_hot(qp.long() % n_q, n_q).bool()

    def expected(batch: int, n: int) -> Tensor:
        shape = tuple(weights.shape)
        fits = {1: (n,), 2: (n, n), 3: (batch, n, n)}[weights.ndim]
        if shape != fits:
            raise ValueError(
                f"weights of shape {list(shape)} do not fit inputs of batch {batch} and length {n}: expected "
                f"[{n}] (per key), [{n}, {n}] (query x key) or [{batch}, {n}, {n}] (per example)"
            )
        return weights[None, None, :] if weights.ndim == 1 else weights

    def make_hook(hs: list[int]):
        def hook(pattern: Float[Tensor, "batch head query key"], hook) -> Tensor:
            batch, _, n_q, n_k = pattern.shape
            if weights is not None:
                kw: dict[str, Any] = dict(weights=expected(batch, n_k).to(pattern.device))
            else:
                toks = seen.get("tokens")
                if toks is None or toks.ndim != 2 or tuple(toks.shape) != (batch, n_k):
                    raise ValueError("tokens= needs the model to be run on token ids (not embeddings)")
                kw = dict(key_tokens=toks, token_weight=token_weight, token_listed=token_listed, others=others)
            rows = row_mask(batch, n_q, pattern.device)[:, None, :, None]
            pattern = pattern.clone()
            for h in hs:
                new = impose(pattern[:, h], **kw)
                pattern[:, h] = torch.where(rows[:, 0], new, pattern[:, h])
            return pattern

        return hook

    by_layer: dict[int, list[int]] = {}
    for lay, h in pairs:
        by_layer.setdefault(lay, []).append(h)
    hooks = [(get_act_name("pattern", lay), make_hook(hs)) for lay, hs in sorted(by_layer.items())]
    handle = model.embed.register_forward_pre_hook(record_tokens) if tokens is not None else None
    try:
        with hooks_added(model, hooks):
            yield model
    finally:
        if handle is not None:
            handle.remove()
