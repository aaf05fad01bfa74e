"""Regenerate every Count01 result: tables (CSV + markdown) and figures in docs/results/count01/,
then docs/results/count01.md from those tables.

    python -m experiments.count01.run_all            # everything (fixed seeds), a few minutes on 2 cores
    python -m experiments.count01.run_all --quick --out /tmp/results   # tiny sizes: a smoke test
    python -m experiments.count01.run_all --only shipped minimal       # some parts (the doc is rebuilt
                                                                         from whatever tables exist)
Run from the repository root. OUT (default docs/results) receives count01.md and the tables in count01/.
"""

from __future__ import annotations

import os
import resource
import time


from experiments import cli

def cpu_seconds() -> float:
    """CPU time (user + system) of this process and its finished children (kaleido's browser)."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


PARTS = ("training", "shipped", "isolation", "minimal", "two_layer")


def main(argv=None) -> int:
    parser = cli.parser(__doc__, cli.RESULTS)
    parser.add_argument("--only", nargs="+", choices=PARTS, default=list(PARTS))
    args = cli.parse(parser, argv)
    import pandas as pd  # (after parsing: --help imports no torch)

    from experiments.count01 import exp_models, exp_shipped, exp_training, page
    from experiments.count01.common import DEFAULT_OUT, Settings, setup, write_table

    results = args.out or DEFAULT_OUT.parent
    out = results / "count01"  # the tables and figures
    if args.no_png:
        os.environ["COUNT01_NO_PNG"] = "1"
    setup()
    s = Settings.quick_settings(out) if args.quick else Settings(out=out)
    out.mkdir(parents=True, exist_ok=True)

    timings = []
    load_at_start = os.getloadavg()[0]
    start, cpu_start = time.perf_counter(), cpu_seconds()

    def timed(name, fn, *a):
        t, cpu = time.perf_counter(), cpu_seconds()
        print(f"[count01] {name} ...", flush=True)
        result = fn(*a)
        timings.append(dict(step=name, seconds=time.perf_counter() - t, cpu_seconds=cpu_seconds() - cpu))
        print(f"[count01] {name}: {timings[-1]['seconds']:.1f} s", flush=True)
        return result

    if "training" in args.only:
        sweep_models, _ = timed("accuracy sweep", exp_training.sweep, s)
        primary_models, _ = timed("primary configuration over seeds", exp_training.primary, s)
        timed("ensemble correlation", exp_training.ensemble, s, sweep_models, primary_models)
    if "shipped" in args.only:
        timed("shipped model: head map", exp_shipped.head_map, s)
        timed("shipped model: intervention sweep", exp_shipped.intervention, s)
        timed("shipped model: logit analysis", exp_shipped.logits, s)
        timed("shipped model: ablation and amplification", exp_shipped.ablation, s)
        timed("shipped model: every head mean-ablated, per reference draw", exp_shipped.all_heads_over_draws, s)
    if "isolation" in args.only:
        timed("Table 1: joint vs isolated heads", exp_models.isolation, s)
    if "minimal" in args.only:
        timed("minimal solution", exp_models.minimal, s)
    if "two_layer" in args.only:
        timed("two-layer model", exp_models.two_layer, s)
    total = time.perf_counter() - start
    timings.append(dict(step="total", seconds=total, cpu_seconds=cpu_seconds() - cpu_start))
    table = pd.DataFrame(timings)
    table["cpu_cores"] = os.cpu_count()
    table["torch_threads"] = 1
    table["load_avg_1min_at_start"] = load_at_start
    table["load_avg_1min_at_end"] = os.getloadavg()[0]
    if set(args.only) != set(PARTS) and (out / "timing.csv").exists():
        # a partial run replaces the rows of the steps it ran; the total is the sum of every step's row
        old = pd.read_csv(out / "timing.csv")
        steps = table[table.step != "total"]
        kept = old[~old.step.isin(steps.step) & (old.step != "total")]
        merged = pd.concat([kept, steps]).set_index("step").reindex(
            [n for n in old.step if n != "total"] + [n for n in steps.step if n not in set(old.step)]).reset_index()
        summed = merged[["seconds", "cpu_seconds"]].sum()
        table = pd.concat([merged, pd.DataFrame([{**merged.iloc[-1].to_dict(), "step": "total",
                                                  "seconds": summed.seconds, "cpu_seconds": summed.cpu_seconds}])])
    if set(args.only) == set(PARTS) or (out / "timing.csv").exists():
        write_table(table, out, "timing")
    doc = page.build(results, quick=args.quick)
    print(f"[count01] done in {total:.1f} s; doc: {doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
