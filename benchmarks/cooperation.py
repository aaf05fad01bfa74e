"""hc.cooperation against hc.interactions on the shipped Count01 model (16 heads, 512 inputs, accuracy),
in one run: one reading (mean ablation, one reference) as issue 23 timed it, and the default reading
family (zero, and mean and resample aligned by role with 4 reference draws each, every threshold band,
the write readings: issue 48) beside the obvious way to get it, one call per ablation reading (9 calls),
whose reference draws are not stacked on the batch axis.

    python benchmarks/cooperation.py [--threads N] [--repeats 3]
"""

from __future__ import annotations

import argparse
import time

import torch

import headcoop as hc


def best(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = hc.load("count01")
    inputs, reference = model.task.sample(512, seed=0), model.task.sample(512, seed=1)
    common = dict(metric="accuracy", how="mean", reference=reference)
    t_int = best(lambda: hc.interactions(model, tokens=inputs, **common), args.repeats)
    t_coop = best(lambda: hc.cooperation(model, inputs=inputs, draws=1, **common), args.repeats)
    t_family = best(lambda: hc.cooperation(model, inputs=inputs), args.repeats)
    task = model.task
    refs = [task.sample(512, seed=1 + d) for d in range(4)]

    def one_call_per_reading():
        hc.cooperation(model, inputs=inputs, how="zero", draws=1)
        for how in ("mean", "resample"):
            for ref in refs:
                hc.cooperation(model, inputs=inputs, how=how, reference=ref, draws=1)

    t_loop = best(one_call_per_reading, 1)
    print(f"torch threads {torch.get_num_threads()}")
    print(f"hc.interactions {t_int:.2f} s, hc.cooperation one reading {t_coop:.2f} s, ratio {t_coop / t_int:.2f}")
    print(f"hc.cooperation default family (9 ablation readings x 20 threshold readings) {t_family:.2f} s; "
          f"one call per ablation reading {t_loop:.2f} s: {t_loop / t_family:.1f}x slower")
    print(hc.cooperation(model, inputs=inputs))


if __name__ == "__main__":
    main()
