"""Edge attribution on the GPT-2-small shape: hc.edges' EAP (every edge), EAP verified on its top 20 edges
plus 20 sampled ones, against exact edge patching of every edge, same model, inputs and run.

    python benchmarks/edges.py [--exact-sample 192] [--reference-sample 8] [--threads N]
    python benchmarks/edges.py --floor 21 --threads 1   # EAP against its floor only, paired, two shapes

The model: 12 layers x 12 heads, d_model 768, d_mlp 3072, vocabulary 50257, LayerNorm, random weights, on 8
inputs of 16 tokens. Its graph has 32,936 edges (158 writers: token and positional embeddings, 144 heads, 12
MLPs; 445 readers: each head's q, k and v, each MLP, the logits). Exact patching of all of them is too long to
run here: it is timed on a sample of `--exact-sample` edges spread over the layers on the engine (stacked
copies) and scaled to all edges by their number per reader layer, which the line says; the obvious baseline,
one plain forward pass per edge (the reference path), is timed on `--reference-sample` edges and scaled the
same way. A forward pass is timed alone too: EAP's cost in forward-pass equivalents is its time over it, beside
its floor measured in the same run (plain TransformerLens: the source's forward pass, the target's forward and
backward), and the ratio of the two (`--eap-only` prints just these).
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

import headcoop as hc
from headcoop.analysis.edges.exact import edge_copies, writer_outputs
from headcoop.analysis.edges.graph import graph
from headcoop.analysis.engine.copies import clean_corrupt, evaluate, target_run

warnings.filterwarnings("ignore")
SHAPE = dict(n_layers=12, d_model=768, d_head=64, n_heads=12, d_mlp=3072, d_vocab=50257)
BATCH, N_POS = 8, 16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--exact-sample", type=int, default=192)
    parser.add_argument("--reference-sample", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--eap-only", action="store_true", help="EAP against its floor only (no exact patching)")
    parser.add_argument(
        "--floor",
        type=int,
        default=0,
        metavar="N",
        help="only EAP against its floor, paired: N rounds of (floor, EAP) on both shapes (issue 72)",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.floor:
        for name, shape in FLOOR_SHAPES.items():
            paired_floor(name, shape, args.floor)
        return
    cfg = HookedTransformerConfig(n_ctx=N_POS, act_fn="gelu", normalization_type="LN", attn_only=False, seed=0, **SHAPE)
    model = HookedTransformer(cfg).eval()
    gen = torch.Generator().manual_seed(0)
    clean = torch.randint(0, SHAPE["d_vocab"], (BATCH, N_POS), generator=gen)
    corrupt = clean.clone()
    corrupt[:, -3] = torch.randint(0, SHAPE["d_vocab"], (BATCH,), generator=gen)

    def metric(logits):
        return logits[:, -1, 100].mean() - logits[:, -1, 200].mean()

    writers, readers, all_edges = graph(model)
    print(
        f"GPT-2-small shape, random weights, {BATCH} inputs x {N_POS} tokens, {torch.get_num_threads()} torch threads: "
        f"{len(writers)} writers, {len(readers)} readers, {len(all_edges)} edges"
    )
    with torch.no_grad():
        model(clean)
        start = time.perf_counter()
        for _ in range(3):
            model(clean)
        forward = (time.perf_counter() - start) / 3
    print(f"one forward pass: {forward:.3f} s")

    def floor_once() -> float:
        """EAP's compute floor, plain TransformerLens: the source forward pass, the target's forward and backward."""
        start = time.perf_counter()
        with torch.no_grad():
            model(clean)
        with torch.enable_grad():
            metric(model(corrupt)).backward()
        model.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    def eap_once() -> float:
        start = time.perf_counter()
        hc.edges(model, clean=clean, corrupt=corrupt, metric=metric, estimator="eap", progress=False)
        return time.perf_counter() - start

    floor_once(), eap_once()  # warm
    floor_s = min(floor_once() for _ in range(3))
    eap_s = min(eap_once() for _ in range(3))
    print(
        f"EAP's floor (source forward; target forward + backward, plain TransformerLens): {floor_s:.3f} s "
        f"= {floor_s / forward:.2f} forward-pass equivalents"
    )
    print(
        f"EAP, every edge: {eap_s:.3f} s = {eap_s / forward:.2f} forward-pass equivalents, {eap_s / floor_s:.2f}x its floor "
        "(best of 3 each)"
    )
    if args.eap_only:
        return
    start = time.perf_counter()
    verified = hc.edges(model, clean=clean, corrupt=corrupt, metric=metric, estimator="eap", verify=20, sample=20)
    verified_s = time.perf_counter() - start
    print(f"EAP verified on its top 20 + 20 sampled edges: {verified_s:.2f} s; missed: {verified.missed}")

    # exact edge patching: a sample of edges per reader layer, timed on the engine and scaled to every edge
    clean_t, corrupt_t, score = clean_corrupt(model, clean, corrupt, metric)
    _, source = model.run_with_cache(clean_t)
    target = target_run(model, corrupt_t, score, lambda n: True)
    out_s, out_t = writer_outputs(model, source, writers), writer_outputs(model, target.cache, writers)
    deltas = {w: out_s[w] - out_t[w] for w in writers}
    layer_of = lambda e: cfg.n_layers if e[1][0] == "logits" else e[1][1]  # noqa: E731
    by_layer: dict[int, list] = {}
    for e in all_edges:
        by_layer.setdefault(layer_of(e), []).append(e)
    rng = np.random.default_rng(0)

    def timed(per_layer: int, path: str) -> float:
        """Seconds to patch every edge, scaled from `per_layer` sampled edges of each reader layer."""
        total = 0.0
        for layer, edges in sorted(by_layer.items()):
            picked = [edges[i] for i in rng.choice(len(edges), size=min(per_layer, len(edges)), replace=False)]
            start = time.perf_counter()
            evaluate(target, edge_copies(model, picked, deltas, target, source), path, 256)
            total += (time.perf_counter() - start) / len(picked) * len(edges)
        return total

    per_layer = max(1, args.exact_sample // len(by_layer))
    exact_s = timed(per_layer, "stacked")
    print(
        f"exact edge patching of every edge on the engine (timed on {per_layer} edges per reader layer, "
        f"{per_layer * len(by_layer)} in all, scaled): {exact_s:.0f} s"
    )
    ref_per_layer = max(1, args.reference_sample // len(by_layer)) if args.reference_sample >= len(by_layer) else 1
    reference_s = timed(ref_per_layer, "reference")
    print(
        f"one plain forward pass per edge (timed on {ref_per_layer} edge per reader layer, scaled): {reference_s:.0f} s"
    )
    print(
        f"ratios: verified EAP is {exact_s / verified_s:.0f}x faster than exact patching of every edge on the engine, "
        f"{reference_s / verified_s:.0f}x faster than one pass per edge; the engine is {reference_s / exact_s:.1f}x "
        "faster than one pass per edge"
    )


FLOOR_SHAPES = {
    "4-layer d_model 256 + MLPs": dict(n_layers=4, d_model=256, d_head=32, n_heads=8, d_mlp=1024, d_vocab=200),
    "GPT-2-small shape": SHAPE,
}


def paired_floor(name: str, shape: dict, rounds: int) -> None:
    """EAP over every edge against its floor (the source's forward pass, the target's forward and backward,
    plain TransformerLens), in process time, each EAP call timed right after its own floor and the median of
    the per-round ratios printed (issue 72: medians of floors and of EAP calls taken minutes apart on a loaded
    machine gave 1.31x-1.61x for the same code), with a callable metric and with metric="logit_diff"."""
    from headcoop.tasks.base import Batch

    cfg = HookedTransformerConfig(n_ctx=N_POS, act_fn="gelu", normalization_type="LN", seed=0, **shape)
    model = HookedTransformer(cfg).eval()
    gen = torch.Generator().manual_seed(0)
    clean = torch.randint(0, shape["d_vocab"], (BATCH, N_POS), generator=gen)
    corrupt = clean.clone()
    corrupt[:, -3] = torch.randint(0, shape["d_vocab"], (BATCH,), generator=gen)
    answer, wrong = torch.full((BATCH,), 100), torch.full((BATCH,), 150)

    def metric(logits):
        return logits[:, -1, 100].mean() - logits[:, -1, 150].mean()

    def floor() -> float:
        start = time.process_time()
        with torch.no_grad():
            model(clean)
        with torch.enable_grad():
            metric(model(corrupt)).backward()
        model.zero_grad(set_to_none=True)
        return time.process_time() - start

    calls = {
        "callable metric": lambda: hc.edges(model, clean=clean, corrupt=corrupt, metric=metric, estimator="eap",
                                            progress=False),
        'metric="logit_diff"': lambda: hc.edges(model, clean=Batch.from_answers(clean, answer, wrong),
                                                corrupt=Batch.from_answers(corrupt, answer, wrong),
                                                metric="logit_diff", estimator="eap", progress=False),
    }  # fmt: skip
    for call in calls.values():
        floor(), call()  # warm
    ratios: dict = {what: [] for what in calls}
    floors = []
    for _ in range(rounds):
        for what, call in calls.items():
            f = floor()
            start = time.process_time()
            call()
            ratios[what].append((time.process_time() - start) / f)
            floors.append(f)
    line = ", ".join(f"{what} {np.median(r):.2f}x (range {min(r):.2f}-{max(r):.2f})" for what, r in ratios.items())
    print(
        f"{name}, {BATCH} x {N_POS} tokens, {torch.get_num_threads()} thread(s), process time, median of "
        f"{rounds} paired rounds: floor {np.median(floors) * 1e3:.1f} ms; EAP over every edge: {line}"
    )


if __name__ == "__main__":
    main()
