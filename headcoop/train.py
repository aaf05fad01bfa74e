"""Training one model: cross-entropy only at the task's loss positions."""

from __future__ import annotations

import math

import torch
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer

from headcoop.tasks.base import Task


def step_seed(seed: int, step: int) -> int:
    """The data seed of one training step: every step sees fresh, repeatable samples."""
    return (seed * 1_000_003 + step) % (2**62)


def lr_at(step: int, steps: int, lr: float, warmup: int) -> float:
    """Linear warm-up over `warmup` steps, then cosine decay to lr / 10."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def make_optimizer(params, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.98), weight_decay=weight_decay)


def check_training_args(steps: int, batch_size: int, lr: float) -> None:
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    if not lr > 0:
        raise ValueError(f"lr must be positive, got {lr!r}")


def train(
    task: Task,
    model: HookedTransformer,
    steps: int = 3000,
    batch_size: int = 256,
    lr: float = 1e-2,
    weight_decay: float = 0.0,
    warmup: int = 100,
    seed: int = 0,
    log_every: int = 50,
    progress: bool = True,
) -> HookedTransformer:
    """Train `model` on `task` with AdamW; the loss counts only the task's loss positions.

    Deterministic on CPU: batches come from `task.sample(batch_size, seed=step_seed(seed, step))`.
    Returns the same model, in eval mode, with `model.history` (a list of
    {step, loss, acc} every `log_every` steps) and `model.train_settings`.
    """
    check_training_args(steps, batch_size, lr)
    device = next(model.parameters()).device
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(params, lr, weight_decay)
    history = list(getattr(model, "history", []))
    model.train()
    bar = tqdm(range(steps), desc=f"train {task.name}", disable=not progress, leave=False)
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, steps, lr, warmup)
        batch = task.sample(batch_size, seed=step_seed(seed, step)).to(device)
        logits = model(batch.tokens)
        loss = task.loss(logits, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % log_every == 0 or step == steps - 1:
            acc = task.correct(logits.detach(), batch).float().mean().item()
            history.append({"step": step, "loss": loss.item(), "acc": acc})
            bar.set_postfix(loss=f"{loss.item():.4f}", acc=f"{acc:.3f}")
    return mark_trained(
        model, task, history, steps=steps, batch_size=batch_size, lr=lr, weight_decay=weight_decay, warmup=warmup, seed=seed
    )


def mark_trained(model: HookedTransformer, task: Task, history: list[dict], **settings) -> HookedTransformer:
    """Put `model` in eval mode with its task, training history and settings attached (what `hc.save` records)."""
    model.eval()
    model.task = task
    model.history = history
    model.train_settings = settings
    return model


def evaluate(model: HookedTransformer, task: Task | None = None, **kwargs) -> dict[str, float]:
    """The task's accuracies for `model` on fresh samples (the model's own task by default)."""
    task = task or getattr(model, "task", None)
    if task is None:
        raise ValueError("this model carries no task; pass one: hc.evaluate(model, hc.Count01())")
    model.eval()
    return task.evaluate(model, **kwargs)
