"""Regenerate docs/results/cooperation.md and its tables in docs/results/cooperation/.

    python -m experiments.cooperation.run_all                          # everything (fixed seeds)
    python -m experiments.cooperation.run_all --quick --out /tmp/results   # tiny sizes: a smoke test

Run from the repository root. OUT (default docs/results) receives cooperation.md and the tables.
"""

from __future__ import annotations

import time

from experiments import cli


def main(argv=None) -> int:
    args = cli.parse(cli.parser(__doc__, cli.RESULTS, png_help="accepted for symmetry with the other experiments (this page has no figures)"), argv)
    from experiments.cooperation import exp_mechanisms, page  # (after parsing: --help imports no torch)
    from experiments.cooperation.common import DEFAULT_OUT, Settings
    from experiments.shared import setup

    setup()
    results = args.out or DEFAULT_OUT
    s = Settings.quick_settings(results / "cooperation") if args.quick else Settings(out=results / "cooperation")
    start = time.perf_counter()
    for name, step in (("Count01 mechanisms", exp_mechanisms.count01_mechanisms),
                       ("SkipPair mechanisms", exp_mechanisms.skip_pair_mechanisms),
                       ("two-layer mechanisms", exp_mechanisms.two_layer_mechanisms),
                       ("two-layer paths", exp_mechanisms.two_layer_paths)):  # fmt: skip
        t = time.perf_counter()
        print(f"[cooperation] {name} ...", flush=True)
        step(s)
        print(f"[cooperation] {name}: {time.perf_counter() - t:.1f} s", flush=True)
    doc = page.build(results)
    print(f"[cooperation] done in {time.perf_counter() - start:.1f} s; doc: {doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
