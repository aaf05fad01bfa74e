"""Peak memory at GPT-2-medium shape (issue 51): EAP, a sample of exact edge patching, AtP* and head patching
beside a plain TransformerLens forward-and-backward of the same batch, each in a fresh process.

    python benchmarks/memory.py [--budget-mb 512] [--prompts 32] [--tokens 64] [--json out.json]

The model: a HookedTransformer of GPT-2 medium's shape (24 layers x 16 heads, d_model 1024, d_mlp 4096,
vocabulary 50,257, LayerNorm; random weights, seed 0, float32: 1.42 GB of weights), 32 prompts of 64 token ids,
the corrupt prompt changing one token, the logit difference of a right and a wrong answer at the last position
(the named metric "logit_diff" on Batches, a mean over inputs, so that a gradient pass may run in parts). Each case runs in its
own process; its peak resident memory (`ru_maxrss`) is printed beside the process's memory once the model and
inputs are loaded, so that what the analysis adds is their difference. The goal: peak within the budget plus
the model's own size, and at most 2x the plain forward-and-backward when no budget is given.
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

SHAPE = dict(n_layers=24, d_model=1024, d_head=64, n_heads=16, d_mlp=4096, d_vocab=50257, n_ctx=1024, act_fn="gelu_new",
             normalization_type="LN")  # fmt: skip

CASES = {
    "plain forward and backward (TransformerLens)": "plain(model, tokens, metric)",
    "hc.edges, EAP": "hc.edges(model, clean=clean, corrupt=corrupt, metric='logit_diff', progress=False{budget})",
    "hc.edges, EAP with 16 sampled edges patched exactly": "hc.edges(model, clean=clean, corrupt=corrupt, metric='logit_diff', sample=16, progress=False{budget})",
    "hc.attribute, AtP* by head": "hc.attribute(model, clean=clean, corrupt=corrupt, metric='logit_diff', estimator='atp*', verify=8, sample=8, progress=False{budget})",
    "hc.patch z of layer 12, all positions": "hc.patch(model, clean=clean, corrupt=corrupt, metric='logit_diff', layer=12, progress=False{budget})",
}


def plain(model, tokens, metric) -> None:
    """The obvious baseline: one forward pass with gradients, the metric, one backward pass."""
    with torch.enable_grad():
        metric(model(tokens)).backward()


def child(case: str, prompts: int, tokens_n: int, budget_mb: float | None) -> None:
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    import headcoop as hc  # noqa: F401  (the statements use it)

    torch.manual_seed(0)
    model = HookedTransformer(HookedTransformerConfig(**SHAPE, seed=0)).eval()
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, SHAPE["d_vocab"], (prompts, tokens_n), generator=gen)
    corrupt = tokens.clone()
    corrupt[:, tokens_n // 4] = torch.randint(0, SHAPE["d_vocab"], (prompts,), generator=gen)
    answer, wrong = torch.randint(0, SHAPE["d_vocab"], (2, prompts), generator=gen)
    rows = torch.arange(prompts)
    from headcoop.tasks.base import Batch

    last = torch.full((prompts,), tokens_n - 1)
    fields = dict(loss_pos=last[:, None], answer_pos=last, labels=torch.zeros(prompts, dtype=torch.long))
    clean = Batch(tokens=tokens, targets=answer[:, None], answer=answer, wrong=wrong, **fields)  # noqa: F841
    corrupt = Batch(tokens=corrupt, targets=wrong[:, None], answer=wrong, wrong=answer, **fields)  # noqa: F841
    metric = lambda logits: (logits[rows, -1, answer] - logits[rows, -1, wrong]).mean()  # noqa: E731, F841
    loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10
    weights = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    start = time.perf_counter()
    statement = CASES[case].format(budget="" if budget_mb is None else f", memory_budget_mb={budget_mb}")
    exec(statement, {**globals(), **locals()})
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10
    print(json.dumps({"case": case, "peak_mb": peak, "loaded_mb": loaded, "weights_mb": weights,
                      "seconds": time.perf_counter() - start, "statement": statement}))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--budget-mb", type=float, default=512.0, help="memory_budget_mb of the analyses (0: none given)"
    )
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--only", nargs="+", metavar="WORD", help="only the cases whose name holds one of these words")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    budget = args.budget_mb or None
    if args.case:
        child(args.case, args.prompts, args.tokens, budget)
        return
    rows = []
    for case in CASES:
        if args.only and not case.startswith("plain") and not any(w in case for w in args.only):
            continue
        command = [sys.executable, __file__, "--case", case, "--prompts", str(args.prompts), "--tokens",
                   str(args.tokens), "--budget-mb", str(args.budget_mb)]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:  # -9: killed, which on a machine without swap means out of memory
            print(f"{case}: failed (exit {done.returncode})\n{done.stderr[-1500:]}", flush=True)
            continue
        row = json.loads(done.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(
            f"{case}: peak {row['peak_mb']:,.0f} MB (model and inputs loaded: {row['loaded_mb']:,.0f} MB; the "
            f"analysis added {row['peak_mb'] - row['loaded_mb']:,.0f} MB), {row['seconds']:.0f} s",
            flush=True,
        )
    plain_row = next((r for r in rows if r["case"].startswith("plain")), None)
    for row in rows:
        if row is plain_row or plain_row is None:
            continue
        added, plain_added = row["peak_mb"] - row["loaded_mb"], plain_row["peak_mb"] - plain_row["loaded_mb"]
        goal = f"budget {budget:.0f} MB + weights {row['weights_mb']:,.0f} MB" if budget else "2x plain"
        within = added <= (budget + row["weights_mb"]) if budget else added <= 2 * plain_added
        print(
            f"  {row['case']}: added {added:,.0f} MB = {added / plain_added:.2f}x the plain forward and backward's "
            f"{plain_added:,.0f} MB; goal ({goal}): {'met' if within else 'NOT met'}"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
