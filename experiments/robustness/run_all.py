"""Regenerate docs/results/robustness.md and its tables in docs/results/robustness/: every setup variant
the sources leave open, at two training lengths, over seeds.

    python -m experiments.robustness.run_all                            # everything (fixed seeds)
    python -m experiments.robustness.run_all --quick --out /tmp/results  # tiny sizes: a smoke test

Run from the repository root. The grid is 26 jobs (each Count01 variant's models per training length and
its short runs, Count01's Table 1 per variant, each SkipPair variant's models; `exp_grid.jobs`), run in worker processes (two by default, one torch thread each) or on a Dask cluster
(--scheduler); seeds decide every number, and the tables are joined in variant order, so they do not
depend on where or in which order the jobs ran.
"""

from __future__ import annotations

import contextlib
import functools
import json
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor

from experiments import cli


def _run(job: tuple, s) -> tuple[dict, float]:
    """One job of the grid in a worker process (s: the run's Settings)."""
    from experiments.robustness import exp_grid
    from experiments.shared import setup

    setup()
    start = time.perf_counter()
    tables = exp_grid.run_job(job, s)
    return tables, time.perf_counter() - start


def main(argv=None) -> int:
    parser = cli.parser(
        __doc__, cli.RESULTS, png_help="accepted for symmetry with the other experiments (this page has no figures)"
    )
    parser.add_argument("--workers", type=int, default=2, help="local worker processes (default 2)")
    parser.add_argument(
        "--only",
        nargs="+",
        choices=("count01_grid", "count01_table1", "skip_pair_grid"),
        default=None,
        help="run only these jobs and rewrite only their tables (timing.json is left as it is)",
    )
    parser.add_argument(
        "--scheduler",
        default=None,
        help="a running Dask scheduler's address (tcp://host:8786) to "
        "send the jobs to instead; its workers must run from this repository's root",
    )
    args = cli.parse(parser, argv)
    from tqdm.auto import tqdm  # (after parsing: --help imports no torch)

    import headcoop as hc
    from experiments.robustness import exp_grid, page
    from experiments.robustness.common import DEFAULT_OUT, Settings
    from experiments.shared import setup
    from headcoop.training.executors import as_executor, each_result

    setup()
    results = args.out or DEFAULT_OUT
    s = Settings.quick_settings(results / "robustness") if args.quick else Settings(out=results / "robustness")
    start = time.perf_counter()
    parts, took = [], {}
    with contextlib.ExitStack() as stack:
        if args.scheduler:
            executor = as_executor(stack.enter_context(hc.dask_client(scheduler=args.scheduler)))
        else:
            executor = stack.enter_context(
                ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn"))
            )
        jobs = [job for job in exp_grid.jobs(s) if args.only is None or job[0] in args.only]
        for job, result, error in tqdm(each_result(executor, functools.partial(_run, s=s), jobs), total=len(jobs),
                                       desc="robustness grid", unit="job"):  # fmt: skip
            if error is not None:
                raise RuntimeError(f"robustness job {job} failed: {error!r}") from error
            tables, seconds = result
            parts.append(tables)
            took[job[0]] = took.get(job[0], 0.0) + seconds
    total = time.perf_counter() - start
    exp_grid.write_tables(parts, s)
    if args.only:  # the full run's timing stays; the partial rerun is recorded beside it
        timing_file = s.out / "timing.json"
        timing = json.loads(timing_file.read_text()) if timing_file.exists() else {}
        timing.setdefault("reruns", []).append({"only": args.only, "total_s": round(total, 1), "cores": os.cpu_count()})
        timing_file.write_text(json.dumps(timing, indent=1) + "\n")
        doc = page.build(results)
        print(f"[robustness] {', '.join(args.only)} done in {total:.1f} s; doc: {doc}")
        return 0
    (s.out / "timing.json").write_text(json.dumps(
        {"quick": args.quick, "workers": args.workers if not args.scheduler else "dask", "cores": os.cpu_count(),
         "jobs": len(exp_grid.jobs(s)), "total_s": round(total, 1),
         **{f"{k}_s": round(v, 1) for k, v in took.items()}}, indent=1) + "\n")  # fmt: skip
    doc = page.build(results)
    print(f"[robustness] done in {total:.1f} s; doc: {doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
