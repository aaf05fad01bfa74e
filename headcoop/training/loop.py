"""Training one model: cross-entropy only at the task's loss positions."""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator
from typing import Any, Literal

import torch

from headcoop.checks import check_finite, check_float, check_int, check_seed
from headcoop.display.progress import tqdm
from headcoop.models.tl import HookedTransformer, attach
from headcoop.tasks.base import Task, check_sample_size


def step_seed(seed: int, step: int) -> int:
    """The data seed of one training step: every step sees fresh, repeatable samples."""
    return (seed * 1_000_003 + step) % (2**62)


Schedule = Literal["cosine", "constant"]
SCHEDULES = ("cosine", "constant")


def lr_at(step: int, steps: int, lr: float, warmup: int, schedule: Schedule = "cosine") -> float:
    """Linear warm-up over `warmup` steps, then cosine decay to lr / 10 ("cosine") or lr itself ("constant")."""
    if step < warmup:
        return lr * (step + 1) / warmup
    if schedule == "constant":
        return lr
    progress = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """How a model is trained: the one configuration of `hc.train`, `hc.train_many`, `hc.sweep`, the CLI and
    the checkpoint JSON ("train"). Validated on construction; errors name the bad value.

    steps:        optimizer steps.                      batch_size:   sequences per step.
    lr:           peak learning rate (AdamW, betas 0.9/0.98).
    weight_decay: AdamW weight decay.                   warmup:       steps of linear warm-up.
    schedule:     after warm-up, "cosine" decay to lr / 10, or "constant".
    seed:         the data stream (and, where the model is built from a config, its initial weights).
    """

    steps: int = 3000
    batch_size: int = 256
    lr: float = 1e-2
    weight_decay: float = 0.0
    warmup: int = 100
    schedule: Schedule = "cosine"
    seed: int = 0

    def __post_init__(self) -> None:
        check_training_args(self.steps, self.batch_size, self.lr, self.weight_decay, self.warmup)
        check_seed(self.seed)
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}; valid values are {list(SCHEDULES)}")

    def lr_at(self, step: int) -> float:
        """The learning rate of `step`."""
        return lr_at(step, self.steps, self.lr, self.warmup, self.schedule)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, settings: dict[str, Any]) -> "TrainConfig":
        """From `to_dict()` or a checkpoint's "train" entry (older ones lack `schedule`: it was "cosine")."""
        if not isinstance(settings, dict):
            raise TypeError(f"training settings must be a dict, got {type(settings).__name__}")
        unknown = sorted(set(settings) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(
                f"unknown training settings {unknown}; valid ones are {[f.name for f in dataclasses.fields(cls)]}"
            )
        return cls(**settings)

    @classmethod
    def resolve(cls, config: "TrainConfig | None" = None, **overrides: Any) -> "TrainConfig":
        """`config` (default TrainConfig()) with the keyword arguments that are not None put in."""
        if config is not None and not isinstance(config, cls):
            raise TypeError(f"config must be a hc.TrainConfig, got {type(config).__name__}")
        changes = {key: value for key, value in overrides.items() if value is not None}
        return dataclasses.replace(config or cls(), **changes)


def make_optimizer(params, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.98), weight_decay=weight_decay)


def check_training_args(
    steps: int, batch_size: int, lr: float, weight_decay: float = 0.0, warmup: int = 0, log_every: int = 1
) -> None:
    """TypeError/ValueError naming the first bad training setting."""
    check_int("steps", steps, 1)
    check_int("batch_size", batch_size, 1)
    check_float("lr", lr, 0.0, low_open=True)
    check_float("weight_decay", weight_decay, 0.0)
    check_int("warmup", warmup, 0)
    check_int("log_every", log_every, 1)


def trainable_parameters(model: HookedTransformer) -> list[torch.nn.Parameter]:
    """The parameters training updates; ValueError when there are none."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError(
            f"model {model.cfg.model_name!r} has no trainable parameters (every one has requires_grad False)"
        )
    return params


def loss_drop(history: list[dict]) -> float:
    """How much the logged training loss (`model.history`) fell over the last tenth of the run, in nats:
    about 0 on a plateau. Absolute, since a relative drop of a loss near zero says nothing; NaN for a
    history of fewer than two entries."""
    losses = [h["loss"] for h in history]
    if len(losses) < 2:
        return float("nan")
    return losses[max(0, int(len(losses) * 0.9) - 1)] - losses[-1]


@contextlib.contextmanager
def deterministic(device: torch.device) -> Iterator[None]:
    """Deterministic kernels for the length of a `with` block on the CPU, restored afterwards.

    With two or more threads, the CPU backward of the embedding lookup (an index_put with
    accumulation) sums in a thread-dependent order; torch's deterministic mode sorts it instead, so
    the same seed gives bit-identical weights run after run at a given thread count. (Different thread
    counts split matrix products differently and may still differ in the last bits.) CUDA needs an
    environment variable for deterministic cuBLAS, so on GPUs the mode is left as the caller set it.
    """
    if torch.device(device).type != "cpu":
        yield
        return
    before, warn_only = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before, warn_only=warn_only)


def check_loss(loss: torch.Tensor, step: int, lr: float) -> None:
    """ValueError when the loss of `step` is NaN or inf (training diverged)."""
    if not torch.isfinite(loss).all():
        raise ValueError(
            f"training diverged: the loss at step {step} is {loss.detach().flatten().tolist()[:8]} "
            f"(not finite) with lr={lr!r}; lower the learning rate. The model's weights are not usable."
        )


def train(
    task: Task,
    model: HookedTransformer,
    steps: int | None = None,
    batch_size: int | None = None,
    lr: float | None = None,
    weight_decay: float | None = None,
    warmup: int | None = None,
    seed: int | None = None,
    log_every: int = 50,
    progress: bool = True,
    config: TrainConfig | None = None,
) -> HookedTransformer:
    """Train `model` on `task` with AdamW; the loss counts only the task's loss positions.

    The settings are a `TrainConfig` (`config=`, default TrainConfig()), and the keywords steps ..
    seed override single fields of it. Deterministic on CPU at any thread count: batches come from
    `task.sample(batch_size, seed=step_seed(seed, step))` and the kernels run in torch's deterministic
    mode, so the same seed gives bit-identical weights on every run (see `deterministic`).
    Returns the same model, in eval mode, with `model.history` (a list of {step, loss, acc} every
    `log_every` steps) and `model.train_settings` (the TrainConfig as a dict).
    ValueError for a model with non-finite weights, none to train, or a shape the task does not fit,
    and when the loss stops being finite (training diverged).
    """
    if not isinstance(task, Task):
        raise TypeError(f"task must be a headcoop Task such as hc.Count01(), got {type(task).__name__}")
    cfg = TrainConfig.resolve(config, steps=steps, batch_size=batch_size, lr=lr, weight_decay=weight_decay,
                              warmup=warmup, seed=seed)  # fmt: skip
    check_int("log_every", log_every, 1)
    check_sample_size(cfg.batch_size, task.n_ctx)
    if not isinstance(model, HookedTransformer):  # training is for the toy tasks' HookedTransformers
        raise TypeError(f"hc.train needs a HookedTransformer, got {type(model).__name__}")
    task.check_ready(model, "hc.train")
    device = next(model.parameters()).device
    optimizer = make_optimizer(trainable_parameters(model), cfg.lr, cfg.weight_decay)
    history = list(getattr(model, "history", []))
    model.train()
    bar = tqdm(range(cfg.steps), desc=f"train {task.name}", disable=not progress)
    with deterministic(device):
        for step in bar:
            for group in optimizer.param_groups:
                group["lr"] = cfg.lr_at(step)
            batch = task.sample(cfg.batch_size, seed=step_seed(cfg.seed, step)).to(device)
            logits = model(batch.tokens)
            loss = task.loss(logits, batch)
            check_loss(loss, step, cfg.lr)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if step % log_every == 0 or step == cfg.steps - 1:
                acc = task.correct(logits.detach(), batch).float().mean().item()
                history.append({"step": step, "loss": loss.item(), "acc": acc})
            if progress:  # the loss of every step (it is on the host already: check_loss read it)
                bar.set_postfix(loss=f"{loss.item():.4f}", acc=f"{history[-1]['acc']:.3f}", refresh=False)
    model.eval()
    check_finite(model, "hc.train (after the last step)")
    return mark_trained(model, task, history, cfg)


def mark_trained(model: HookedTransformer, task: Task, history: list[dict], config: TrainConfig) -> HookedTransformer:
    """Put `model` in eval mode with its task, training history and settings attached (what `hc.save` records)."""
    model.eval()
    attach(model, task=task, history=history, train_settings=config.to_dict())
    return model


def evaluate(model: HookedTransformer, task: Task | None = None, **kwargs) -> dict[str, float]:
    """The task's accuracies for `model` on fresh samples (the model's own task by default)."""
    if not isinstance(model, HookedTransformer):
        raise TypeError(f"hc.evaluate needs a HookedTransformer, got {type(model).__name__}")
    task = task or getattr(model, "task", None)
    if task is None:
        raise ValueError("this model carries no task; pass one: hc.evaluate(model, hc.Count01())")
    if not isinstance(task, Task):
        raise TypeError(f"task must be a headcoop Task such as hc.Count01(), got {type(task).__name__}")
    check_finite(model, "hc.evaluate")  # whatever the task's own evaluate checks
    model.eval()
    return task.evaluate(model, **kwargs)
