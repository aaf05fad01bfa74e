"""Training many attention-only models at once.

The parameters of models with the same shape are stacked along a leading model
axis ([K, ...]) and trained by one fused forward (`headcoop.models.fused`) that computes only
what the loss needs: the logits at the task's loss positions. Each model keeps its own
initialisation, its own data stream (`task.sample(batch_size, seed=step_seed(seed_k, step))`)
and its own AdamW state, exactly as `headcoop.training.loop.train` would give it; Adam
and weight decay are elementwise, so stacking changes nothing but float rounding.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import io
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
from jaxtyping import Int
from torch import Tensor

from headcoop.checks import check_finite, check_int, check_seed, usable_device
from headcoop.display.progress import tqdm
from headcoop.models.fused import attn_scales, check_supported, fused_logits, stack_parameters
from headcoop.models.tl import HookedTransformer, HookedTransformerConfig
from headcoop.tasks.base import Batch, Task, build_model, check_sample_size, hold_entries
from headcoop.training.loop import (
    TrainConfig,
    deterministic,
    make_optimizer,
    mark_trained,
    step_seed,
    trainable_parameters,
)

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


# --- models and groups -----------------------------------------------------------------


def model_settings(task: Task) -> list[str]:
    """The keyword arguments `task.model` accepts besides seed (n_heads, d_model, ...)."""
    return [p for p in inspect.signature(task.config).parameters if p != "self"]


def resolved(device: str) -> torch.device:
    """`device` as its parameters name it: "cuda" is the current CUDA device ("cuda:0", ...)."""
    want = torch.device(device)
    if want.type == "cuda" and want.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return want


def move(model: HookedTransformer, device: str) -> HookedTransformer:
    """`model` on `device` (TransformerLens's `.to`, which updates cfg.device), without its printout."""
    if next(model.parameters()).device == resolved(device):
        return model
    with contextlib.redirect_stdout(io.StringIO()):
        return model.to(device)


def _named_device(item: Any) -> str | None:
    if isinstance(item, HookedTransformer):
        return str(next(item.parameters()).device)
    if isinstance(item, HookedTransformerConfig):
        return str(item.device) if item.device is not None else None
    return item.get("device") if isinstance(item, dict) else None


def build(task: Task, item: Any, seed: int, device: str = "cpu") -> HookedTransformer:
    """The model an item of `train_many` stands for: a model as is; a config or a dict of
    `task.model` kwargs built with `seed` (on the CPU, so a seed gives the same initial weights
    everywhere), prepared by the task and moved to `device`."""
    if isinstance(item, HookedTransformer):
        model = item
    elif isinstance(item, HookedTransformerConfig):
        model = task.prepare(move(build_model(item, seed), device))
    elif isinstance(item, dict):
        unknown = sorted(set(item) - set(model_settings(task)))
        if unknown:
            raise ValueError(f"unknown {task.name} model setting(s) {unknown}; valid ones are {model_settings(task)}")
        model = move(task.model(seed=seed, **item), device)  # built on the CPU: the same weights everywhere
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
        task = getattr(models[0], "task", None)
        if task is not None:  # entries the task holds fixed stay fixed in the stacked copies too
            hold_entries(self.params, task.held_entries(models[0]))
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
    steps: int | None = None,
    batch_size: int | None = None,
    lr: float | None = None,
    weight_decay: float | None = None,
    warmup: int | None = None,
    seeds: Sequence[int] | None = None,
    progress: bool | Any = True,
    log_every: int = 50,
    config: TrainConfig | None = None,
    device: str | None = None,
    on_checkpoint: Callable[[int, list[HookedTransformer]], None] | None = None,
    checkpoint_every: int | None = None,
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
    config: a TrainConfig (steps .. warm-up and schedule; its seed is replaced by each model's own);
    the keywords steps .. warmup override single fields of it.
    on_checkpoint, checkpoint_every: call on_checkpoint(step, models) after every `checkpoint_every`
    optimizer steps (step counts those done), with the models' weights as they are then (training
    continues on its own copy; the callback may read them, e.g. to measure a checkpoint, not train them).
    device: where configs and dicts are built and every model trains ("cpu", "cuda", "cuda:1"); None:
    the given models' device, else the CPU. One device for all: models elsewhere are a ValueError, a
    device this machine lacks a RuntimeError (no silent CPU fallback).
    Long: the docstring documents each argument; the body is one pass over shape groups (group, stack, train, unstack) that shares their state.
    """
    if not isinstance(task, Task):
        raise TypeError(f"task must be a headcoop Task such as hc.Count01(), got {type(task).__name__}")
    cfg = TrainConfig.resolve(config, steps=steps, batch_size=batch_size, lr=lr, weight_decay=weight_decay,
                              warmup=warmup)  # fmt: skip
    steps, batch_size = cfg.steps, cfg.batch_size
    check_int("log_every", log_every, 1)
    if (on_checkpoint is None) != (checkpoint_every is None):
        raise ValueError("pass on_checkpoint and checkpoint_every together (a callable and a step count)")
    if on_checkpoint is not None:
        check_int("checkpoint_every", checkpoint_every, 1)
        if not callable(on_checkpoint):
            raise TypeError(f"on_checkpoint must be callable, got {type(on_checkpoint).__name__}")
    check_sample_size(batch_size, task.n_ctx)
    if not isinstance(progress, bool) and not hasattr(progress, "update"):
        raise TypeError(f"progress must be True, False or a tqdm bar, got {progress!r}")
    if isinstance(configs_or_models, (str, bytes, dict)) or not isinstance(configs_or_models, Sequence):
        raise TypeError(f"train_many takes a list of configs, dicts or models, got {type(configs_or_models).__name__}")
    items = list(configs_or_models)
    if not items:
        raise ValueError("train_many needs at least one config or model")
    seeds = _check_seeds(seeds, len(items))
    device = usable_device(device)
    if device is None:  # the device the items name, if they agree
        given = {d for d in (usable_device(_named_device(item)) for item in items) if d is not None}
        if len(given) > 1:
            raise ValueError(f"train_many trains on one device; the models name {sorted(given)}: pass device=")
        device = given.pop() if given else "cpu"
    models = [build(task, item, seed, device) for item, seed in zip(items, seeds)]
    elsewhere = sorted({str(next(m.parameters()).device) for m in models} - {str(resolved(device))})
    if elsewhere:
        raise ValueError(f"train_many trains on one device, {device!r}; models given on {elsewhere}: move them "
                         f"with model.to({device!r}) or pass device=")  # fmt: skip
    if len({id(m) for m in models}) != len(models):
        raise ValueError("the same model object appears more than once; pass distinct models")
    for model in models:
        check_finite(model, "train_many")
        trainable_parameters(model)
    groups = group_models(models, seeds)
    stream_seeds = sorted(set(seeds))
    optimizer = make_optimizer([p for g in groups for p in g.trainable()], cfg.lr, cfg.weight_decay)
    histories = [list(getattr(m, "history", [])) for m in models]

    own_bar = not hasattr(progress, "update")
    bar: Any = tqdm(total=steps, desc=f"train_many {task.name} x{len(models)}", disable=not progress) \
        if own_bar else progress  # fmt: skip
    with deterministic(groups[0].device):
        for step in range(steps):
            for group in optimizer.param_groups:
                group["lr"] = cfg.lr_at(step)
            data = sample_streams(task, batch_size, [step_seed(s, step) for s in stream_seeds])
            on_device = {}
            losses, logged = [], step % log_every == 0 or step == steps - 1
            for g in groups:
                if g.device not in on_device:
                    on_device[g.device] = data.to(g.device)
                batch = on_device[g.device].select(g.rows)
                logits = fused_logits(g.params, g.cfg, batch.tokens, batch.loss_pos, g.positional)
                loss = task.row_loss(logits, cast(Batch, batch))  # [K]; Streams carries a Batch's fields
                check_loss_of_models(loss, g.indices, step, cfg.lr)
                losses.append(loss)
                if logged:
                    acc = task.row_correct(logits.detach(), cast(Batch, batch)).flatten(1).float().mean(1)
                    _log(histories, g.indices, step, loss.detach(), acc)
            optimizer.zero_grad(set_to_none=False)
            cast(Tensor, sum(loss.sum() for loss in losses)).backward()
            if step == 0:
                _fill_missing_grads(optimizer)
            optimizer.step()
            bar.update(1 if own_bar else len(models))
            if on_checkpoint is not None and checkpoint_every is not None and (step + 1) % checkpoint_every == 0:
                for g in groups:
                    g.write_back()
                with torch.no_grad():
                    on_checkpoint(step + 1, models)
            if logged and own_bar:
                bar.set_postfix(loss=f"{sum(x.detach().sum().item() for x in losses) / len(models):.4f}")
    if own_bar:
        bar.close()

    for g in groups:
        g.write_back()
    for model in models:
        check_finite(model, "train_many (after the last step)")
    for model, seed, history in zip(models, seeds, histories):
        mark_trained(model, task, history, dataclasses.replace(cfg, seed=seed))
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
