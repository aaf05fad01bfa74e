"""Activation patching on a suite of model shapes: hc.patch vs transformer_lens.patching, same model, same
inputs, same run (issue 12's speed suite).

    python benchmarks/patching_shapes.py [--repeats 2] [--threads N] [--only NAME ...]

Shapes: the shipped 1-layer Count01; a 2-layer attention-only model; an attn-only-2l-shaped model
(LayerNorm, shortformer positions, a word-level tokenizer attached); a 2-layer model with MLPs and
LayerNorm (gelu-2l shape, d_model 64); a 4-layer d_model 256 model with MLPs. Sweeps: every head's z, q, v
and pattern one position at a time, and z at all positions. Prints the best-of-`repeats` time of each
side, their ratio, the exact ceiling of that sweep (`patching_bound.py`: TransformerLens's multiply-adds over
the least an exact method needs; by-position sweeps only) and the share of it reached, headcoop's method, and
the largest relative difference (max |diff| / max(1, |value|)).
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch
import transformer_lens.patching as tlp
from patching_bound import SHAPES as BOUND_SHAPES
from patching_bound import sweep_ratio
from transformer_lens import HookedTransformer, HookedTransformerConfig

import headcoop as hc

warnings.filterwarnings("ignore", category=DeprecationWarning)
tlp.tqdm = lambda iterable, *args, **kwargs: iterable  # TransformerLens's bar only slows its baseline
from headcoop.storage.foreign import word_tokenizer  # noqa: E402  (after the tqdm patch above)

SWEEPS = [
    ("z each", "z", "each", tlp.get_act_patch_attn_head_out_by_pos),
    ("z all", "z", "all", tlp.get_act_patch_attn_head_out_all_pos),
    ("q each", "q", "each", tlp.get_act_patch_attn_head_q_by_pos),
    ("v each", "v", "each", tlp.get_act_patch_attn_head_v_by_pos),
    ("pattern each", "pattern", "each", tlp.get_act_patch_attn_head_pattern_by_pos),
]


def build(seed: int, **cfg) -> HookedTransformer:
    model = HookedTransformer(HookedTransformerConfig(seed=seed, **cfg))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "b_" in name or name.endswith((".b", ".w")):
                param.add_(0.3 * torch.randn(param.shape, generator=gen))
    return model.eval()


def shapes() -> dict:
    """name -> (model, clean tokens, corrupt tokens, answer ids, wrong ids)."""
    out = {}
    model = hc.load("count01")
    clean, corrupt = model.task.patching_inputs(n=128)
    out["count01 (shipped, 1 layer)"] = (
        model,
        clean.tokens,
        corrupt.tokens,
        clean.answer_pos,
        clean.answer,
        clean.wrong,
    )
    gen = torch.Generator().manual_seed(0)
    specs = {
        "2-layer attn-only": (128, 16, dict(n_layers=2, d_model=32, d_head=8, n_heads=4, n_ctx=16, d_vocab=50,
                                            attn_only=True)),
        "attn-only-2l shape + tokenizer": (128, 16, dict(n_layers=2, d_model=64, d_head=16, n_heads=4, n_ctx=16,
                                                          d_vocab=15, attn_only=True, normalization_type="LN",
                                                          positional_embedding_type="shortformer")),
        "gelu-2l shape (d_model 64)": (128, 16, dict(n_layers=2, d_model=64, d_head=16, n_heads=4, n_ctx=16, d_vocab=50,
                                                     attn_only=False, d_mlp=256, act_fn="gelu", normalization_type="LN")),
        "4-layer d_model 256 + MLPs": (32, 16, dict(n_layers=4, d_model=256, d_head=32, n_heads=8, n_ctx=16,
                                                    d_vocab=200, attn_only=False, d_mlp=1024, act_fn="gelu",
                                                    normalization_type="LN")),
    }  # fmt: skip
    for name, (batch, width, cfg) in specs.items():
        model = build(0, **cfg)
        if "tokenizer" in name:
            model.set_tokenizer(word_tokenizer([f"w{i}" for i in range(cfg["d_vocab"])]), default_padding_side="right")
        clean = torch.randint(0, cfg["d_vocab"], (batch, width), generator=gen)
        corrupt = clean.clone()
        corrupt[:, width // 2] = torch.randint(0, cfg["d_vocab"], (batch,), generator=gen)
        answer = torch.randint(0, cfg["d_vocab"], (batch,), generator=gen)
        out[name] = (model, clean, corrupt, torch.full((batch,), width - 1), answer, (answer + 1) % cfg["d_vocab"])
    return out


def best_time(fn, repeats: int):
    fn()
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--only", nargs="*", default=None, help="substrings of the shape names to run")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    print(f"torch threads {torch.get_num_threads()}")
    print(f"{'shape':32s} {'sweep':13s} {'patches':>7s} {'TL s':>8s} {'hc s':>8s} {'ratio':>7s} {'ceiling':>8s} "
          f"{'share':>6s}  method      rel diff")  # fmt: skip
    worst = float("inf")
    for name, (model, clean, corrupt, answer_pos, answer, wrong) in shapes().items():
        if args.only and not any(s in name for s in args.only):
            continue
        rows = torch.arange(len(clean))

        def metric(logits, answer_pos=answer_pos, answer=answer, wrong=wrong, rows=rows):
            at = logits[rows, answer_pos]
            return (at[rows, answer] - at[rows, wrong]).mean()

        for label, component, positions, tl_fn in SWEEPS:

            def run_tl():
                _, cache = model.run_with_cache(clean)
                return tl_fn(model, corrupt, cache, metric)

            def run_hc():
                return hc.patch(model, clean=clean, corrupt=corrupt, metric=metric, component=component,
                                positions=positions)  # fmt: skip

            t_tl, ref = best_time(run_tl, args.repeats)
            t_hc, ours = best_time(run_hc, args.repeats)
            ref = ref.cpu()
            if component == "pattern":
                ref = ref.permute(0, 2, 1)
            rel = ((ours.values - ref).abs() / ref.abs().clamp(min=1)).max().item()
            worst = min(worst, t_tl / t_hc)
            bound = (f"{sweep_ratio(BOUND_SHAPES[name], component):7.1f}x "
                     f"{t_tl / t_hc / sweep_ratio(BOUND_SHAPES[name], component):6.0%}") if positions == "each" \
                else f"{'-':>8s} {'-':>6s}"  # fmt: skip
            print(
                f"{name:32s} {label:13s} {ours.values.numel():7d} {t_tl:8.3f} {t_hc:8.3f} {t_tl / t_hc:6.1f}x "
                f"{bound}  {ours.method:11s} {rel:.1e}",
                flush=True,
            )
            if rel > 1e-5:
                raise SystemExit(f"results disagree for {name}, {label}: relative {rel}")
    print(f"slowest ratio: {worst:.1f}x")


if __name__ == "__main__":
    main()
