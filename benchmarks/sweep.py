"""Runs per minute: the serial sweep against the same sweep on a local Dask cluster, same grid, same run.

    python benchmarks/sweep.py [--workers 2] [--seeds 8] [--steps 300] [--chunk 4]

The grid is Count01 models of two shapes (GRID: d_model 16, 4 and 8 heads of width 2) over `--seeds`
seeds; each side starts from an empty folder. The serial sweep runs in this process with as many torch
threads as there are workers (the cores the cluster uses); the Dask sweep on `--workers` worker processes
with one thread each. Before timing, each side runs a 5-step sweep of both shapes (a worker process's
first chunk pays for imports and first calls, about 4 s here); cluster start-up and that warm-up are
printed, not counted. Prints runs per minute for
each, the overhead per run of the cluster (time per run x workers against the serial time per run at
one thread per core), and checks that both sweeps saved bit-identical weights.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from pathlib import Path

import torch

import headcoop as hc
from headcoop.training.executors import dask_client

warnings.filterwarnings("ignore", category=DeprecationWarning)
GRID = {"n_heads": [4, 8], "d_model": [16], "d_head": [2]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--chunk", type=int, default=4)
    args = parser.parse_args()
    task, seeds = hc.Count01(), list(range(args.seeds))
    train = dict(steps=args.steps, batch_size=64, warmup=10, chunk=args.chunk, progress=False)
    n_runs = len(seeds) * len(GRID["n_heads"])
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        torch.set_num_threads(args.workers)
        warm = dict(train, steps=5)
        hc.sweep(task, GRID, [100], tmp / "warm-serial", **warm)  # first-call costs, on both sides
        start = time.perf_counter()
        hc.sweep(task, GRID, seeds, tmp / "serial", **train)
        t_serial = time.perf_counter() - start

        start = time.perf_counter()
        client = dask_client(workers=args.workers)
        hc.sweep(task, GRID, [100], tmp / "warm-dask", executor=client, **warm)
        t_up = time.perf_counter() - start
        try:
            start = time.perf_counter()
            table = hc.sweep(task, GRID, seeds, tmp / "dask", executor=client, **train)
            t_dask = time.perf_counter() - start
        finally:
            cluster = client.cluster
            client.close()
            cluster.close()
        same = all(
            all(torch.equal(a, b) for a, b in zip(hc.load(tmp / "serial" / n).state_dict().values(),
                                                  hc.load(tmp / "dask" / n).state_dict().values()))
            for n in table["name"]
        )  # fmt: skip
    print(f"{n_runs} runs ({len(GRID['n_heads'])} shapes x {len(seeds)} seeds, {args.steps} steps, chunks of "
          f"{args.chunk}); torch {torch.__version__}, {args.workers} workers")  # fmt: skip
    print(f"serial ({args.workers} torch threads): {t_serial:6.1f} s = {n_runs / t_serial * 60:6.1f} runs/min")
    print(
        f"dask, {args.workers} worker processes x 1 thread: {t_dask:6.1f} s = {n_runs / t_dask * 60:6.1f} runs/min "
        f"(cluster start and a 5-step warm-up sweep: {t_up:.1f} s, not counted)"
    )
    print(
        f"time per run, dask / serial: {t_dask / t_serial:.2f} (1.00: no overhead; below 1: the workers "
        f"train in parallel better than threads do)"
    )
    print(f"weights bit-identical: {same}")


if __name__ == "__main__":
    main()
