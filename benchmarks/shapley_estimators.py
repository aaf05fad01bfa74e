"""Which estimator of Shapley values to use above the exact limit, measured: headcoop's antithetic permutation
sampling against shapiq's KernelSHAP, SVARM and permutation sampling, at equal budgets of coalitions, on a
144-head game (12 layers x 12 heads at toy width: d_model 48, d_head 4, d_mlp 192, vocabulary 512, LayerNorm;
8 inputs of 16 tokens, logit difference, zero ablation), where a coalition costs milliseconds.

    python benchmarks/shapley_estimators.py [--reference 60000] [--budgets 2900 5800 11600]

The reference is a long permutation run (`--reference` coalitions); each estimator's error is its RMSE and
largest error over the 144 heads against it, as a share of |v(N) - v(empty)|, beside the standard error it
reports (shapiq's estimators: the spread of 4 independent runs of a quarter of the budget each). The
reference's own standard error bounds how small a measured error can be.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
warnings.filterwarnings("ignore")


def main() -> None:
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    from headcoop.analysis.games import estimators
    from headcoop.analysis.games.coalitions import CoalitionGame

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", type=int, default=60000)
    parser.add_argument("--budgets", type=int, nargs="+", default=[2900, 5800, 11600])
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    cfg = HookedTransformerConfig(n_layers=12, d_model=48, d_head=4, n_heads=12, d_mlp=192, d_vocab=512, n_ctx=64,
                                  act_fn="gelu_new", normalization_type="LN", seed=0)  # fmt: skip
    torch.manual_seed(0)
    model = HookedTransformer(cfg).eval()
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 512, (8, 16), generator=gen)
    answer, wrong = torch.randint(0, 512, (8,), generator=gen), torch.randint(0, 512, (8,), generator=gen)
    n = 144
    game = CoalitionGame(model, [(lay, h) for lay in range(12) for h in range(12)], tokens=tokens, metric="logit_diff",
                         answer=answer, wrong=wrong, how="zero")  # fmt: skip
    head_game = estimators.HeadGame(game)
    ends = game.values(torch.stack([torch.ones(n, dtype=torch.bool), torch.zeros(n, dtype=torch.bool)]))
    scale = float(abs(ends[0] - ends[1]))
    start = time.perf_counter()
    reference, reference_se = estimators.shapiq_shapley(head_game, "permutation", args.reference, 8, seed=123)
    done = head_game.evaluated
    took = time.perf_counter() - start
    print(f"|v(N) - v(empty)| = {scale:.4f}; reference: {done:,} coalitions in {took:.0f} s ({took / done * 1000:.2f} ms "
          f"each), its largest standard error {float(reference_se.max()) / scale:.4f} of that")  # fmt: skip
    print(
        f"{'budget':>7} {'estimator':20} {'rmse':>7} {'max err':>8} {'max se':>7} {'seconds':>8}   (shares of |v(N) - v(empty)|)"
    )
    for budget in args.budgets:
        for name in estimators.SHAPLEY_ESTIMATORS:
            start = time.perf_counter()
            phi, se = estimators.shapiq_shapley(head_game, name, budget, 4, seed=1)
            rmse = float((phi - reference).pow(2).mean().sqrt()) / scale
            worst = float((phi - reference).abs().max()) / scale
            print(
                f"{budget:7d} {name:20} {rmse:7.4f} {worst:8.4f} {float(se.max()) / scale:7.4f} "
                f"{time.perf_counter() - start:8.0f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
