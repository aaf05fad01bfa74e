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

from experiments.count01.page import QUOTES as COUNT01_QUOTES
from experiments.robustness.common import COUNT01_VARIANTS, DEFAULT_OUT, SKIP_PAIR_VARIANTS
from experiments.skip_pair.page import QUOTES as SKIP_PAIR_QUOTES
from headcoop.pages import Claim, Section, Table, Text, render

HERE = Path(__file__).resolve().parent


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
    Rule("reach", COUNT01_QUOTES["reach"], "at most a quarter of the d=1, d'=1, one-head runs reach both_acc >= 0.99",
         lambda t: t[t.kind == "minimal"], lambda r: _share((r.both_acc >= 0.99).sum(), len(r)), lambda v: v <= 0.25),
    Rule("tip", COUNT01_QUOTES["tip"], "proxy: every primary model has the answer on top at `=` and `[EOS]` on top "
         "at the answer (both_acc >= 0.99); the logit ordering itself is measured on the default setup only",
         lambda t: t[t.kind == "primary"], lambda r: _share((r.both_acc >= 0.99).sum(), len(r)), lambda v: v == 1.0),
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
    Rule("one_head", SKIP_PAIR_QUOTES["one_head"], "every 1-head, d_head 4 seed right on every sampled signal input",
         lambda t: t[t["shape"] == "1 head, d_head 4"], lambda r: _share(r.signal_all.sum(), len(r)),
         lambda v: v == 1.0),
)  # fmt: skip


def judge(table: pd.DataFrame, rule: Rule, variants: list[str]) -> tuple[pd.DataFrame, dict[str, list[int]]]:
    """Per cell (variant x steps): the value and whether the rule holds; (table, {variant: [steps where it
    holds]})."""
    cells, held = [], {}
    steps = sorted(int(n) for n in table.steps.unique())
    for variant in variants:
        row, held[variant] = {"setup": variant}, []
        for n in steps:
            picked = rule.rows(table[(table.variant == variant) & (table.steps == n)])
            value, text = rule.value(picked)
            ok = rule.holds(value)
            row[f"{n} steps"] = f"{'holds' if ok else 'fails'} ({text})"
            if ok:
                held[variant].append(n)
        cells.append(row)
    return pd.DataFrame(cells), held


def verdict(held: dict[str, list[int]], steps: list[int]) -> str:
    """"holds under X; fails under Y", naming a training length only where the two lengths disagree."""
    def named(variant: str, lengths: list[int]) -> str:
        return variant if len(lengths) == len(steps) else f"{variant} ({', '.join(map(str, lengths))} steps)"

    holds = [named(v, s) for v, s in held.items() if s]
    fails = [named(v, [n for n in steps if n not in s]) for v, s in held.items() if len(s) < len(steps)]
    if not fails:
        return "holds under every setup tried"
    if not holds:
        return "fails under every setup tried"
    return f"holds under {'; '.join(holds)}; fails under {'; '.join(fails)}"


def _section(number: str, title: str, table: pd.DataFrame, rules, variants, source: str) -> Section:
    blocks, claims = [], []
    steps = sorted(int(n) for n in table.steps.unique())
    for rule in rules:
        cells, held = judge(table, rule, variants)
        said = verdict(held, steps)
        n_held = sum(len(s) for s in held.values())
        blocks += [Text(f"**\"{rule.source}\"** ({source}). Rule: {rule.rule}."), Table(cells), Text(f"Verdict: {said}.")]
        claims.append(Claim(number, rule.source, f"holds in {n_held} of {len(held) * len(steps)} cells", said))
    return Section(title, tuple(blocks), claims=tuple(claims))


def _listed(values: pd.Series, sep: str = ", ") -> str:
    return sep.join(str(v) for v in sorted(values.unique()))


def build(out: Path = DEFAULT_OUT) -> Path:
    """Render OUT/robustness.md from OUT/robustness/*.csv; returns its path."""
    tables = out / "robustness"
    count01 = pd.read_csv(tables / "count01_grid.csv")
    skip_pair = pd.read_csv(tables / "skip_pair_grid.csv")
    timing = json.loads((tables / "timing.json").read_text())
    sections = [
        _section("1", "1. Count01 claims across setups", count01, COUNT01_RULES, list(COUNT01_VARIANTS),
                 "the summary of the paper"),
        _section("2", "2. SkipPair claims across setups", skip_pair, SKIP_PAIR_RULES, list(SKIP_PAIR_VARIANTS),
                 "the post"),
    ]  # fmt: skip
    page = render(
        "page.md.j2", HERE,
        title="Robustness: which claims survive the setup the sources leave open",
        source_name="source",
        claims=[c for s in sections for c in s.claims],
        claims_note="One row per claim tested across the grid; *measured here* counts the cells (setup variant x "
        "training length) in which the rule holds, the verdict names them (a training length is named only where "
        "the two disagree). Rules are in `experiments/robustness/page.py`.",
        sections=sections,
        timing=timing,
        seeds=dict(primary=_listed(count01[count01.kind == "primary"].seed), minimal=_listed(count01[count01.kind == "minimal"].seed),
                   skip_pair=_listed(skip_pair.seed), count01_steps=_listed(count01.steps, " and "),
                   skip_pair_steps=_listed(skip_pair.steps, " and ")),
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
    path = folder / f"{task}_grid.csv"
    if not path.exists():
        return None
    table = pd.read_csv(path)
    rules, variants = (COUNT01_RULES, list(COUNT01_VARIANTS)) if task == "count01" else (SKIP_PAIR_RULES, list(SKIP_PAIR_VARIANTS))
    steps = sorted(int(n) for n in table.steps.unique())
    rows = [{"claim": rule.source, "across setups": verdict(judge(table, rule, variants)[1], steps)} for rule in rules]
    text = (f"The claims below were also measured under every setup variant the source leaves open ({', '.join(variants[1:])}), "
            f"at {' and '.join(map(str, steps))} training steps: `robustness.md` has the rules and the numbers per "
            "setup. Here, where each holds and where it fails:")  # fmt: skip
    return Section("Across setups (from robustness.md)", (Text(text), Table(pd.DataFrame(rows))))
