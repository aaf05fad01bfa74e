"""Write docs/results/skip_pair.md from the tables run_all.py produced (every number comes from them).

The sections are data (`headcoop.display.pages.Section`: text, tables, figures), the claims `Claim` records with
verdicts from `claim_verdicts`; the page is rendered from `page.md.j2` (extending headcoop's
`results.md.j2`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pandas as pd

import headcoop as hc
from experiments.cooperation import answers
from experiments.robustness.page import (
    REGISTRY_SAYS,
    across_setups,
    default_verdicts,
    registry_rows,
    short_verdicts,
    with_registry,
)
from experiments.skip_pair.exp_runs import SPLIT_THRESHOLD
from experiments.skip_pair.quotes import QUOTES
from headcoop.display.pages import Claim, Details, FigureFile, Section, Table, Text, render
from headcoop.studies.skip_pair import ORDERING_KINDS
from headcoop.tasks.skip_pair import NOISE, PAIRS

HERE = Path(__file__).resolve().parent
PAIR_KEYS = [f"{a}{b}" for a, b in PAIRS]
# the section of this page that holds the evidence for each claim, in the order of claim_verdicts
CLAIM_SECTIONS = ("1", "1", "2", "2", "5", "3", "3", "4", "3")


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.4f}" if math.isfinite(value) else "nan"
    return str(value)


def table(df: pd.DataFrame) -> Table:
    """A table of `df` as this page shows it: floats with 4 decimals, the index dropped."""
    return Table(df, cell=_cell)


def frac(n: int, d: int) -> str:
    return f"{n}/{d}"


def shape(runs: pd.DataFrame, h: int, d: int) -> pd.DataFrame:
    return runs[(runs.n_heads == h) & (runs.d_head == d)]


def pair_table(runs: pd.DataFrame, h: int, d: int) -> pd.DataFrame:
    """Per pair type: mean exact accuracy over seeds, and seeds right on every context of that type."""
    rows = shape(runs, h, d)
    task = hc.SkipPair()
    out = []
    for (a, b), key in zip(PAIRS, PAIR_KEYS):
        out.append({
            "pair": f"{{{a},{b}}}", "completion": task.mapping[(a, b)],
            "mean accuracy": rows[f"acc_{key}"].mean(), "min accuracy": rows[f"acc_{key}"].min(),
            "seeds right on every context": frac(int(rows[f"all_{key}"].sum()), len(rows)),
        })  # fmt: skip
    return pd.DataFrame(out)


def noise_line(rows: pd.DataFrame) -> str:
    q = rows.noise_loss.quantile([0.0, 0.5, 1.0]).values
    opt = rows.noise_loss_optimum.iloc[0]
    return (
        f"noise-case loss: median {q[1]:.4f}, range {q[0]:.4f} to {q[2]:.4f}, against the uniform optimum "
        f"ln 7 = {opt:.4f} (median excess {q[1] - opt:.4f} nats)"
    )


def relation_counts(rows: pd.DataFrame) -> dict[str, int]:
    return {k: int((rows.relation == k).sum()) for k in ORDERING_KINDS}


def relation_text(rows: pd.DataFrame) -> str:
    c = relation_counts(rows)
    return ", ".join(f"{k} {c[k]}" for k in ORDERING_KINDS) + f" (of {len(rows)} seeds)"


def ordering_table(rows: pd.DataFrame) -> pd.DataFrame:
    cols = ["seed", "order_h0", "order_h1", "relation", "kendall_tau", "split_heads", "signal_acc", "signal_all",
            "noise_loss", "constructive_centered", "constructive_raw", "specific_rows"]  # fmt: skip
    df = rows[cols].copy()
    df["signal_all"] = df.signal_all.map(lambda v: "yes" if v == 1.0 else "no")
    df["specific_rows"] = df.specific_rows.astype(int).astype(str) + "/8"
    return df.rename(columns={"order_h0": "H0 ordering", "order_h1": "H1 ordering", "kendall_tau": "tau",
                              "split_heads": "heads splitting", "signal_all": "100%",
                              "constructive_centered": "constructive (centered)", "constructive_raw":
                              "constructive (raw)", "specific_rows": "OV matches ordering"})  # fmt: skip


def capacity_table(runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    g = runs.groupby(["n_heads", "d_head"])
    solved = g.signal_all.mean().unstack()
    n = g.seed.count().unstack()
    acc = g.signal_acc.mean().unstack()
    a = pd.DataFrame({"n_heads": solved.index})
    b = pd.DataFrame({"n_heads": acc.index})
    for d in solved.columns:
        a[f"d_head {d}"] = [f"{int(round(s * k))}/{int(k)}" for s, k in zip(solved[d], n[d])]
        b[f"d_head {d}"] = acc[d].values
    return a, b


def split_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (n_heads, d_head): how often and how much heads split attention between two signal tokens."""
    out = []
    for (h, d), rows in runs.groupby(["n_heads", "d_head"]):
        solved = rows[rows.signal_all == 1.0]
        out.append({
            "n_heads": h, "d_head": d,
            "models with a splitting head": frac(int((rows.split_heads > 0).sum()), len(rows)),
            "among 100% models": frac(int((solved.split_heads > 0).sum()), len(solved)),
            "split pairs per head (of 6)": rows.split_pairs.mean(),
            "pairs split by every head": rows.split_shared.mean() if h > 1 else float("nan"),
            "median max split": rows.split_max.median(),
        })  # fmt: skip
    return pd.DataFrame(out)


def _share(n: int, d: int) -> str:
    """Words for n of d seeds."""
    return "all" if n == d else "none" if n == 0 else "most" if n > d / 2 else "some"


def split_during_training(dynamics: pd.DataFrame) -> pd.DataFrame:
    """Per d_head: models, models learnt at some checkpoint, and models split (both heads on the same two
    signal tokens) at a checkpoint where they had learnt the task."""
    learnt = dynamics[dynamics.learnt]
    rows = []
    for d, g in dynamics.groupby("d_head"):
        lg = learnt[learnt.d_head == d]
        split_models = lg[lg.model_split_pairs > 0].seed.nunique()
        rows.append({"d_head": int(d), "models": g.seed.nunique(), "learnt at some checkpoint": lg.seed.nunique(),
                     "split while learnt": int(split_models),
                     "learnt checkpoints split": f"{int((lg.model_split_pairs > 0).sum())}/{len(lg)}"})  # fmt: skip
    return pd.DataFrame(rows)


def _across(robustness: Path | None) -> list[Section]:
    if robustness is None:
        return []

    section = across_setups(robustness, "skip_pair")
    return [] if section is None else [section]


def split_text(rows: pd.DataFrame) -> str:
    return (f"{frac(int((rows.split_heads > 0).sum()), len(rows))} models with a splitting head, "
            f"{rows.split_pairs.mean():.2f} split pairs per head, {rows.split_shared.mean():.2f} pairs split by "
            "both heads")  # fmt: skip


def cons(rows: pd.DataFrame, col: str) -> str:
    v = rows[col]
    return f"median {v.median():g}/10, range {v.min():g}..{v.max():g}"


def spec(rows: pd.DataFrame) -> str:
    return f"{int(rows.specific_rows.sum())}/{int(rows.specific_total.sum())}"


class _Blocks:
    """The page's sections as they are written: `section(title)` opens one, `w(block)` adds a block (a string
    becomes a paragraph), `figure(name, caption)` a figure of the skip_pair folder."""

    def __init__(self, png: bool):
        self.sections: list[tuple[str, list]] = []
        self.png = png

    def section(self, title: str) -> None:
        self.sections.append((title, []))

    def w(self, block) -> None:
        self.sections[-1][1].append(Text(block.strip("\n")) if isinstance(block, str) else block)

    def figure(self, name: str, caption: str) -> FigureFile:
        return FigureFile(name, caption, folder="skip_pair", png=self.png)


def _facts(
    runs: pd.DataFrame,
    long_runs: pd.DataFrame,
    shipped: pd.DataFrame,
    typical: pd.DataFrame,
    timing: dict,
    setup: dict,
    dynamics: pd.DataFrame | None,
) -> SimpleNamespace:
    """What the page's sections and claims read off the tables, computed once."""
    task = hc.SkipPair()
    t = lambda h, d: shape(runs, h, d)  # noqa: E731
    main5, main1 = t(2, 5), t(2, 1)
    grid_seeds = setup["grid_seeds"]
    cap_solved, cap_acc = capacity_table(runs)
    one = runs[runs.n_heads == 1].groupby("d_head").signal_all.agg(["sum", "count"])
    one_text = ", ".join(f"d_head {d}: {int(r['sum'])}/{int(r['count'])}" for d, r in one.iterrows())
    one_small = one[one.index < 4]["sum"].sum() if len(one) else 0
    one_large = one[one.index >= 4]
    one_small += int(long_runs.signal_all.sum())
    only_if_fails = one_small > 0  # a head with d_head < 4 solved the task
    if_fails = len(one_large) == 0 or bool((one_large["sum"] == 0).any())  # some d_head >= 4 never solved it
    large_text = f"{int(one_large['sum'].sum())}/{int(one_large['count'].sum())}"
    # The post claims sufficiency ("can be solved with one head, as long as d_head >= 4"), nothing about
    # smaller heads: the verdict is about d_head >= 4; what smaller heads did is reported beside it.
    one_head_seen = (
        f"one head with d_head >= 4 solved it in {large_text} seeds"
        + (", and in every d_head >= 4 tried" if not if_fails else ", not in every d_head >= 4 tried")
        + ("; smaller heads sometimes did too (the post does not say they cannot)" if only_if_fails else "")
    )
    long_one = long_runs.groupby("d_head").signal_all.agg(["sum", "count"])
    long_text = ", ".join(f"d_head {d}: {int(r['sum'])}/{int(r['count'])}" for d, r in long_one.iterrows())
    long_steps = timing.get("long_steps")
    splits = split_table(runs)
    two_all = runs[runs.n_heads == 2]
    two_small, two_large = two_all[two_all.d_head < 3], two_all[two_all.d_head >= 3]

    sp = shipped.set_index("name")
    typ = typical.set_index("name")
    split_dyn = split_during_training(dynamics) if dynamics is not None else None
    return SimpleNamespace(task=task, main5=main5, main1=main1, grid_seeds=grid_seeds, cap_solved=cap_solved, cap_acc=cap_acc, one_text=one_text, one_head_seen=one_head_seen, long_text=long_text, long_steps=long_steps, splits=splits, two_all=two_all, two_small=two_small, two_large=two_large, sp=sp, typ=typ, split_dyn=split_dyn)  # fmt: skip


def _task_section(b: "_Blocks", task, timing: dict) -> None:
    """The task as we read it: vocabulary, lengths, examples, mapping, model, training, evaluation."""
    section, w = b.section, b.w
    mapping_table = table(pd.DataFrame(
        [["completion", *task.mapping.values()]], columns=["pair", *(f"{{{a},{b}}}" for a, b in task.mapping)]
    ))  # fmt: skip

    section("The task as we read it")
    w(
        f"- **Vocabulary**: {task.d_vocab} tokens `0..11`: `0` is the read-off token, `1..4` signal, `5..11` noise. "
        'The post says d_model = 11 with "sequences of integers in the range [0, 11]"; that range holds 12 integers, and with one-hot '
        f"embeddings d_model = d_vocab, so our models have d_model = {task.d_vocab}."
    )
    w(
        f"- **Context length**: {task.seq_len} tokens including the read-off token (the post does not give it): "
        f"{task.seq_len - 1} context positions, then `0`."
    )
    w(
        f"- **Signal example** (fraction {task.signal_fraction} of training batches): {task.seq_len - 1 - 2} noise "
        "tokens uniform over 5..11, two positions (uniform among the context positions) holding signal tokens drawn "
        "independently and uniformly from 1..4 (so repeats such as {3,3} occur), then `0`; the target is "
        "mapping[{a, b}]."
    )
    w(
        f"- **Noise example**: all {task.seq_len} tokens uniform over 5..11 (no read-off token), target uniform over "
        f"5..11, so the best possible loss is ln {len(NOISE)}."
    )
    w(
        "- **Mapping** (an injection from the 10 unordered pairs; it contains the post's examples {1,4} -> 3 and "
        "{3,3} -> 7, the rest is our arbitrary choice):\n"
    )
    w(mapping_table)
    w(
        "- **Model**: one attention-only layer, no LayerNorm, one-hot embedding and unembedding (identity, frozen), "
        "unembedding bias frozen at 0, positional embedding frozen at 0 (attention sees token identity only), "
        "attention scores divided by sqrt(d_head) (TransformerLens default), all biases b_Q, b_K, b_V, b_O trained."
    )
    r = timing["recipe"]
    w(
        f"- **Training** (`hc.train_many`, the shipped models' recipe): AdamW (betas 0.9, 0.98), {r['steps']} steps, "
        f"batch {r['batch_size']}, peak lr {r['lr']}, {r['warmup']} warm-up steps then cosine decay to lr/10, "
        f"weight decay {r['weight_decay']}; cross-entropy at the last position only; fresh samples every step. "
        "Seed k initialises model k and drives its data."
    )
    w(
        "- **Evaluation is exact, not sampled**: with no positional embedding the read-off position sees its "
        "context as a multiset, so we enumerate every distinct input (10 pairs x 1,716 noise multisets for signal; "
        "7 query tokens x 5,005 multisets for noise) with its probability "
        "(`headcoop.studies.skip_pair.exact_evaluate`). "
        "*Accuracy of a pair type* = probability that the argmax at `0` is the pair's completion; "
        "*100%* = right on every signal input; *signal accuracy* = mean over the 10 pair types (as "
        "`hc.evaluate`); *noise loss* = expected cross-entropy on noise examples.\n"
    )
    w(
        "- **Which superposition, and how d_head 1 is read** (the post names two kinds and defines neither beyond a "
        'sentence): "In contrast with the “hierarchical” superposition presented above, we can call the latter type '
        '“bottleneck superposition”", the latter being superposition "per head in the d_head dimension". Here the '
        "word *superposition* (`hc.cooperation`, the registry's rows) is the hierarchical kind only: across heads, each "
        "head writing several completions consistent with the token it attends to through a map of rank >= 2. A d_head "
        '1 head has rank 1 by construction, so a d_head 1 pair is *not testable* for it, never "superposition" by '
        "default; the bottleneck kind (4 signal tokens through 1 dimension) holds at d_head 1 by counting alone and has "
        "no test here (robustness.md, claims with no verdict).\n"
    )


def _claims(f: SimpleNamespace, timing: dict, interference: pd.DataFrame | None) -> list:
    """The page's claim records: each quote of the post beside what this page measured."""
    main5, main1, one_text, long_text, long_steps, two_small, two_large, split_dyn = (f.main5, f.main1, f.one_text, f.long_text, f.long_steps, f.two_small, f.two_large, f.split_dyn)  # fmt: skip
    n5, n1 = len(main5), len(main1)
    claims = [
        (
            QUOTES["perfect"],
            f"{frac(int(main5.signal_all.sum()), n5)} seeds right on every signal input; mean signal accuracy "
            f"{main5.signal_acc.mean():.4f}; {noise_line(main5)}",
        ),
        (
            QUOTES["dhead1"],
            f"{frac(int(main1.signal_all.sum()), n1)} seeds right on every signal input; mean signal accuracy "
            f"{main1.signal_acc.mean():.4f}; {noise_line(main1)}",
        ),
        (
            QUOTES["strict"],
            f"d_head 5: {frac(int((main5.split_heads == 0).sum()), n5)} seeds have both heads strict (every pair of "
            f"signal tokens gets at most {SPLIT_THRESHOLD:.0%} / at least {1 - SPLIT_THRESHOLD:.0%} of the pair's "
            f"attention); d_head 1: {frac(int((main1.split_heads == 0).sum()), n1)}",
        ),
        (QUOTES["reversed"], f"d_head 5: {relation_text(main5)}; d_head 1: {relation_text(main1)}"),
        (
            QUOTES["split"],
            f"2-head models, d_head < 3: {split_text(two_small)}; d_head >= 3: {split_text(two_large)} "
            f"(split = the less-attended of two signal tokens gets > {SPLIT_THRESHOLD:.0%} of the two's attention)"
            + (
                "; during training (section 5): "
                + "; ".join(
                    f"d_head {r['d_head']}: {r['split while learnt']}/{r['models']} models split while learnt"
                    for _, r in split_dyn.iterrows()
                )
                if split_dyn is not None
                else ""
            ),
        ),
        (
            QUOTES["conditional"],
            f"(head, attended token) rows whose top OV completions are exactly the consistent set: d_head 5 "
            f"{spec(main5)}, d_head 1 {spec(main1)}",
        ),
        (
            QUOTES["only_correct"],
            f"pair types whose completion is the only one pushed up by both heads, per seed: d_head 5 "
            f"{cons(main5, 'constructive_centered')} (centered), {cons(main5, 'constructive_raw')} (raw > 0); "
            f"d_head 1 {cons(main1, 'constructive_centered')} (centered)"
            + (
                f"; where both heads write to several outputs (raw, section 3): d_head 5 "
                f"{int(interference[interference.d_head == 5].only_correct.sum())}/"
                f"{int(interference[interference.d_head == 5].qualifying.sum())} pair types"
                if interference is not None
                else ""
            ),
        ),
        (
            QUOTES["one_head"],
            f"1-head seeds right on every signal input: {one_text} ({timing['recipe']['steps']} steps); trained "
            f"{long_steps} steps: {long_text} (section 4)",
        ),
        (
            QUOTES["caption"],
            f"pair types whose completion is pushed up (centered) by both heads, per seed: d_head 5 "
            f"{cons(main5, 'correct_up_both')}; pair types that only the sum of the heads gets right (neither head's "
            f"own top completion is right): d_head 5 {cons(main5, 'needs_both')}, d_head 1 {cons(main1, 'needs_both')}",
        ),
    ]
    records = [Claim(where, c, m, REGISTRY_SAYS) for where, (c, m) in zip(CLAIM_SECTIONS, claims)]
    return records


def _sections_1_to_3(b: "_Blocks", f: SimpleNamespace, runs: pd.DataFrame, interference: pd.DataFrame | None) -> None:
    """Sections 1-3: accuracy per pair type, preference orderings, conditional contributions."""
    section, w, figure = b.section, b.w, b.figure
    main5, main1, two_all, sp = (f.main5, f.main1, f.two_all, f.sp)  # fmt: skip
    section("1. Accuracy per signal pair type")
    for name, rows in (("2 heads, d_head 5", main5), ("2 heads, d_head 1", main1)):
        w(f"**{name}**, {len(rows)} seeds (seeds {rows.seed.min()}..{rows.seed.max()}); {noise_line(rows)}.\n")
        w(table(pair_table(runs, 2, 5 if "5" in name else 1)))

    section("2. Preference orderings")
    w(
        "A head's *preference ordering* lists the signal tokens 1..4 by its pre-softmax QK score from the read-off "
        "token `0` (`hc.qk(model, head).scores[0, 1:5]`), most preferred first. Two heads' orderings are "
        "*equal* (same permutation), *reversed* (one is the exact reverse of the other, Kendall tau = -1; this is "
        "the only relation under which, for every pair of distinct signal tokens, each head attends to a different "
        "one), *partly reversed* (neither, Kendall tau < 0), or *partly equal* (neither, tau >= 0). A head is "
        f"*splitting* a pair {{a, b}} of distinct signal tokens when min(p_a, p_b)/(p_a + p_b) > {SPLIT_THRESHOLD} "
        "at the read-off (section 5); a head with no split pair has a strict ordering in the sense that, of any two "
        f"signal tokens present, the preferred one takes at least {1 - SPLIT_THRESHOLD:.0%} of the two's "
        "attention.\n"
    )
    w(f"- 2 heads, d_head 5: {relation_text(main5)}.")
    w(f"- 2 heads, d_head 1: {relation_text(main1)}.")
    by_d = two_all.groupby("d_head")
    w("- All 2-head models of the capacity grid and the extra seeds, by d_head:\n")
    rel = pd.DataFrame([{"d_head": d, **relation_counts(g), "seeds": len(g),
                         "top choices differ": int(g.top_differ.sum())} for d, g in by_d])  # fmt: skip
    w(table(rel))
    w(figure("orderings_by_d_head", "orderings by d_head"))
    for name, rows in (("2 heads, d_head 5", main5), ("2 heads, d_head 1", main1)):
        w(Details(f"Per seed, {name}", (table(ordering_table(rows)),)))

    section("3. Conditional logit contributions and constructive interference")
    w(
        "*Conditional contribution*: the direct effect on the logits of a head attending fully to signal token t, "
        "`hc.ov(model, head).effects[t]`, read at the 10 completions (columns ordered by pair). Rows are sorted by "
        "the head's preference; ■ marks the completions *consistent* with the ordering: pairs {t, x} where x is t "
        "or ranked below t (a higher-ranked x would have drawn the head's attention). For the k-th favourite "
        "token there are 5 - k of them. *OV matches ordering* counts the (head, token) rows whose 5 - k largest "
        "effects are exactly the consistent completions.\n"
    )
    w(
        "*Pushed up*: for a pair type P, a head's contribution to each completion is its direct logit attribution "
        "(`hc.dla`, the head's `z @ W_O @ W_U` at the read-off) averaged exactly over all contexts of type P. The "
        "head *pushes up* a completion when that mean exceeds the head's mean over the 10 completions (*centered*; "
        "softmax ignores a shift common to all logits), or, in the *raw* variant, when it exceeds 0. "
        "*Constructive* pair types: those whose own completion is the only completion pushed up by both heads.\n"
    )
    for name in sp.index:
        row = sp.loc[name]
        w(
            f"**{name}** (H0 {row.order_h0}, H1 {row.order_h1}: {row.relation}; OV matches ordering in "
            f"{int(row.specific_rows)}/{int(row.specific_total)} rows; constructive pair types "
            f"{int(row.constructive_centered)}/10 centered, {int(row.constructive_raw)}/10 raw; correct completion "
            f"pushed up by both heads in {int(row.correct_up_both)}/10):\n"
        )
        w(figure(f"conditional_contributions_{name}", f"conditional contributions {name}"))
        w(figure(f"pair_contributions_{name}", f"pair contributions {name}"))
    w(
        "Across seeds (2 heads): constructive pair types (centered) per seed "
        f"d_head 5 {cons(main5, 'constructive_centered')}, d_head 1 {cons(main1, 'constructive_centered')}; raw: "
        f"d_head 5 {cons(main5, 'constructive_raw')}, d_head 1 {cons(main1, 'constructive_raw')}. "
        f"Correct completion pushed up (centered) by both heads: d_head 5 {cons(main5, 'correct_up_both')}, "
        f"d_head 1 {cons(main1, 'correct_up_both')}. OV matches ordering: d_head 5 {spec(main5)} rows, "
        f"d_head 1 {spec(main1)} rows.\n"
    )
    if interference is not None:
        w(
            '**As the post states it**: "In contexts where both heads write to multiple outputs, they will only '
            "constructively interfere on the correct token.\" With *raw* contributions (as the post's figure shows), "
            "a pair type qualifies when each head pushes at least two completions above zero; of those, we count the "
            "ones whose correct completion is the only one both heads push above zero (2-head models of section 5's "
            f"training runs, seeds {interference.seed.min()}..{interference.seed.max()}, `interference.csv`):\n"
        )
        w(
            table(
                interference.groupby("d_head")[["qualifying", "only_correct", "only_correct_all_pairs"]]
                .sum()
                .reset_index()
            )
        )


def _sections_4_to_6(
    b: "_Blocks",
    f: SimpleNamespace,
    runs: pd.DataFrame,
    long_runs: pd.DataFrame,
    shipped: pd.DataFrame,
    timing: dict,
    dynamics: pd.DataFrame | None,
) -> None:
    """Sections 4-6 and the regeneration note: capacity, split attention, the shipped checkpoints."""
    section, w, figure = b.section, b.w, b.figure
    grid_seeds, cap_solved, cap_acc, one_text, one_head_seen, long_text, long_steps, splits, two_small, two_large, sp, typ, split_dyn = (f.grid_seeds, f.cap_solved, f.cap_acc, f.one_text, f.one_head_seen, f.long_text, f.long_steps, f.splits, f.two_small, f.two_large, f.sp, f.typ, f.split_dyn)  # fmt: skip
    section("4. Capacity map")
    w(
        f"n_heads 1..4 x d_head 1..6, seeds {grid_seeds[0]}..{grid_seeds[-1]} per cell (the 2-head d_head 1 and 5 "
        "cells also hold the extra seeds). Fraction of seeds right on every signal input:\n"
    )
    w(table(cap_solved))
    w("Mean signal accuracy (mean over pair types, exact):\n")
    w(table(cap_acc))
    w(figure("capacity_map", "capacity map"))
    w(
        f"One head, {timing['recipe']['steps']} steps: {one_text}. One head, d_head "
        f"{long_runs.d_head.min()}..{long_runs.d_head.max()}, trained {long_steps} steps "
        f"(same recipe otherwise, seeds {long_runs.seed.min()}..{long_runs.seed.max()}): {long_text}; mean signal "
        f"accuracy "
        + ", ".join(f"d_head {d} {g.signal_acc.mean():.3f}" for d, g in long_runs.groupby("d_head"))
        + f'. The post\'s sufficiency claim ("{QUOTES["one_head"]}"): {one_head_seen} (its verdict, in the claims '
        "table above, is the claim registry's). The post states "
        "no converse, so heads with d_head < 4 that solve it do not contradict it.\n"
    )

    section("5. Split attention")
    w(
        "*Split*: for a head and two distinct signal tokens a, b in the context, min(p_a, p_b) / (p_a + p_b) of its "
        "attention at the read-off: 0 when it attends to one of them only, 0.5 when evenly. With one a and one b "
        "present, p_a / p_b = exp(s_a - s_b) whatever the noise tokens, so split = sigmoid(-|s_a - s_b|) from the "
        "QK scores (`headcoop.studies.skip_pair.split_attention`, checked against the model's attention pattern in the "
        f"tests). A head *splits* when some pair's split exceeds {SPLIT_THRESHOLD}; *max split* is the largest "
        "value over a model's heads and the 6 pairs.\n"
    )
    w(table(splits))
    one_big = runs[(runs.n_heads == 1) & (runs.d_head >= 4)]
    w(f"- 2-head models: d_head < 3: {split_text(two_small)}; d_head >= 3: {split_text(two_large)}.")
    if len(one_big):
        w(
            f"- 1-head models with d_head >= 4 split {one_big.split_pairs.mean():.2f} of the 6 pairs on average and "
            f"{frac(int((one_big.signal_all == 1.0).sum()), len(one_big))} of them are right on every signal input"
            + (
                ": a lone head that solves the task attends to both signal tokens at once rather than following a "
                "preference hierarchy, as the post's “once a head has enough dimensions to store every "
                '"interesting" token orthogonally” would allow.'
                if one_big.split_pairs.mean() > 5
                else "."
            )
            + (
                f" Its value vectors for the 4 signal tokens are distinct but not orthogonal: the largest |cos| between "
                f"two of them is {one_big.value_cos_max.median():.2f} at the median ({one_big.value_cos_max.min():.2f}.."
                f'{one_big.value_cos_max.max():.2f}; robustness.md\'s row on "stored orthogonally").'
                if "value_cos_max" in one_big
                else ""
            )
        )
    w("")
    w(figure("split_attention", "split attention"))
    if dynamics is not None:
        steps = sorted(dynamics.step.unique())
        w(
            '**During training, as the post describes it** (a model-level scheme in which "the heads would attend to '
            'the same tokens to varying degree"): 2-head models of every d_head, one run each per seed, measured at '
            f"checkpoints every {steps[0]} steps (`hc.train_many(..., on_checkpoint=...)`, `dynamics.csv`). A pair "
            f"{{a, b}} is *split by the model* at a checkpoint when both heads give the less-attended of a and b more "
            f"than {SPLIT_THRESHOLD:.0%} of the two's attention; a checkpoint counts once the model has learnt the "
            "task there (sampled signal accuracy >= 0.9), since at initialisation every head attends almost "
            "uniformly.\n"
        )
        w(table(split_dyn))

    section("6. Shipped checkpoints")
    for name in typ.index:
        row, s = typ.loc[name], sp.loc[name]
        same = int(s.seed) == int(row.typical_seed) and int(s.train_seed) == int(row.typical_seed)
        w(
            f'- `hc.load("{name}")` (2 heads, d_head {int(row.d_head)}): typical seed {int(row.typical_seed)}: '
            f"{row.why}. The checkpoint is trained by `experiments/train_shipped.py` (`hc.train`, same recipe) "
            f"with model seed {int(s.seed)} and data seed {s.train_seed}"
            + (" (the typical seed)." if same else " -- NOT the typical seed; update RECIPES and regenerate.")
            + f" Measured from its weights: H0 {s.order_h0}, H1 {s.order_h1} ({s.relation}); signal accuracy "
            f"{s.signal_acc:.4f}, 100%: {'yes' if s.signal_all == 1.0 else 'no'}; noise loss {s.noise_loss:.4f}."
        )
    w("")
    cols = ["name", "seed", "order_h0", "scores_h0", "order_h1", "scores_h1", "relation", "signal_acc", "signal_all",
            "noise_loss", "constructive_centered", "specific_rows"]  # fmt: skip
    w(table(shipped[cols]))
    w("QK scores are those from `0` to keys 1, 2, 3, 4.\n")
    w(figure("qk_scores", "QK scores"))

    section("Regeneration")
    w(
        f"`python -m experiments.skip_pair.run_all` trained and measured {timing['n_models']} models in "
        f"{timing['train_and_measure_s']} s and had written every table and figure after {timing['total_s']} s "
        f"with {timing['threads']} torch thread(s), on a machine with {timing.get('cores', '?')} CPU cores "
        f"(1-minute load average {timing.get('load_start', '?')} at the start, {timing.get('load_end', '?')} when "
        "training ended; other jobs on the machine raise it and the times with it). Figures are written as HTML "
        "(plotly.js from its CDN) and PNG (when kaleido can export).\n"
    )


def write(
    out: Path,
    runs: pd.DataFrame,
    long_runs: pd.DataFrame,
    shipped: pd.DataFrame,
    typical: pd.DataFrame,
    timing: dict,
    setup: dict,
    png: bool = True,
    robustness: Path | None = None,
    dynamics: pd.DataFrame | None = None,
    interference: pd.DataFrame | None = None,
) -> Path:
    """Write OUT/skip_pair.md from the tables; returns its path. png: the figures were exported as PNG
    (run_all --no-png: link the interactive HTML only). robustness: the folder of the robustness grid's
    tables, whose verdicts across setups the page adds (None, or a folder without them: left out).
    dynamics, interference: the tables of `exp_dynamics.dynamics` (split attention at training checkpoints;
    constructive interference where both heads write to several outputs)."""
    f = _facts(runs, long_runs, shipped, typical, timing, setup, dynamics)
    task = f.task
    b = _Blocks(png)
    _task_section(b, task, timing)
    records = _claims(f, timing, interference)
    _sections_1_to_3(b, f, runs, interference)
    _sections_4_to_6(b, f, runs, long_runs, shipped, timing, dynamics)
    grid = robustness if robustness is not None else out / "robustness"
    page = render(
        "page.md.j2", HERE,
        title="SkipPair: the OV-coherent toy model of attention-head superposition, reproduced",
        source_name="post", answers=answers.from_tables(out, ("skip_pair",), "cooperation.md"),
        claims=with_registry(records + registry_rows(grid, "skip_pair", records), default_verdicts(grid, "skip_pair"),
                             short_verdicts(grid, "skip_pair")),
        claims_note="Rows whose section is *robustness.md* are claims no section below tests, measured by the "
        "registry's favoured reading. Every verdict is the claim registry's (`experiments/claims.py`), the same on every page: the "
        "claim's logical form, then in one sentence its favoured reading's verdict in the default setup of "
        "`robustness.md`, what flips it, and what the other readings say; the middle column keeps this page's own "
        "measurement. *most* means more than half. Below the table, every reading in full, each with what flips its "
        "verdict (another setup, with its count, or another threshold of the rule's band) or what was tried without "
        "flipping it.",
        sections=[Section(title, tuple(blocks)) for title, blocks in b.sections] + _across(robustness),
        task=task,
        recipe=timing["recipe"],
    )  # fmt: skip
    path = out / "skip_pair.md"
    path.write_text(page, encoding="utf-8")
    return path


def rebuild(tables: Path, out: Path) -> Path:
    """Rewrite OUT/skip_pair.md from the tables run_all saved in TABLES (and OUT/robustness's grid, when
    there): what run_all writes last, without training anything."""
    from experiments.skip_pair import common

    timing = json.loads((tables / "timing.json").read_text())
    saved = {n: pd.read_csv(tables / f"{n}.csv") for n in ("runs", "runs_long", "shipped", "typical_seeds",
                                                           "dynamics", "interference")}  # fmt: skip
    return write(out, saved["runs"], saved["runs_long"], saved["shipped"], saved["typical_seeds"],
                 dict(timing, total_s=timing["doc_total_s"]), common.QUICK if timing.get("quick") else common.FULL,
                 robustness=out / "robustness", dynamics=saved["dynamics"], interference=saved["interference"])  # fmt: skip


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Rewrite docs/results/skip_pair.md from its saved tables.")
    parser.add_argument("--out", type=Path, default=HERE.parents[1] / "docs" / "results", help="results folder")
    args = parser.parse_args()
    print(rebuild(args.out / "skip_pair", args.out))
