"""Path patching of every edge of a 2-layer, 8-heads-per-layer model (LayerNorm, d_model 64; 8 x 8 senders
x receivers x q/k/v = 192 edges, plus 8 direct paths): hc.path_patch against the obvious loop (one hooked
forward pass per edge, TransformerLens's split q/k/v inputs with the receiver's LayerNorm scale frozen),
same inputs, same run.

    python benchmarks/path_patching.py [--batch 64] [--threads N]
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

import headcoop as hc

warnings.filterwarnings("ignore", category=DeprecationWarning)


def loop(model, clean, corrupt, metric):
    """One forward pass per edge (and per direct path), caches computed once."""
    _, src = model.run_with_cache(clean)
    _, tgt = model.run_with_cache(corrupt)
    out = {}
    model.set_use_split_qkv_input(True)
    try:
        for a in range(model.cfg.n_layers):
            for i in range(model.cfg.n_heads):
                delta = (src[f"blocks.{a}.attn.hook_z"][:, :, i] - tgt[f"blocks.{a}.attn.hook_z"][:, :, i]) @ model.W_O[
                    a, i
                ]
                for b in range(a + 1, model.cfg.n_layers):
                    for j in range(model.cfg.n_heads):
                        for via in "qkv":

                            def add(x, hook, b=b, j=j, delta=delta):
                                x = x.clone()
                                x[:, :, j] = tgt[f"blocks.{b}.hook_resid_pre"] + delta
                                return x

                            def scale(s, hook, b=b, j=j):
                                s = s.clone()
                                s[:, :, j] = tgt[f"blocks.{b}.ln1.hook_scale"]
                                return s

                            hooks = [(f"blocks.{b}.hook_{via}_input", add), (f"blocks.{b}.ln1.hook_scale", scale)]
                            out[(f"L{a}H{i}", f"L{b}H{j}", via)] = float(
                                metric(model.run_with_hooks(corrupt, fwd_hooks=hooks))
                            )
    finally:
        model.set_use_split_qkv_input(False)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    cfg = HookedTransformerConfig(n_layers=2, d_model=64, d_head=8, n_heads=8, n_ctx=16, d_vocab=50, attn_only=True,
                                  normalization_type="LN", seed=0)  # fmt: skip
    model = HookedTransformer(cfg).eval()
    gen = torch.Generator().manual_seed(0)
    clean = torch.randint(0, 50, (args.batch, 16), generator=gen)
    corrupt = clean.clone()
    corrupt[:, 5] = (clean[:, 5] + 7) % 50

    def metric(logits):
        return logits[:, -1, 3].mean() - logits[:, -1, 9].mean()

    hc.path_patch(model, clean=clean, corrupt=corrupt, metric=metric, direct=False)  # warm-up
    start = time.perf_counter()
    ours = hc.path_patch(model, clean=clean, corrupt=corrupt, metric=metric, direct=False)
    t_hc = time.perf_counter() - start
    start = time.perf_counter()
    theirs = loop(model, clean, corrupt, metric)
    t_loop = time.perf_counter() - start
    diff = max(abs(ours.values[k] - v) for k, v in theirs.items())
    print(
        f"{len(theirs)} edges, batch {args.batch}: hc.path_patch {t_hc:.3f} s, loop {t_loop:.3f} s, "
        f"ratio {t_loop / t_hc:.1f}x, max |diff| {diff:.1e}"
    )


if __name__ == "__main__":
    main()
