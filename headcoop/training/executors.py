"""Where a sweep's chunks run: any `concurrent.futures.Executor`-style object, or a Dask cluster.

`as_executor` accepts a `concurrent.futures` executor (a process pool), a `dask.distributed.Client`
(its `get_executor(pure=False)` is used) or anything else whose `submit(fn, *args)` returns a future
with `result()` (Ray's executor, for instance). `each_result` yields results as they finish, whatever
kind of future the executor hands back. `dask_client` starts a local Dask cluster of worker processes or
connects to a running scheduler; Dask is the optional extra `headcoop[dist]`. Ray has no
`concurrent.futures` executor of its own; `RayExecutor` is one (each submit a Ray task, its future
`ObjectRef.future()`), extra `headcoop[ray]`.
"""

from __future__ import annotations

import concurrent.futures as cf
import math
from collections.abc import Callable, Iterator
from typing import Any

DASK_MISSING = ('Dask is not installed: distributed sweeps need it. Install it with pip install "headcoop[dist]" '
                '(or pip install "dask[distributed]")')  # fmt: skip


def as_executor(executor: Any) -> Any:
    """The object whose `submit` a sweep calls: a Dask Client's executor, or `executor` itself.

    TypeError for anything without a callable `submit`."""
    if hasattr(executor, "get_executor") and hasattr(executor, "scheduler_info"):  # a dask.distributed Client
        return executor.get_executor(pure=False)
    if not callable(getattr(executor, "submit", None)):
        raise TypeError(
            "executor must have a submit(fn, *args) method: a concurrent.futures.ProcessPoolExecutor, a "
            f"dask.distributed.Client or its get_executor(), a Ray executor; got {type(executor).__name__}"
        )
    return executor


def width(executor: Any) -> int | None:
    """How many chunks the executor runs at once, where it says (Dask: its worker threads; a pool: its
    workers); None where it does not."""
    client = getattr(executor, "_client", None)
    if client is not None and hasattr(client, "nthreads"):
        return sum(client.nthreads().values()) or None
    return getattr(executor, "_max_workers", None)


def chunk_size(chunk: int, n_runs: int, executor: Any) -> int:
    """At most `chunk` runs per chunk, and few enough that every worker gets one when runs are few."""
    lanes = width(executor)
    return max(1, min(chunk, math.ceil(n_runs / lanes))) if lanes else chunk


def each_result(executor: Any, fn: Callable, jobs: list) -> Iterator[tuple[Any, Any, BaseException | None]]:
    """Submit fn(job) for every job; yield (job, result, None) or (job, None, error) as each finishes.
    Futures that are not `concurrent.futures.Future`s are waited for in helper threads."""
    with cf.ThreadPoolExecutor(max_workers=max(1, len(jobs))) as waiters:
        futures = {}
        for job in jobs:
            try:
                future = executor.submit(fn, job)
            except Exception as err:  # noqa: BLE001 - e.g. a process pool broken by a killed worker
                yield job, None, err
                continue
            if not isinstance(future, cf.Future):
                future = waiters.submit(future.result)
            futures[future] = job
        for future in cf.as_completed(futures):
            try:
                yield futures[future], future.result(), None
            except Exception as err:  # noqa: BLE001 - the caller decides: retry the chunk or raise
                yield futures[future], None, err


def lost_worker(error: BaseException) -> bool:
    """Whether `error` says the worker (not the work) failed: a killed Dask worker or a broken pool."""
    names = {type(e).__name__ for e in (error, error.__cause__, error.__context__) if e is not None}
    return bool(names & {"KilledWorker", "BrokenProcessPool", "BrokenExecutor", "CommClosedError",
                         "CancelledError", "FutureCancelledError", "WorkerCrashedError", "NodeDiedError",
                         "ObjectLostError", "OwnerDiedError"})  # fmt: skip


def renewed(executor: Any) -> Any:
    """A working stand-in for `executor` after one of its workers died: a new `ProcessPoolExecutor` of the
    same size, start method and initializer for a pool that the death broke (a broken pool takes no more
    work); `executor` itself otherwise (Dask and Ray replace dead workers themselves)."""
    if isinstance(executor, cf.ProcessPoolExecutor) and getattr(executor, "_broken", False):
        pool: Any = executor  # the pool's own settings are private attributes of ProcessPoolExecutor
        return cf.ProcessPoolExecutor(max_workers=pool._max_workers, mp_context=pool._mp_context,
                                      initializer=pool._initializer, initargs=pool._initargs)  # fmt: skip
    return executor


def dask_client(workers: int | None = None, scheduler: str | None = None, timeout_s: float = 10.0):
    """A `dask.distributed.Client`: on a new local cluster of `workers` processes (one thread each), or
    connected to the scheduler at `scheduler` ("tcp://host:8786"), waiting at most `timeout_s` seconds
    for it (OSError naming the address when none answers). ImportError naming the extra to install when
    Dask is missing."""
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError:
        raise ImportError(DASK_MISSING) from None
    if (workers is None) == (scheduler is None):
        raise ValueError("pass exactly one of workers= (a local cluster) or scheduler= (an address)")
    if scheduler is not None:
        if not isinstance(scheduler, str) or not scheduler.strip():
            raise ValueError(f"scheduler must be an address such as 'tcp://10.0.0.5:8786', got {scheduler!r}")
        try:
            return Client(scheduler, timeout=f"{timeout_s}s")
        except (OSError, TimeoutError) as err:
            raise OSError(f"no Dask scheduler answered at {scheduler!r} within {timeout_s:g} s ({type(err).__name__}); "
                          "start one with `dask scheduler` (and workers with `dask worker ADDRESS`), or check the "
                          "address") from None  # fmt: skip
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0")
    client = Client(cluster)
    client.run(_warm_up)  # import torch and headcoop in every worker now, not inside the first chunk
    return client


def _warm_up() -> None:
    import headcoop  # noqa: F401


class RayExecutor:
    """A `concurrent.futures`-style executor on Ray: `submit(fn, *args)` runs fn as a Ray task (Ray
    retries a task whose worker process died, `max_retries` times) and returns its
    `concurrent.futures.Future`. Starts Ray in this process (`ray.init(address=address,
    num_cpus=num_cpus)`) unless it is running; `shutdown()` stops what it started."""

    def __init__(self, address: str | None = None, num_cpus: int | None = None, max_retries: int = 3):
        try:
            import ray
        except ImportError:
            raise ImportError('Ray is not installed: pip install "headcoop[ray]" (or pip install ray)') from None
        self._ray, self._started = ray, False
        if not ray.is_initialized():
            ray.init(address=address, num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
            self._started = True
        self._max_retries = max_retries
        self._max_workers = int(ray.cluster_resources().get("CPU", 1))

    def submit(self, fn: Callable, *args) -> cf.Future:
        task = self._ray.remote(num_cpus=1, max_retries=self._max_retries)(fn)
        return task.remote(*args).future()

    def shutdown(self, wait: bool = True) -> None:
        if self._started:
            self._ray.shutdown()
            self._started = False

    def __enter__(self) -> "RayExecutor":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
