"""The pair map on a GPT-2-small-shaped model: every one of the 10,296 head pairs of 12 layers x 12 heads
(d_model 768, d_mlp 3072, vocabulary 50,257, LayerNorm, random weights), 16 prompts of 16 tokens, logit
difference, mean ablation over 64 reference sequences.

    python benchmarks/pair_map.py                  # the whole map, exact (the goal: under 60 minutes here)
    python benchmarks/pair_map.py --layers 4 8     # the growth: the map at 4 and 8 layers too
    python benchmarks/pair_map.py --screen         # the screened map (second-order attribution, verified)
    python benchmarks/pair_map.py --planted        # the planted bench at GPT-2 size (experiments/pair_map/planted.py):
                                                   # the planted pairs ranked first and named right?

Printed, measured in the same run: one plain forward pass of the batch; the map's time, its coalitions and
forward-pass equivalents beside the count of pairs; its prediction (made from the singles before the pairs
ran) against the time taken; the obvious loop's time per pair (hc.ablate of the two heads, one forward pass,
timed on a few pairs) extrapolated to all pairs; and the process's peak resident memory against the weights
and the memory budget.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
warnings.filterwarnings("ignore")

SHAPE = dict(d_model=768, d_head=64, n_heads=12, d_mlp=3072, d_vocab=50257, n_ctx=64, act_fn="gelu_new",
             normalization_type="LN")  # fmt: skip


def build(n_layers: int = 12, batch: int = 16, n_pos: int = 16, device: str = "cpu"):
    """The model, a Batch of `batch` random prompts with random answer / wrong tokens, 64 reference prompts; all
    on `device`."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    import headcoop as hc

    torch.manual_seed(0)
    model = HookedTransformer(HookedTransformerConfig(n_layers=n_layers, **SHAPE, seed=0, device=device)).eval()
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, SHAPE["d_vocab"], (batch, n_pos), generator=gen)
    answer = torch.randint(0, SHAPE["d_vocab"], (batch,), generator=gen)
    wrong = (answer + 1 + torch.randint(0, 1000, (batch,), generator=gen)) % SHAPE["d_vocab"]
    reference = torch.randint(0, SHAPE["d_vocab"], (64, n_pos), generator=gen)
    return model, hc.Batch.from_answers(tokens, answer, wrong).to(device), reference.to(device)


def synced(device: str) -> float:
    """time.perf_counter() after the device's queued work has finished (a GPU runs asynchronously)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter()


def run(n_layers: int, screen: bool, named: int, loop_pairs: int = 4, device: str = "cpu",
        budget_mb: float = 256) -> dict:  # fmt: skip
    import headcoop as hc

    torch.set_grad_enabled(False)
    model, batch, reference = build(n_layers, device=device)
    weights_gb = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30
    model(batch.tokens)  # warm-up (a GPU's first pass loads its kernels)
    start = synced(device)
    for _ in range(3):
        model(batch.tokens)
    forward_s = (synced(device) - start) / 3
    rows = torch.arange(len(batch.tokens))
    # the obvious loop: each head's mean z over the reference computed once, then per pair plain hook_z hooks
    # setting the two heads to it and one forward pass
    _, cache = model.run_with_cache(reference, names_filter=lambda name: name.endswith("hook_z"))
    means = {lay: cache[f"blocks.{lay}.attn.hook_z"].mean(0) for lay in range(n_layers)}
    start = synced(device)
    for a, b in [(0, 13), (30, 31), (60, 100), (100, 140)][:loop_pairs]:
        heads = [(a // 12 % n_layers, a % 12), (b // 12 % n_layers, b % 12)]

        def setter(lay, head):
            def hook(z, hook=None):
                z[:, :, head] = means[lay][None, :, head]
                return z

            return hook

        logits = model.run_with_hooks(batch.tokens, fwd_hooks=[(f"blocks.{lay}.attn.hook_z", setter(lay, head))
                                                               for lay, head in heads])[rows, -1]  # fmt: skip
        float((logits[rows, batch.answer] - logits[rows, batch.wrong]).mean())
    loop_pair_s = (synced(device) - start) / loop_pairs
    base_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    start = synced(device)
    result = hc.pair_map(model, batch, metric="logit_diff", how="mean", reference=reference,
                         method="screen" if screen else "exact", named=0, progress=True,
                         memory_budget_mb=budget_mb)  # fmt: skip
    map_s = synced(device) - start
    k = 12 * n_layers
    pairs = k * (k - 1) // 2
    out = dict(layers=n_layers, heads=k, pairs=pairs, threads=torch.get_num_threads(), forward_s=forward_s,
               map_s=map_s, coalitions=result.cost["coalitions"], passes=result.cost["passes"],
               predicted_exact_s=result.cost["predicted_exact_s"], loop_pair_s=loop_pair_s,
               loop_all_s=loop_pair_s * (pairs + k + 1), exact=result.exact, missed=result.missed,
               interacting=int(result.to_dataframe().interacts.sum()), weights_gb=weights_gb,
               peak_gb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, base_gb=base_gb, budget_mb=budget_mb,
               device=str(torch.cuda.get_device_name()) if device.startswith("cuda") else "cpu",
               gpu_peak_gb=torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None)  # fmt: skip
    print(f"{n_layers} layers, {k} heads, {pairs:,} pairs: one forward pass {forward_s:.3f} s; the map "
          f"{'screened' if screen else 'exact'} {map_s:.0f} s ({map_s / 60:.1f} min), {out['coalitions']:,} coalitions, "
          f"{out['passes']:.0f} forward-pass equivalents ({out['passes'] / pairs:.2f} per pair); predicted from the "
          f"singles {out['predicted_exact_s']:.0f} s; the obvious loop {loop_pair_s:.2f} s a pair = "
          f"{out['loop_all_s'] / 60:.0f} min ({out['loop_all_s'] / map_s:.1f}x the map); peak RSS {out['peak_gb']:.2f} GB, "
          f"{out['peak_gb'] - base_gb:.2f} GB above the process before the map ({base_gb:.2f} GB: torch, the model's "
          f"{weights_gb:.2f} GB of weights, a forward pass); the budget {budget_mb / 1024:.2f} GB", flush=True)  # fmt: skip
    print("\n".join(result.lines()), flush=True)
    if named:
        start = time.perf_counter()
        worded = result.with_words(model, batch, reference, named)
        out["named_s"] = time.perf_counter() - start
        out["named"] = worded.named.to_dict("records")
        print(f"naming {len(worded.named)} pairs by hc.cooperation: {out['named_s']:.0f} s", flush=True)
    return out


def planted_run(screen: bool) -> dict:
    """The planted GPT-2-sized bench (12 x 12, d_model 768, d_mlp 3072, vocabulary 1,000, no norm): the whole
    map, then hc.cooperation's words for the 4 strongest pairs, against the planted truths."""
    import headcoop as hc
    from experiments.pair_map import planted

    torch.set_grad_enabled(False)
    model = planted.build()
    batch, reference = planted.inputs(model, 16), planted.inputs(model, 64, seed=1)
    truths = planted.truths(model, batch, reference)
    start = time.perf_counter()
    result = hc.pair_map(model, batch, reference=reference, method="screen" if screen else "exact", named=4,
                         progress=True)  # fmt: skip
    seconds = time.perf_counter() - start
    frame = result.to_dataframe()
    top = [tuple(sorted(p)) for p in zip(frame.head_a[:4], frame.head_b[:4])]
    expected = {tuple(sorted(pair)): word for pair, (word, _) in planted.PLANTED.items()}
    words = {tuple(sorted((r.head_a, r.head_b))): (r.word, r.agreement) for r in result.named.itertuples()}
    ranked = set(top) == set(expected)
    named = all(words.get(pair, ("", 0))[0] == word for pair, word in expected.items())
    print("\n".join(result.lines()))
    print(f"planted GPT-2-sized bench: {seconds:.0f} s (map {result.cost['seconds']:.0f} s, words the rest); "
          f"the planted pairs are the top 4: {ranked}; named right: {named}; fifth |I| "
          f"{abs(float(frame.interaction[4])):.3g} against the weakest planted {min(abs(t['interaction']) for t in truths.values()):.3g}",
          flush=True)  # fmt: skip
    for pair, word in expected.items():
        got, agreement = words.get(pair, ("not named", 0.0))
        truth = truths[pair if pair in truths else pair[::-1]]["interaction"]
        print(f"  {pair[0]}+{pair[1]}: planted {word}, named {got} ({agreement:.0%} of readings); I by plain hooks "
              f"{truth:+.3f}")  # fmt: skip
    return dict(seconds=seconds, map_s=result.cost["seconds"], ranked=ranked, named=named,
                words={f"{a}+{b}": w for (a, b), w in words.items()}, lines=result.lines())  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="*", default=[12])
    parser.add_argument("--screen", action="store_true")
    parser.add_argument("--named", type=int, default=0, help="pairs to name by hc.cooperation after the map")
    parser.add_argument("--planted", action="store_true")
    parser.add_argument("--json")
    parser.add_argument("--device", default="cpu", help="cpu or cuda: where the model, inputs and map run")
    parser.add_argument("--budget-mb", type=float, default=256, help="hc.pair_map's memory_budget_mb")
    args = parser.parse_args()
    if args.planted:
        results = [planted_run(args.screen)]
    else:
        results = [run(n, args.screen, args.named, device=args.device, budget_mb=args.budget_mb) for n in args.layers]
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
