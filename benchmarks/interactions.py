"""Exact Shapley values and pairwise interactions of the 16 heads of the shipped Count01 model (65,536
coalitions, 512 inputs, accuracy metric): hc.interactions against the obvious loop (hc.ablate of the heads
outside each coalition, one forward pass per coalition), in the same run.

    python benchmarks/interactions.py [--inputs 512] [--loop-coalitions 256] [--threads N]

The loop is timed on `--loop-coalitions` random coalitions and extrapolated to all 65,536 (printed as
such); the values it computes are compared with hc.interactions' coalition values for the same masks.
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch

import headcoop as hc
from headcoop.analysis.coalitions import CoalitionGame

warnings.filterwarnings("ignore", category=DeprecationWarning)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--inputs", type=int, default=512)
    parser.add_argument("--loop-coalitions", type=int, default=256)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    model = hc.load("count01")
    batch = model.task.sample(args.inputs, seed=3)
    start = time.perf_counter()
    result = hc.interactions(model, batch, metric="accuracy")
    t_hc = time.perf_counter() - start
    print(f"hc.interactions: {t_hc:.2f} s for 65,536 coalitions ({result.method})")
    print(result)

    players = [(0, h) for h in range(16)]
    game = CoalitionGame(model, players, tokens=batch, metric="accuracy")
    masks = torch.rand(args.loop_coalitions, 16, generator=torch.Generator().manual_seed(0)) < 0.5
    rows = torch.arange(len(batch))
    start = time.perf_counter()
    loop = []
    for mask in masks:
        off = [f"L0H{h}" for h in range(16) if not mask[h]]
        if off:
            with hc.ablate(model, heads=off, how="mean"):
                logits = model(batch.tokens)
        else:
            logits = model(batch.tokens)
        loop.append(float((logits[rows, batch.answer_pos].argmax(-1) == batch.answer).double().mean()))
    t_loop = (time.perf_counter() - start) / len(masks) * 2**16
    diff = (game.values(masks).cpu() - torch.tensor(loop, dtype=torch.float64)).abs().max().item()
    print(f"loop (hc.ablate + forward per coalition): {t_loop:.1f} s for 65,536 coalitions, extrapolated from "
          f"{len(masks)}; ratio {t_loop / t_hc:.0f}x; max |diff| of the {len(masks)} values {diff:.1e}")


if __name__ == "__main__":
    main()
