"""Write docs/results/robustness.md from the grid tables in docs/results/robustness/: per claim, under which
setups (variant x training length) it holds and under which it fails. Every number is read from a table
run_all wrote; the rules are `COUNT01_RULES` and `SKIP_PAIR_RULES` below.

    python -m experiments.robustness.page [--out FOLDER]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from experiments.count01.common import pearson_ci
from experiments.count01.quotes import PAPER_R
from experiments.count01.quotes import QUOTES as COUNT01_QUOTES
from experiments.robustness.common import COUNT01_VARIANTS, DEFAULT_OUT, SKIP_PAIR_VARIANTS, Settings
from experiments.skip_pair.quotes import QUOTES as SKIP_PAIR_QUOTES
from headcoop.pages import Claim, Section, Table, Text, render

HERE = Path(__file__).resolve().parent
FULL = Settings()  # the sizes run_all uses without --quick, named in the rules' words


@dataclass(frozen=True)
class Rule:
    """How one claim is judged in one cell of the grid: `rows` picks the models, `value` computes (number,
    text) from them, `holds` says whether the number supports the quoted words."""

    key: str
    source: str
    rule: str
    rows: Callable[[pd.DataFrame], pd.DataFrame]
    value: Callable[[pd.DataFrame], tuple[float, str]]
    holds: Callable[[float], bool]
    table: str = "grid"  # which of the task's tables (count01_<table>.csv, skip_pair_<table>.csv)
    per_length: bool = True  # False: one cell per setup, over the models of every training length
    reading: str = ""  # which reading of the quote, where one quote is tested two ways


def _share(part: float, whole: float) -> tuple[float, str]:
    return (part / whole if whole else float("nan")), f"{int(part)}/{int(whole)}"


def _split_value(rows: pd.DataFrame) -> tuple[float, str]:
    """(share of d_head 5 models split while learnt, text with both d_heads)."""
    parts, share = [], float("nan")
    for d in (5, 1):
        r = rows[rows["shape"] == f"2 heads, d_head {d}"]
        split = int((r.split_while_learnt > 0).sum())
        parts.append(f"d_head {d}: {split}/{len(r)}")
        if d == 5:
            share = split / len(r) if len(r) else float("nan")
    return share, ", ".join(parts)


def _band_value(rows: pd.DataFrame) -> tuple[float, str]:
    """(lowest mean s_acc over the imposed w01 in 0.1..10, text): mean over every head of the cell's models."""
    curve = rows.groupby("w01").s_acc.mean()
    inside = curve[(curve.index >= 0.1 - 1e-9) & (curve.index <= 10 + 1e-9)]
    if not len(inside):
        return float("nan"), "no w01 in 0.1..10"
    high = curve[curve >= 0.95]
    span = f"; >= 0.95 for w01 {high.index.min():.2g}..{high.index.max():.2g}" if len(high) else "; never >= 0.95"
    return float(inside.min()), f"min {inside.min():.3f} at w01 {inside.idxmin():.2g}{span}"


def _r_value(y: str) -> Callable[[pd.DataFrame], tuple[float, str]]:
    """(1 if the paper's r lies in the Fisher 95% interval of r(weighted_s_acc, y) and the interval is above 0,
    else 0; text)."""
    def value(rows: pd.DataFrame) -> tuple[float, str]:
        rows = rows.dropna(subset=["weighted_s_acc", y])
        if len(rows) < 4 or rows.weighted_s_acc.std() == 0 or rows[y].std() == 0:
            return float("nan"), f"n = {len(rows)}: no spread"
        c = pearson_ci(rows.weighted_s_acc, rows[y], n_boot=0)
        inside = 0 < c["fisher_lo"] <= PAPER_R <= c["fisher_hi"]
        return float(inside), f"r = {c['r']:.2f} ({c['fisher_lo']:.2f}..{c['fisher_hi']:.2f}), n = {c['n']}"
    return value


def _table1_value(rows: pd.DataFrame) -> tuple[float, str]:
    """(the smaller of isolated - joint by s_acc and by l_acc_head, text with both and l_acc)."""
    d = {m: float((rows[f"isolated_{m}"] - rows[f"joint_{m}"]).mean()) for m in ("s_acc", "l_acc_head", "l_acc")}
    return min(d["s_acc"], d["l_acc_head"]), (f"s_acc {d['s_acc']:+.3f}, l_acc_head {d['l_acc_head']:+.3f}, "
                                              f"l_acc {d['l_acc']:+.3f}")


def _tip_value(rows: pd.DataFrame) -> tuple[float, str]:
    """(share of models with the answer on top at '=' and [EOS] on top at the answer, text)."""
    top = rows.eq_answer_top.astype(bool) & rows.ans_eos_top.astype(bool)
    return _share(top.sum(), len(rows))


def _fixed_value(rows: pd.DataFrame) -> tuple[float, str]:
    """(share of models keeping the 4/5 order in >= 90% of the strings of each answer, text)."""
    kept = rows.kept_45_min >= 0.9
    return _share(kept.sum(), len(rows))[0], f"{int(kept.sum())}/{len(rows)}; lowest share {rows.kept_45_min.min():.2f}"


COUNT01_RULES = (
    Rule("half", COUNT01_QUOTES["half"], "share of the primary models' heads with s_acc >= 0.95 in 0.35..0.65",
         lambda t: t[t.kind == "primary"], lambda r: _share(r.successful.sum(), r.heads.sum()),
         lambda v: 0.35 <= v <= 0.65),
    Rule("w01", COUNT01_QUOTES["w01"], "at least 75% of the successful heads have 0.1 < w01 < 10",
         lambda t: t[t.kind == "primary"], lambda r: _share(r.successful_w01_in_0_1_10.sum(), r.successful.sum()),
         lambda v: v >= 0.75),
    Rule("w02", COUNT01_QUOTES["w02"], "at least half of the successful heads have w02 > 10",
         lambda t: t[t.kind == "primary"], lambda r: _share(r.successful_w02_gt_10.sum(), r.successful.sum()),
         lambda v: v >= 0.5),
    Rule("band", COUNT01_QUOTES["band"], "on the primary models, with attention to '2' set to 0 and w01 imposed "
         "on every head ([BOS] and '=' keep the model's attention, as `count01.md` section 4), the mean s_acc over "
         f"all heads is >= 0.95 at every imposed w01 from 0.1 to 10 ({len(FULL.w01s)} points, 2 per decade from 0.001 "
         "to 1000)",
         lambda t: t, _band_value, lambda v: v >= 0.95, table="band"),
    Rule("r", COUNT01_QUOTES["r"], "y = model answer accuracy (the summary's \"model accuracy\"): the paper's 0.72 "
         "lies in the Fisher 95% interval, and the interval above 0, of Pearson r between the readout-weighted mean head s_acc and the answer "
         "accuracy, over one model set per setup fixed in code (the primary and minimal models of both training "
         f"lengths and primary models trained {', '.join(map(str, FULL.early_steps))} steps, seeds "
         f"{', '.join(map(str, FULL.early_seeds))})",
         lambda t: t, _r_value("answer_acc"), lambda v: v == 1.0, table="ensemble", per_length=False,
         reading="y = model answer accuracy"),
    Rule("r45", COUNT01_QUOTES["r"], "y = the model's own separation, logit(5) > logit(4) at '=' (the summary's "
         "\"The final model's separation accuracy\"); the same models and interval",
         lambda t: t, _r_value("answer_45_acc"), lambda v: v == 1.0, table="ensemble", per_length=False,
         reading="y = the model's own separation"),
    Rule("joint", COUNT01_QUOTES["joint"], "isolated - joint, averaged over the 16 heads of each seed's primary "
         "model, is above 0.005 both by s_acc and by l_acc_head (the paper's l_acc); l_acc with the constant "
         f"terms is shown beside them. Trained {FULL.table1_steps[0]} steps and, to a loss plateau, {FULL.table1_steps[1]} "
         f"(as `count01.md` Table 1), seeds {', '.join(map(str, FULL.table1_seeds))}",
         lambda t: t, _table1_value, lambda v: v > 0.005, table="table1"),
    Rule("bias", COUNT01_QUOTES["bias"], "at least half of the primary models' heads have abs(bias_45) > "
         "abs(signal_45) / 5 (as `count01.md` section 7)",
         lambda t: t[t.kind == "primary"], lambda r: _share(r.biased.sum(), r.heads.sum()), lambda v: v >= 0.5),
    Rule("tip", COUNT01_QUOTES["tip"], "every primary model, for both true answers, has as its most frequent "
         "ordering of the '4', '5' and [EOS] logits one led by the answer at '=' and one led by [EOS] at the answer "
         "position", lambda t: t[t.kind == "primary"], _tip_value, lambda v: v == 1.0,
         reading="the balance tips toward [EOS]"),
    Rule("fixed", COUNT01_QUOTES["tip"], "every primary model keeps the order of the '4' and '5' logits from '=' to "
         "the answer position in at least 90% of the strings of each true answer (our reading of 'about fixed'; the "
         "summary does not say which ordering, or over which tokens)",
         lambda t: t[t.kind == "primary"], _fixed_value, lambda v: v == 1.0, reading="the ordering about fixed"),
    Rule("reach", COUNT01_QUOTES["reach"], "at most a quarter of the d=1, d'=1, one-head runs reach both_acc >= 0.99",
         lambda t: t[t.kind == "minimal"], lambda r: _share((r.both_acc >= 0.99).sum(), len(r)), lambda v: v <= 0.25),
)  # fmt: skip

SKIP_PAIR_RULES = (
    Rule("perfect", SKIP_PAIR_QUOTES["perfect"], "every 2-head, d_head 5 seed right on every sampled signal input",
         lambda t: t[t["shape"] == "2 heads, d_head 5"], lambda r: _share(r.signal_all.sum(), len(r)),
         lambda v: v == 1.0),
    Rule("dhead1", SKIP_PAIR_QUOTES["dhead1"], "at least one 2-head, d_head 1 seed right on every sampled signal input",
         lambda t: t[t["shape"] == "2 heads, d_head 1"], lambda r: _share(r.signal_all.sum(), len(r)),
         lambda v: v > 0),
    Rule("strict", SKIP_PAIR_QUOTES["strict"], "in most 2-head, d_head 5 seeds both heads split no pair of signal "
         "tokens (the less-attended one gets at most 10% of the two's attention)",
         lambda t: t[t["shape"] == "2 heads, d_head 5"], lambda r: _share((r.strict_heads == 2).sum(), len(r)),
         lambda v: v > 0.5),
    Rule("reversed", SKIP_PAIR_QUOTES["reversed"], "in most 2-head, d_head 5 seeds the two orderings are exact reverses",
         lambda t: t[t["shape"] == "2 heads, d_head 5"], lambda r: _share((r.relation == "reversed").sum(), len(r)),
         lambda v: v > 0.5),
    Rule("split", SKIP_PAIR_QUOTES["split"], "no 2-head, d_head 5 model has a pair of signal tokens split by both "
         "heads (each gives the less-attended one more than 10% of the two's attention) at any of 12 training "
         "checkpoints where it has learnt the task (sampled signal accuracy >= 0.9); the d_head 1 count is shown "
         "beside it",
         lambda t: t[t["shape"].isin(["2 heads, d_head 5", "2 heads, d_head 1"])], _split_value, lambda v: v == 0),
    Rule("conditional", SKIP_PAIR_QUOTES["conditional"], "in more than half of the (head, attended signal token) "
         "rows of the 2-head, d_head 5 seeds, the head's OV effect puts exactly the completions consistent with its "
         "ordering on top (`skip_pair.md` section 3)",
         lambda t: t[t["shape"] == "2 heads, d_head 5"],
         lambda r: _share(r.specific_rows.sum(), r.specific_total.sum()), lambda v: v > 0.5),
    Rule("only_correct", SKIP_PAIR_QUOTES["only_correct"], "in every pair type of the 2-head, d_head 5 seeds where "
         "both heads push at least two completions above zero, the correct completion is the only one both push "
         f"above zero (raw direct contributions averaged over {FULL.n_pair} sampled contexts per pair type: long "
         "contexts cannot be enumerated)",
         lambda t: t[t["shape"] == "2 heads, d_head 5"], lambda r: _share(r.only_correct.sum(), r.qualifying.sum()),
         lambda v: v == 1.0),
    Rule("one_head", SKIP_PAIR_QUOTES["one_head"], "every 1-head, d_head 4 seed right on every sampled signal input",
         lambda t: t[t["shape"] == "1 head, d_head 4"], lambda r: _share(r.signal_all.sum(), len(r)),
         lambda v: v == 1.0),
    Rule("caption", SKIP_PAIR_QUOTES["caption"], "in the median 2-head, d_head 5 seed, both heads push the correct "
         "completion up (above their mean over the 10 completions) in more than half of the 10 pair types "
         "(sampled contributions, as above)",
         lambda t: t[t["shape"] == "2 heads, d_head 5"],
         lambda r: (float(r.correct_up_both.median()), f"median {r.correct_up_both.median():g}/10 pair types"),
         lambda v: v > 5),
)  # fmt: skip


ALL_LENGTHS = "every training length"


def lengths(table: pd.DataFrame, rule: Rule) -> list:
    """The columns of a rule's cells: its table's training lengths, or one column over all of them."""
    return sorted(int(n) for n in table.steps.unique()) if rule.per_length else [ALL_LENGTHS]


def judge(tables: dict[str, pd.DataFrame], rule: Rule, variants: list[str]) -> tuple[pd.DataFrame, dict[str, list]]:
    """Per cell (variant x training length, or variant alone): the value and whether the rule holds;
    (table, {variant: [lengths where it holds]})."""
    table = tables[rule.table]
    cells, held = [], {}
    for variant in variants:
        row, held[variant] = {"setup": variant}, []
        for n in lengths(table, rule):
            picked = table[table.variant == variant]
            picked = rule.rows(picked if n == ALL_LENGTHS else picked[picked.steps == n])
            value, text = rule.value(picked)
            ok = rule.holds(value)
            row[n if n == ALL_LENGTHS else f"{n} steps"] = f"{'holds' if ok else 'fails'} ({text})"
            if ok:
                held[variant].append(n)
        cells.append(row)
    return pd.DataFrame(cells), held


def verdict(held: dict[str, list], steps: list) -> str:
    """"holds under X; fails under Y", naming a training length only where the lengths disagree."""
    def named(variant: str, part: list) -> str:
        return variant if len(part) == len(steps) else f"{variant} ({', '.join(map(str, part))} steps)"

    holds = [named(v, s) for v, s in held.items() if s]
    fails = [named(v, [n for n in steps if n not in s]) for v, s in held.items() if len(s) < len(steps)]
    if not fails:
        return "holds under every setup tried"
    if not holds:
        return "fails under every setup tried"
    return f"holds under {'; '.join(holds)}; fails under {'; '.join(fails)}"


def _section(number: str, title: str, tables: dict[str, pd.DataFrame], rules, variants, source: str) -> Section:
    blocks, claims = [], []
    for rule in rules:
        cells, held = judge(tables, rule, variants)
        steps = lengths(tables[rule.table], rule)
        said = verdict(held, steps)
        n_held = sum(len(s) for s in held.values())
        blocks += [Text(f"**\"{rule.source}\"** ({source}{', ' + rule.reading if rule.reading else ''}). Rule: {rule.rule}."),
                   Table(cells), Text(f"Verdict: {said}.")]  # fmt: skip
        reading = f"{rule.reading}: " if rule.reading else ""
        claims.append(Claim(number, rule.source, f"{reading}holds in {n_held} of {len(held) * len(steps)} cells", said))
    return Section(title, tuple(blocks), claims=tuple(claims))


def load(folder: Path, task: str) -> dict[str, pd.DataFrame]:
    """The grid tables of `task` ("count01" or "skip_pair") in `folder`, by the names rules use."""
    names = {rule.table for rule in (COUNT01_RULES if task == "count01" else SKIP_PAIR_RULES)}
    missing = [f"{task}_{n}.csv" for n in sorted(names) if not (folder / f"{task}_{n}.csv").exists()]
    if missing:
        raise FileNotFoundError(f"{folder} lacks {', '.join(missing)}: run python -m experiments.robustness.run_all")
    return {n: pd.read_csv(folder / f"{task}_{n}.csv") for n in names}


def _listed(values: pd.Series, sep: str = ", ") -> str:
    return sep.join(str(v) for v in sorted(values.unique()))


def build(out: Path = DEFAULT_OUT) -> Path:
    """Render OUT/robustness.md from OUT/robustness/*.csv; returns its path."""
    tables = out / "robustness"
    count01_tables, skip_pair_tables = load(tables, "count01"), load(tables, "skip_pair")
    count01, skip_pair = count01_tables["grid"], skip_pair_tables["grid"]
    table1, ensemble = count01_tables["table1"], count01_tables["ensemble"]
    short = ensemble[ensemble.kind == "primary-short"]
    timing = json.loads((tables / "timing.json").read_text())
    sections = [
        _section("1", "1. Count01 claims across setups", count01_tables, COUNT01_RULES, list(COUNT01_VARIANTS),
                 "the summary of the paper"),
        _section("2", "2. SkipPair claims across setups", skip_pair_tables, SKIP_PAIR_RULES, list(SKIP_PAIR_VARIANTS),
                 "the post"),
    ]  # fmt: skip
    page = render(
        "page.md.j2", HERE,
        title="Robustness: which claims survive the setup the sources leave open",
        source_name="source",
        claims=[c for s in sections for c in s.claims],
        claims_note="One row per claim tested across the grid; *measured here* counts the cells (setup variant x "
        "training length, or setup alone where a claim is about a set of models of every length) in which the rule "
        "holds, the verdict names them (a training length is named only where the lengths disagree). A quote tested "
        "two ways has a row for each. Rules are in `experiments/robustness/page.py`.",
        sections=sections,
        timing=timing,
        seeds=dict(primary=_listed(count01[count01.kind == "primary"].seed), minimal=_listed(count01[count01.kind == "minimal"].seed),
                   skip_pair=_listed(skip_pair.seed), count01_steps=_listed(count01.steps, " and "),
                   skip_pair_steps=_listed(skip_pair.steps, " and "), table1_steps=_listed(table1.steps, " and "),
                   table1=_listed(table1.seed), early_steps=_listed(short.steps), early=_listed(short.seed),
                   ensemble_models=int(ensemble.groupby("variant").size().iloc[0])),
        count01_variants=COUNT01_VARIANTS, skip_pair_variants=SKIP_PAIR_VARIANTS,
    )  # fmt: skip
    target = out / "robustness.md"
    target.write_text(page, encoding="utf-8")
    return target


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results folder (default docs/results)")
    print(build(parser.parse_args().out))


def across_setups(folder: Path, task: str) -> Section | None:
    """For the task's own page ("count01" or "skip_pair"): one row per claim the grid tests, with where it
    holds and fails across setups; None when `folder` holds no grid tables."""
    if not (folder / f"{task}_grid.csv").exists():
        return None
    tables = load(folder, task)
    rules, variants = (COUNT01_RULES, list(COUNT01_VARIANTS)) if task == "count01" else (SKIP_PAIR_RULES, list(SKIP_PAIR_VARIANTS))
    rows = [{"claim": rule.source + (f" ({rule.reading})" if rule.reading else ""), "across setups": verdict(judge(tables, rule, variants)[1], lengths(tables[rule.table], rule))}
            for rule in rules]  # fmt: skip
    steps = sorted(int(n) for n in tables["grid"].steps.unique())
    text = (f"The claims below were also measured under every setup variant the source leaves open ({', '.join(variants[1:])}), "
            f"at {' and '.join(map(str, steps))} training steps"
            + (f" (Table 1 at {' and '.join(map(str, sorted(int(n) for n in tables['table1'].steps.unique())))})" if task == "count01" else "")
            + ": `robustness.md` has the rules and the numbers per setup. Here, where each holds and where it fails:")  # fmt: skip
    return Section("Across setups (from robustness.md)", (Text(text), Table(pd.DataFrame(rows))))
