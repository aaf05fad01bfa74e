"""Cooperation at 144 heads: Shapley values of every head of a GPT-2-small-shaped model (12 layers x 12 heads,
d_model 768, d_mlp 3072, vocabulary 50,257, random weights), 8 inputs of 16 tokens, logit difference, mean
ablation over 64 reference sequences; plus the strongest pairwise interactions. And the memory of the
analyses at batch 32.

    python benchmarks/heads_144.py [--minutes 10] [--estimator kernelshap] [--json out.json]
    python benchmarks/heads_144.py --memory      # peak RSS of each analysis at batch 32, one process each

Printed, measured in the same run:
- the cost of one coalition on headcoop's batched game against one plain forward pass, and against the
  obvious loop (hc.ablate of the heads outside the coalition, then a forward pass), timed on a few
  coalitions and extrapolated to the coalitions used;
- the Shapley run: time, coalitions evaluated, the largest standard error as a share of |v(N) - v(empty)|
  (the goal: 2% within 10 minutes in all), and the coalitions that 2% would need at the measured rate
  (standard errors fall as 1/sqrt(coalitions));
- the top pairs' interaction indices with their standard errors, and what the screening cost.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
warnings.filterwarnings("ignore")

SHAPE = dict(n_layers=12, d_model=768, d_head=64, n_heads=12, d_mlp=3072, d_vocab=50257, n_ctx=64, act_fn="gelu_new",
             normalization_type="LN")  # fmt: skip


def build(batch: int = 8, n_pos: int = 16):
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    torch.manual_seed(0)
    model = HookedTransformer(HookedTransformerConfig(**SHAPE, seed=0)).eval()
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, SHAPE["d_vocab"], (batch, n_pos), generator=gen)
    answer = torch.randint(0, SHAPE["d_vocab"], (batch,), generator=gen)
    wrong = torch.randint(0, SHAPE["d_vocab"], (batch,), generator=gen)
    reference = torch.randint(0, SHAPE["d_vocab"], (64, n_pos), generator=gen)
    return model, tokens, answer, wrong, reference


def shapley_run(args) -> dict:
    import headcoop as hc
    from headcoop.analysis.games.coalitions import CoalitionGame
    from headcoop.analysis.games.estimators import HeadGame, shapiq_shapley, top_interactions

    torch.set_grad_enabled(False)
    model, tokens, answer, wrong, reference = build()
    players = [(lay, h) for lay in range(12) for h in range(12)]
    n = len(players)
    game = CoalitionGame(model, players, tokens=tokens, metric="logit_diff", answer=answer, wrong=wrong, how="mean",
                         reference=reference)  # fmt: skip
    out: dict = {"threads": torch.get_num_threads()}
    start = time.perf_counter()
    for _ in range(3):
        model(tokens)
    out["forward_s"] = (time.perf_counter() - start) / 3
    masks = torch.rand(48, n, generator=torch.Generator().manual_seed(1)) < 0.5
    start = time.perf_counter()
    values = game.values(masks)
    out["coalition_s"] = (time.perf_counter() - start) / len(masks)
    out["game_path"] = game.method
    rows = torch.arange(len(tokens))
    start = time.perf_counter()
    loop = []
    for mask in masks[:6]:
        off = [f"L{lay}H{h}" for (lay, h), on in zip(players, mask.tolist()) if not on]
        with hc.ablate(model, heads=off, how="mean", reference=reference):
            logits = model(tokens)[rows, -1]
        loop.append(float((logits[rows, answer] - logits[rows, wrong]).double().mean()))
    out["loop_coalition_s"] = (time.perf_counter() - start) / 6
    out["loop_max_diff"] = float((values[:6].cpu() - torch.tensor(loop, dtype=torch.float64)).abs().max())
    ends = game.values(torch.stack([torch.ones(n, dtype=torch.bool), torch.zeros(n, dtype=torch.bool)])).cpu()
    scale = abs(float(ends[0] - ends[1]))
    out["v_full"], out["v_empty"], out["scale"] = float(ends[0]), float(ends[1]), scale
    print(
        f"one forward pass {out['forward_s'] * 1000:.0f} ms; one coalition on the batched game "
        f"{out['coalition_s'] * 1000:.0f} ms ({game.method}); the obvious loop {out['loop_coalition_s'] * 1000:.0f} ms "
        f"per coalition (max |diff| {out['loop_max_diff']:.1e}); |v(N) - v(empty)| = {scale:.4f}",
        flush=True,
    )

    total_s = args.minutes * 60
    shapley_s = total_s * args.shapley_share
    budget = int(shapley_s / out["coalition_s"])
    head_game = HeadGame(game)
    start = time.perf_counter()
    phi, se = shapiq_shapley(head_game, args.estimator, budget, 4, seed=0)
    out["shapley_s"] = time.perf_counter() - start
    out["shapley_coalitions"] = head_game.evaluated
    out["max_se_share"] = float(se.max()) / scale
    out["needed_coalitions"] = int(head_game.evaluated * (out["max_se_share"] / args.target) ** 2)
    out["needed_minutes"] = out["needed_coalitions"] * out["coalition_s"] / 60
    print(
        f"Shapley ({args.estimator}): {out['shapley_s']:.0f} s, {head_game.evaluated:,} coalitions, largest "
        f"standard error {out['max_se_share']:.2%} of |v(N) - v(empty)| (goal {args.target:.0%}); 2% would need "
        f"about {out['needed_coalitions']:,} coalitions = {out['needed_minutes']:.0f} minutes at this rate; the loop: "
        f"{head_game.evaluated * out['loop_coalition_s'] / 60:.0f} minutes for the same coalitions",
        flush=True,
    )

    pair_game = HeadGame(game)
    left = max(total_s - out["shapley_s"], 60)
    screen = max(int(left * 0.5 / out["coalition_s"]), 300)
    samples = max(int(left * 0.5 / out["coalition_s"] / (4 * args.top)), 2)
    start = time.perf_counter()
    inter, errors, pairs = top_interactions(pair_game, args.top, screen, samples, seed=0)
    out["pairs_s"] = time.perf_counter() - start
    out["pairs_coalitions"] = pair_game.evaluated
    out["screen_coalitions"], out["pair_samples"] = screen, samples
    names = [f"L{lay}H{h}" for lay, h in players]
    out["top_pairs"] = [(names[i], names[j], float(inter[i, j]), float(errors[i, j])) for i, j in pairs]
    print(
        f"top {args.top} pairs: {out['pairs_s']:.0f} s, {pair_game.evaluated:,} coalitions (SVARM-IQ screening "
        f"{screen:,}, then {samples} draws per pair)",
        flush=True,
    )
    for a, b, value, err in out["top_pairs"][: args.top]:
        print(f"  {a}-{b}: {value / scale:+.3f} +- {err / scale:.3f} of |v(N) - v(empty)|")
    out["total_s"] = out["shapley_s"] + out["pairs_s"]
    out["goal_met"] = out["total_s"] <= 600 and out["max_se_share"] <= args.target
    print(
        f"total {out['total_s'] / 60:.1f} minutes; goal (2% in <= 10 minutes) {'met' if out['goal_met'] else 'not met'}"
    )
    return out


MEMORY_CASES = {
    "hc.patch z by head and position": "hc.patch(model, clean=tokens, corrupt=corrupt, metric=metric, positions='each', layer=5)",
    "hc.patch resid_pre by position": "hc.patch(model, clean=tokens, corrupt=corrupt, metric=metric, component='resid_pre', positions='each')",
    "hc.attribute atp* by position": "hc.attribute(model, clean=tokens, corrupt=corrupt, metric=metric, positions='each', estimator='atp*', verify=8, sample=8)",
    "hc.dla": "hc.dla(model, tokens, answer=answer, wrong=wrong)",
    "hc.path_patch (layer 10 receivers)": "hc.path_patch(model, clean=tokens, corrupt=corrupt, metric=metric, senders=[(9, h) for h in range(12)], receivers=[(10, 0), (10, 1)], via='v')",
    "coalition game, 64 coalitions of 144 heads": "CoalitionGame(model, players, tokens=tokens, metric='logit_diff', answer=answer, wrong=wrong, how='zero').values(torch.rand(64, 144) < 0.5)",
    "hc.probe z": "hc.probe(model, tokens, labels=torch.arange(32) % 2, layer=3)",
}


def memory_child(case: str) -> None:
    import headcoop as hc  # noqa: F401  (the statements use it)
    from headcoop.analysis.games.coalitions import CoalitionGame  # noqa: F401

    torch.set_grad_enabled(False)
    model, tokens, answer, wrong, _ = build(batch=32, n_pos=16)
    corrupt = tokens.roll(1, 0)
    players = [(lay, h) for lay in range(12) for h in range(12)]  # noqa: F841
    rows = torch.arange(32)
    metric = lambda logits: (logits[rows, -1, answer] - logits[rows, -1, wrong]).mean()  # noqa: E731, F841
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    start = time.perf_counter()
    exec(MEMORY_CASES[case], {**globals(), **locals()})
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(json.dumps({"case": case, "peak_gb": peak, "model_loaded_gb": base, "seconds": time.perf_counter() - start}))


def memory() -> list[dict]:
    out = []
    for case in MEMORY_CASES:
        proc = subprocess.run([sys.executable, __file__, "--memory-case", case], capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"{case}: failed\n{proc.stderr[-2000:]}")
            continue
        row = json.loads(proc.stdout.strip().splitlines()[-1])
        out.append(row)
        print(
            f"{case}: peak RSS {row['peak_gb']:.2f} GB (model and inputs alone {row['model_loaded_gb']:.2f} GB), "
            f"{row['seconds']:.0f} s; {'under' if row['peak_gb'] < 4 else 'OVER'} 4 GB",
            flush=True,
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--shapley-share", type=float, default=0.6, help="share of the time for Shapley values")
    parser.add_argument("--estimator", default="kernelshap", choices=["kernelshap", "svarm", "permutation"])
    parser.add_argument("--target", type=float, default=0.02)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--memory-case", help=argparse.SUPPRESS)
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.memory_case:
        memory_child(args.memory_case)
        return
    result = {"memory": memory()} if args.memory else shapley_run(args)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
