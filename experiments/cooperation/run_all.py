"""Regenerate docs/results/cooperation.md and its tables in docs/results/cooperation/.

    python -m experiments.cooperation.run_all                          # everything (fixed seeds)
    python -m experiments.cooperation.run_all --quick --out /tmp/results   # tiny sizes: a smoke test

Run from the repository root. OUT (default docs/results) receives cooperation.md and the tables.
"""

from __future__ import annotations

import json
import os
import time

from experiments import cli


def main(argv=None) -> int:
    args = cli.parse(cli.parser(__doc__, cli.RESULTS, png_help="accepted for symmetry with the other experiments (this page has no figures)"), argv)
    from experiments.cooperation import exp_mechanisms, page  # (after parsing: --help imports no torch)
    from experiments.cooperation.common import DEFAULT_OUT, Settings
    from experiments.shared import setup
    import torch

    setup()
    results = args.out or DEFAULT_OUT
    s = Settings.quick_settings(results / "cooperation") if args.quick else Settings(out=results / "cooperation")
    start = time.perf_counter()
    steps = {}
    for name, step in (("Count01 answer", exp_mechanisms.count01_answer),
                       ("SkipPair answer", exp_mechanisms.skip_pair_answer),
                       ("Count01 mechanisms", exp_mechanisms.count01_mechanisms),
                       ("SkipPair mechanisms", exp_mechanisms.skip_pair_mechanisms),
                       ("two-layer mechanisms", exp_mechanisms.two_layer_mechanisms),
                       ("two-layer paths", exp_mechanisms.two_layer_paths)):  # fmt: skip
        t = time.perf_counter()
        print(f"[cooperation] {name} ...", flush=True)
        step(s)
        steps[name] = round(time.perf_counter() - t, 1)
        print(f"[cooperation] {name}: {steps[name]:.1f} s", flush=True)
    if not args.quick:  # the page's figures (seconds; a quick run's page goes without them)
        from experiments.cooperation import figures

        figures.count01_same(s.out)
        figures.count01_pairs(s.out)
        figures.skip_pair_words(s.out, draws=s.draws)
    timing = dict(total_s=round(time.perf_counter() - start, 1), steps=steps, cores=os.cpu_count(),
                  threads=torch.get_num_threads(), quick=args.quick)  # fmt: skip
    (s.out / "timing.json").write_text(json.dumps(timing, indent=1) + "\n")
    if not args.quick:  # the commit the tables were generated at (`experiments.consistency` checks it)
        from experiments.consistency import record

        record(s.out)
    doc = page.build(results)
    print(f"[cooperation] done in {time.perf_counter() - start:.1f} s; doc: {doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
