"""The report's cost predictions beside the measured time of the same calls (issue 51: within 2x).

    python benchmarks/report_predictions.py [--gpt2]

For each model, a report context as `headcoop report` builds it (its task's patching inputs, one forward pass
timed), then each analysis the report budgets: its prediction (`headcoop.reporting.budget`: forward passes x the
timed forward pass) and the call the report makes, timed. Models: the shipped Count01 (one layer, 16 heads: the
linear path) and SkipPair checkpoints, and with --gpt2 a GPT-2-small-shaped model (random weights, 16 prompts
of 16 tokens) with the three heads `benchmarks/report.py` covers. Prints predicted, measured and their ratio;
a ratio outside 0.5..2 is marked.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
warnings.filterwarnings("ignore")


def contexts(gpt2: bool):
    import headcoop as hc
    from headcoop.reporting.context import Context as _Context

    for name in ("count01", "skip-pair"):
        model = hc.load(name)
        clean, corrupt = model.task.patching_inputs()
        yield name, _Context(model=model, task=model.task, source=name, examples=3, clean=clean, corrupt=corrupt)
    if gpt2:
        from transformer_lens import HookedTransformer, HookedTransformerConfig

        from benchmarks.heads_144 import SHAPE

        torch.manual_seed(0)
        model = HookedTransformer(HookedTransformerConfig(**SHAPE, seed=0)).eval()
        gen = torch.Generator().manual_seed(0)
        tokens = torch.randint(0, SHAPE["d_vocab"], (16, 16), generator=gen)
        corrupt = tokens.clone()
        corrupt[:, 4] = torch.randint(0, SHAPE["d_vocab"], (16,), generator=gen)
        answer, wrong = torch.randint(0, SHAPE["d_vocab"], (2, 16), generator=gen)
        task = hc.contrast(tokens, corrupt, answer, wrong)
        clean, bad = task.patching_inputs()
        yield "GPT-2-small shape, 3 heads", _Context(model=model, task=task, source="gpt2-shape", examples=3, clean=clean,
                                                     corrupt=bad, heads=[(0, 1), (5, 5), (11, 2)])  # fmt: skip


def analyses(ctx):
    """(name, predicted forward passes, the call) of each analysis the report budgets."""
    import headcoop as hc
    from headcoop.reporting.budget import depth as _depth
    from headcoop.reporting.cooperation import _cooperation_forwards, _shapley_forwards

    heads = None if ctx.all_heads else ctx.heads
    k = len(ctx.heads)
    out = [("exact head patching, all positions", ctx.patch_cost(),
            lambda: hc.patch(ctx.model, clean=ctx.clean, corrupt=ctx.corrupt, metric=ctx.metric, heads=heads, progress=False)),
           ("exact head patching, each position", ctx.patch_cost(ctx.clean.tokens.shape[1]),
            lambda: hc.patch(ctx.model, clean=ctx.clean, corrupt=ctx.corrupt, metric=ctx.metric, heads=heads,
                             positions="each", progress=False))]  # fmt: skip
    if 2 <= k <= 32:
        draws = 4 if k <= 16 else 1
        out.append((f"hc.cooperation ({draws} draws)", _cooperation_forwards(ctx, draws),
                    lambda: hc.cooperation(ctx.model, inputs=ctx.clean, heads=heads, metric="accuracy", reference=ctx.clean,
                                           max_exact=16, draws=draws, progress=False)))  # fmt: skip
    if k <= 16:
        out.append(("Shapley values, exact (hc.interactions)", _shapley_forwards(ctx),
                    lambda: hc.interactions(ctx.model, ctx.clean, heads=heads, metric="accuracy", how="mean",
                                            reference=ctx.clean.tokens, progress=False)))  # fmt: skip
    senders = [(lay, h) for lay, h in ctx.heads if any(r > lay for r, _ in ctx.heads)]
    if ctx.model.cfg.n_layers > 1 and senders:
        edges = sum(3 * _depth(ctx.model, r) for s, _ in ctx.heads for r, _ in ctx.heads if r > s)
        direct = sum(_depth(ctx.model, s) for s, _ in senders)
        out.append(("path patching (hc.path_patch)", 2 + edges + direct,
                    lambda: hc.path_patch(ctx.model, clean=ctx.clean, corrupt=ctx.corrupt, metric=ctx.metric,
                                          senders=ctx.names, receivers=ctx.names, progress=False)))  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpt2", action="store_true", help="also the GPT-2-small shape (minutes)")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    print(f"torch threads {torch.get_num_threads()}")
    for name, ctx in contexts(args.gpt2):
        print(f"\n{name}: one forward pass {ctx.budget.forward_s:.4f} s, {len(ctx.heads)} heads")
        for what, forwards, call in analyses(ctx):
            predicted = forwards * ctx.budget.forward_s
            start = time.perf_counter()
            call()
            took = time.perf_counter() - start
            ratio = took / predicted
            mark = "" if 0.5 <= ratio <= 2 else "   <- outside 2x"
            print(
                f"  {what:45s} predicted {predicted:8.2f} s, measured {took:8.2f} s, measured / predicted {ratio:5.2f}{mark}"
            )


if __name__ == "__main__":
    main()
