"""SmolLM2-135M's induction heads, found from generic inputs (issue 73): on repeated random tokens, each of its
270 heads' previous-token, duplicate-token and induction scores (attention read with plain hooks on
hook_pattern), the loss on each half, and exact patching of every head's output (hc.patch) on the repeat's
loss. Writes docs/results/smollm2/ (heads.csv, summary.json) and docs/results/smollm2.md.

    python -m experiments.smollm2.run_all [--out FOLDER] [--n 8] [--half 40] [--seed 0] [--no-patch]

The model: `hc.load_gguf("smollm2-135m")` (SmolLM2-135M-Instruct, Q4_1 weights dequantized: what is analysed
is the quantized model). Inputs: n sequences of `half` random token ids (2,000..20,000: ordinary words and
pieces), each repeated once. Scores: previous-token, the mean attention from each position of the first half
to the one before it; duplicate-token, from each position of the repeat to the same token in the first half;
induction, to the token after it. Patching: the corrupt run's repeat is replaced by fresh random tokens (no
repetition to use); each head's z is patched from the repeated run into it at every position, and the metric is
the negative mean loss on the repeat's tokens from its second on (the share of the clean - corrupt gap restored
is printed beside it).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parents[2] / "docs" / "results"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--half", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-patch", action="store_true", help="scores only (no exact patching of every head)")
    args = parser.parse_args(argv)

    import pandas as pd
    import torch

    import headcoop as hc
    from experiments.shared import setup, write_table

    setup(threads=torch.get_num_threads())
    times: dict[str, float] = {}
    start = time.perf_counter()
    model = hc.load_gguf("smollm2-135m")
    times["load (cached conversion, or converting it)"] = time.perf_counter() - start
    cfg = model.cfg
    gen = torch.Generator().manual_seed(args.seed)
    first = torch.randint(2000, 20000, (args.n, args.half), generator=gen)
    clean = torch.cat([first, first], 1)
    corrupt = torch.cat([first, torch.randint(2000, 20000, (args.n, args.half), generator=gen)], 1)

    start = time.perf_counter()
    names = {f"blocks.{layer}.attn.hook_pattern" for layer in range(cfg.n_layers)}
    with torch.no_grad():
        loss, cache = model.run_with_cache(clean, return_type="loss", loss_per_token=True,
                                           names_filter=lambda name: name in names)  # fmt: skip
    times["one forward pass with the patterns cached"] = time.perf_counter() - start
    h = args.half
    q_first, q_repeat = torch.arange(1, h), torch.arange(h, 2 * h)
    rows = []
    for layer in range(cfg.n_layers):
        p = cache[f"blocks.{layer}.attn.hook_pattern"]  # [batch, head, query, key]
        prev = p[:, :, q_first, q_first - 1].mean((0, 2))
        dup = p[:, :, q_repeat, q_repeat - h].mean((0, 2))
        ind = p[:, :, q_repeat[:-1], q_repeat[:-1] - h + 1].mean((0, 2))
        for head in range(cfg.n_heads):
            rows.append(dict(head=f"L{layer}H{head}", layer=layer, kv_group=head // (cfg.n_heads // cfg.n_key_value_heads),
                             previous_token=float(prev[head]), duplicate_token=float(dup[head]),
                             induction=float(ind[head])))  # fmt: skip
    heads = pd.DataFrame(rows)
    summary = dict(loss_first_half=float(loss[:, : h - 1].mean()), loss_repeat=float(loss[:, h:].mean()),
                   n=args.n, half=args.half, seed=args.seed, model=cfg.model_name)  # fmt: skip

    if not args.no_patch:

        def metric(logits):  # the negative mean loss on the repeat's tokens from its second on (higher is better)
            logp = logits[:, h:-1].log_softmax(-1)
            target = clean[:, h + 1 :].to(logp.device)
            return logp.gather(-1, target[..., None]).mean()

        start = time.perf_counter()
        patched = hc.patch(model, clean=clean, corrupt=corrupt, metric=metric, component="z", progress=False)
        times[f"hc.patch of all {cfg.n_layers * cfg.n_heads} heads' z (exact)"] = time.perf_counter() - start
        frame = patched.to_dataframe()
        frame["head"] = [f"L{int(a)}H{int(b)}" for a, b in zip(frame["layer"], frame["head"])]
        heads = heads.merge(frame[["head", "value", "normalized"]].rename(
            columns={"value": "patched_metric", "normalized": "restored"}), on="head")  # fmt: skip
        summary.update(clean_metric=patched.clean_value, corrupt_metric=patched.corrupt_value, method=patched.method)
    summary["seconds"] = times
    out = args.out / "smollm2"
    write_table(heads, out, "heads")
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    for column in ("previous_token", "duplicate_token", "induction", "restored"):
        if column in heads:
            print(column, heads.nlargest(5, column)[["head", column]].to_string(index=False))


if __name__ == "__main__":
    main()
