"""SmolLM2-135M's indirect-object identification (issue 73, item 3): on prompts from templates with single-token
names, the logit difference (indirect object minus subject) decomposed by head (hc.dla), exact patching of every
head from prompts whose names are all different (hc.patch), the name movers' attention, who takes over when the
name movers are ablated (backup name movers: the rise of each other head's direct effect), hc.cooperation on the
key heads and the pair map over all 270 heads (hc.pair_map, screened with its miss bound on this CPU). Writes
docs/results/smollm2/ioi_*.csv and ioi.json, which `experiments.smollm2.page` renders.

    python -m experiments.smollm2.ioi [--out FOLDER] [--n 24] [--seed 0] [--no-map]

Prompts: "When A and B went to the PLACE, B gave a THING to" (and two more templates of the same shape), A the
indirect object (the answer), B the subject (the wrong answer); every name, place and thing one token of the
model's tokenizer with its leading space, so every prompt of a template has the same length. The corrupt prompt
replaces the three name slots with three other names (the "ABC" prompts of Wang et al. 2022), so no name repeats:
what patching a head from the clean run restores is what it does with the repetition. Name movers: the heads of
largest positive direct effect on the logit difference at the last position (DLA, the final norm's scale frozen).
Backup: with the top name movers' z mean-ablated (their mean over the prompts), each other head's direct effect
again; the rise, and the share of the lost logit difference the model recovers.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parents[2] / "docs" / "results"
NAMES = ("Mary John Tom James Anna Paul Sarah David Emma Mike Lisa Mark Kate Peter Alice Bob Jack Laura Chris Emily "
         "Daniel Rachel Steve Helen George Linda Frank Susan Henry Nancy").split()  # fmt: skip
PLACES = ("store", "park", "school", "market", "beach")
THINGS = ("drink", "book", "ball", "gift", "bag")
TEMPLATES = (
    "When {A} and {B} went to the {P}, {B} gave a {T} to",
    "After {A} and {B} arrived at the {P}, {B} handed a {T} to",
    "Then {A} and {B} were working at the {P}. {B} decided to give a {T} to",
)
NAME_MOVERS = 3  # the name movers ablated to find their backups


def prompts(tokenizer, n: int, seed: int):
    """(clean ids [n, pos], corrupt ids, answer ids [n], wrong ids [n], template index [n]) with one template per
    block of n // len(TEMPLATES) prompts, so that each block has one length."""
    import random

    import torch

    rng = random.Random(seed)
    one = lambda word: tokenizer.encode(" " + word, add_special_tokens=False)  # noqa: E731
    names = [name for name in NAMES if len(one(name)) == 1]
    rows: dict[int, list] = {}
    for i in range(n):
        t = i % len(TEMPLATES)
        a, b, c, d, e = rng.sample(names, 5)
        fill = dict(P=rng.choice(PLACES), T=rng.choice(THINGS))
        clean = TEMPLATES[t].format(A=a, B=b, **fill)
        corrupt = TEMPLATES[t].format(A=c, B=d, **fill).replace(f", {d} ", f", {e} ").replace(f". {d} ", f". {e} ")
        rows.setdefault(t, []).append((tokenizer.encode(clean), tokenizer.encode(corrupt), one(a)[0], one(b)[0]))
    out = []
    for t, block in sorted(rows.items()):
        lengths = {len(x[0]) for x in block} | {len(x[1]) for x in block}
        if len(lengths) != 1:
            raise ValueError(f"template {t} gives prompts of lengths {sorted(lengths)}: a word is not one token")
        out.append([torch.tensor([x[0] for x in block]), torch.tensor([x[1] for x in block]),
                    torch.tensor([x[2] for x in block]), torch.tensor([x[3] for x in block])])  # fmt: skip
    return out


def head_frame(model, blocks, scores: dict) -> "object":
    import pandas as pd

    cfg = model.cfg
    rows = []
    for layer in range(cfg.n_layers):
        for head in range(cfg.n_heads):
            row = dict(head=f"L{layer}H{head}", layer=layer)
            row.update({k: float(v[layer, head]) for k, v in scores.items()})
            rows.append(row)
    return pd.DataFrame(rows)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--n", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-map", action="store_true", help="leave out the pair map over all 270 heads")
    args = parser.parse_args(argv)

    import torch

    import headcoop as hc
    from experiments.shared import setup, write_table

    setup(threads=torch.get_num_threads())
    times: dict[str, float] = {}
    tick = time.perf_counter()
    model = hc.load_gguf("smollm2-135m")
    times["load"] = time.perf_counter() - tick
    cfg = model.cfg
    blocks = prompts(model.tokenizer, args.n, args.seed)
    rows = lambda b: torch.arange(len(b[0]))  # noqa: E731

    # 1. the behaviour, and each head's direct effect on the logit difference (every template)
    tick = time.perf_counter()
    ld, acc, dla_heads, att_io, att_s = [], [], [], [], []
    for clean, _, answer, wrong in blocks:
        names_at = [(clean[i] == answer[i]).nonzero()[0, 0] for i in range(len(clean))]  # A's position
        s_at = [(clean[i] == wrong[i]).nonzero()[0, 0] for i in range(len(clean))]  # B's first position
        with torch.no_grad():
            logits, cache = model.run_with_cache(clean, names_filter=lambda n: n.endswith("hook_pattern"))
        last = logits[:, -1]
        ld.append(last[rows((clean,)), answer] - last[rows((clean,)), wrong])
        acc.append(last.argmax(-1) == answer)
        result = hc.dla(model, clean, answer=answer, wrong=wrong)
        heads = result.heads()  # [batch, layer, head, vocab]
        dla_heads.append(heads[rows((clean,)), :, :, answer] - heads[rows((clean,)), :, :, wrong])
        pattern = torch.stack([cache[f"blocks.{lay}.attn.hook_pattern"][:, :, -1] for lay in range(cfg.n_layers)], 1)
        att_io.append(pattern[rows((clean,)), :, :, torch.tensor(names_at)])
        att_s.append(pattern[rows((clean,)), :, :, torch.tensor(s_at)])
    ld_all, acc_all = torch.cat(ld), torch.cat(acc).float()
    direct = torch.cat(dla_heads).mean(0)  # [layer, head]
    times["behaviour, DLA and attention"] = time.perf_counter() - tick

    # 2. exact patching of every head's z from the clean run into the corrupt one (logit difference)
    tick = time.perf_counter()
    patched = []
    for clean, corrupt, answer, wrong in blocks:
        batch = hc.Batch.from_answers(clean, answer, wrong)
        bad = hc.Batch.from_answers(corrupt, answer, wrong)
        result = hc.patch(model, clean=batch, corrupt=bad, metric="logit_diff", progress=False)
        frame = result.to_dataframe().set_index(["layer", "head"])["value"]
        restored = (frame - result.corrupt_value) / (result.clean_value - result.corrupt_value)
        patched.append(torch.tensor(restored.unstack().values, dtype=torch.float64) * len(clean))
    restored_share = torch.stack(patched).sum(0) / args.n
    times["exact patching of every head (z, every position)"] = time.perf_counter() - tick

    heads = head_frame(model, blocks, dict(direct_effect=direct, patching_restored=restored_share,
                                           attention_to_io=torch.cat(att_io).mean(0),
                                           attention_to_s=torch.cat(att_s).mean(0)))  # fmt: skip
    movers = heads.sort_values("direct_effect", ascending=False).head(NAME_MOVERS)

    # 3. backup: the top name movers mean-ablated, each other head's direct effect again
    tick = time.perf_counter()
    off = [(int(r.layer), int(r.head[r.head.index("H") + 1 :])) for r in movers.itertuples()]
    after, ld_after = [], []
    for clean, _, answer, wrong in blocks:
        with hc.ablate(model, heads=[f"L{lay}H{h}" for lay, h in off], how="mean", reference=clean):
            with torch.no_grad():
                last = model(clean)[:, -1]
            result = hc.dla(model, clean, answer=answer, wrong=wrong)
        h = result.heads()
        after.append(h[rows((clean,)), :, :, answer] - h[rows((clean,)), :, :, wrong])
        ld_after.append(last[rows((clean,)), answer] - last[rows((clean,)), wrong])
    rise = torch.cat(after).mean(0) - direct
    heads["direct_effect_movers_ablated"] = [float(x) for x in (direct + rise).flatten()]
    heads["rise_movers_ablated"] = [float(x) for x in rise.flatten()]
    lost = float(direct[[lay for lay, _ in off], [h for _, h in off]].sum())
    summary = dict(n=args.n, seed=args.seed, templates=list(TEMPLATES), model=cfg.model_name,
                   logit_diff=float(ld_all.mean()), accuracy=float(acc_all.mean()),
                   name_movers=[f"L{lay}H{h}" for lay, h in off], movers_direct=lost,
                   logit_diff_movers_ablated=float(torch.cat(ld_after).mean()))  # fmt: skip
    summary["recovered_share"] = ((summary["logit_diff_movers_ablated"] - (summary["logit_diff"] - lost)) / lost
                                  if lost > 0 else float("nan"))  # fmt: skip
    times["backup: name movers mean-ablated"] = time.perf_counter() - tick

    # 4. hc.cooperation on the key heads (the name movers and the largest backup), the logit difference
    tick = time.perf_counter()
    backups = heads[~heads["head"].isin(summary["name_movers"])].sort_values("rise_movers_ablated", ascending=False)
    key = summary["name_movers"] + [str(backups["head"].iloc[0])]
    clean, corrupt, answer, wrong = blocks[0]
    batch = hc.Batch.from_answers(clean, answer, wrong)
    coop = hc.cooperation(model, inputs=batch, reference=hc.Batch.from_answers(corrupt, answer, wrong), heads=key,
                          metric="logit_diff", draws=1, progress=False)  # fmt: skip
    summary["cooperation"] = dict(heads=key, word=coop.mechanism, agreement=coop.agreement,
                                  roles=dict(coop.roles), inputs=len(clean))  # fmt: skip
    pairs = coop.to_dataframe()[["head_a", "head_b", "mechanism", "agreement", "reason"]]
    times["hc.cooperation on 4 key heads (one template, draws=1)"] = time.perf_counter() - tick

    folder = args.out / "smollm2"
    folder.mkdir(parents=True, exist_ok=True)
    write_table(heads, folder, "ioi_heads")
    write_table(pairs, folder, "ioi_cooperation")
    summary["seconds"] = {k: round(v, 1) for k, v in times.items()}
    (folder / "ioi.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")  # kept if the map fails
    if not args.no_map:
        tick = time.perf_counter()
        result = hc.pair_map(model, batch, how="mean", reference=hc.Batch.from_answers(corrupt, answer, wrong),
                             method="screen", named=0, progress=False)  # fmt: skip
        times["hc.pair_map over 270 heads (screen)"] = time.perf_counter() - tick
        write_table(result.to_dataframe().head(40), folder, "ioi_pair_map")
        summary["pair_map"] = result.lines()
    summary["seconds"] = {k: round(v, 1) for k, v in times.items()}
    (folder / "ioi.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
