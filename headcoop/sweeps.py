"""Resumable sweeps: train every (grid point, seed) with train_many and save each as a checkpoint.

A run's checkpoint is `OUT/<model name>-s<seed>` (e.g. `count01-L1-H16-d32-dh2-s0`). A run
is finished when `hc.load` can read its checkpoint, so re-running an interrupted sweep
trains only what is missing; temporary folders left by a killed save are removed.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm.auto import tqdm

from headcoop.checkpoints import load, save
from headcoop.fast_train import model_settings, train_many
from headcoop.tasks.base import Task
from headcoop.train import check_training_args

Grid = Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Any]]


def expand_grid(task: Task, grid: Grid) -> list[dict[str, Any]]:
    """The grid points: a list of dicts of `task.model` kwargs as given, or the cartesian
    product of a dict of lists (in key order, the last key varying fastest)."""
    if isinstance(grid, Mapping):
        keys = list(grid)
        values = [v if isinstance(v, (list, tuple, range)) else [v] for v in grid.values()]
        if any(len(v) == 0 for v in values):
            raise ValueError(f"every grid entry needs at least one value, got {dict(grid)}")
        points = [dict(zip(keys, combo)) for combo in itertools.product(*values)]
    elif isinstance(grid, Sequence) and not isinstance(grid, str) and all(isinstance(p, Mapping) for p in grid):
        points = [dict(p) for p in grid]
    else:
        raise TypeError(f"grid must be a list of dicts or a dict of lists, got {type(grid).__name__}")
    if not points:
        raise ValueError("the grid is empty")
    valid = model_settings(task)
    for point in points:
        unknown = sorted(set(point) - set(valid))
        if unknown:
            raise ValueError(f"unknown {task.name} model setting(s) {unknown} in the grid; valid ones are {valid}")
    return points


def run_name(task: Task, point: Mapping[str, Any], seed: int) -> str:
    """The folder name of one run: the model's config name and the seed, e.g. 'count01-L1-H4-d8-dh2-s0'."""
    return f"{task.config(**point).model_name}-s{seed}"


def _check_seeds(seeds: Sequence[int]) -> list[int]:
    seeds = [seeds] if isinstance(seeds, int) else list(seeds)
    if not seeds:
        raise ValueError("seeds is empty; pass at least one int")
    for s in seeds:
        if not isinstance(s, int) or isinstance(s, bool):
            raise TypeError(f"seeds must be ints, got {s!r}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds repeat: {seeds}")
    return seeds


def remove_leftovers(out: Path, names: Sequence[str]) -> list[Path]:
    """Delete the temporary folders `hc.save` leaves in `out` when killed mid-write
    (`.<name>.<random>` for the given run names); returns what was removed."""
    pattern = re.compile(r"^\.(%s)\.[^.]+$" % "|".join(re.escape(n) for n in names))
    removed = []
    for entry in out.iterdir():
        if entry.is_dir() and pattern.match(entry.name):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def finished_metrics(path: Path, task: Task, settings: dict[str, Any]) -> dict[str, Any] | None:
    """The saved metrics of a finished run at `path`, None when there is no readable checkpoint.

    ValueError when the checkpoint was trained for another task or with other settings.
    """
    try:
        model = load(path)
    except (FileNotFoundError, ValueError):
        return None
    meta = model.checkpoint_meta
    if meta.get("task") != task.to_dict() or meta.get("train") != settings:
        raise ValueError(
            f"{path} holds a run with other settings (task {meta.get('task')}, training {meta.get('train')}); "
            f"this sweep wants task {task.to_dict()}, training {settings}. Use another out folder."
        )
    return dict(meta.get("metrics") or {})


def sweep(
    task: Task,
    grid: Grid,
    seeds: Sequence[int],
    out: str | os.PathLike,
    steps: int = 3000,
    batch_size: int = 256,
    lr: float = 1e-2,
    weight_decay: float = 0.0,
    warmup: int = 100,
    progress: bool = True,
    chunk: int = 32,
) -> pd.DataFrame:
    """Train every (grid point, seed) not yet finished in `out` and save each model there.

    grid: list of dicts of `task.model` kwargs, or a dict of lists (cartesian product).
    Runs are trained `chunk` models at a time with train_many (grouped by shape) and saved
    with their `task.evaluate` metrics after each chunk, so an interrupted sweep loses at most
    one chunk. Returns one row per run: the grid settings, seed, metrics, name and path.
    """
    check_training_args(steps, batch_size, lr)
    if not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be a positive int, got {chunk!r}")
    points, seeds = expand_grid(task, grid), _check_seeds(seeds)
    out = Path(out)
    runs = [(point, seed, run_name(task, point, seed)) for point in points for seed in seeds]
    names = [name for _, _, name in runs]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"grid points give the same model {twice}; remove the duplicates")
    out.mkdir(parents=True, exist_ok=True)
    remove_leftovers(out, names)

    settings = dict(steps=steps, batch_size=batch_size, lr=lr, weight_decay=weight_decay, warmup=warmup)
    metrics = {
        name: finished_metrics(out / name, task, dict(settings, seed=seed)) for _, seed, name in runs
    }
    pending = [run for run in runs if metrics[run[2]] is None]
    bar = tqdm(total=len(pending) * steps, desc=f"sweep {task.name}", unit="model-step", disable=not progress)
    for start in range(0, len(pending), chunk):
        part = pending[start : start + chunk]
        models = train_many(
            task, [point for point, _, _ in part], seeds=[seed for _, seed, _ in part],
            progress=bar, **settings,
        )  # fmt: skip
        for (point, seed, name), model in zip(part, models):
            metrics[name] = task.evaluate(model)
            save(model, out / name, metrics=metrics[name], sweep={"grid": point, "seed": seed})
    bar.close()

    return pd.DataFrame(
        [{**point, "seed": seed, **metrics[name], "name": name, "path": str(out / name)} for point, seed, name in runs]
    )


# --- command line ------------------------------------------------------------------------


def _cmd_sweep(args: argparse.Namespace) -> int:
    from headcoop.tasks import TASKS

    params = {"positional": True} if args.positional else {}
    if params and args.task != "count01":
        raise ValueError("--positional applies to count01 only")
    task = TASKS[args.task](**params)
    grid = dict(n_heads=args.heads, d_model=args.d_model, d_head=args.d_head, n_layers=args.layers)
    grid = {key: values for key, values in grid.items() if values is not None}
    table = sweep(
        task, grid, args.seeds, args.out, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
        weight_decay=args.weight_decay, warmup=args.warmup, progress=not args.no_progress, chunk=args.chunk,
    )  # fmt: skip
    csv = Path(args.out) / "sweep.csv"
    table.to_csv(csv, index=False)
    print(table.drop(columns=["path"]).to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    print(f"{len(table)} runs in {args.out} (table: {csv})")
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `headcoop sweep TASK --heads 1 2 4 --d-model 8 16 --d-head 2 --seeds 0 1 2 --steps N --out DIR`."""
    from headcoop.tasks import TASKS

    p = subparsers.add_parser(
        "sweep",
        help="train a grid of model sizes x seeds (resumable) and tabulate their accuracy",
        description="Train every combination of the given sizes and seeds, many models at once, saving each "
        "as OUT/<name>-s<seed>. Re-running the same command skips finished runs, so an interrupted "
        "sweep resumes. Prints the table of metrics and writes it to OUT/sweep.csv.",
    )
    p.add_argument("task", choices=sorted(TASKS), help="the toy task")
    p.add_argument("--heads", type=int, nargs="+", default=None, help="head counts to try (task default)")
    p.add_argument("--d-model", type=int, nargs="+", default=None, help="residual widths (Count01 only)")
    p.add_argument("--d-head", type=int, nargs="+", default=None, help="head widths (task default)")
    p.add_argument("--layers", type=int, nargs="+", default=None, help="layer counts (default 1)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="seeds of weights and data (default 0)")
    p.add_argument("--steps", type=int, default=3000, help="optimizer steps per model (default 3000)")
    p.add_argument("--batch-size", type=int, default=256, help="sequences per step (default 256)")
    p.add_argument("--lr", type=float, default=1e-2, help="peak learning rate (default 1e-2)")
    p.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay (default 0)")
    p.add_argument("--warmup", type=int, default=100, help="linear warm-up steps (default 100)")
    p.add_argument("--positional", action="store_true", help="Count01 with a learned positional embedding")
    p.add_argument("--chunk", type=int, default=32, help="models trained together between saves (default 32)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.add_argument("--out", required=True, help="folder of the sweep's checkpoints")
    p.set_defaults(func=_cmd_sweep)
    return p
