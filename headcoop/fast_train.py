"""Training many attention-only models at once.

The parameters of models with the same shape are stacked along a leading model
axis ([K, ...]) and trained by one fused forward that computes only what the
loss needs: the logits at the task's loss positions. Each model keeps its own
initialisation, its own data stream (`task.sample(batch_size, seed=step_seed(seed_k, step))`)
and its own AdamW state, exactly as `headcoop.train.train` would give it; Adam
and weight decay are elementwise, so stacking changes nothing but float rounding.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer, HookedTransformerConfig

from headcoop.tasks.base import Task, build_model
from headcoop.checks import check_finite, check_seed
from headcoop.tasks.base import check_sample_size
from headcoop.train import (
    check_training_args, deterministic, lr_at, make_optimizer, mark_trained, step_seed, trainable_parameters,
)

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


# --- data ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Streams:
    """One training batch for each of S data streams, stacked.

    tokens:   [stream, batch, pos]
    loss_pos: [stream, batch, n_loss]
    targets:  [stream, batch, n_loss]
    """

    tokens: Int[Tensor, "stream batch pos"]
    loss_pos: Int[Tensor, "stream batch n_loss"]
    targets: Int[Tensor, "stream batch n_loss"]

    def to(self, device: torch.device | str) -> "Streams":
        return Streams(*(getattr(self, f.name).to(device) for f in dataclasses.fields(self)))

    def select(self, rows: Tensor | None) -> "Streams":
        """The streams at `rows` (all of them for None)."""
        if rows is None:
            return self
        return Streams(*(getattr(self, f.name)[rows] for f in dataclasses.fields(self)))


def sample_streams(task: Task, batch_size: int, seeds: Sequence[int]) -> Streams:
    """`task.sample(batch_size, seed=s)` for every s in `seeds`, stacked on a leading stream axis.

    Returns Streams with tokens [S, batch_size, pos], loss_pos and targets [S, batch_size, n_loss].
    """
    batches = [task.sample(batch_size, seed=int(s)) for s in seeds]
    return Streams(
        tokens=torch.stack([b.tokens for b in batches]),
        loss_pos=torch.stack([b.loss_pos for b in batches]),
        targets=torch.stack([b.targets for b in batches]),
    )


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
            resid = _first_layer_by_token(params, tokens, every, scales[0]).transpose(1, 2).unflatten(1, every.shape[1:])
        for layer in range(1, cfg.n_layers - 1):
            resid = resid + _attend(resid, resid, causal, params, layer, scales[layer])
        resid_q = (positions == loss_pos[..., None]).to(W_E.dtype) @ resid  # [K, B, n_loss, d_model]
        hidden = positions > loss_pos[..., None]  # keys after each loss position
        last = cfg.n_layers - 1
        resid_q = resid_q + _attend(resid_q, resid, hidden, params, last, scales[last])
    return resid_q @ params["unembed.W_U"][:, None] + params["unembed.b_U"][:, None, None]


def per_model_loss(
    logits: Float[Tensor, "model batch n_loss vocab"], targets: Int[Tensor, "model batch n_loss"]
) -> Float[Tensor, " model"]:
    """Each model's mean cross-entropy over its batch's loss positions (what `Task.loss` computes)."""
    # classes on axis 1: for logits stored vocab-major this is the fast layout
    return F.cross_entropy(logits.permute(0, 3, 1, 2), targets, reduction="none").flatten(1).mean(1)


# --- models and groups -----------------------------------------------------------------


def model_settings(task: Task) -> list[str]:
    """The keyword arguments `task.model` accepts besides seed (n_heads, d_model, ...)."""
    return [p for p in inspect.signature(task.config).parameters if p != "self"]


def build(task: Task, item: Any, seed: int) -> HookedTransformer:
    """The model an item of `train_many` stands for: a model as is; a config or a dict of
    `task.model` kwargs built with `seed` and prepared by the task."""
    if isinstance(item, HookedTransformer):
        model = item
    elif isinstance(item, HookedTransformerConfig):
        model = task.prepare(build_model(item, seed))
    elif isinstance(item, dict):
        unknown = sorted(set(item) - set(model_settings(task)))
        if unknown:
            raise ValueError(f"unknown {task.name} model setting(s) {unknown}; valid ones are {model_settings(task)}")
        model = task.model(seed=seed, **item)
    else:
        raise TypeError(
            f"train_many items must be HookedTransformerConfig, dict of task.model kwargs or HookedTransformer, "
            f"got {type(item).__name__}"
        )
    check_supported(model)
    if model.cfg.d_vocab != task.d_vocab or model.cfg.n_ctx < task.n_ctx:
        raise ValueError(
            f"model {model.cfg.model_name!r} has d_vocab {model.cfg.d_vocab} and n_ctx {model.cfg.n_ctx}; "
            f"{task.name} needs d_vocab {task.d_vocab} and n_ctx >= {task.n_ctx}"
        )
    return model


def _signature(model: HookedTransformer) -> tuple:
    """Models with equal signatures can be stacked: same shapes, frozen set, scales, device, dtype."""
    params = tuple((n, tuple(p.shape), p.requires_grad) for n, p in model.named_parameters())
    return (str(model.cfg.device), str(model.cfg.dtype), tuple(attn_scales(model.cfg)), params)


class _Group:
    """Models of one shape trained as one stacked computation."""

    def __init__(self, models: list[HookedTransformer], indices: list[int], stream_rows: list[int], n_streams: int):
        self.models, self.indices = models, indices
        self.cfg = models[0].cfg
        self.device = next(models[0].parameters()).device
        stacked = stack_parameters(models)
        frozen = {n for n, p in models[0].named_parameters() if not p.requires_grad}
        self.params = {n: t.requires_grad_(n not in frozen) for n, t in stacked.items()}
        W_pos = self.params["pos_embed.W_pos"]
        self.positional = W_pos.requires_grad or bool(W_pos.any())
        identity = stream_rows == list(range(n_streams))  # this group reads every stream, in order
        self.rows = None if identity else torch.tensor(stream_rows, device=self.device)

    def trainable(self) -> list[Tensor]:
        return [p for p in self.params.values() if p.requires_grad]

    @torch.no_grad()
    def write_back(self) -> None:
        for k, model in enumerate(self.models):
            for name, param in model.named_parameters():
                param.copy_(self.params[name][k])


def group_models(models: Sequence[HookedTransformer], seeds: Sequence[int]) -> list[_Group]:
    """Split `models` into stackable groups (first-appearance order); each group's data rows
    index the sorted unique `seeds`."""
    stream_of = {s: i for i, s in enumerate(sorted(set(seeds)))}
    by_signature: dict[tuple, list[int]] = {}
    for i, model in enumerate(models):
        by_signature.setdefault(_signature(model), []).append(i)
    return [
        _Group([models[i] for i in idx], idx, [stream_of[seeds[i]] for i in idx], len(stream_of))
        for idx in by_signature.values()
    ]


def _check_task_scoring(task: Task) -> None:
    if type(task).loss is not Task.loss or type(task).correct is not Task.correct:
        raise ValueError(
            f"train_many computes the standard loss (cross-entropy at batch.loss_pos); {type(task).__name__} "
            "overrides Task.loss or Task.correct, so train its models with hc.train"
        )


def _check_seeds(seeds: Sequence[int] | None, k: int) -> list[int]:
    if seeds is None:
        return list(range(k))
    seeds = list(seeds)
    if len(seeds) != k:
        raise ValueError(f"got {len(seeds)} seeds for {k} models; pass one seed per model")
    return [check_seed(s, "each seed") for s in seeds]


# --- training --------------------------------------------------------------------------


def train_many(
    task: Task,
    configs_or_models: Sequence[HookedTransformerConfig | dict | HookedTransformer],
    steps: int = 3000,
    batch_size: int = 256,
    lr: float = 1e-2,
    weight_decay: float = 0.0,
    warmup: int = 100,
    seeds: Sequence[int] | None = None,
    progress: bool | Any = True,
    log_every: int = 50,
) -> list[HookedTransformer]:
    """Train K models on `task` in one vectorised computation; returns K HookedTransformers in input order.

    Items are HookedTransformerConfig, dicts of `task.model` kwargs ({"n_heads": 4, "d_model": 8,
    "d_head": 2}) or HookedTransformer models (trained in place). seeds: one int per model
    (default 0..K-1); seed k initialises model k when it is built here and drives its data
    stream, `task.sample(batch_size, seed=step_seed(seed_k, step))`. Optimiser, schedule and
    the attributes set on each model (task, history, train_settings) are those of `hc.train`;
    parameters with requires_grad False stay fixed. Models of different shapes are grouped and
    the groups step together, sharing each step's batches between models of equal seed.
    progress: a bool, or a tqdm bar to advance by K model-steps per step.
    """
    if not isinstance(task, Task):
        raise TypeError(f"task must be a headcoop Task such as hc.Count01(), got {type(task).__name__}")
    check_training_args(steps, batch_size, lr, weight_decay, warmup, log_every)
    check_sample_size(batch_size, task.n_ctx)
    if not isinstance(progress, bool) and not hasattr(progress, "update"):
        raise TypeError(f"progress must be True, False or a tqdm bar, got {progress!r}")
    _check_task_scoring(task)
    if isinstance(configs_or_models, (str, bytes, dict)) or not isinstance(configs_or_models, Sequence):
        raise TypeError(f"train_many takes a list of configs, dicts or models, got {type(configs_or_models).__name__}")
    items = list(configs_or_models)
    if not items:
        raise ValueError("train_many needs at least one config or model")
    seeds = _check_seeds(seeds, len(items))
    models = [build(task, item, seed) for item, seed in zip(items, seeds)]
    if len({id(m) for m in models}) != len(models):
        raise ValueError("the same model object appears more than once; pass distinct models")
    for model in models:
        check_finite(model, "train_many")
        trainable_parameters(model)
    groups = group_models(models, seeds)
    stream_seeds = sorted(set(seeds))
    optimizer = make_optimizer([p for g in groups for p in g.trainable()], lr, weight_decay)
    histories = [list(getattr(m, "history", [])) for m in models]

    own_bar = not hasattr(progress, "update")
    bar = tqdm(total=steps, desc=f"train_many {task.name} x{len(models)}", disable=not progress, leave=False) \
        if own_bar else progress  # fmt: skip
    with deterministic(groups[0].device):
        for step in range(steps):
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, steps, lr, warmup)
            data = sample_streams(task, batch_size, [step_seed(s, step) for s in stream_seeds])
            on_device = {}
            losses, logged = [], step % log_every == 0 or step == steps - 1
            for g in groups:
                if g.device not in on_device:
                    on_device[g.device] = data.to(g.device)
                batch = on_device[g.device].select(g.rows)
                logits = fused_logits(g.params, g.cfg, batch.tokens, batch.loss_pos, g.positional)
                loss = per_model_loss(logits, batch.targets)
                check_loss_of_models(loss, g.indices, step, lr)
                losses.append(loss)
                if logged:
                    acc = (logits.detach().argmax(-1) == batch.targets).flatten(1).float().mean(1)
                    _log(histories, g.indices, step, loss.detach(), acc)
            optimizer.zero_grad(set_to_none=False)
            sum(loss.sum() for loss in losses).backward()
            if step == 0:
                _fill_missing_grads(optimizer)
            optimizer.step()
            bar.update(1 if own_bar else len(models))
            if logged and own_bar:
                bar.set_postfix(loss=f"{sum(x.detach().sum().item() for x in losses) / len(models):.4f}")
    if own_bar:
        bar.close()

    for g in groups:
        g.write_back()
    for model in models:
        check_finite(model, "train_many (after the last step)")
    settings = dict(steps=steps, batch_size=batch_size, lr=lr, weight_decay=weight_decay, warmup=warmup)
    for model, seed, history in zip(models, seeds, histories):
        mark_trained(model, task, history, **settings, seed=seed)
    return models


def check_loss_of_models(loss: Tensor, indices: list[int], step: int, lr: float) -> None:
    """ValueError naming the models (by input index) whose loss at `step` is not finite."""
    bad = ~torch.isfinite(loss.detach())
    if bad.any():
        which = [indices[i] for i in bad.nonzero().flatten().tolist()]
        raise ValueError(
            f"training diverged: at step {step} the loss of model(s) {which} is not finite "
            f"({loss.detach()[bad].tolist()[:4]}) with lr={lr!r}; lower the learning rate"
        )


def _fill_missing_grads(optimizer: torch.optim.Optimizer) -> None:
    """Give zero gradients to parameters the loss does not reach (b_K of a one-layer model
    without positions): AdamW then still applies weight decay to them, as in hc.train."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is None:
                p.grad = torch.zeros_like(p)


def _log(histories: list[list], indices: list[int], step: int, loss: Tensor, acc: Tensor) -> None:
    for i, loss_k, acc_k in zip(indices, loss.tolist(), acc.tolist()):
        histories[i].append({"step": step, "loss": loss_k, "acc": acc_k})
