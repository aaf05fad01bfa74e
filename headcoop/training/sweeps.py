"""Resumable sweeps: train every (grid point, seed) with train_many and save each as a checkpoint.

A run's checkpoint is `OUT/<model name>-s<seed>` (e.g. `count01-L1-H16-d32-dh2-s0`). A run
is finished when `hc.load` can read its checkpoint, so re-running an interrupted sweep
trains only what is missing; temporary folders left by a killed save are removed. Sweeps
started into one folder at once claim runs before training them (see `headcoop.training.chunk_locks`).
"""

from __future__ import annotations

import dataclasses
import errno
import itertools
import os
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd
import torch

from headcoop.checks import check_float, check_int, check_out_folder, check_seed, usable_device
from headcoop.display.progress import tqdm
from headcoop.storage.checkpoints import check_save_target, clean_leftovers, load, read_meta, save
from headcoop.tasks.base import Task, check_sample_size
from headcoop.training.chunk_locks import Claims
from headcoop.training.executors import as_executor, chunk_size, each_result, lost_worker, renewed
from headcoop.training.fast import model_settings, train_many
from headcoop.training.loop import TrainConfig

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


class Run(NamedTuple):
    """One run of a sweep: its grid point (`task.model` kwargs), its seed, and its folder name."""

    point: dict[str, Any]
    seed: int
    name: str


def run_name(task: Task, point: Mapping[str, Any], seed: int) -> str:
    """The folder name of one run: the model's config name and the seed, e.g. 'count01-L1-H4-d8-dh2-s0'."""
    return f"{task.config(**point).model_name}-s{seed}"


def _check_seeds(seeds: Sequence[int]) -> list[int]:
    seeds = [seeds] if isinstance(seeds, int) and not isinstance(seeds, bool) else seeds
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Iterable):
        raise TypeError(f"seeds must be an int or a list of ints, got {seeds!r}")
    seeds = [check_seed(s, "each seed") for s in seeds]
    if not seeds:
        raise ValueError("seeds is empty; pass at least one int")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds repeat: {seeds}")
    return seeds


def finished_metrics(path: Path, task: Task, config: TrainConfig) -> dict[str, Any] | None:
    """The saved metrics of a finished run at `path`, None when there is no readable checkpoint.

    ValueError when the checkpoint was trained for another task or with other settings.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            meta = read_meta(path)
    except (FileNotFoundError, ValueError):
        return None
    try:
        train = meta.get("train")
        saved = TrainConfig.from_dict(train) if isinstance(train, dict) else None  # none recorded: not this sweep's
    except (TypeError, ValueError):
        saved = None
    if meta.get("task") != task.to_dict() or saved != config:
        raise ValueError(
            f"{path} holds a run with other settings (task {meta.get('task')}, training {meta.get('train')}); "
            f"this sweep wants task {task.to_dict()}, training {config.to_dict()}. Use another out folder."
        )
    try:
        load(path)  # the weights too: a damaged run is trained again
    except (FileNotFoundError, ValueError):
        return None
    return dict(meta.get("metrics") or {})


def sweep(
    task: Task,
    grid: Grid,
    seeds: Sequence[int],
    out: str | os.PathLike,
    steps: int | None = None,
    batch_size: int | None = None,
    lr: float | None = None,
    weight_decay: float | None = None,
    warmup: int | None = None,
    progress: bool = True,
    chunk: int = 32,
    poll_s: float = 0.5,
    config: TrainConfig | None = None,
    executor: Any = None,
    device: str | None = None,
    threads: int | None = None,
    retries: int = 2,
) -> pd.DataFrame:
    """Train every (grid point, seed) not yet finished in `out` and save each model there.

    grid: list of dicts of `task.model` kwargs, or a dict of lists (cartesian product).
    Runs are trained `chunk` models at a time with train_many (grouped by shape) and saved
    with their `task.evaluate` metrics after each chunk, so an interrupted sweep loses at most
    one chunk. Sweeps started into the same folder at once share the work: each run is claimed
    (`OUT/.headcoop-claims/<run>`) by the sweep that trains it, the others skip it and, at the end,
    wait for it (polling every `poll_s` seconds; a claim whose process died is taken over).
    Training follows `config` (a TrainConfig; the keywords steps .. warmup override single fields), each
    run with its own seed from `seeds`. Returns one row per run: the grid settings, seed, metrics, name,
    path and `status` ("trained", "finished before", "trained by another sweep", or "failed" with a
    `reason` column: a run whose worker died once more than `retries` allows, or whose checkpoint does not
    load; a warning names them, and running the same sweep again trains them). A run is "trained" only once
    its saved checkpoint loads.

    executor: None trains in this process. Otherwise chunks of runs of one shape go to
    `executor.submit`: a `concurrent.futures.ProcessPoolExecutor`, a `dask.distributed.Client` (or its
    `get_executor()`), a Ray executor (`headcoop.training.executors`). Each chunk's worker trains it with
    `train_many`, saves every run atomically into `out` itself and returns the metrics; this process
    holds the runs' claims and shows one progress bar (advanced per finished chunk). A chunk whose
    worker died is sent again (at most `retries` times; runs it already saved are not retrained), and
    weights are bit-identical to a serial sweep's (seeds decide everything; see `deterministic`).
    device: where models train ("cpu", "cuda"); RuntimeError where the machine has no such device.
    threads: torch threads per chunk (None: one with an executor, where workers run side by side and more
    threads each would oversubscribe the cores; in this process, its own setting).
    A process pool broken by a killed worker is replaced by a new pool of the same size (shut down at the
    end) and the lost chunks are sent there.
    Long: the docstring documents each argument and the resume rules; the body is 62 lines.
    """
    cfg = TrainConfig.resolve(config, steps=steps, batch_size=batch_size, lr=lr, weight_decay=weight_decay,
                              warmup=warmup)  # fmt: skip
    check_int("chunk", chunk, 1)
    check_float("poll_s", poll_s, 0.0, low_open=True)
    check_int("retries", retries, 0)
    if threads is not None:
        check_int("threads", threads, 1)
    device = usable_device(device)
    if executor is not None:
        executor = as_executor(executor)
        if threads is None:  # workers run side by side: torch's default (every core each) oversubscribes 30-70x
            threads = 1
    if not isinstance(task, Task):
        raise TypeError(f"task must be a headcoop Task such as hc.Count01(), got {type(task).__name__}")
    points, seeds = expand_grid(task, grid), _check_seeds(seeds)
    check_sample_size(cfg.batch_size, task.n_ctx)
    out = check_out_folder(out, "sweep")
    runs = [Run(point, seed, run_name(task, point, seed)) for point in points for seed in seeds]
    names = [name for _, _, name in runs]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"grid points give the same model {twice}; remove the duplicates")
    out.mkdir(parents=True, exist_ok=True)

    claims = Claims(out)
    metrics: dict[str, dict | None] = {}
    status: dict[str, str] = {}
    for _, seed, name in runs:
        if not claims.alive(name):
            clean_leftovers(out / name)
            claims.clear_stale(name)
        metrics[name] = finished_metrics(out / name, task, dataclasses.replace(cfg, seed=seed))
        if metrics[name] is not None:
            status[name] = "finished before"
    pending = [run for run in runs if metrics[run.name] is None]
    for _, _, name in pending:  # a folder in the way that headcoop did not write: refused before any training
        check_save_target(out / name)
    bar = tqdm(total=len(pending) * cfg.steps, desc=f"sweep {task.name}", unit="model-step", disable=not progress)
    work = SweepWork(task, out, cfg, chunk, claims, metrics, status, bar, executor, device, threads, retries)
    try:
        work.train(pending)
        _wait_for_others(work, pending, poll_s)
    except OSError as err:
        if err.errno == errno.ENOSPC:
            raise OSError(
                errno.ENOSPC,
                f"sweep stopped: no space left on the device for {out}; finished runs "
                "are kept, free space and run the same sweep again to resume",
            ) from None
        raise
    finally:
        claims.release_all()
        bar.close()
        for pool in work.owned:
            pool.shutdown(wait=False, cancel_futures=True)

    table = pd.DataFrame(
        [{**point, "seed": seed, **(metrics[name] or {}), "name": name, "path": str(out / name),
          "status": status[name], **({"reason": work.reasons[name]} if name in work.reasons else {})}
         for point, seed, name in runs]
    )  # fmt: skip
    if work.reasons:
        warnings.warn(f"sweep: {len(work.reasons)} run(s) failed: {sorted(work.reasons)[:4]}; see the table's "
                      "'reason' column and run the same sweep again to resume", stacklevel=2)  # fmt: skip
    return table


@dataclasses.dataclass
class SweepWork:
    """What one sweep trains, where, and what it has learnt so far (metrics and status per run name)."""

    task: Task
    out: Path
    cfg: TrainConfig
    chunk: int
    claims: Claims
    metrics: dict
    status: dict
    bar: Any
    executor: Any = None
    device: str | None = None
    threads: int | None = None
    retries: int = 2
    reasons: dict = dataclasses.field(default_factory=dict)  # run name -> why it failed
    owned: list = dataclasses.field(default_factory=list)  # executors this sweep started (replacement pools)

    def finished(self, seed: int, name: str) -> dict | None:
        return finished_metrics(self.out / name, self.task, dataclasses.replace(self.cfg, seed=seed))

    def claim(self, runs: list) -> list:
        """The runs of `runs` this sweep now claims and still has to train."""
        mine = []
        for run in runs:
            point, seed, name = run
            if not self.claims.take(name):
                continue
            done = self.finished(seed, name)  # another sweep may have finished it between scan and claim
            if done is None:
                mine.append(run)
                continue
            self.metrics[name], self.status[name] = done, "trained by another sweep"
            self.claims.release(name)
            self.bar.update(self.cfg.steps)
        return mine

    def record(self, results: dict, advance: bool = True, runs: list | None = None) -> None:
        """Note each run's metrics and status. With `runs` (a chunk that came back from a worker), a run
        counts as "trained" only once its checkpoint loads here; otherwise it is "failed", with the reason."""
        seeds = {name: seed for _, seed, name in runs or []}
        for name, (metrics, status) in results.items():
            if runs is not None and self.finished(seeds[name], name) is None:
                metrics, status = None, "failed"
                self.reasons[name] = "the worker reported it trained, but its checkpoint does not load here"
            self.metrics[name], self.status[name] = metrics, status
            self.claims.release(name)
            if advance:  # (a chunk trained here has advanced the bar step by step)
                self.bar.update(self.cfg.steps)

    def fail(self, runs: list, reason: str) -> None:
        """Mark runs "failed" with `reason`: what one can resume by running the same sweep again."""
        for _, seed, name in runs:
            done = self.finished(seed, name)  # the worker may have saved some before it died
            if done is not None:
                self.metrics[name], self.status[name] = done, "trained"
            else:
                self.metrics[name], self.status[name], self.reasons[name] = None, "failed", reason
            self.claims.release(name)
            self.bar.update(self.cfg.steps)

    def train(self, runs: list) -> None:
        """Train every run of `runs` that no other live sweep has claimed."""
        if self.executor is None:
            for start in range(0, len(runs), self.chunk):
                mine = self.claim(runs[start : start + self.chunk])
                if mine:
                    results = train_chunk(ChunkJob(self.task, self.cfg, mine, str(self.out), self.device,
                                                   self.threads, progress=self.bar))  # fmt: skip
                    self.record(results, advance=False)
            return
        mine = self.claim(runs)
        size = chunk_size(self.chunk, len(mine), self.executor)
        jobs = [ChunkJob(self.task, self.cfg, part, str(self.out), self.device, self.threads)
                for part in _chunks_of_one_shape(mine, size)]  # fmt: skip
        for attempt in range(self.retries + 1):
            failed = []
            for job, results, error in each_result(self.executor, train_chunk, jobs):
                if error is None:
                    self.record(results, runs=job.runs)
                elif lost_worker(error) and attempt < self.retries:
                    failed.append(job)
                elif lost_worker(error):
                    self.fail(job.runs, f"its worker died ({type(error).__name__}) and the chunk was sent "
                                        f"{self.retries + 1} time(s); run the same sweep again to resume")  # fmt: skip
                else:
                    names = [name for _, _, name in job.runs]
                    raise RuntimeError(
                        f"sweep: the chunk of runs {names} failed on its worker ({type(error).__name__}: {error}); "
                        "finished runs are kept in the out folder, run the same sweep again to resume"
                    ) from error
            if not failed:
                return
            jobs = failed
            fresh = renewed(self.executor)  # a process pool broken by the death takes no more work
            if fresh is not self.executor:
                self.owned.append(fresh)
                self.executor = fresh


def _chunks_of_one_shape(runs: list, size: int) -> list[list]:
    """Runs grouped by grid point (one model shape per chunk), at most `size` per chunk, in run order."""
    by_point: dict[str, list] = {}
    for run in runs:
        by_point.setdefault(repr(sorted(run.point.items())), []).append(run)
    return [group[i : i + size] for group in by_point.values() for i in range(0, len(group), size)]


@dataclasses.dataclass(frozen=True)
class ChunkJob:
    """One chunk of runs for one worker: train them together and save each into `out`."""

    task: Task
    config: TrainConfig
    runs: list  # [Run]
    out: str
    device: str | None = None
    threads: int | None = None
    progress: Any = False  # a tqdm bar in this process; never sent to a worker


def train_chunk(job: ChunkJob) -> dict[str, tuple[dict, str]]:
    """Train the runs of `job` not yet saved in `job.out` (an earlier attempt of a chunk whose worker
    died may have saved some) with `train_many`, and save each atomically; returns {run name: (metrics,
    status)}. Runs in a worker process (any executor) or in the sweep's own."""
    before = torch.get_num_threads()
    if job.threads is not None:
        torch.set_num_threads(job.threads)
    try:
        return _train_chunk(job)
    finally:
        torch.set_num_threads(before)  # (a serial sweep runs this in the caller's own process)


def _train_chunk(job: ChunkJob) -> dict[str, tuple[dict, str]]:
    out, results, todo = Path(job.out), {}, []
    for point, seed, name in job.runs:
        clean_leftovers(out / name)  # a temporary folder of a killed attempt (its writer is gone)
        done = finished_metrics(out / name, job.task, dataclasses.replace(job.config, seed=seed))
        if done is None:
            todo.append((point, seed, name))
        else:
            results[name] = (done, "trained")  # by an earlier attempt of this sweep's chunk
    if todo:
        models = train_many(job.task, [point for point, _, _ in todo], seeds=[seed for _, seed, _ in todo],
                            progress=job.progress, config=job.config, device=job.device)  # fmt: skip
        for (point, seed, name), model in zip(todo, models):
            metrics = job.task.evaluate(model)
            save(model, out / name, metrics=metrics, sweep={"grid": point, "seed": seed})
            results[name] = (metrics, "trained")
    return results


def _wait_for_others(work: SweepWork, pending: list, poll_s: float) -> None:
    """Wait for the runs other sweeps claimed; train any whose claimer died without finishing it."""
    metrics = work.metrics
    while True:
        missing = [run for run in pending if metrics[run.name] is None and work.status.get(run.name) != "failed"]
        if not missing:
            return
        for point, seed, name in missing:
            done = work.finished(seed, name)
            if done is not None:
                metrics[name], work.status[name] = done, "trained by another sweep"
                work.bar.update(work.cfg.steps)
        orphans = [run for run in missing if metrics[run.name] is None and not work.claims.alive(run.name)]
        if orphans:
            work.train(orphans)
        elif any(metrics[run.name] is None for run in missing):
            time.sleep(poll_s)
