"""Regenerate every SkipPair result in docs/results/skip_pair.md and docs/results/skip_pair/.

    python -m experiments.skip_pair.run_all            # the full run (a few minutes on 2 CPU cores)
    python -m experiments.skip_pair.run_all --quick --out /tmp/results   # smoke test: tiny grid, few steps

Run from the repository root. OUT (default docs/results) receives skip_pair.md and the tables in skip_pair/.
One `hc.train_many` call per seed set trains every model: the capacity grid (n_heads 1..4 x d_head 1..6,
seeds 0..7) and extra seeds 8..19 of the two headline shapes (2 heads, d_head 5 and d_head 1), all with the
shipped models' recipe (3000 steps, lr 1e-2, batch 256). Seed k initialises model k and drives its data.
Every model is then measured exactly over all inputs (see headcoop.studies.skip_pair), and the
shipped checkpoints hc.load("skip-pair") / hc.load("skip-pair-dhead1") are measured the same way.
"""

from __future__ import annotations

import json
import os
import time


from experiments import cli

def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__, cli.RESULTS, png_help="write HTML figures only (skip kaleido)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: fastest for tiny models)")
    args = cli.parse(parser, argv)
    import pandas as pd  # (after parsing: --help imports no torch)

    import headcoop as hc
    from experiments.skip_pair import exp_dynamics, figures, page
    from experiments.skip_pair.common import DEFAULT_OUT, FULL, QUICK, RECIPE, SHIPPED, setup
    from experiments.skip_pair.exp_runs import plan, shipped_rows, train_and_measure, typical_seed

    setup(args.threads)
    start = time.time()
    load_start = os.getloadavg()[0]

    grid = QUICK if args.quick else FULL
    recipe = dict(RECIPE, steps=grid.get("steps", RECIPE["steps"]))
    out = args.out or DEFAULT_OUT
    tables = out / "skip_pair"
    tables.mkdir(parents=True, exist_ok=True)

    task = hc.SkipPair()
    runs = plan(grid)
    table = train_and_measure(task, runs, recipe)
    table.to_csv(tables / "runs.csv", index=False)
    # one head, small d_head, trained longer: does "one head needs d_head >= 4" hold with more steps?
    long = grid["long"]
    long_runs = [(h, d, s) for h in long["heads"] for d in long["d_heads"] for s in long["seeds"]]
    long_table = train_and_measure(task, long_runs, dict(recipe, steps=long["steps"]))
    long_table.to_csv(tables / "runs_long.csv", index=False)
    # split attention at training checkpoints; constructive interference as the post words it
    dyn = grid["dynamics"]
    dynamics, interference = exp_dynamics.dynamics(task, dyn["d_heads"], dyn["seeds"], recipe, dyn["every"])
    dynamics.to_csv(tables / "dynamics.csv", index=False)
    interference.to_csv(tables / "interference.csv", index=False)
    trained = time.time()

    shipped = shipped_rows()
    shipped.to_csv(tables / "shipped.csv", index=False)
    typical = []
    for name, (h, d) in SHIPPED.items():
        seed, why = typical_seed(table, h, d)
        typical.append(dict(name=name, n_heads=h, d_head=d, typical_seed=seed, why=why))
    typical = pd.DataFrame(typical)
    typical.to_csv(tables / "typical_seeds.csv", index=False)

    figures.PNG = not args.no_png
    figures.write_all(tables, table, shipped)
    timing = dict(
        quick=args.quick, threads=args.threads, n_models=len(runs) + len(long_runs) + len(dyn["d_heads"]) * len(dyn["seeds"]), recipe=recipe,
        long_steps=long["steps"],
        train_and_measure_s=round(trained - start, 1), total_s=None,
        cores=os.cpu_count(), load_start=round(load_start, 2), load_end=round(os.getloadavg()[0], 2),
    )  # fmt: skip
    timing["total_s"] = timing["doc_total_s"] = round(time.time() - start, 1)  # the doc states the time so far
    page.write(out, table, long_table, shipped, typical, timing, grid, png=not args.no_png, robustness=out / "robustness",
               dynamics=dynamics, interference=interference)
    timing["total_s"] = round(time.time() - start, 1)
    (tables / "timing.json").write_text(json.dumps(timing, indent=1))
    print(f"{timing['n_models']} models; trained and measured in {timing['train_and_measure_s']} s; "
          f"total {timing['total_s']} s")
    print(f"wrote {out / 'skip_pair.md'} and {tables}/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
