"""Activation patching: hc.patch (patches stacked along the batch axis) vs transformer_lens.patching
(one forward pass and one .item() per patch), same model, same inputs, same run.

    python benchmarks/patching.py [--batch 128] [--repeats 3] [--budget-mb 256] [--threads N]

Prints the best-of-`repeats` time of each, their ratio, and the largest difference between the two
results (absolute, and relative to max(1, |value|)), for the per-position head-output sweep (the headline), the all-position sweep and the
per-destination-position attention-pattern and per-position query sweeps.
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch
import transformer_lens.patching as tlp

import headcoop as hc

warnings.filterwarnings("ignore", category=DeprecationWarning)
# TransformerLens wraps its patch loop in a tqdm bar; drop it (this only makes the baseline faster).
tlp.tqdm = lambda iterable, *args, **kwargs: iterable


def best_time(fn, repeats: int) -> tuple[float, torch.Tensor]:
    fn()  # warm-up
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def load_model():
    try:
        return hc.load("count01"), "hc.load('count01')"
    except (FileNotFoundError, OSError, ValueError) as error:
        print(f"note: shipped count01 checkpoint unavailable ({error}); using hc.Count01().model(seed=0)")
        return hc.Count01().model(seed=0), "hc.Count01().model(seed=0) (untrained)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=128, help="examples in the clean/corrupt batch")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats after one warm-up (best is kept)")
    parser.add_argument("--budget-mb", type=float, default=256, help="hc.patch memory_budget_mb")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    torch.set_grad_enabled(False)
    model, source = load_model()
    task = model.task
    clean, corrupt = task.patching_inputs(n=args.batch)
    clean, corrupt = clean.to(model.cfg.device), corrupt.to(model.cfg.device)
    metric = lambda logits: task.metric(logits, clean)  # noqa: E731
    cfg = model.cfg
    print(
        f"model: {source}: {cfg.n_layers} layer(s), {cfg.n_heads} heads, d_model {cfg.d_model}, "
        f"d_head {cfg.d_head}; inputs [{args.batch}, {clean.tokens.shape[1]}]; device {cfg.device}; "
        f"torch threads {torch.get_num_threads()}"
    )

    cases = [
        ("z, positions='each'", "z", "each", tlp.get_act_patch_attn_head_out_by_pos),
        ("z, positions='all'", "z", "all", tlp.get_act_patch_attn_head_out_all_pos),
        ("pattern, positions='each'", "pattern", "each", tlp.get_act_patch_attn_head_pattern_by_pos),
        ("q, positions='each'", "q", "each", tlp.get_act_patch_attn_head_q_by_pos),
    ]
    for label, component, positions, tl_fn in cases:

        def run_tl():
            _, cache = model.run_with_cache(clean.tokens)
            return tl_fn(model, corrupt.tokens, cache, metric)

        def run_hc():
            return hc.patch(
                model,
                clean=clean,
                corrupt=corrupt,
                component=component,
                positions=positions,
                memory_budget_mb=args.budget_mb,
            ).values

        t_tl, ref = best_time(run_tl, args.repeats)
        t_hc, ours = best_time(run_hc, args.repeats)
        ref = ref.cpu()
        if component == "pattern" and positions == "each":
            ref = ref.permute(0, 2, 1)  # TL: [layer, head, dest_pos]; headcoop: [layer, dest_pos, head]
        diff = (ours - ref).abs().max().item()
        # float32 rounding grows with the metric's size (logit differences near 100 on the trained model)
        rel = ((ours - ref).abs() / ref.abs().clamp(min=1)).max().item()
        print(
            f"{label:28s} patches {ours.numel():5d}  transformer_lens {t_tl:8.3f} s  headcoop {t_hc:7.3f} s  "
            f"ratio {t_tl / t_hc:6.1f}x  max |diff| {diff:.1e} (relative {rel:.1e})"
        )
        if rel > 1e-5:
            raise SystemExit(f"results disagree for {label}: max |diff| {diff}, relative {rel}")


if __name__ == "__main__":
    main()
