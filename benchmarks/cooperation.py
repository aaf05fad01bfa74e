"""hc.cooperation against hc.interactions on the shipped Count01 model (16 heads, 512 inputs, accuracy,
mean ablation), in one run (issue 23's speed goal: cooperation at most twice interactions).

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
    t_coop = best(lambda: hc.cooperation(model, inputs=inputs, **common), args.repeats)
    print(f"torch threads {torch.get_num_threads()}")
    print(f"hc.interactions {t_int:.2f} s, hc.cooperation {t_coop:.2f} s, ratio {t_coop / t_int:.2f} (goal <= 2)")
    print(hc.cooperation(model, inputs=inputs, **common))


if __name__ == "__main__":
    main()
