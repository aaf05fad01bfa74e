"""Exact Shapley values and pairwise interactions of the 16 heads of the shipped Count01 model (65,536
coalitions, 512 inputs, accuracy metric): hc.interactions against the obvious loop (hc.ablate of the heads
outside each coalition, one forward pass per coalition), in the same run.

    python benchmarks/interactions.py [--inputs 512] [--loop-coalitions 256] [--threads N] [--sampled]

The loop is timed on `--loop-coalitions` random coalitions and extrapolated to all 65,536 (printed as
such); the values it computes are compared with hc.interactions' coalition values for the same masks.
--sampled also times sampled Shapley values of a 4-layer model with 8 heads per layer (32 heads,
LayerNorm, d_model 64, 64 inputs of 16 tokens, logit difference) to a standard error of 1% of
|v(all) - v(none)|, against hc.ablate and one forward pass per coalition.
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch

import headcoop as hc
from headcoop.analysis.games.coalitions import CoalitionGame

warnings.filterwarnings("ignore", category=DeprecationWarning)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--inputs", type=int, default=512)
    parser.add_argument("--loop-coalitions", type=int, default=256)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--sampled", action="store_true", help="also time sampled Shapley values of 32 heads")
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
    print(
        f"loop (hc.ablate + forward per coalition): {t_loop:.1f} s for 65,536 coalitions, extrapolated from "
        f"{len(masks)}; ratio {t_loop / t_hc:.0f}x; max |diff| of the {len(masks)} values {diff:.1e}"
    )


def sampled() -> None:
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    from headcoop.analysis.games.estimators import HeadGame, shapiq_shapley

    cfg = HookedTransformerConfig(n_layers=4, d_model=64, d_head=8, n_heads=8, n_ctx=16, d_vocab=50, attn_only=True,
                                  normalization_type="LN", seed=0)  # fmt: skip
    model = HookedTransformer(cfg).eval()
    ids = torch.randint(0, 50, (64, 16), generator=torch.Generator().manual_seed(0))
    hc.contrast(ids, ids.flip(0), ids[:, 3], ids[:, 4]).attach(model)
    players = [(lay, h) for lay in range(4) for h in range(8)]
    game = CoalitionGame(model, players, metric="logit_diff")
    ends = game.values(torch.stack([torch.ones(32, dtype=torch.bool), torch.zeros(32, dtype=torch.bool)])).cpu()
    scale = abs(float(ends[0] - ends[1]))
    start = time.perf_counter()
    head_game = HeadGame(game)
    _, se = shapiq_shapley(head_game, "kernelshap", 12_144, 4, seed=0)  # the coalitions the old sampler used
    t_hc = time.perf_counter() - start
    masks = torch.rand(64, 32, generator=torch.Generator().manual_seed(1)) < 0.5
    rows, answer, wrong = torch.arange(64), ids[:, 3], ids[:, 4]
    start = time.perf_counter()
    loop = []
    for mask in masks:
        off = [f"L{lay}H{h}" for (lay, h), on in zip(players, mask.tolist()) if not on]
        with hc.ablate(model, heads=off, how="mean"):
            logits = model(ids)[rows, -1]
        loop.append(float((logits[rows, answer] - logits[rows, wrong]).double().mean()))
    t_loop = (time.perf_counter() - start) / len(masks) * head_game.evaluated
    diff = (game.values(masks).cpu() - torch.tensor(loop, dtype=torch.float64)).abs().max().item()
    print(
        f"sampled Shapley (shapiq KernelSHAP, 4 runs), 32 heads: {t_hc:.1f} s for {head_game.evaluated:,} coalitions, max se "
        f"{float(se.max()) / scale:.4f} of |v(all) - v(none)|; one forward pass per coalition: {t_loop:.1f} s "
        f"(extrapolated from {len(masks)}), ratio {t_loop / t_hc:.1f}x; max |diff| of the {len(masks)} values {diff:.1e}"
    )
    print(f"coalition values: {game.method}")


if __name__ == "__main__":
    import sys

    main()
    if "--sampled" in sys.argv:
        sampled()
