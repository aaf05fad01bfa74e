"""Regenerate docs/results/robustness.md and its tables in docs/results/robustness/: every setup variant
the sources leave open, at two training lengths, over seeds.

    python -m experiments.robustness.run_all                            # everything (fixed seeds)
    python -m experiments.robustness.run_all --quick --out /tmp/results  # tiny sizes: a smoke test

Run from the repository root. The Count01 and SkipPair grids run in two worker processes at once (one
torch thread each); seeds decide every number, so the tables do not depend on the order they finish in.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from experiments.robustness import exp_grid, page
from experiments.robustness.common import DEFAULT_OUT, Settings, setup


def _run(step: str, s: Settings) -> float:
    setup()
    start = time.perf_counter()
    getattr(exp_grid, step)(s)
    return time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for the smoke test")
    parser.add_argument("--out", type=Path, default=None, help=f"results folder (default {DEFAULT_OUT})")
    parser.add_argument("--no-png", action="store_true", help="accepted for symmetry with the other experiments "
                        "(this page has no figures)")
    parser.add_argument("--workers", type=int, default=2, help="processes for the two grids (default 2)")
    args = parser.parse_args(argv)
    if args.quick and args.out is None:
        parser.error("--quick needs --out (the quick tables must not overwrite docs/results)")
    setup()
    results = args.out or DEFAULT_OUT
    s = Settings.quick_settings(results / "robustness") if args.quick else Settings(out=results / "robustness")
    start = time.perf_counter()
    steps = ("count01_grid", "skip_pair_grid")
    with ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        took = dict(zip(steps, pool.map(_run, steps, [s] * len(steps))))
    total = time.perf_counter() - start
    s.out.mkdir(parents=True, exist_ok=True)
    (s.out / "timing.json").write_text(json.dumps(
        {"quick": args.quick, "workers": args.workers, "cores": os.cpu_count(), "total_s": round(total, 1),
         **{f"{k}_s": round(v, 1) for k, v in took.items()}}, indent=1) + "\n")  # fmt: skip
    doc = page.build(results)
    print(f"[robustness] done in {total:.1f} s; doc: {doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
