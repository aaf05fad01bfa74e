"""The claim registry (issue 24): every claim of the two sources that a page judges, as data, and the one
way a verdict is drawn from numbers. `robustness.md`, the verdict columns of `count01.md`, `skip_pair.md` and
`cooperation.md`, and their "across setups" sections render from it, so no two pages can judge one claim two
ways.

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

A reading reads either the robustness grid (`table` "grid", "band", "ensemble" or "table1": one cell per setup
variant and training length) or a task page's own tables (`table` "<page>/<name>", e.g.
"cooperation/skip_pair_contexts": docs/results/<page>/<name>.csv, or a table DERIVED from them): one cell, the
default setup with the models that page studies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd

from experiments.cooperation.measures import WRITES_TO, active_pairs
from experiments.cooperation.quotes import FINDING, SUPERPOSE
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

    @property
    def on_page(self) -> bool:
        """True when the reading reads a task page's own tables (one cell: the default setup, that page's models)."""
        return "/" in self.table


PAGE = "the page's models"  # the one cell of a reading that reads a task page's tables


def _count01_models(coop: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Per (model, how) of cooperation.md's Count01 models: the pairs of active heads (`active_pairs`) and the
    model verdict of `hc.cooperation` on accuracy (`mechanism`)."""
    verdicts = coop["cooperation/count01_mechanisms"]
    verdicts = verdicts[verdicts.metric == "accuracy"][["model", "how", "mechanism", "net_sum_verdict"]]
    active = active_pairs(coop["cooperation/count01_heads"], coop["cooperation/count01_pairs"])
    return active.merge(verdicts, on=["model", "how"], how="left")


# tables a reading may read that are built from page tables: name -> (the tables it needs, how)
DERIVED: dict[str, tuple[tuple[str, ...], Callable[[dict[str, pd.DataFrame]], pd.DataFrame]]] = {
    "cooperation/count01_models": (("cooperation/count01_mechanisms", "cooperation/count01_heads",
                                    "cooperation/count01_pairs"), _count01_models),
}  # fmt: skip


def page_tables(results: Path, names: set[str]) -> dict[str, pd.DataFrame]:
    """The page tables `names` ("<page>/<name>") from the results folder (docs/results), derived ones built;
    a table whose file is missing is left out (its readings are then "not testable here": not measured)."""
    wanted = set(names) | {n for name in names if name in DERIVED for n in DERIVED[name][0]}
    out = {n: pd.read_csv(results / f"{n}.csv") for n in sorted(wanted) if n not in DERIVED and (results / f"{n}.csv").exists()}
    for name in names:
        if name in DERIVED and all(n in out for n in DERIVED[name][0]):
            out[name] = DERIVED[name][1](out)
    return out


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


def _noise_text(quiet: float, q: int, noisy: float, n: int) -> str:
    return f"mean s_acc {quiet:.3f} over {q} heads with w02 > 10 against {noisy:.3f} over {n} with w02 < 3"


def _noise_outcome(quiet_sum: float, q: int, noisy_sum: float, n: int) -> Outcome:
    """quiet - noisy mean s_acc; not testable where either group of heads is empty."""
    if not q or not n:
        return Outcome(f"{q} heads with w02 > 10, {n} with w02 < 3",
                       untestable=f"no head with {'w02 > 10' if not q else 'w02 < 3'}: nothing to compare")
    quiet, noisy = quiet_sum / q, noisy_sum / n
    return Outcome(_noise_text(quiet, q, noisy, n), value=quiet - noisy)


def _noise_grid(rows: pd.DataFrame) -> Outcome:
    rows = _primary(rows)
    if "noisy_heads" not in rows:
        return Outcome("not measured", untestable="not measured in this grid")
    return _noise_outcome(rows.quiet_s_acc.sum(), int(rows.quiet_heads.sum()), rows.noisy_s_acc.sum(), int(rows.noisy_heads.sum()))


def _noise_heads(heads: pd.DataFrame) -> Outcome:
    quiet, noisy = heads[heads.w02 > 10], heads[heads.w02 < 3]
    return _noise_outcome(quiet.s_acc.sum(), len(quiet), noisy.s_acc.sum(), len(noisy))


def _same_first(orderings: str) -> bool:
    """Do the two heads of a 2-head model put the same signal token first ("2>3>4>1 | 2>1>4>3")?"""
    first, second = orderings.split(" | ")
    return first.split(">")[0] == second.split(">")[0]


def _shared_favourite(t: pd.DataFrame, shape: str, want: bool) -> Outcome:
    rows = t[t["shape"] == shape]
    shared = rows.orderings.map(_same_first) if len(rows) else pd.Series(dtype=bool)
    passed = int(shared.sum()) if want else int((~shared.astype(bool)).sum())
    return count(passed, len(rows), "models whose heads share their first token" if want else "models whose heads "
                 "put different tokens first")


def _contexts(passed: str, units: str) -> Callable[[pd.DataFrame], Outcome]:
    """Contexts of cooperation.md's 2-head, d_head 5 seeds (skip_pair_contexts) where column `passed` holds, of
    those counted by column `units`."""
    def measure(t: pd.DataFrame) -> Outcome:
        t = t[(t.d_head == 5) & t.seed.notna()]
        return count(t[passed].sum(), t[units].sum(), "contexts")
    return measure


def _ensemble(key: str, how: str) -> Callable[[pd.DataFrame], Outcome]:
    """cooperation.md's Count01 models under one ablation: R1 the model verdict is redundant; R2 most pairs of
    active heads are redundant; R3 every pair of active heads is redundant. Under the reading family a model
    whose word (R1), or most of whose active pairs (R2, R3), the readings leave undetermined cannot show
    either way: it is left out, and where every model is, the reading is not testable here."""
    def measure(t: pd.DataFrame) -> Outcome:
        t = t[t.how == how]
        if how == "family":
            n = len(t)
            t = t[t.mechanism != "undetermined"] if key == "R1" else t[t.conflicting <= t.active_pairs / 2]
            if not len(t):
                return count(0, 0, "models", untestable=f"the reading family leaves all {n} models undetermined "
                             "(the readings disagree; cooperation.md section 1 names what flips each)")
        ok = {"R1": t.mechanism == "redundant", "R2": t.redundant_share > 0.5,
              "R3": (t.redundant == t.active_pairs) & (t.active_pairs > 0)}[key]
        return count(ok.sum(), len(t), "models")
    return measure


def _superposed(which: str, how: str) -> Callable[[pd.DataFrame], Outcome]:
    """hc.cooperation's pair verdict is "superposition": for the shipped d_head 5 model, or per d_head 5 seed."""
    def measure(t: pd.DataFrame) -> Outcome:
        t = t[(t.d_head == 5) & (t.how == how)]
        t = t[t.seed.isna()] if which == "shipped" else t[t.seed.notna()]
        what = "shipped d_head 5 model" if which == "shipped" else "d_head 5 seeds"
        return Outcome(f"{int((t.mechanism == 'superposition').sum())}/{len(t)} {what} (verdicts: "
                       f"{', '.join(f'{n} {m}' for m, n in t.mechanism.value_counts().items())})",
                       int((t.mechanism == "superposition").sum()), len(t))
    return measure


# --- the registry ---------------------------------------------------------------------------------------

SUMMARY = "count01-paper-summary.md"
POST = "ov-coherent-skip-pair-post.md"
D5, D1, ONE = "2 heads, d_head 5", "2 heads, d_head 1", "1 head, d_head 4"

REGISTRY: tuple[ClaimEntry, ...] = (
    ClaimEntry("half", C["half"], SUMMARY, "comparison", (
        Reading("share of successful heads", "share of the primary models' heads with s_acc >= 0.95 in 0.35..0.65",
                lambda t: (lambda r: Outcome(f"{int(r.successful.sum())}/{int(r.heads.sum())} heads", value=r.successful.sum() / max(r.heads.sum(), 1)))(_primary(t)),
                holds=lambda v: 0.35 <= v <= 0.65, favoured="the quote gives the share"),
        Reading("share of successful heads, count01.md's models", "the same over count01.md's primary models",
                lambda t: Outcome(f"{int(t.successful.sum())}/{len(t)} heads", value=t.successful.mean()),
                table="count01/primary_heads", holds=lambda v: 0.35 <= v <= 0.65),
    ), "count01"),
    ClaimEntry("w01", C["w01"], SUMMARY, "typical", (
        Reading("most successful heads", "successful heads (s_acc >= 0.95) with 0.1 < w01 < 10",
                lambda t: count(_primary(t).successful_w01_in_0_1_10.sum(), _primary(t).successful.sum(), "successful heads"),
                favoured="a generic plural (\"Successful heads have\") states what is typical"),
        Reading("most successful heads, count01.md's models", "the same over count01.md's primary models",
                lambda t: (lambda g: count(((g.w01 > 0.1) & (g.w01 < 10)).sum(), len(g), "successful heads"))(t[t.successful]),
                table="count01/primary_heads"),
    ), "count01"),
    ClaimEntry("w02", C["w02"], SUMMARY, "typical", (
        Reading("most successful heads", "successful heads with w02 > 10",
                lambda t: count(_primary(t).successful_w02_gt_10.sum(), _primary(t).successful.sum(), "successful heads"),
                favoured="a generic plural states what is typical"),
        Reading("most successful heads, count01.md's models", "the same over count01.md's primary models",
                lambda t: (lambda g: count((g.w02 > 10).sum(), len(g), "successful heads"))(t[t.successful]),
                table="count01/primary_heads"),
    ), "count01"),
    ClaimEntry("noise", C["noise"], SUMMARY, "comparison", (
        Reading("w02 > 10 heads separate better", "mean s_acc of the primary models' heads with w02 > 10 (they largely "
                "ignore '2') minus that of heads with w02 < 3 ('2' gets at least a third of the attention of '0' and "
                "'1': \"significant attention\", our threshold) is > 0.01", _noise_grid, holds=lambda v: v > 0.01,
                favoured="\"degrades separability\": heads that attend to '2' separate worse than heads that ignore it"),
        Reading("w02 > 10 heads separate better, count01.md's models", "the same over the heads of count01.md's primary "
                "models (`count01/primary_heads.csv`)", _noise_heads, table="count01/primary_heads", holds=lambda v: v > 0.01),
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
        Reading("strong, count01.md's models", "the first reading over count01.md's model set (a sweep over sizes "
                "and the primary models, `count01/ensemble_models.csv`)", _r("answer_acc", "strong"),
                table="count01/ensemble_models", holds=lambda v: v == 1.0),
        Reading("the value 0.72, count01.md's models", "the paper's 0.72 lies in the Fisher 95% interval over "
                "count01.md's model set", _r("answer_acc", "value"), table="count01/ensemble_models", holds=lambda v: v == 1.0),
        Reading("the value 0.72, count01.md's primary-size models", "the same over its primary-size models only "
                "(the 10..160-step runs included)", lambda t: _r("answer_acc", "value")(t[t.group != "sweep"]),
                table="count01/ensemble_models", holds=lambda v: v == 1.0),
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
        Reading("successful heads, count01.md's models", "the first reading over count01.md's primary models",
                lambda t: (lambda g: count((g.bias_45.abs() > g.signal_45.abs() / 5).sum(), len(g), "successful heads"))(t[t.successful]),
                table="count01/primary_heads"),
    ), "count01"),
    ClaimEntry("tip", C["tip"], SUMMARY, "universal", (
        Reading("the balance tips toward [EOS]", "every primary model, for both answers, has as its most frequent "
                "ordering of '4', '5', [EOS] one led by the answer at '=' and one led by [EOS] at the answer", _tip),
        Reading("[EOS] climbs from second to first", "every primary model, for both answers, has as its most frequent "
                "ordering at '=' the answer, then [EOS] (so from '=' to the answer only [EOS] and the answer swap: the "
                "ordering otherwise fixed); unlike the reading above, accuracy does not imply it",
                lambda t: count(_primary(t).eq_eos_second.astype(bool).sum(), len(_primary(t)), "models")
                if "eq_eos_second" in t else Outcome("not measured", untestable="not measured in this grid")),
        Reading("the ordering about fixed, per string", "every primary model keeps the 4/5 order from '=' to the "
                "answer in >= 90% of the strings of each answer",
                lambda t: count((_primary(t).kept_45_min >= 0.9).sum(), len(_primary(t)), "models"),
                favoured="\"the ordering of the logits\" of a model is read string by string"),
        Reading("the ordering about fixed, mean logits", "every primary model keeps the order of the mean '4' and "
                "'5' logits from '=' to the answer, for both answers",
                lambda t: count(_primary(t).mean_order_kept.astype(bool).sum(), len(_primary(t)), "models")
                if "mean_order_kept" in t else Outcome("not measured", untestable="not measured in this grid")),
    ), "count01"),
    ClaimEntry("minimal", C["minimal"], SUMMARY, "existence", (
        Reading("hand-written weights", "count01.md's hand-written d=1, d'=1, one-head model reaches both_acc >= 0.99 on "
                "every evaluation (two samples and every string of length 1..7; default setup only)",
                lambda t: count(int((t.both_acc >= 0.99).all()), 1, "hand-written model right on every evaluation "
                                f"(min both_acc {t.both_acc.min():.3f})"),
                table="count01/minimal_handwritten", favoured="\"exists\": one model that solves the task shows it"),
        Reading("a trained run", "d=1, d'=1, one-head runs that reach both_acc >= 0.99",
                lambda t: count((t[t.kind == "minimal"].both_acc >= 0.99).sum(), (t.kind == "minimal").sum(), "runs reach both_acc >= 0.99")),
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
    ClaimEntry("finding", FINDING, "count01-paper-abstract.md", "typical", tuple(
        Reading(f"{key}, {how}" + ("" if how == "family" else " ablation"), rule + "; hc.cooperation on accuracy, "
                + ("the default reading family (a word where 90% of zero, mean, resample and aligned-mean readings, "
                   "reference draws and threshold bands agree)" if how == "family" else f"{how} ablation")
                + ", over cooperation.md's Count01 models", _ensemble(key, how), table="cooperation/count01_models",
                favoured="the abstract's question defines a pseudo-ensemble as heads \"all solving the same subtask\"; "
                "neither source fixes the ablation" if key == "R3" else "")
        for key, rule in (("R3", "models in which every pair of active heads is redundant"),
                          ("R2", "models in which most pairs of active heads are redundant"),
                          ("R1", "models whose hc.cooperation word (a majority of the active pairs) is redundant"))
        for how in ("zero", "mean", "family")),
        "count01", note="A head is *active* unless neither its total nor its isolated effect on the accuracy (nor on "
        "its margin) exceeds a tenth of its fair share of the heads' absolute effects with a 95% interval that "
        "excludes 0; cooperation.md section 1 has the pairs."),
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
        Reading("never at d_head 5, whole orderings", "2-head, d_head 5 models whose two heads' final preference "
                "orderings put different signal tokens first (a shared first token: both heads attend to it whenever "
                "it is in the context)", lambda t: _shared_favourite(t, D5, want=False)),
        Reading("seen at d_head 1, whole orderings (existence)", "2-head, d_head 1 models whose heads' final orderings "
                "put the same signal token first", lambda t: _shared_favourite(t, D1, want=True)),
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
        *(Reading(f"every context, writes to: {w.split(',')[0]}", "contexts of cooperation.md's d_head 5 seeds where "
                  f"both heads write to several outputs (reading *{w}* of *writes to*): the answer is the only output "
                  "both write to", _contexts(f"only_correct | {w}", f"several | {w}"), table="cooperation/skip_pair_contexts")
          for w in WRITES_TO),
    ), "skip_pair"),
    ClaimEntry("one_head", S["one_head"], POST, "existence", (
        Reading("some seed", "1-head, d_head 4 seeds right on every sampled signal input",
                lambda t: count(t[t["shape"] == ONE].signal_all.sum(), (t["shape"] == ONE).sum(), "seeds"),
                favoured="\"can be solved with one head\": one model"),
        Reading("every d_head >= 4 tried", "d_head values >= 4 of skip_pair.md's one-head runs at which some seed is "
                "right on every signal input (\"as long as d_head >= 4\": enough at each such width)",
                lambda t: (lambda one: count((one.groupby("d_head").signal_all.max() > 0).sum(), one.d_head.nunique(),
                                             "d_head values >= 4"))(t[(t.n_heads == 1) & (t.d_head >= 4)]),
                table="skip_pair/runs"),
        Reading("every seed with d_head >= 4", "skip_pair.md's one-head seeds with d_head >= 4 that are right on "
                "every signal input (sufficiency read as always)",
                lambda t: (lambda one: count(one.signal_all.sum(), len(one), "seeds"))(t[(t.n_heads == 1) & (t.d_head >= 4)]),
                table="skip_pair/runs"),
    ), "skip_pair"),
    ClaimEntry("caption", S["caption"], POST, "universal", (
        Reading("every pair type", "(model, pair type) of solved 2-head, d_head 5 models where both heads push the "
                "correct completion above their mean over the 10 completions",
                lambda t: count(_solved(t, D5).correct_up_both.sum(), 10 * len(_solved(t, D5)), "(model, pair type)",
                                _mechanism_untestable(_solved(t, D5))),
                favoured="\"for any given pair of inputs\": universal"),
        Reading("every context", "contexts (noise included) of cooperation.md's d_head 5 seeds where both heads' "
                "centered DLA on the answer is > 0", _contexts("answer_up_both", "contexts"),
                table="cooperation/skip_pair_contexts"),
    ), "skip_pair"),
    ClaimEntry("superpose", SUPERPOSE, POST, "existence", (
        Reading("the example model, reading family", "hc.cooperation's word for the two heads of the shipped 2-head, "
                "d_head 5 model (accuracy, the default reading family: the word where 90% of the readings agree) is "
                "superposition", _superposed("shipped", "family"), table="cooperation/skip_pair_mechanisms",
                favoured="\"this shows\": the post's example model, which the shipped d_head 5 model reproduces; "
                "superposition is the post's mechanism (writes and attention), stable over the readings"),
        *(Reading(f"the example model, {how} ablation", f"the same, {how} ablation alone", _superposed("shipped", how),
                  table="cooperation/skip_pair_mechanisms") for how in ("mean", "zero")),
        *(Reading(f"some d_head 5 seed, {label}", f"d_head 5 seeds of cooperation.md whose pair word ({label}) is "
                  "superposition", _superposed("seeds", how), table="cooperation/skip_pair_mechanisms")
          for how, label in (("family", "reading family"), ("mean", "mean ablation"), ("zero", "zero ablation"))),
        Reading("most d_head 5 seeds, reading family", "the same, read as typical (shown for contrast)",
                _superposed("seeds", "family"), table="cooperation/skip_pair_mechanisms"),
    ), "skip_pair", note="\"an interesting example\" is an existence claim: one pair of heads in superposition would "
       "show it."),
)  # fmt: skip

# The readings of one claim that share its form but are read as another form, for contrast
FORM_OF_READING = {("perfect", "every seed"): "universal", ("only_correct", "most qualifying pair types"): "typical",
                   ("split", "seen at d_head 1 (existence)"): "existence",
                   ("split", "seen at d_head 1, whole orderings (existence)"): "existence",
                   ("superpose", "most d_head 5 seeds, reading family"): "typical",
                   ("one_head", "every d_head >= 4 tried"): "universal", ("one_head", "every seed with d_head >= 4"): "universal"}

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
