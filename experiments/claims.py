"""The claim registry (issue 24): every claim of the two sources that the grid measures, as data, and the one
way a verdict is drawn from numbers. `robustness.md`, and the "across setups" sections of `count01.md` and
`skip_pair.md`, render from it, so no two pages can judge one claim two ways.

A claim is its verbatim quote, the seed document it comes from, and its **logical form**:

- "existence"   ("a 2-head model which solves the task"): holds when at least one unit passes;
- "universal"   ("for any given pair of inputs"): holds when every unit passes; one counterexample fails it;
- "typical"     ("heads are typically biased", a generic plural): holds when more than half of the units pass;
- "comparison"  (a number against the source's, or a sign): holds by the reading's own test;
- "correlation" ("strongly correlates"): holds by the reading's own test on r and its interval.

Each claim is measured under one or more **readings** (named measurements), shown side by side; the reading
the source's wording favours is marked, with why. Each reading has a **testability check**: a cell (setup x
training length) where the measurement could not have come out the other way is "not testable here", never
"holds" or "fails" (a model that cannot represent any solution, a test implied by accuracy, no unit to test).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd

from experiments.count01.quotes import PAPER_R
from experiments.count01.quotes import QUOTES as C
from experiments.skip_pair.quotes import QUOTES as S

Form = Literal["existence", "universal", "typical", "comparison", "correlation"]
HOLDS, FAILS, UNTESTABLE = "holds", "fails", "not testable here"
STRONG = 0.5  # "strongly correlates": r >= 0.5 with the 95% interval above 0 (our threshold; the source gives none)


@dataclass(frozen=True)
class Outcome:
    """What one reading measured in one cell: `passed` of `units` (existence / universal / typical) or a
    `value` (comparison / correlation), the text shown, and why the cell is not testable (None if it is)."""

    text: str
    passed: int = 0
    units: int = 0
    value: float = float("nan")
    untestable: str | None = None


@dataclass(frozen=True)
class Reading:
    """One named measurement of a claim: `measure` turns the cell's rows (already restricted to one setup
    and training length) into an Outcome; `holds` decides comparison and correlation claims."""

    name: str
    rule: str
    measure: Callable[[pd.DataFrame], Outcome]
    table: str = "grid"
    favoured: str = ""  # why the source's wording favours this reading; "" if it does not
    holds: Callable[[float], bool] | None = None
    per_length: bool = True  # False: one cell per setup, over the models of every training length


@dataclass(frozen=True)
class ClaimEntry:
    key: str
    quote: str
    source: str  # the seed document the quote is verbatim in
    form: Form
    readings: tuple[Reading, ...]
    task: str  # "count01" or "skip_pair": whose grid tables the readings read
    note: str = ""  # what a reader needs beside the readings (which setup is the source's, ...)


def judge(form: str, reading: Reading, out: Outcome) -> str:
    """The verdict of one cell by the logical form the reading is judged in (`form_of`)."""
    if out.untestable:
        return UNTESTABLE
    if form in ("comparison", "correlation"):
        if out.value != out.value:  # NaN: nothing to compare
            return UNTESTABLE
        return HOLDS if reading.holds(out.value) else FAILS
    if out.units == 0:
        return UNTESTABLE
    ok = {"existence": out.passed >= 1, "universal": out.passed == out.units, "typical": out.passed > out.units / 2}
    return HOLDS if ok[form] else FAILS


# --- measurements ---------------------------------------------------------------------------------------


def count(passed, units, what: str, untestable: str | None = None) -> Outcome:
    return Outcome(f"{int(passed)}/{int(units)} {what}", int(passed), int(units), untestable=untestable)


def _primary(t: pd.DataFrame) -> pd.DataFrame:
    return t[t.kind == "primary"]


def _solved(t: pd.DataFrame, shape: str) -> pd.DataFrame:
    """SkipPair models of one shape that learnt the task (sampled signal accuracy >= 0.9): the mechanism
    claims are about models that solve it."""
    return t[(t["shape"] == shape) & (t.signal_acc >= 0.9)]


def _mechanism_untestable(rows: pd.DataFrame) -> str | None:
    return None if len(rows) else "no model of this shape learnt the task (signal accuracy >= 0.9)"


def _band(others: str) -> Callable[[pd.DataFrame], Outcome]:
    def measure(rows: pd.DataFrame) -> Outcome:
        rows = rows[rows.others.astype(str) == others] if "others" in rows else rows
        curve = rows.groupby("w01").s_acc.mean()
        inside = curve[(curve.index >= 0.1 - 1e-9) & (curve.index <= 10 + 1e-9)]
        if not len(inside):
            return Outcome("no w01 in 0.1..10", untestable="no imposed w01 in 0.1..10")
        ok = int((inside >= 0.95).sum())
        return Outcome(f"{ok}/{len(inside)} imposed w01 in 0.1..10 with mean s_acc >= 0.95 (min {inside.min():.3f} at "
                       f"w01 {inside.idxmin():.2g})", ok, len(inside))  # fmt: skip
    return measure


def _fisher(rows: pd.DataFrame, y: str) -> tuple[float, float, float, int] | None:
    rows = rows.dropna(subset=["weighted_s_acc", y])
    if len(rows) < 4 or rows.weighted_s_acc.std() == 0 or rows[y].std() == 0:
        return None
    r = float(np.corrcoef(rows.weighted_s_acc, rows[y])[0, 1])
    z, se = np.arctanh(np.clip(r, -0.999999, 0.999999)), 1 / np.sqrt(len(rows) - 3)
    return r, float(np.tanh(z - 1.96 * se)), float(np.tanh(z + 1.96 * se)), len(rows)


def _r(y: str, test: str, short: bool = True) -> Callable[[pd.DataFrame], Outcome]:
    """test "strong": value 1 when r >= STRONG and the interval is above 0; "value": 1 when the paper's r
    lies in the interval."""
    def measure(rows: pd.DataFrame) -> Outcome:
        if not short:
            rows = rows[rows.kind != "primary-short"]
        f = _fisher(rows, y)
        if f is None:
            return Outcome(f"n = {len(rows)}: no spread", untestable="no spread in the model set")
        r, lo, hi, n = f
        ok = (r >= STRONG and lo > 0) if test == "strong" else (lo <= PAPER_R <= hi)
        return Outcome(f"r = {r:.2f} ({lo:.2f}..{hi:.2f}), n = {n}", value=float(ok))
    return measure


def _table1(metric: str) -> Callable[[pd.DataFrame], Outcome]:
    def measure(rows: pd.DataFrame) -> Outcome:
        d = float((rows[f"isolated_{metric}"] - rows[f"joint_{metric}"]).mean())
        return Outcome(f"isolated - joint {d:+.3f} (mean over {len(rows)} heads)", value=d)
    return measure


def _syntax(prefix: str) -> Callable[[pd.DataFrame], Outcome]:
    """Models whose accuracy (answer or [EOS]) drops by more than 0.01 when every head's readout is equalised;
    not testable where, with every head zeroed, [EOS] accuracy stays >= 0.99 in every model: the syntax
    then needs no head, so no aggregation of heads can matter to it."""
    def measure(rows: pd.DataFrame) -> Outcome:
        rows = _primary(rows)
        if f"{prefix}_answer_acc" not in rows:
            return Outcome("not measured", untestable="not measured in this grid")
        drop = ((rows.model_answer_acc - rows[f"{prefix}_answer_acc"] > 0.01)
                | (rows.model_eos_acc - rows[f"{prefix}_eos_acc"] > 0.01))  # fmt: skip
        carried = (rows.zeroed_eos_acc < 0.99).any()
        text = (f"{int(drop.sum())}/{len(rows)} models lose accuracy (equalised: answer {rows[f'{prefix}_answer_acc'].mean():.3f}, "
                f"[EOS] {rows[f'{prefix}_eos_acc'].mean():.3f}; every head zeroed: answer {rows.zeroed_answer_acc.mean():.3f}, "
                f"[EOS] {rows.zeroed_eos_acc.mean():.3f})")  # fmt: skip
        return Outcome(text, int(drop.sum()), len(rows),
                       untestable=None if carried else "[EOS] needs no head (every head zeroed: [EOS] accuracy >= 0.99)")
    return measure


def _reach(rows: pd.DataFrame) -> Outcome:
    """Runs that do NOT reach both_acc >= 0.99 ("difficult to reach": most fail); not testable where no run
    produces the answer at all (answer accuracy < 0.05 in every run): the model then cannot represent a
    solution in this setup, so failing to reach one says nothing about gradient descent."""
    rows = rows[rows.kind == "minimal"]
    missed = int((rows.both_acc < 0.99).sum())
    dead = bool(len(rows)) and bool((rows.answer_acc < 0.05).all())
    return count(missed, len(rows), f"runs miss both_acc >= 0.99 (best answer accuracy {rows.answer_acc.max():.3f})",
                 "no run produces the answer (answer accuracy < 0.05 in every run): no solution is representable" if dead else None)


def _tip(rows: pd.DataFrame) -> Outcome:
    rows = _primary(rows)
    top = int((rows.eq_answer_top.astype(bool) & rows.ans_eos_top.astype(bool)).sum())
    implied = bool(len(rows)) and bool((rows.both_acc >= 0.99).all())
    return count(top, len(rows), "models: answer on top at '=', [EOS] on top at the answer",
                 "implied by accuracy: every model has answer and [EOS] accuracy >= 0.99" if implied else None)


# --- the registry ---------------------------------------------------------------------------------------

SUMMARY = "count01-paper-summary.md"
POST = "ov-coherent-skip-pair-post.md"
D5, D1, ONE = "2 heads, d_head 5", "2 heads, d_head 1", "1 head, d_head 4"

REGISTRY: tuple[ClaimEntry, ...] = (
    ClaimEntry("half", C["half"], SUMMARY, "comparison", (
        Reading("share of successful heads", "share of the primary models' heads with s_acc >= 0.95 in 0.35..0.65",
                lambda t: (lambda r: Outcome(f"{int(r.successful.sum())}/{int(r.heads.sum())} heads", value=r.successful.sum() / max(r.heads.sum(), 1)))(_primary(t)),
                holds=lambda v: 0.35 <= v <= 0.65, favoured="the quote gives the share"),
    ), "count01"),
    ClaimEntry("w01", C["w01"], SUMMARY, "typical", (
        Reading("most successful heads", "successful heads (s_acc >= 0.95) with 0.1 < w01 < 10",
                lambda t: count(_primary(t).successful_w01_in_0_1_10.sum(), _primary(t).successful.sum(), "successful heads"),
                favoured="a generic plural (\"Successful heads have\") states what is typical"),
    ), "count01"),
    ClaimEntry("w02", C["w02"], SUMMARY, "typical", (
        Reading("most successful heads", "successful heads with w02 > 10",
                lambda t: count(_primary(t).successful_w02_gt_10.sum(), _primary(t).successful.sum(), "successful heads"),
                favoured="a generic plural states what is typical"),
    ), "count01"),
    ClaimEntry("band", C["band"], SUMMARY, "universal", (
        Reading("[BOS] and '=' keep their attention", "at every imposed w01 from 0.1 to 10 the mean s_acc over the "
                "primary models' heads is >= 0.95; attention to '2' set to 0, [BOS] and '=' keep the model's",
                _band("model"), table="band", favoured="the source sets only the attention to '2' to zero"),
        Reading("[BOS] and '=' set to 0 too", "the same, with the attention to [BOS] and '=' also set to 0",
                _band("0.0"), table="band"),
    ), "count01"),
    ClaimEntry("r", C["r"], SUMMARY, "correlation", (
        Reading("strong, y = answer accuracy", f"Pearson r between the readout-weighted mean head s_acc and the "
                f"model's answer accuracy is >= {STRONG} with its Fisher 95% interval above 0",
                _r("answer_acc", "strong"), table="ensemble", holds=lambda v: v == 1.0, per_length=False,
                favoured="\"Model accuracy strongly correlates\" (the summary's key outcome)"),
        Reading("strong, y = answer accuracy, without the short runs", "the same without the primary models "
                "trained 10..160 steps (their spread carries much of r)", _r("answer_acc", "strong", short=False),
                table="ensemble", holds=lambda v: v == 1.0, per_length=False),
        Reading("strong, y = the model's own separation", "the same with y = the share of strings with "
                "logit(5) > logit(4) at '=' (\"The final model's separation accuracy\")", _r("answer_45_acc", "strong"),
                table="ensemble", holds=lambda v: v == 1.0, per_length=False),
        Reading("the value 0.72, y = answer accuracy", "the paper's 0.72 lies in the Fisher 95% interval",
                _r("answer_acc", "value"), table="ensemble", holds=lambda v: v == 1.0, per_length=False),
    ), "count01"),
    ClaimEntry("joint", C["joint"], SUMMARY, "comparison", tuple(
        Reading(f"by {m}", f"isolated - joint {m}, mean over the heads of each setup's Table 1 models, > 0.005",
                _table1(m), table="table1", holds=lambda v: v > 0.005,
                favoured="the paper's own metric" if m == "l_acc_head" else "")
        for m in ("s_acc", "l_acc_head", "l_acc")), "count01"),
    ClaimEntry("bias", C["bias"], SUMMARY, "typical", (
        Reading("successful heads", "successful heads with |bias_45| > |signal_45| / 5",
                lambda t: count(_primary(t).biased_successful.sum(), _primary(t).successful.sum(), "successful heads")
                if "biased_successful" in t else Outcome("not measured", untestable="not measured in this grid"),
                favoured="a failed head has signal about 0, so any bias passes the test: only successful heads can fail it"),
        Reading("every head", "every head with |bias_45| > |signal_45| / 5",
                lambda t: count(_primary(t).biased.sum(), _primary(t).heads.sum(), "heads")),
    ), "count01"),
    ClaimEntry("tip", C["tip"], SUMMARY, "universal", (
        Reading("the balance tips toward [EOS]", "every primary model, for both answers, has as its most frequent "
                "ordering of '4', '5', [EOS] one led by the answer at '=' and one led by [EOS] at the answer", _tip),
        Reading("the ordering about fixed, per string", "every primary model keeps the 4/5 order from '=' to the "
                "answer in >= 90% of the strings of each answer",
                lambda t: count((_primary(t).kept_45_min >= 0.9).sum(), len(_primary(t)), "models"),
                favoured="\"the ordering of the logits\" of a model is read string by string"),
        Reading("the ordering about fixed, mean logits", "every primary model keeps the order of the mean '4' and "
                "'5' logits from '=' to the answer, for both answers",
                lambda t: count(_primary(t).mean_order_kept.astype(bool).sum(), len(_primary(t)), "models")
                if "mean_order_kept" in t else Outcome("not measured", untestable="not measured in this grid")),
    ), "count01"),
    ClaimEntry("reach", C["reach"], SUMMARY, "typical", (
        Reading("most runs miss", "d=1, d'=1, one-head runs that do not reach both_acc >= 0.99", _reach,
                favoured="\"difficult to reach\": most runs from random initialisation miss it"),
    ), "count01"),
    ClaimEntry("aggregate", C["aggregate"], "count01-paper-abstract.md", "typical", (
        Reading("whole readout equalised", "primary models that lose > 0.01 answer or [EOS] accuracy when each "
                "head's z is rescaled so that its whole readout (the '4', '5' and [EOS] logits) has the mean norm",
                _syntax("uniform_whole"), favoured="the output layer aggregates each head's whole output, [EOS] included"),
        Reading("5 - 4 readout equalised", "the same with only each head's logit(5) - logit(4) readout equalised",
                _syntax("uniform_45")),
    ), "count01", note="The source's architecture is \"Head outputs are concatenated and projected to logits\": the "
       "heads-only readout setup. Under our default readout the unembedding also reads the embedding, so [EOS] can "
       "come without any head; each cell shows answer and [EOS] accuracy with every head zeroed, so a reader sees "
       "what the heads carry."),
    # SkipPair
    ClaimEntry("perfect", S["perfect"], POST, "existence", (
        Reading("some seed", "2-head, d_head 5 seeds right on every sampled signal input",
                lambda t: count(t[t["shape"] == D5].signal_all.sum(), (t["shape"] == D5).sum(), "seeds"),
                favoured="\"a 2-head model which solves the task\": one model"),
        Reading("every seed", "the same, read as every seed (shown for contrast)",
                lambda t: count(t[t["shape"] == D5].signal_all.sum(), (t["shape"] == D5).sum(), "seeds")),
    ), "skip_pair"),
    ClaimEntry("dhead1", S["dhead1"], POST, "existence", (
        Reading("some seed", "2-head, d_head 1 seeds right on every sampled signal input",
                lambda t: count(t[t["shape"] == D1].signal_all.sum(), (t["shape"] == D1).sum(), "seeds"),
                favoured="\"capability\": one model suffices"),
    ), "skip_pair"),
    ClaimEntry("strict", S["strict"], POST, "typical", (
        Reading("most solved seeds", "2-head, d_head 5 seeds that learnt the task in which both heads split no "
                "pair of signal tokens (the less-attended one gets at most 10% of the two's attention)",
                lambda t: count((_solved(t, D5).strict_heads == 2).sum(), len(_solved(t, D5)), "seeds",
                                _mechanism_untestable(_solved(t, D5))),
                favoured="the post describes its typical 2-head model"),
    ), "skip_pair"),
    ClaimEntry("reversed", S["reversed"], POST, "typical", (
        Reading("most solved seeds", "2-head, d_head 5 seeds that learnt the task whose two orderings are exact reverses",
                lambda t: count((_solved(t, D5).relation == "reversed").sum(), len(_solved(t, D5)), "seeds",
                                _mechanism_untestable(_solved(t, D5))),
                favoured="\"generally reversed\""),
    ), "skip_pair"),
    ClaimEntry("split", S["split"], POST, "universal", (
        Reading("never at d_head 5", "2-head, d_head 5 models with no pair of signal tokens split by both heads at "
                "any of 12 training checkpoints where the model has learnt the task",
                lambda t: count((t[t["shape"] == D5].split_while_learnt == 0).sum(), (t["shape"] == D5).sum(), "models unsplit"),
                favoured="\"we only saw split attention for d_head < 3\" excludes d_head >= 3"),
        Reading("seen at d_head 1 (existence)", "2-head, d_head 1 models split while learnt (the other half of the sentence)",
                lambda t: count((t[t["shape"] == D1].split_while_learnt > 0).sum(), (t["shape"] == D1).sum(),
                                "d_head 1 models split while learnt")),
    ), "skip_pair"),
    ClaimEntry("conditional", S["conditional"], POST, "typical", (
        Reading("most (head, token) rows", "rows of solved 2-head, d_head 5 models whose OV effect puts exactly the "
                "completions consistent with the ordering on top",
                lambda t: count(_solved(t, D5).specific_rows.sum(), _solved(t, D5).specific_total.sum(), "rows",
                                _mechanism_untestable(_solved(t, D5))),
                favoured="a description of the typical head"),
    ), "skip_pair"),
    ClaimEntry("only_correct", S["only_correct"], POST, "universal", (
        Reading("every qualifying pair type", "pair types of solved 2-head, d_head 5 models where both heads push "
                "at least two completions above zero: the correct completion is the only one both push above zero",
                lambda t: count(_solved(t, D5).only_correct.sum(), _solved(t, D5).qualifying.sum(), "pair types",
                                _mechanism_untestable(_solved(t, D5))),
                favoured="\"In contexts where both heads write to multiple outputs, they will only constructively interfere\": a universal statement"),
        Reading("most qualifying pair types", "the same, read as typical (shown for contrast)",
                lambda t: count(_solved(t, D5).only_correct.sum(), _solved(t, D5).qualifying.sum(), "pair types",
                                _mechanism_untestable(_solved(t, D5)))),
    ), "skip_pair"),
    ClaimEntry("one_head", S["one_head"], POST, "existence", (
        Reading("some seed", "1-head, d_head 4 seeds right on every sampled signal input",
                lambda t: count(t[t["shape"] == ONE].signal_all.sum(), (t["shape"] == ONE).sum(), "seeds"),
                favoured="\"can be solved with one head\": one model"),
    ), "skip_pair"),
    ClaimEntry("caption", S["caption"], POST, "universal", (
        Reading("every pair type", "(model, pair type) of solved 2-head, d_head 5 models where both heads push the "
                "correct completion above their mean over the 10 completions",
                lambda t: count(_solved(t, D5).correct_up_both.sum(), 10 * len(_solved(t, D5)), "(model, pair type)",
                                _mechanism_untestable(_solved(t, D5))),
                favoured="\"for any given pair of inputs\": universal"),
    ), "skip_pair"),
)  # fmt: skip

# The readings of one claim that share its form but are read as another form, for contrast
FORM_OF_READING = {("perfect", "every seed"): "universal", ("only_correct", "most qualifying pair types"): "typical",
                   ("split", "seen at d_head 1 (existence)"): "existence"}

# Claims with no verdict, and why (issue 24, item 5)
UNTESTED: tuple[tuple[str, str, str], ...] = (
    ("Head performance on the Count01 task is primarily determined by attention patterns, with value feature "
     "vectors playing a minor role.", "count01-paper-abstract.md",
     "not measured: it needs an intervention that swaps value vectors between heads at fixed attention, not yet in the grid"),
    ("Instead, we claim there is an analogous force pushing the model toward adopting a distributed "
     "representation/head superposition", POST, "a thesis about training pressure, not a measurable property "
     "of one model; out of reach of this grid"),
    ("When the head attends to its “favourite” token (“2” and “1” respectively), it implicitly has no information "
     "about the other position, and so writes roughly uniformly to the logits of all possible completions.", POST,
     "not in the grid; skip_pair.md section 3 shows each head's OV effect per attended token, from which it could "
     "be read (the spread of the favourite token's row), but no rule is fixed for \"roughly uniformly\""),
)


def form_of(entry: ClaimEntry, reading: Reading) -> str:
    return FORM_OF_READING.get((entry.key, reading.name), entry.form)


def entries(task: str) -> tuple[ClaimEntry, ...]:
    return tuple(e for e in REGISTRY if e.task == task)
