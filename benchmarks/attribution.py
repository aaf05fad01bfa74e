"""Attribution patching: hc.attribute ("atp", "atp*", and "atp" verified on its top 20 plus 20 sampled cells)
against the exact hc.patch sweep and TransformerLens's by-position patching, same model, inputs and run.

    python benchmarks/attribution.py [--only gpt2] [--tl-patches 64] [--threads N] [--json]

Shapes (issue 25): a 4-layer d_model 256 model with MLPs (8 heads, 1,024 cells) and a GPT-2-small-shaped
model with random weights (12 layers, 12 heads, d_model 768, d_mlp 3072, vocabulary 50257, LayerNorm), both
on 8 inputs of 32 tokens, every head's z at every position (4,608 cells on the GPT-2 shape).

Printed per shape: each method's time, its speed-up over the exact sweep, its cost in forward-pass
equivalents (a backward pass counted as two), and its Pearson / Spearman correlation and recall@10 against
the exact sweep. TransformerLens runs one forward pass per patch: it is timed on the first `--tl-patches`
patches and scaled to all of them by their number (its cost per patch is one full forward pass whatever
the patch), which the line says.
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch
import transformer_lens.patching as tlp
from transformer_lens import HookedTransformer, HookedTransformerConfig

import headcoop as hc

warnings.filterwarnings("ignore")
tlp.tqdm = lambda iterable, *args, **kwargs: iterable

SHAPES = {
    "4-layer d_model 256 + MLPs": dict(n_layers=4, d_model=256, d_head=32, n_heads=8, d_mlp=1024, d_vocab=200),
    "GPT-2-small shape (random weights)": dict(
        n_layers=12, d_model=768, d_head=64, n_heads=12, d_mlp=3072, d_vocab=50257
    ),
}
BATCH, N_POS, VERIFY, SAMPLE = 8, 32, 20, 20


def build(seed: int, **shape) -> HookedTransformer:
    cfg = HookedTransformerConfig(
        n_ctx=N_POS, act_fn="gelu", normalization_type="LN", attn_only=False, seed=seed, **shape
    )
    model = HookedTransformer(cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "b_" in name or name.endswith((".b", ".w")):
                param.add_(0.3 * torch.randn(param.shape, generator=gen))
    return model.eval()


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="*", default=None, help="substrings of the shape names to run")
    parser.add_argument("--tl-patches", type=int, default=64, help="patches TransformerLens is timed on (then scaled)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--json",
        action="store_true",
        help="also write docs/results/attribution/benchmark.json (what docs/results/attribution.md shows)",
    )
    args = parser.parse_args()
    table = []
    if args.threads:
        torch.set_num_threads(args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"device {device}, torch threads {torch.get_num_threads()}, {BATCH} inputs of {N_POS} tokens, z by position")
    for name, shape in SHAPES.items():
        if args.only and not any(s in name for s in args.only):
            continue
        model = build(0, **shape).to(device)
        gen = torch.Generator().manual_seed(1)
        clean = torch.randint(0, shape["d_vocab"], (BATCH, N_POS), generator=gen)
        corrupt = clean.clone()
        corrupt[:, N_POS // 2 :] = torch.randint(0, shape["d_vocab"], (BATCH, N_POS - N_POS // 2), generator=gen)
        answer = torch.randint(0, shape["d_vocab"], (BATCH,), generator=gen)
        clean, corrupt, answer = clean.to(device), corrupt.to(device), answer.to(device)
        rows = torch.arange(BATCH, device=device)

        def metric(logits, answer=answer, rows=rows):
            last = logits[:, -1]
            return (last[rows, answer] - last[rows, (answer + 1) % last.shape[-1]]).mean()

        kw = dict(clean=clean, corrupt=corrupt, metric=metric, component="z")
        hc.attribute(model, **kw, estimator="atp", verify=0, sample=0)  # warm-up
        t_exact, exact = timed(lambda: hc.patch(model, **kw, positions="each"))
        cells = exact.values.numel()
        print(f"\n{name}: {cells} cells; exact hc.patch sweep {t_exact:.2f} s ({exact.method})", flush=True)
        with torch.no_grad():
            _, cache = model.run_with_cache(clean)
        index = tlp.make_df_from_ranges([model.cfg.n_layers, N_POS, model.cfg.n_heads], ["layer", "pos", "head"])
        n_tl = min(args.tl_patches, len(index))

        def run_tl():  # TL's by-position head-output patcher on the first n_tl patches
            return tlp.generic_activation_patch(model, corrupt, cache, metric, patch_setter=tlp.layer_pos_head_vector_patch_setter,
                                                activation_name="z", index_df=index.iloc[:n_tl])  # fmt: skip

        with torch.no_grad():
            t_tl_part, _ = timed(run_tl)
        t_tl = t_tl_part * cells / n_tl
        print(f"  TransformerLens (one pass per patch): {t_tl:.1f} s, scaled from {t_tl_part:.2f} s on {n_tl} of "
              f"{cells} patches; hc.patch is {t_tl / t_exact:.1f}x it", flush=True)  # fmt: skip
        print(f"  {'method':28s} {'time s':>8s} {'vs exact':>9s} {'vs TL':>8s} {'fwd-equiv':>10s} {'pearson':>8s} "
              f"{'spearman':>9s} {'recall@10':>10s}")  # fmt: skip
        for label, method, verify, sample in (
            ("atp", "atp", 0, 0),
            ("atp*", "atp*", 0, 0),
            ("ig (10 steps)", "ig", 0, 0),
            (f"atp, verified {VERIFY}+{SAMPLE}", "atp", VERIFY, SAMPLE),
            (f"atp*, verified {VERIFY}+{SAMPLE}", "atp*", VERIFY, SAMPLE),
        ):
            t, result = timed(lambda: hc.attribute(model, **kw, estimator=method, verify=verify, sample=sample))
            c = result.compare(exact, k=10)
            pearson, spearman, recall = c["pearson"], c["spearman"], c["recall@10"]
            cost = result.cost["estimate"] + result.cost.get("verification", 0)
            table.append({"shape": name, "method": label, "cells": cells, "seconds": round(t, 3),
                          "exact sweep s": round(t_exact, 3), "vs exact": round(t_exact / t, 1),
                          "TL s (scaled)": round(t_tl, 1), "vs TL": round(t_tl / t, 1), "forward equivalents": cost,
                          "pearson": round(pearson, 3), "spearman": round(spearman, 3), "recall@10": recall})  # fmt: skip
            print(f"  {label:28s} {t:8.2f} {t_exact / t:8.1f}x {t_tl / t:7.1f}x {cost:10.0f} {pearson:8.3f} "
                  f"{spearman:9.3f} {recall:10.1f}", flush=True)  # fmt: skip
            if verify:
                m = result.missed
                print(f"    missed outside the top: estimate {m['estimate']:.1f} ({m['low']:.1f}..{m['high']:.1f}) of "
                      f"{m['rest']} cells; exact sweep: "
                      f"{int(((exact.values - result.target_value).abs().reshape(-1)[~result.top.reshape(-1)] > m['threshold']).sum())}")  # fmt: skip

    if args.json:
        import json
        from pathlib import Path

        folder = Path(__file__).resolve().parents[1] / "docs" / "results" / "attribution"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "benchmark.json").write_text(
            json.dumps(
                {
                    "device": f"{device}, {torch.get_num_threads()} threads",
                    "batch": BATCH,
                    "n_pos": N_POS,
                    "rows": table,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
