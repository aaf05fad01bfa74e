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

import dataclasses
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
    undecided: int = 0  # units the instrument leaves undetermined: they count neither way (issue 71)


@dataclass(frozen=True)
class Band:
    """One threshold of a reading's rule and the other values it is read at, so a verdict shows whether it
    flips inside a plausible band: `at(value)` is the reading with this threshold at `value` and every other
    threshold at the rule's own (this one's is `default`)."""

    threshold: str  # the number as the rule words it: "s_acc >=", "drop >"
    default: float
    others: tuple[float, ...]
    at: Callable[[float], Reading]


@dataclass(frozen=True)
class Reading:
    """One named measurement of a claim: `measure` turns the cell's rows (already restricted to one setup
    and training length) into an Outcome; `holds` decides comparison and correlation claims. `bands`: each
    threshold of the rule and the other values it is also read at (empty: the rule has no threshold of its
    own, or `fixed` says why it is not banded)."""

    name: str
    rule: str
    measure: Callable[[pd.DataFrame], Outcome]
    table: str = "grid"
    favoured: str = ""  # why the source's wording favours this reading; "" if it does not
    holds: Callable[[float], bool] | None = None
    per_length: bool = True  # False: one cell per setup, over the models of every training length
    bands: tuple[Band, ...] = ()
    fixed: str = ""  # why a rule with a threshold has no band here ("" when it has none or has bands)

    @property
    def on_page(self) -> bool:
        """True when the reading reads a task page's own tables (one cell: the default setup, that page's models)."""
        return "/" in self.table


def banded_by(make: Callable[..., Reading], **thresholds: tuple[str, float, tuple[float, ...]]) -> Reading:
    """`make(**defaults)` carrying one band per threshold: `thresholds` maps each keyword of `make` to (how the
    rule words it, the rule's value, the other values read)."""
    defaults = {key: default for key, (_, default, _) in thresholds.items()}

    def at(key: str) -> Callable[[float], Reading]:
        return lambda value: dataclasses.replace(make(**{**defaults, key: value}), bands=())

    bands = tuple(Band(words, default, tuple(others), at(key)) for key, (words, default, others) in thresholds.items())
    return dataclasses.replace(make(**defaults), bands=bands)


def banded(threshold: str, default: float, others: tuple[float, ...], make: Callable[[float], Reading]) -> Reading:
    """`make(default)` carrying the band of its one threshold (`banded_by` with one keyword)."""
    return banded_by(lambda value: make(value), value=(threshold, default, others))


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
    out = {
        n: pd.read_csv(results / f"{n}.csv")
        for n in sorted(wanted)
        if n not in DERIVED and (results / f"{n}.csv").exists()
    }
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
    if ok[form]:
        return HOLDS
    # one rule for every claim (issue 71): units the instrument leaves undetermined could go either way, so a
    # verdict fails only where it would fail with every one of them passing; else it is not testable here
    best = out.passed + out.undecided
    could = {"existence": best >= 1, "universal": best == out.units, "typical": best > out.units / 2}
    return UNTESTABLE if out.undecided and could[form] else FAILS


# --- measurements ---------------------------------------------------------------------------------------


def count(passed, units, what: str, untestable: str | None = None, undecided: int = 0) -> Outcome:
    """`passed` of `units`, `undecided` of them left undetermined by the instrument (said in the text)."""
    text = f"{int(passed)}/{int(units)} {what}" + (f" ({int(undecided)} undetermined)" if undecided else "")
    return Outcome(text, int(passed), int(units), untestable=untestable, undecided=int(undecided))


def _primary(t: pd.DataFrame) -> pd.DataFrame:
    return t[t.kind == "primary"]


SOLVED = 0.9  # a SkipPair model "learnt the task" at sampled signal accuracy >= 0.9 (banded at 0.8 and 0.99)


def _solved(t: pd.DataFrame, shape: str, floor: float = SOLVED) -> pd.DataFrame:
    """SkipPair models of one shape that learnt the task (sampled signal accuracy >= floor): the mechanism
    claims are about models that solve it."""
    return t[(t["shape"] == shape) & (t.signal_acc >= floor)]


def _mechanism_untestable(rows: pd.DataFrame) -> str | None:
    return None if len(rows) else "no model of this shape learnt the task (signal accuracy >= 0.9)"


def _band(others: str, floor: float = 0.95) -> Callable[[pd.DataFrame], Outcome]:
    def measure(rows: pd.DataFrame) -> Outcome:
        rows = rows[rows.others.astype(str) == others] if "others" in rows else rows
        curve = rows.groupby("w01").s_acc.mean()
        inside = curve[(curve.index >= 0.1 - 1e-9) & (curve.index <= 10 + 1e-9)]
        if not len(inside):
            return Outcome("no w01 in 0.1..10", untestable="no imposed w01 in 0.1..10")
        ok = int((inside >= floor).sum())
        return Outcome(f"{ok}/{len(inside)} imposed w01 in 0.1..10 with mean s_acc >= {floor:g} (min {inside.min():.3f} at "
                       f"w01 {inside.idxmin():.2g})", ok, len(inside))  # fmt: skip

    return measure


def _collapse(others: str, ceiling: float = 0.75) -> Callable[[pd.DataFrame], Outcome]:
    """Imposed w01 at which attention strongly favours '0' or '1' (w01 <= 0.01 or >= 100, attention to '2' set
    to 0): the mean s_acc over the heads is below `ceiling` (the outputs no longer separate the classes)."""

    def measure(rows: pd.DataFrame) -> Outcome:
        rows = rows[rows.others.astype(str) == others] if "others" in rows else rows
        curve = rows.groupby("w01").s_acc.mean()
        extreme = curve[(curve.index <= 0.01 + 1e-12) | (curve.index >= 100 - 1e-9)]
        if not len(extreme):
            return Outcome("no imposed w01 <= 0.01 or >= 100", untestable="no extreme w01 imposed")
        ok = int((extreme < ceiling).sum())
        return Outcome(
            f"{ok}/{len(extreme)} imposed w01 <= 0.01 or >= 100 with mean s_acc < {ceiling:g} (max "
            f"{extreme.max():.3f} at w01 {extreme.idxmax():.2g})",
            ok,
            len(extreme),
        )

    return measure


def _collapse_heads(ceiling: float = 0.75) -> Callable[[pd.DataFrame], Outcome]:
    """Trained heads whose own attention strongly favours '0' or '1' (w01 <= 0.01 or >= 100) with s_acc below
    `ceiling`; not testable where no head has such a w01."""

    def measure(heads: pd.DataFrame) -> Outcome:
        extreme = heads[(heads.w01 <= 0.01) | (heads.w01 >= 100)]
        return count(
            (extreme.s_acc < ceiling).sum(),
            len(extreme),
            f"heads with w01 <= 0.01 or >= 100 have s_acc < {ceiling:g}",
            None if len(extreme) else "no head's attention strongly favours '0' or '1'",
        )

    return measure


def _fisher(rows: pd.DataFrame, y: str) -> tuple[float, float, float, int] | None:
    rows = rows.dropna(subset=["weighted_s_acc", y])
    if len(rows) < 4 or rows.weighted_s_acc.std() == 0 or rows[y].std() == 0:
        return None
    r = float(np.corrcoef(rows.weighted_s_acc, rows[y])[0, 1])
    z, se = np.arctanh(np.clip(r, -0.999999, 0.999999)), 1 / np.sqrt(len(rows) - 3)
    return r, float(np.tanh(z - 1.96 * se)), float(np.tanh(z + 1.96 * se)), len(rows)


def _r(y: str, test: str, short: bool = True, strong: float = STRONG) -> Callable[[pd.DataFrame], Outcome]:
    """test "strong": value 1 when r >= `strong` and the interval is above 0; "value": 1 when the paper's r
    lies in the interval. short=False leaves out the models trained 10..160 steps (grid: kind
    "primary-short"; count01.md's models: group "primary-short")."""

    def measure(rows: pd.DataFrame) -> Outcome:
        if not short:
            rows = rows[(rows.kind if "kind" in rows else rows.group) != "primary-short"]
        f = _fisher(rows, y)
        if f is None:
            return Outcome(f"n = {len(rows)}: no spread", untestable="no spread in the model set")
        r, lo, hi, n = f
        ok = (r >= strong and lo > 0) if test == "strong" else (lo <= PAPER_R <= hi)
        return Outcome(f"r = {r:.2f} ({lo:.2f}..{hi:.2f}), n = {n}", value=float(ok))

    return measure


def _table1(metric: str) -> Callable[[pd.DataFrame], Outcome]:
    def measure(rows: pd.DataFrame) -> Outcome:
        d = float((rows[f"isolated_{metric}"] - rows[f"joint_{metric}"]).mean())
        return Outcome(f"isolated - joint {d:+.3f} (mean over {len(rows)} heads)", value=d)

    return measure


def _syntax(prefix: str, drop_by: float = 0.01) -> Callable[[pd.DataFrame], Outcome]:
    """Models whose accuracy (answer or [EOS]) drops by more than 0.01 when every head's readout is equalised;
    not testable where, with every head zeroed, [EOS] accuracy stays >= 0.99 in every model: the syntax
    then needs no head, so no aggregation of heads can matter to it."""

    def measure(rows: pd.DataFrame) -> Outcome:
        rows = _primary(rows)
        if f"{prefix}_answer_acc" not in rows:
            return Outcome("not measured", untestable="not measured in this grid")
        drop = ((rows.model_answer_acc - rows[f"{prefix}_answer_acc"] > drop_by)
                | (rows.model_eos_acc - rows[f"{prefix}_eos_acc"] > drop_by))  # fmt: skip
        carried = (rows.zeroed_eos_acc < 0.99).any()
        text = (f"{int(drop.sum())}/{len(rows)} models lose accuracy (equalised: answer {rows[f'{prefix}_answer_acc'].mean():.3f}, "
                f"[EOS] {rows[f'{prefix}_eos_acc'].mean():.3f}; every head zeroed: answer {rows.zeroed_answer_acc.mean():.3f}, "
                f"[EOS] {rows.zeroed_eos_acc.mean():.3f})")  # fmt: skip
        return Outcome(
            text,
            int(drop.sum()),
            len(rows),
            untestable=None if carried else "[EOS] needs no head (every head zeroed: [EOS] accuracy >= 0.99)",
        )

    return measure


def _reach(solved: float = 0.99) -> Callable[[pd.DataFrame], Outcome]:
    """Runs that do NOT reach both_acc >= solved ("difficult to reach": most fail); not testable where no run
    produces the answer at all (answer accuracy < 0.05 in every run): the model then cannot represent a
    solution in this setup, so failing to reach one says nothing about gradient descent."""

    def measure(rows: pd.DataFrame) -> Outcome:
        rows = rows[rows.kind == "minimal"]
        missed = int((rows.both_acc < solved).sum())
        dead = bool(len(rows)) and bool((rows.answer_acc < 0.05).all())
        return count(
            missed,
            len(rows),
            f"runs miss both_acc >= {solved:g} (best answer accuracy {rows.answer_acc.max():.3f})",
            "no run produces the answer (answer accuracy < 0.05 in every run): no solution is representable"
            if dead
            else None,
        )

    return measure


def _reliably(solved: float = 0.99) -> Callable[[pd.DataFrame], Outcome]:
    """Primary-size runs (d_model 32, 16 heads) that reach both_acc >= solved."""

    def measure(rows: pd.DataFrame) -> Outcome:
        rows = _primary(rows) if "kind" in rows else rows[(rows.d_model >= 32) & (rows.n_heads >= 16)]
        return count((rows.both_acc >= solved).sum(), len(rows), f"primary-size runs reach both_acc >= {solved:g}")

    return measure


def _two_tasks(drop_by: float = 0.25) -> Callable[[pd.DataFrame], Outcome]:
    """Primary models in which zeroing every head costs both the answer and [EOS] more than `drop_by` of
    accuracy: the heads carry both of the two tasks (the answer, the syntax)."""

    def measure(rows: pd.DataFrame) -> Outcome:
        rows = _primary(rows)
        if "zeroed_eos_acc" not in rows:
            return Outcome("not measured", untestable="not measured in this grid")
        answer = rows.model_answer_acc - rows.zeroed_answer_acc > drop_by
        eos = rows.model_eos_acc - rows.zeroed_eos_acc > drop_by
        return count(
            (answer & eos).sum(),
            len(rows),
            f"models lose > {drop_by:g} of both answer and [EOS] accuracy "
            f"with every head zeroed (answer needs the heads in {int(answer.sum())}, [EOS] in {int(eos.sum())})",
        )

    return measure


FLOOR = ("successful: s_acc >=", 0.95, (0.9, 0.99))  # a successful head, and the band it is read over
BIAS = ("|bias_45| > |signal_45| /", 5, (2, 10))  # "biased", our threshold, and its band


def _heads(t: pd.DataFrame, floor: float | None) -> pd.DataFrame:
    """The primary models' heads (`count01_heads` of the grid, or count01.md's `primary_heads`) with s_acc >=
    floor (None: every head)."""
    return t if floor is None else t[t.s_acc >= floor]


def _successful_share(floor: float) -> Callable[[pd.DataFrame], Outcome]:
    def measure(t: pd.DataFrame) -> Outcome:
        ok = int((t.s_acc >= floor).sum())
        return Outcome(f"{ok}/{len(t)} heads", value=ok / len(t) if len(t) else float("nan"))

    return measure


def _unexploited(gap: float = 0.05, floor: float = 0.95) -> Callable[[pd.DataFrame], Outcome]:
    """Successful heads (s_acc >= floor) that the output layer reads worse than they separate: s_acc - l_acc > gap."""

    def measure(t: pd.DataFrame) -> Outcome:
        heads = _heads(t, floor)
        return count(
            (heads.s_acc - heads.l_acc > gap).sum(), len(heads), f"successful heads with s_acc - l_acc > {gap:g}"
        )

    return measure


def _w01_heads(f: float, floor: float) -> Callable[[pd.DataFrame], Outcome]:
    def measure(t: pd.DataFrame) -> Outcome:
        heads = _heads(t, floor)
        return count(((heads.w01 > 1 / f) & (heads.w01 < f)).sum(), len(heads), "successful heads")

    return measure


def _w02_heads(cut: float, floor: float) -> Callable[[pd.DataFrame], Outcome]:
    def measure(t: pd.DataFrame) -> Outcome:
        heads = _heads(t, floor)
        return count((heads.w02 > cut).sum(), len(heads), "successful heads")

    return measure


def _biased(k: float, floor: float | None) -> Callable[[pd.DataFrame], Outcome]:
    def measure(t: pd.DataFrame) -> Outcome:
        heads = _heads(t, floor)
        return count(
            (heads.bias_45.abs() > heads.signal_45.abs() / k).sum(),
            len(heads),
            "successful heads" if floor is not None else "heads",
        )

    return measure


def _kept(share: float = 0.9) -> Callable[[pd.DataFrame], Outcome]:
    """Primary models that keep the 4/5 order from '=' to the answer in >= `share` of the strings of each answer."""

    def measure(t: pd.DataFrame) -> Outcome:
        return count((_primary(t).kept_45_min >= share).sum(), len(_primary(t)), "models")

    return measure


def _mean_order_shipped(t: pd.DataFrame) -> Outcome:
    """count01.md's shipped model (`logit_means.csv`): for both answers, the order of the mean '4' and '5' logits
    at '=' is the order at the answer."""
    kept = 0
    for answer in ("4", "5"):
        rows = t[t["true answer"].astype(str) == answer].set_index("position")
        at = [rows.loc[p, "mean logit 5"] > rows.loc[p, "mean logit 4"] for p in rows.index]
        kept += len(set(at)) == 1
    return count(
        kept, 2, "answers keep the order of the mean '4' and '5' logits from '=' to the answer (shipped model)"
    )


def _tip(rows: pd.DataFrame) -> Outcome:
    rows = _primary(rows)
    top = int((rows.eq_answer_top.astype(bool) & rows.ans_eos_top.astype(bool)).sum())
    implied = bool(len(rows)) and bool((rows.both_acc >= 0.99).all())
    return count(
        top,
        len(rows),
        "models: answer on top at '=', [EOS] on top at the answer",
        "implied by accuracy: every model has answer and [EOS] accuracy >= 0.99" if implied else None,
    )


def _noise_outcome(quiet_sum: float, q: int, noisy_sum: float, n: int, cut: float = 3) -> Outcome:
    """quiet - noisy mean s_acc; not testable where either group of heads is empty."""
    if not q or not n:
        return Outcome(
            f"{q} heads with w02 > 10, {n} with w02 < {cut:g}",
            untestable=f"no head with {'w02 > 10' if not q else f'w02 < {cut:g}'}: nothing to compare",
        )
    quiet, noisy = quiet_sum / q, noisy_sum / n
    return Outcome(
        f"mean s_acc {quiet:.3f} over {q} heads with w02 > 10 against {noisy:.3f} over {n} with w02 < {cut:g}",
        value=quiet - noisy,
    )


def _noise_heads(cut: float = 3) -> Callable[[pd.DataFrame], Outcome]:
    """Heads that largely ignore '2' (w02 > 10) against heads that give it significant attention (w02 < cut)."""

    def measure(heads: pd.DataFrame) -> Outcome:
        quiet, noisy = heads[heads.w02 > 10], heads[heads.w02 < cut]
        return _noise_outcome(quiet.s_acc.sum(), len(quiet), noisy.s_acc.sum(), len(noisy), cut)

    return measure


def _same_first(orderings: str) -> bool:
    """Do the two heads of a 2-head model put the same signal token first ("2>3>4>1 | 2>1>4>3")?"""
    first, second = orderings.split(" | ")
    return first.split(">")[0] == second.split(">")[0]


def _shared_favourite(t: pd.DataFrame, shape: str, want: bool) -> Outcome:
    rows = t[t["shape"] == shape]
    shared = rows.orderings.map(_same_first) if len(rows) else pd.Series(dtype=bool)
    passed = int(shared.sum()) if want else int((~shared.astype(bool)).sum())
    return count(
        passed,
        len(rows),
        "models whose heads share their first token" if want else "models whose heads put different tokens first",
    )


def _runs(t: pd.DataFrame, n_heads: int, d_head: int | None = None, floor: float | None = SOLVED) -> pd.DataFrame:
    """Runs of one shape (d_head None: every d_head) that learnt the task (signal accuracy >= floor; None: every
    run), from skip_pair.md's runs (`skip_pair/runs.csv`: columns n_heads, d_head) or the robustness grid (column
    shape, "2 heads, d_head 5")."""
    if "shape" in t:
        t = t[t["shape"] == f"{n_heads} head{'s' if n_heads > 1 else ''}, d_head {d_head}"]
    else:
        t = t[t.n_heads == n_heads] if d_head is None else t[(t.n_heads == n_heads) & (t.d_head == d_head)]
    return t if floor is None else t[t.signal_acc >= floor]


def _covered(column: str, floor: float = SOLVED) -> Callable[[pd.DataFrame], Outcome]:
    """(model, pair of distinct signal tokens) of solved 2-head, d_head 5 runs in which the two heads prefer
    different tokens of the pair (`pairs_covered`), and also give them more than 90% of the pair's attention
    (`pairs_covered_fully`)."""

    def measure(t: pd.DataFrame) -> Outcome:
        if column not in t:
            return Outcome("not measured", untestable="not measured in this table")
        rows = _runs(t, 2, 5, floor)
        return count(
            rows[column].sum(),
            6 * len(rows),
            "(model, pair of distinct signal tokens)",
            None if len(rows) else "no model of this shape learnt the task",
        )

    return measure


def _covered_given_reversed(t: pd.DataFrame) -> Outcome:
    """The same over the models whose orderings are exact reverses: implied by the orderings (a reversed pair
    of orderings prefers different tokens of every pair), so it cannot fail."""
    rows = _runs(t, 2, 5)
    rows = rows[rows.relation == "reversed"]
    return count(
        rows.pairs_covered.sum() if "pairs_covered" in rows else 0,
        6 * len(rows),
        "(model, pair)",
        "implied by the orderings: two exactly reversed orderings prefer different tokens of every pair",
    )


def _least_favourite(floor: float = SOLVED, d_head: int = 5) -> Callable[[pd.DataFrame], Outcome]:
    """Heads of solved 2-head runs whose own OV effect, attending to their least favourite token x (an (x, x)
    context), ranks the completion of (x, x) first (`least_favourite_alone`)."""

    def measure(t: pd.DataFrame) -> Outcome:
        if "least_favourite_alone" not in t:
            return Outcome("not measured", untestable="not measured in this table")
        rows = _runs(t, 2, d_head, floor)
        return count(
            rows.least_favourite_alone.sum(),
            2 * len(rows),
            "heads guess the (x, x) answer alone",
            None if len(rows) else "no model of this shape learnt the task",
        )

    return measure


def _orthogonal(ceiling: float = 0.3, floor: float = SOLVED) -> Callable[[pd.DataFrame], Outcome]:
    """Solved runs with d_head >= 4 (room for the 4 signal tokens) whose every head stores the 4 signal tokens'
    value vectors with pairwise |cos| < ceiling (`value_cos_max`)."""

    def measure(t: pd.DataFrame) -> Outcome:
        if "value_cos_max" not in t:
            return Outcome("not measured", untestable="not measured in this table")
        rows = t[(t.d_head >= 4) & (t.signal_acc >= floor)]
        low = t[t.d_head <= 2]
        return count(
            (rows.value_cos_max < ceiling).sum(),
            len(rows),
            f"solved runs with d_head >= 4 store the signal "
            f"tokens with every |cos| < {ceiling:g} (median max |cos| {rows.value_cos_max.median():.2f}; at "
            f"d_head <= 2 {low.value_cos_max.median():.2f})",
        )

    return measure


def _smallest_d_head(t: pd.DataFrame, need: str) -> dict[int, float]:
    """{n_heads: the smallest d_head at which `need` ("every", "most", "some") of its seeds solve the task
    exactly (signal_all)}, nan where no d_head does."""
    rule = {"every": lambda s: s.all(), "most": lambda s: s.mean() > 0.5, "some": lambda s: s.any()}[need]
    ok = t.groupby(["n_heads", "d_head"]).signal_all.apply(lambda s: rule(s.astype(bool)))
    return {
        int(h): float(min((d for (hh, d), v in ok.items() if hh == h and v), default=float("nan")))
        for h in sorted(t.n_heads.unique())
    }


def _tradeoff(need: str = "every") -> Callable[[pd.DataFrame], Outcome]:
    """Value 1 when the smallest solving d_head never rises with n_heads and falls from 1 head to the most
    heads tried: more heads need fewer dimensions per head."""

    def measure(t: pd.DataFrame) -> Outcome:
        smallest = _smallest_d_head(t, need)
        values = list(smallest.values())
        if any(v != v for v in values) or len(values) < 2:
            return Outcome(f"smallest d_head: {smallest}", untestable="some head count never solves the task")
        ok = all(b <= a for a, b in zip(values, values[1:])) and values[-1] < values[0]
        text = ", ".join(f"{h} heads: d_head {int(d)}" for h, d in smallest.items())
        return Outcome(f"smallest d_head at which {need} seed solves: {text}", value=float(ok))

    return measure


def _partly_equal(t: pd.DataFrame) -> Outcome:
    """Ordering-level split attention: 2-head runs with d_head >= 3 whose orderings are 'partly equal'
    (Kendall tau >= 0: the heads agree on more pairs than they reverse)."""
    rows = t[(t.n_heads == 2) & (t.d_head >= 3)]
    low = t[(t.n_heads == 2) & (t.d_head < 3)]
    return count(
        (rows.relation != "partly equal").sum(),
        len(rows),
        "2-head runs with d_head >= 3 not partly equal "
        f"(d_head < 3: {int((low.relation == 'partly equal').sum())}/{len(low)} partly equal)",
    )


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
                return count(
                    0,
                    0,
                    "models",
                    untestable=f"the reading family leaves all {n} models undetermined "
                    "(the readings disagree; cooperation.md section 1 names what flips each)",
                )
        ok = {
            "R1": t.mechanism == "redundant",
            "R2": t.redundant_share > 0.5,
            "R3": (t.redundant == t.active_pairs) & (t.active_pairs > 0),
        }[key]
        return count(ok.sum(), len(t), "models")

    return measure


def _same_computation(t: pd.DataFrame) -> Outcome:
    """cooperation.md's Count01 models whose heads compute the same function: `hc.cooperation`'s
    same-computation axis (baseline-free: the pushes of the heads that push correlate and lie on one
    direction; `count01_answer.csv`): the one-layer models (the shipped model and the seeds), the paper's
    population; a model the tolerance band leaves undetermined counts neither way."""
    t = t[t.layers == 1] if "layers" in t else t
    return count((t.same_word == "same computation (pseudo-ensemble)").sum(), len(t), "one-layer models",
                 undecided=(t.same_word == "undetermined").sum())  # fmt: skip


def _same_function(t: pd.DataFrame) -> Outcome:
    """cooperation.md's Count01 models whose heads compute the same function on the counts by counterfactual
    edits (issues 59, 71: `hc.cooperation`'s function axis on the task's semantic features, the noise token
    apart; `count01_answer.csv`), over the paper's population, the one-layer models (the two-layer ones go past
    it and are reported beside, not counted); "undetermined" (the readings disagree) and "not measurable" count
    neither way."""
    if "function_word" not in t:
        return count(0, 0, "models", untestable="count01_answer.csv predates the counterfactual axis (issue 59)")
    one = t[t.layers == 1] if "layers" in t else t
    two = t[t.layers == 2] if "layers" in t else t.iloc[:0]
    same = one.function_word.str.startswith("same function")
    out = count(same.sum(), len(one), "one-layer models",
                undecided=one.function_word.isin(["undetermined", "not measurable"]).sum())  # fmt: skip
    if len(two):
        beside = ", ".join(f"{n} {w}" for w, n in two.function_word.value_counts().items())
        out = dataclasses.replace(out, text=out.text + f"; past the paper, the two-layer models: {beside}")
    return out


def _superposed(which: str, how: str) -> Callable[[pd.DataFrame], Outcome]:
    """hc.cooperation's pair verdict is "superposition": for the shipped d_head 5 model (its row is the default
    call the page's answer reads: the word, and the favoured word's share of the votes), or per d_head 5 seed."""

    def measure(t: pd.DataFrame) -> Outcome:
        t = t[(t.d_head == 5) & (t.how == how)]
        t = t[t.seed.isna()] if which == "shipped" else t[t.seed.notna()]
        passed = int((t.mechanism == "superposition").sum())
        if which == "shipped" and len(t) == 1 and "favoured" in t:
            row = t.iloc[0]
            word = row.mechanism if row.mechanism != "undetermined" else f"undetermined, {row.favoured} favoured"
            alone = "" if how == "family" else f", {how} ablation alone"  # another reading: not the answer's vote
            text = f"shipped d_head 5 model{alone}: {word} ({row.favoured_share:.0%} of votes; a word needs 90%)"
            # an undetermined word is the instrument saying it cannot decide: the page's answer says so too
            undecided = f"the reading leaves the word undetermined ({row.favoured} in {row.favoured_share:.0%} " \
                        "of votes; a word needs 90%)"  # fmt: skip
            return Outcome(text, passed, 1, untestable=undecided if row.mechanism == "undetermined" else None)
        what = "shipped d_head 5 model" if which == "shipped" else "d_head 5 seeds"
        return Outcome(
            f"{passed}/{len(t)} {what} (verdicts: "
            f"{', '.join(f'{n} {m}' for m, n in t.mechanism.value_counts().items())})",
            passed,
            len(t),
        )

    return measure


def _defining(t: pd.DataFrame) -> Outcome:
    """The SkipPair post's defining property on the shipped d_head 5 model (`skip_pair_answer.csv`): both heads'
    writes conditional on the token they do not attend to on a majority of the inputs that can show it; not
    testable where no input can show it for a head."""
    t = t[t.d_head == 5]
    if len(t) != 1:
        return count(0, 0, "models", untestable="skip_pair_answer.csv has no row for the shipped d_head 5 model")
    row = t.iloc[0]
    text = (f"shipped d_head 5 model: each head's writes depend on a token it does not attend to on "
            f"{row.conditional_a:.0%} / {row.conditional_b:.0%} of the inputs that can show it ({row.shown_a:.0%} / "
            f"{row.shown_b:.0%} of the inputs where the pair matters)")  # fmt: skip
    if min(row.shown_a, row.shown_b) <= 0:
        return Outcome(text, 0, 1, untestable="no input can show it for one of the heads")
    return Outcome(text, int(min(row.conditional_a, row.conditional_b) >= 0.5), 1)


# --- the registry ---------------------------------------------------------------------------------------

SUMMARY = "count01-paper-summary.md"
POST = "ov-coherent-skip-pair-post.md"
ABSTRACT = "count01-paper-abstract.md"
D5, D1, ONE = "2 heads, d_head 5", "2 heads, d_head 1", "1 head, d_head 4"

REGISTRY: tuple[ClaimEntry, ...] = (
    ClaimEntry("half", C["half"], SUMMARY, "comparison", tuple(
        banded_by(lambda floor, width, name=name, table=table, rule=rule, favoured=favoured: Reading(
            name, f"{rule}: the share of heads with s_acc >= {floor:g} is in {0.5 - width:g}..{0.5 + width:g}",
            _successful_share(floor), table=table, holds=lambda v: 0.5 - width <= v <= 0.5 + width, favoured=favoured),
            floor=FLOOR, width=("about half: within 0.5 +-", 0.15, (0.1, 0.25)))
        for name, table, rule, favoured in (
            ("share of successful heads", "heads", "every head of the grid's primary models", "the quote gives the share"),
            ("share of successful heads, count01.md's models", "count01/primary_heads", "count01.md's primary models", ""))),
        "count01"),
    ClaimEntry("individually", "Heads individually learn to solve the main task", ABSTRACT, "typical", tuple(
        banded_by(lambda floor, name=name, column=column, table=table, rule=rule, favoured=favoured: Reading(
            name, f"heads of {rule} that solve the count alone: {column} >= {floor:g}",
            lambda t, column=column, floor=floor: count(int((t[column] >= floor).sum()), len(t), "heads"),
            table=table, favoured=favoured),
            floor=FLOOR)
        for name, column, table, rule, favoured in (
            ("most heads separate alone", "s_acc", "heads", "the grid's primary models",
             "\"individually learn to solve\": the paper's own per-head measure, separation accuracy"),
            ("most heads separate alone, count01.md's models", "s_acc", "count01/primary_heads",
             "count01.md's primary models", ""),
            ("most heads answer alone", "l_acc", "heads", "the grid's primary models, read by the output layer "
             "(l_acc, with the constant terms every pass has)", ""))),
        "count01", note="The abstract's clause, judged on its own (the whole sentence, with its aggregation clause, "
        "is judged by the aggregation claim's row); typical: more than half of the heads."),
    ClaimEntry("exploit", C["exploit"], SUMMARY, "existence", tuple(
        banded_by(lambda floor, gap, name=name, table=table, rule=rule, favoured=favoured: Reading(
            name, f"successful heads (s_acc >= {floor:g}) of {rule} that the output layer reads alone worse than they "
            f"separate (s_acc - l_acc > {gap:g}, l_acc with the constant terms every pass has)", _unexploited(gap, floor),
            table=table, favoured=favoured),
            floor=FLOOR, gap=("s_acc - l_acc >", 0.05, (0.025, 0.1)))
        for name, table, rule, favoured in (
            ("some successful head under-read", "heads", "the grid's primary models",
             "\"doesn't fully exploit these successful heads\": at least one successful head is read below what it "
             "separates"),
            ("some successful head under-read, count01.md's models", "count01/primary_heads", "count01.md's primary "
             "models", ""),
            ("most successful heads under-read", "heads", "the grid's primary models (read as typical, for contrast)", ""))),
        "count01", note="The clause is the summary's, not the paper's (the summary puts no quotation marks around "
        "it); \"individually\" is read as each head's readout alone (l_acc)."),
    ClaimEntry("w01", C["w01"], SUMMARY, "typical", tuple(
        banded_by(lambda floor, f, name=name, table=table, rule=rule, favoured=favoured: Reading(
            name, f"successful heads (s_acc >= {floor:g}) of {rule} with {1 / f:g} < w01 < {f:g}", _w01_heads(f, floor),
            table=table, favoured=favoured),
            f=("w01 ~ 1: 1/f < w01 < f, f =", 10, (2, 100)), floor=FLOOR)
        for name, table, rule, favoured in (
            ("most successful heads", "heads", "the grid's primary models",
             "a generic plural (\"Successful heads have\") states what is typical"),
            ("most successful heads, count01.md's models", "count01/primary_heads", "count01.md's primary models", ""))),
        "count01"),
    ClaimEntry("w02", C["w02"], SUMMARY, "typical", tuple(
        banded_by(lambda floor, cut, name=name, table=table, rule=rule, favoured=favoured: Reading(
            name, f"successful heads (s_acc >= {floor:g}) of {rule} with w02 > {cut:g}", _w02_heads(cut, floor),
            table=table, favoured=favoured),
            cut=("w02 >", 10, (3, 30)), floor=FLOOR)
        for name, table, rule, favoured in (
            ("most successful heads", "heads", "the grid's primary models", "a generic plural states what is typical"),
            ("most successful heads, count01.md's models", "count01/primary_heads", "count01.md's primary models", ""))),
        "count01"),
    ClaimEntry("noise", C["noise"], SUMMARY, "comparison", tuple(
        banded_by(lambda noisy, margin, name=name, table=table, rule=rule, favoured=favoured: Reading(
            name, f"mean s_acc of {rule}' heads with w02 > 10 (they largely ignore '2') minus that of heads with w02 < "
            f"{noisy:g} ('2' gets at least 1/{noisy:g} of the attention of '0' and '1': \"significant attention\", our "
            f"threshold) is > {margin:g}", _noise_heads(noisy), table=table, holds=lambda v: v > margin, favoured=favoured),
            noisy=("significant attention: w02 <", 3, (2, 5)), margin=("difference >", 0.01, (0.0, 0.05)))
        for name, table, rule, favoured in (
            ("w02 > 10 heads separate better", "heads", "the grid's primary models",
             "\"degrades separability\": heads that attend to '2' separate worse than heads that ignore it"),
            ("w02 > 10 heads separate better, count01.md's models", "count01/primary_heads", "count01.md's primary models", ""))),
        "count01"),
    ClaimEntry("collapse", C["collapse"], SUMMARY, "universal", (
        banded("s_acc <", 0.75, (0.65, 0.85), lambda c: Reading(
            "imposed extreme w01", f"at every imposed w01 <= 0.01 or >= 100 (attention to '2' set to 0, [BOS] and '=' "
            f"keep the model's) the mean s_acc over the primary models' heads is below {c:g}: the outputs no longer "
            "separate the classes", _collapse("model", c), table="band",
            favoured="the source's \"If attention strongly favors\" is an intervention on attention, as in its Figure 8")),
        banded("s_acc <", 0.75, (0.65, 0.85), lambda c: Reading(
            "trained heads with extreme w01", f"count01.md's primary heads whose own w01 is <= 0.01 or >= 100 have "
            f"s_acc < {c:g}", _collapse_heads(c), table="count01/primary_heads")),
    ), "count01", note="\"collapse to a point\" is read through its consequence the summary names (no separation); the "
       "spread of the outputs themselves is not measured."),
    ClaimEntry("band", C["band"], SUMMARY, "universal", (
        banded("s_acc >=", 0.95, (0.9, 0.99), lambda f: Reading(
            "[BOS] and '=' keep their attention", "at every imposed w01 from 0.1 to 10 the mean s_acc over the "
            f"primary models' heads is >= {f:g}; attention to '2' set to 0, [BOS] and '=' keep the model's",
            _band("model", f), table="band", favoured="the source sets only the attention to '2' to zero")),
        banded("s_acc >=", 0.95, (0.9, 0.99), lambda f: Reading(
            "[BOS] and '=' set to 0 too", "the same, with the attention to [BOS] and '=' also set to 0",
            _band("0.0", f), table="band")),
    ), "count01"),
    ClaimEntry("r", C["r"], SUMMARY, "correlation", (
        banded("strong: r >=", STRONG, (0.3, 0.7), lambda k: Reading(
            "strong, y = answer accuracy", f"Pearson r between the readout-weighted mean head s_acc and the "
            f"model's answer accuracy is >= {k:g} with its Fisher 95% interval above 0",
            _r("answer_acc", "strong", strong=k), table="ensemble", holds=lambda v: v == 1.0, per_length=False,
            favoured="\"Model accuracy strongly correlates\" (the summary's key outcome)")),
        banded("strong: r >=", STRONG, (0.3, 0.7), lambda k: Reading(
            "strong, y = answer accuracy, without the short runs", "the same without the primary models "
            "trained 10..160 steps (their spread carries much of r)", _r("answer_acc", "strong", short=False, strong=k),
            table="ensemble", holds=lambda v: v == 1.0, per_length=False)),
        banded("strong: r >=", STRONG, (0.3, 0.7), lambda k: Reading(
            "strong, y = the model's own separation", "the same with y = the share of strings with "
            "logit(5) > logit(4) at '=' (\"The final model's separation accuracy\")", _r("answer_45_acc", "strong", strong=k),
            table="ensemble", holds=lambda v: v == 1.0, per_length=False)),
        Reading("the value 0.72, y = answer accuracy", "the paper's 0.72 lies in the Fisher 95% interval",
                _r("answer_acc", "value"), table="ensemble", holds=lambda v: v == 1.0, per_length=False,
                fixed="the paper's own number against a 95% interval"),
        Reading("the value 0.72, y = answer accuracy, without the short runs", "the same without the primary "
                "models trained 10..160 steps", _r("answer_acc", "value", short=False), table="ensemble",
                holds=lambda v: v == 1.0, per_length=False, fixed="the paper's own number against a 95% interval"),
        banded("strong: r >=", STRONG, (0.3, 0.7), lambda k: Reading(
            "strong, count01.md's models", "the first reading over count01.md's model set (a sweep over sizes "
            "and the primary models, `count01/ensemble_models.csv`)", _r("answer_acc", "strong", strong=k),
            table="count01/ensemble_models", holds=lambda v: v == 1.0)),
        Reading("the value 0.72, count01.md's models", "the paper's 0.72 lies in the Fisher 95% interval over "
                "count01.md's model set", _r("answer_acc", "value"), table="count01/ensemble_models", holds=lambda v: v == 1.0,
                fixed="the paper's own number against a 95% interval"),
        Reading("the value 0.72, count01.md's primary-size models", "the same over its primary-size models only "
                "(the 10..160-step runs included: 20 runs, 4 of them at 10 steps with answer accuracy 0 to 0.06)",
                lambda t: _r("answer_acc", "value")(t[t.group != "sweep"]),
                table="count01/ensemble_models", holds=lambda v: v == 1.0, fixed="the paper's own number against a 95% interval"),
        Reading("the value 0.72, count01.md's primary-size models, without the 10-step runs", "the same without "
                "the 4 runs of 10 steps (answer accuracy 0 to 0.06), on which the reading above rests",
                lambda t: _r("answer_acc", "value")(t[(t.group != "sweep") & (t.steps > 10)]),
                table="count01/ensemble_models", holds=lambda v: v == 1.0, fixed="the paper's own number against a 95% interval"),
        Reading("the value 0.72, count01.md's models, without the short runs", "count01.md's model set without "
                "the 10..160-step runs (the sweep over sizes and the 8 primary models)",
                _r("answer_acc", "value", short=False), table="count01/ensemble_models", holds=lambda v: v == 1.0,
                fixed="the paper's own number against a 95% interval"),
    ), "count01"),
    ClaimEntry("joint", C["joint"], SUMMARY, "comparison", tuple(
        banded("isolated - joint >", 0.005, (0.0, 0.02), lambda d, m=m: Reading(
            f"by {m}", f"isolated - joint {m}, mean over the heads of each setup's Table 1 models, > {d:g}",
            _table1(m), table="table1", holds=lambda v: v > d))
        for m in ("s_acc", "l_acc_head", "l_acc")), "count01",
        note="No source says which metric Table 1 reports (the summary names only \"Heads trained jointly perform "
        "slightly worse\"), so no reading is favoured: the three metrics are shown side by side."),
    ClaimEntry("bias", C["bias"], SUMMARY, "typical", (
        banded_by(lambda floor, k: Reading(
            "successful heads", f"successful heads (s_acc >= {floor:g}) of the grid's primary models with |bias_45| > "
            f"|signal_45| / {k:g}", _biased(k, floor), table="heads",
            favoured="a failed head has signal about 0, so any bias passes the test: only successful heads can fail it"),
            k=BIAS, floor=FLOOR),
        banded_by(lambda k: Reading(
            "every head", f"every head of the grid's primary models with |bias_45| > |signal_45| / {k:g}",
            _biased(k, None), table="heads"), k=BIAS),
        banded_by(lambda floor, k: Reading(
            "successful heads, count01.md's models", f"successful heads (s_acc >= {floor:g}) of count01.md's primary "
            f"models with |bias_45| > |signal_45| / {k:g}", _biased(k, floor), table="count01/primary_heads"),
            k=BIAS, floor=FLOOR),
    ), "count01"),
    ClaimEntry("tip", C["tip"], SUMMARY, "universal", (
        Reading("the balance tips toward [EOS]", "every primary model, for both answers, has as its most frequent "
                "ordering of '4', '5', [EOS] one led by the answer at '=' and one led by [EOS] at the answer", _tip),
        Reading("[EOS] climbs from second to first", "every primary model, for both answers, has as its most frequent "
                "ordering at '=' the answer, then [EOS] (so from '=' to the answer only [EOS] and the answer swap: the "
                "ordering otherwise fixed); unlike the reading above, accuracy does not imply it",
                lambda t: count(_primary(t).eq_eos_second.astype(bool).sum(), len(_primary(t)), "models")
                if "eq_eos_second" in t else Outcome("not measured", untestable="not measured in this grid")),
        banded("share of strings >=", 0.9, (0.8, 0.95), lambda k: Reading(
            "the ordering about fixed, per string", "every primary model keeps the 4/5 order from '=' to the "
            f"answer in >= {k:.0%} of the strings of each answer", _kept(k),
            favoured="\"the ordering of the logits\" of a model is read string by string")),
        Reading("the ordering about fixed, mean logits", "every primary model keeps the order of the mean '4' and "
                "'5' logits from '=' to the answer, for both answers",
                lambda t: count(_primary(t).mean_order_kept.astype(bool).sum(), len(_primary(t)), "models")
                if "mean_order_kept" in t else Outcome("not measured", untestable="not measured in this grid")),
        Reading("the ordering about fixed, mean logits, count01.md's shipped model", "the same on count01.md's "
                "shipped model (`count01/logit_means.csv`)", _mean_order_shipped, table="count01/logit_means"),
    ), "count01"),
    ClaimEntry("reliably", C["reliably"], SUMMARY, "universal", (
        banded("both_acc >=", 0.99, (0.95, 0.999), lambda k: Reading(
            "every primary run", f"every primary-size run (d_model 32, 16 heads) reaches both_acc >= {k:g}",
            _reliably(k), favoured="\"train reliably\": every run trains, not most")),
        banded("both_acc >=", 0.99, (0.95, 0.999), lambda k: Reading(
            "every run of count01.md's sweep at the primary size", f"the runs of count01.md's sweep with d_model 32 "
            f"and 16 heads reach both_acc >= {k:g}", _reliably(k), table="count01/sweep_runs")),
    ), "count01"),
    ClaimEntry("minimal", C["minimal"], SUMMARY, "existence", (
        Reading("hand-written weights", "count01.md's hand-written d=1, d'=1, one-head model reaches both_acc >= 0.99 on "
                "every evaluation (two samples and every string of length 1..7; default setup only)",
                lambda t: count(int((t.both_acc >= 0.99).all()), 1, "hand-written model right on every evaluation "
                                f"(min both_acc {t.both_acc.min():.3f})"),
                table="count01/minimal_handwritten", favoured="\"exists\": one model that solves the task shows it",
                fixed="the hand-written model is right on every string (both_acc 1.000): no threshold can flip it"),
        banded("both_acc >=", 0.99, (0.95, 0.999), lambda k: Reading(
            "a trained run", f"d=1, d'=1, one-head runs that reach both_acc >= {k:g}",
            lambda t: count((t[t.kind == "minimal"].both_acc >= k).sum(), (t.kind == "minimal").sum(), f"runs reach both_acc >= {k:g}"))),
    ), "count01"),
    ClaimEntry("reach", C["reach"], SUMMARY, "typical", (
        banded("reached: both_acc >=", 0.99, (0.95, 0.999), lambda k: Reading(
            "most runs miss", f"d=1, d'=1, one-head runs that do not reach both_acc >= {k:g}", _reach(k),
            favoured="\"difficult to reach\": most runs from random initialisation miss it")),
    ), "count01"),
    ClaimEntry("aggregate", C["aggregate"], "count01-paper-abstract.md", "typical", (
        banded("accuracy drop >", 0.01, (0.005, 0.05), lambda k: Reading(
            "whole readout equalised", f"primary models that lose > {k:g} answer or [EOS] accuracy when each "
            "head's z is rescaled so that its whole readout (the '4', '5' and [EOS] logits) has the mean norm",
            _syntax("uniform_whole", k), favoured="the output layer aggregates each head's whole output, [EOS] included")),
        banded("accuracy drop >", 0.01, (0.005, 0.05), lambda k: Reading(
            "5 - 4 readout equalised", "the same with only each head's logit(5) - logit(4) readout equalised",
            _syntax("uniform_45", k))),
    ), "count01", note="The source's architecture is \"Head outputs are concatenated and projected to logits\": the "
       "heads-only readout setup. Under our default readout the unembedding also reads the embedding, so [EOS] can "
       "come without any head; each cell shows answer and [EOS] accuracy with every head zeroed, so a reader sees "
       "what the heads carry."),
    ClaimEntry("two_tasks", C["two_tasks"], SUMMARY, "typical", (
        banded("accuracy drop >", 0.25, (0.1, 0.5), lambda k: Reading(
            "the heads carry both tasks", f"primary models in which zeroing every head costs more than {k:g} of "
            "answer accuracy and more than that of [EOS] accuracy: the heads (the ensemble) carry both the counting "
            "and the syntax", _two_tasks(k), favoured="\"the model is working as a proper ensemble, solving two "
            "separate tasks\": the heads solve both")),
    ), "count01", note="The sentence is the paper's (section 6.1, quoted by the summary). Whether the heads are an "
       "ensemble on the counting is the abstract's pseudo-ensemble row (cooperation.md); this row reads the \"two "
       "separate tasks\": the answer and [EOS]."),
    ClaimEntry("finding", FINDING, "count01-paper-abstract.md", "typical", (Reading(
        "R0, same function by edits", "models whose heads compute the same function on the counts: their responses "
        "to the edits that move the count of 1s or of 0s (substitutions, and insertions and deletions where the "
        "lengths vary; the fitted part of the noise token '2' taken out; each head's total push where later layers "
        "read it, else its direct push) are proportional input by input, |cos| >= 0.9 pairwise with 90% on one "
        "direction (hc.cooperation's function axis), over cooperation.md's one-layer Count01 models (the paper's "
        "population; the two-layer ones are shown beside); an undetermined model counts neither way",
        _same_function, table="cooperation/count01_answer",
        favoured="the abstract scopes the claim \"on the semantics of the counting task\" and asks whether the heads "
        "are \"all solving the same subtask\": the same function on the counts, and a function is what changes "
        "under an edit",
        fixed="hc.cooperation's tolerance 0.1 (|cos| >= 0.9); the word bands it at 0.05 and 0.2 and needs every "
        "band and measure to agree"), Reading(
        "R0, same computation on the inputs", "models whose heads compute the same function: the per-input pushes of the heads "
        "that push the answer correlate pairwise at r >= 0.9 and 90% of their variance lies on one direction "
        "(hc.cooperation's same-computation axis, no ablation), over cooperation.md's Count01 models",
        _same_computation, table="cooperation/count01_answer",
        favoured="",
        fixed="hc.cooperation's tolerance 0.1 (r >= 0.9); the word itself bands it at 0.05 and 0.2"),) + tuple(
        Reading(f"{key}, {how}" + ("" if how == "family" else " ablation"), rule + "; hc.cooperation on accuracy, "
                + ("the default reading family (a word where 90% of zero, mean, resample and aligned-mean readings, "
                   "reference draws and threshold bands agree)" if how == "family" else f"{how} ablation")
                + ", over cooperation.md's Count01 models", _ensemble(key, how), table="cooperation/count01_models",
                favoured="",
                fixed="the reading family spans hc.cooperation's thresholds at 0.5x and 2x inside the word itself"
                if how == "family" else "hc.cooperation's default thresholds; the family reading bands them")
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
        banded("learnt: signal accuracy >=", SOLVED, (0.8, 0.99), lambda f: Reading(
            "most solved seeds", f"2-head, d_head 5 seeds that learnt the task (signal accuracy >= {f:g}) in which both "
            "heads split no pair of signal tokens (the less-attended one gets at most 10% of the two's attention)",
            lambda t: count((_solved(t, D5, f).strict_heads == 2).sum(), len(_solved(t, D5, f)), "seeds",
                            _mechanism_untestable(_solved(t, D5, f))),
            favoured="the post describes its typical 2-head model")),
    ), "skip_pair"),
    ClaimEntry("reversed", S["reversed"], POST, "typical", (
        banded("learnt: signal accuracy >=", SOLVED, (0.8, 0.99), lambda f: Reading(
            "most solved seeds", f"2-head, d_head 5 seeds that learnt the task (signal accuracy >= {f:g}) whose two "
            "orderings are exact reverses",
            lambda t: count((_solved(t, D5, f).relation == "reversed").sum(), len(_solved(t, D5, f)), "seeds",
                            _mechanism_untestable(_solved(t, D5, f))),
            favoured="\"generally reversed\"")),
    ), "skip_pair"),
    ClaimEntry("split", S["split"], POST, "universal", (
        Reading("never at d_head 5", "2-head, d_head 5 models with no pair of signal tokens split by both heads at "
                "any of 12 training checkpoints where the model has learnt the task",
                lambda t: count((t[t["shape"] == D5].split_while_learnt == 0).sum(), (t["shape"] == D5).sum(), "models unsplit"),
                fixed="a split is > 10% of the pair's attention on the less-attended token (skip_pair.md section 5); the grid stores counts at that threshold only"),
        Reading("seen at d_head 1 (existence)", "2-head, d_head 1 models split while learnt (the other half of the sentence)",
                lambda t: count((t[t["shape"] == D1].split_while_learnt > 0).sum(), (t["shape"] == D1).sum(),
                                "d_head 1 models split while learnt"), fixed="a split is > 10% of the pair's attention on the less-attended token (skip_pair.md section 5); the grid stores counts at that threshold only"),
        Reading("never at d_head 5, whole orderings", "2-head, d_head 5 models whose two heads' final preference "
                "orderings put different signal tokens first (a shared first token: both heads attend to it whenever "
                "it is in the context)", lambda t: _shared_favourite(t, D5, want=False)),
        Reading("seen at d_head 1, whole orderings (existence)", "2-head, d_head 1 models whose heads' final orderings "
                "put the same signal token first", lambda t: _shared_favourite(t, D1, want=True)),
        Reading("never at d_head >= 3, ordering level", "2-head runs of skip_pair.md with d_head >= 3 whose two "
                "orderings are not *partly equal* (Kendall tau >= 0 without being equal: the heads agree on more pairs "
                "of signal tokens than they reverse, so they attend to the same token in most contexts, \"to varying "
                "degree\")", _partly_equal, table="skip_pair/runs",
                favoured="the post's scheme is one \"in which the heads would attend to the same tokens to varying "
                "degree\", a relation of the two heads' orderings, and \"we only saw split attention for d_head < "
                "3\" excludes d_head >= 3"),
        Reading("seen at d_head < 3, ordering level (existence)", "2-head runs of skip_pair.md with d_head < 3 whose "
                "orderings are *partly equal*",
                lambda t: (lambda r: count((r.relation == "partly equal").sum(), len(r), "2-head runs with d_head < 3 "
                                           "partly equal"))(t[(t.n_heads == 2) & (t.d_head < 3)]),
                table="skip_pair/runs"),
    ), "skip_pair", note="The ordering-level readings fit the post's description (\"the heads would attend to the same "
       "tokens to varying degree\"): they read the two orderings as a whole, where the readings above count split "
       "pairs of tokens."),
    ClaimEntry("conditional", S["conditional"], POST, "typical", (
        banded("learnt: signal accuracy >=", SOLVED, (0.8, 0.99), lambda f: Reading(
            "most (head, token) rows", f"rows of solved (signal accuracy >= {f:g}) 2-head, d_head 5 models whose OV "
            "effect puts exactly the completions consistent with the ordering on top",
            lambda t: count(_solved(t, D5, f).specific_rows.sum(), _solved(t, D5, f).specific_total.sum(), "rows",
                            _mechanism_untestable(_solved(t, D5, f))),
            favoured="a description of the typical head")),
    ), "skip_pair"),
    ClaimEntry("only_correct", S["only_correct"], POST, "universal", (
        banded("learnt: signal accuracy >=", SOLVED, (0.8, 0.99), lambda f: Reading(
            "every qualifying pair type", f"pair types of solved (signal accuracy >= {f:g}) 2-head, d_head 5 models "
            "where both heads push at least two completions above zero: the correct completion is the only one both "
            "push above zero",
            lambda t: count(_solved(t, D5, f).only_correct.sum(), _solved(t, D5, f).qualifying.sum(), "pair types",
                            _mechanism_untestable(_solved(t, D5, f))),
            favoured="\"In contexts where both heads write to multiple outputs, they will only constructively interfere\": a universal statement")),
        banded("learnt: signal accuracy >=", SOLVED, (0.8, 0.99), lambda f: Reading(
            "most qualifying pair types", "the same, read as typical (shown for contrast)",
            lambda t: count(_solved(t, D5, f).only_correct.sum(), _solved(t, D5, f).qualifying.sum(), "pair types",
                            _mechanism_untestable(_solved(t, D5, f))))),
        *(Reading(f"every context, writes to: {w.split(',')[0]}", "contexts of cooperation.md's d_head 5 seeds where "
                  f"both heads write to several outputs (reading *{w}* of *writes to*): the answer is the only output "
                  "both write to", _contexts(f"only_correct | {w}", f"several | {w}"), table="cooperation/skip_pair_contexts",
                  fixed="the four *writes to* readings side by side are its band (no floor, a tenth of the largest, "
                  "centered, half the answer's)")
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
        banded("learnt: signal accuracy >=", SOLVED, (0.8, 0.99), lambda f: Reading(
            "every pair type, every seed", f"(model, pair type) of skip_pair.md's solved (signal accuracy >= {f:g}) "
            "2-head, d_head 5 runs (all its seeds, not the grid's few: one counterexample fails a universal claim) "
            "where both heads push the correct completion above their mean over the 10 completions",
            lambda t: count(_runs(t, 2, 5, f).correct_up_both.sum(), 10 * len(_runs(t, 2, 5, f)), "(model, pair type)",
                            None if len(_runs(t, 2, 5, f)) else "no model of this shape learnt the task"),
            table="skip_pair/runs", favoured="\"for any given pair of inputs\": universal, over every model trained")),
        banded("learnt: signal accuracy >=", SOLVED, (0.8, 0.99), lambda f: Reading(
            "every pair type", f"(model, pair type) of solved (signal accuracy >= {f:g}) 2-head, d_head 5 models of "
            "the robustness grid where both heads push the correct completion above their mean over the 10 completions",
            lambda t: count(_solved(t, D5, f).correct_up_both.sum(), 10 * len(_solved(t, D5, f)), "(model, pair type)",
                            _mechanism_untestable(_solved(t, D5, f))))),
        Reading("every context", "signal contexts (every input a pair type; `Task.mechanism_inputs`) of "
                "cooperation.md's d_head 5 seeds where both heads' centered DLA on the answer is > 0",
                _contexts("answer_up_both", "contexts"), table="cooperation/skip_pair_contexts",
                fixed="> 0 is the sign itself"),
    ), "skip_pair"),
    ClaimEntry("fully_attended", S["fully_attended"], POST, "universal", (
        banded("learnt: signal accuracy >=", SOLVED, (0.8, 0.99), lambda f: Reading(
            "every pair, every solved model", f"(model, pair of distinct signal tokens) of skip_pair.md's solved "
            f"(signal accuracy >= {f:g}) 2-head, d_head 5 runs in which the two heads prefer different tokens of the pair",
            _covered("pairs_covered", f), table="skip_pair/runs",
            favoured="\"for any given context\": universal over the contexts of the models the post describes")),
        banded("learnt: signal accuracy >=", SOLVED, (0.8, 0.99), lambda f: Reading(
            "every pair fully, every solved model", "the same, each head also giving its preferred token more than "
            "90% of the pair's attention (\"fully attended\")", _covered("pairs_covered_fully", f), table="skip_pair/runs")),
        Reading("given reversed orderings", "the same over the runs whose orderings are exact reverses",
                _covered_given_reversed, table="skip_pair/runs"),
        banded("learnt: signal accuracy >=", SOLVED, (0.8, 0.99), lambda f: Reading(
            "every pair, every solved model, across setups", "the first reading on the robustness grid's 2-head, "
            "d_head 5 models of every setup variant and training length", _covered("pairs_covered", f))),
    ), "skip_pair", note="\"This guarantees\" follows from reversed orderings; given them, the cover cannot fail (the "
       "last reading, not testable). Contexts with one signal token repeated need no split and are not counted."),
    ClaimEntry("least_favourite", S["least_favourite"], POST, "universal", (
        banded("learnt: signal accuracy >=", SOLVED, (0.8, 0.99), lambda f: Reading(
            "every head, d_head 5", f"heads of skip_pair.md's solved (signal accuracy >= {f:g}) 2-head, d_head 5 runs "
            "whose own OV effect, attending to their least favourite token x (the only signal token of an (x, x) "
            "context: the head attends nowhere else), ranks the completion of (x, x) first of the 10 completions",
            _least_favourite(f), table="skip_pair/runs",
            favoured="\"the heads can confidently guess\": each head, alone, on its own (x, x) contexts")),
        banded("learnt: signal accuracy >=", SOLVED, (0.8, 0.99), lambda f: Reading(
            "most heads, d_head 5", "the same, read as typical (shown for contrast)", _least_favourite(f),
            table="skip_pair/runs")),
        banded("learnt: signal accuracy >=", SOLVED, (0.8, 0.99), lambda f: Reading(
            "every head, d_head 1", "the same for the 2-head, d_head 1 runs", _least_favourite(f, d_head=1),
            table="skip_pair/runs")),
        banded("learnt: signal accuracy >=", SOLVED, (0.8, 0.99), lambda f: Reading(
            "every head, d_head 5, across setups", "the first reading on the robustness grid's 2-head, d_head 5 "
            "models of every setup variant and training length", _least_favourite(f))),
    ), "skip_pair", note="Per pair type (x, x) and head: the head's direct effect alone, not the model's answer."),
    ClaimEntry("orthogonal", S["orthogonal"], POST, "existence", (
        banded("every |cos| <", 0.3, (0.2, 0.5), lambda c: Reading(
            "some solved run with d_head >= 4", f"skip_pair.md's solved runs with d_head >= 4 (room for the 4 signal "
            f"tokens) whose every head stores the 4 signal tokens' value vectors (W_E[t] W_V + b_V) with pairwise "
            f"|cos| < {c:g}", _orthogonal(c), table="skip_pair/runs",
            favoured="\"can be stored\": a possibility, shown by one model")),
        banded("every |cos| <", 0.3, (0.2, 0.5), lambda c: Reading(
            "most solved runs with d_head >= 4", "the same, read as typical (shown for contrast)", _orthogonal(c),
            table="skip_pair/runs")),
    ), "skip_pair", note="At d_head 3 four vectors cannot be pairwise orthogonal (at best |cos| = 1/3), so d_head 3 "
       "is left out: a rule there could not hold."),
    ClaimEntry("tradeoff", S["tradeoff"], POST, "comparison", (
        Reading("smallest d_head falls with n_heads, every seed", "over skip_pair.md's capacity grid (1..4 heads, "
                "d_head 1..6): the smallest d_head at which every seed solves the task exactly never rises with "
                "n_heads and is smaller at 4 heads than at 1", _tradeoff("every"), table="skip_pair/runs",
                holds=lambda v: v == 1.0, favoured="\"trade-off here between degrees of freedom in d_head and n_heads\": "
                "more heads, fewer dimensions per head", fixed="the solving criterion is banded by the next two readings"),
        Reading("smallest d_head falls with n_heads, most seeds", "the same with most seeds solving", _tradeoff("most"),
                table="skip_pair/runs", holds=lambda v: v == 1.0),
        Reading("smallest d_head falls with n_heads, some seed", "the same with some seed solving", _tradeoff("some"),
                table="skip_pair/runs", holds=lambda v: v == 1.0),
    ), "skip_pair", note="The post hedges (\"Possibly\", \"not super crisp\"); a trade-off that holds here shows the "
       "possibility, not its form."),
    ClaimEntry("superpose", SUPERPOSE, POST, "existence", (
        Reading("the example model, the post's definition", "the post's defining property on the two heads of the "
                "shipped 2-head, d_head 5 model: each head's writes depend on a token it does not attend to "
                "(hc.cooperation's conditional writes) on a majority of the inputs that can show it",
                _defining, table="cooperation/skip_pair_answer",
                favoured="the post defines the word: superposition is where \"the information copied from an "
                "attended-to token depends on the information at source tokens to which it is not attending\", and "
                "\"this shows\" points at its example model, which the shipped d_head 5 model reproduces",
                fixed="a majority (0.5) of the inputs that can show it; the measured shares are printed beside"),
        Reading("the example model, reading family", "hc.cooperation's word for the two heads of the shipped 2-head, "
                "d_head 5 model (accuracy, the default reading family: the word where 90% of the readings agree) is "
                "superposition", _superposed("shipped", "family"), table="cooperation/skip_pair_mechanisms",
                fixed="the reading family spans hc.cooperation's thresholds at 0.5x and 2x inside the word itself"),
        *(Reading(f"the example model, {how} ablation", f"the same, {how} ablation alone", _superposed("shipped", how),
                  table="cooperation/skip_pair_mechanisms", fixed="hc.cooperation's default thresholds; the family readings band them") for how in ("mean", "zero")),
        *(Reading(f"some d_head 5 seed, {label}", f"d_head 5 seeds of cooperation.md whose pair word ({label}) is "
                  "superposition", _superposed("seeds", how), table="cooperation/skip_pair_mechanisms",
                  fixed="the reading family spans hc.cooperation's thresholds at 0.5x and 2x inside the word itself"
                  if how == "family" else "hc.cooperation's default thresholds; the family readings band them")
          for how, label in (("family", "reading family"), ("mean", "mean ablation"), ("zero", "zero ablation"))),
        Reading("most d_head 5 seeds, reading family", "the same, read as typical (shown for contrast)",
                _superposed("seeds", "family"), table="cooperation/skip_pair_mechanisms", fixed="the reading family spans hc.cooperation's thresholds at 0.5x and 2x inside the word itself"),
    ), "skip_pair", note="\"an interesting example\" is an existence claim: one pair of heads in superposition would "
       "show it."),
)  # fmt: skip

# The readings of one claim that share its form but are read as another form, for contrast
FORM_OF_READING = {
    ("perfect", "every seed"): "universal",
    ("only_correct", "most qualifying pair types"): "typical",
    ("split", "seen at d_head 1 (existence)"): "existence",
    ("split", "seen at d_head 1, whole orderings (existence)"): "existence",
    ("superpose", "most d_head 5 seeds, reading family"): "typical",
    ("one_head", "every d_head >= 4 tried"): "universal",
    ("one_head", "every seed with d_head >= 4"): "universal",
    ("exploit", "most successful heads under-read"): "typical",
    ("least_favourite", "most heads, d_head 5"): "typical",
    ("orthogonal", "most solved runs with d_head >= 4"): "typical",
    ("split", "seen at d_head < 3, ordering level (existence)"): "existence",
}

# Claims with no verdict, and why (issue 24, item 5)
UNTESTED: tuple[tuple[str, str, str], ...] = (
    (
        "Head performance on the Count01 task is primarily determined by attention patterns, with value feature "
        "vectors playing a minor role.",
        "count01-paper-abstract.md",
        "not measured: it needs an intervention that swaps value vectors between heads at fixed attention, not yet in the grid",
    ),
    (
        "Instead, we claim there is an analogous force pushing the model toward adopting a distributed "
        "representation/head superposition",
        POST,
        "a thesis about training pressure, not a measurable property of one model; out of reach of this grid",
    ),
    (
        "When the head attends to its “favourite” token (“2” and “1” respectively), it implicitly has no information "
        "about the other position, and so writes roughly uniformly to the logits of all possible completions.",
        POST,
        "not in the grid; skip_pair.md section 3 shows each head's OV effect per attended token, from which it could "
        'be read (the spread of the favourite token\'s row), but no rule is fixed for "roughly uniformly"',
    ),
    (
        "This seems to be a common property of attention patterns in real-model heads as well.",
        POST,
        "about real models; every model here is a toy model of the two tasks",
    ),
    (
        "but potentially more complicated arrangements work in larger models",
        POST,
        'a hedge ("potentially") with no arrangement named; skip_pair.md\'s 3- and 4-head runs have orderings '
        "(runs.csv) but no rule says what an arrangement that works is",
    ),
    (
        "the output layer has not learned to exploit it (due to bias misalignment with syntactic task)",
        SUMMARY,
        "the descriptive half (successful heads read below what they separate) is the row \"the model doesn't fully "
        'exploit these successful heads individually"; the causal half needs the same models trained without the '
        "syntactic task ([EOS]) to compare their heads' bias and readout, and hc.Count01 has no such option and no run "
        "here trains one",
    ),
    (
        "The split attention mechanism we stumbled upon for d_head < 3 are much harder to parse, and may rely on more "
        "complicated context-specific solutions.",
        POST,
        'a hedge ("may rely") with no definition of a '
        'context-specific solution; the split itself is the "split attention" row, measured pair by pair and '
        "ordering by ordering",
    ),
    (
        "There is also the possibility that superposition is happening both in the n_head dimension and per head in "
        "the d_head dimension.",
        POST,
        "a possibility the post names and does not test. It decides how d_head 1 is read "
        "(skip_pair.md, definitions): hc.cooperation's word superposition is the post's \"hierarchical\" kind, across "
        "heads, and needs each head to write several completions through a map of rank >= 2; a d_head 1 head has rank 1 "
        'by construction, so its pairs are *not testable* for it. "bottleneck superposition", several tokens '
        "per head dimension, holds at d_head 1 by counting alone (4 signal tokens through 1 dimension) and so could "
        "not come out otherwise: no rule here tests it",
    ),
)


# The same claims said again elsewhere in the sources (summary sections, the abstract's key results, the post's key
# takeaways): {registry key: ((verbatim words, source), ...)}. Each is judged by that key's row; robustness.md
# lists them under it.
ALSO: dict[str, tuple[tuple[str, str], ...]] = {
    "w01": (("Attention heads individually learn to solve the counting task by attending roughly equally to '0' and "
             "'1' tokens (w01 ≈ 1)", SUMMARY),),
    "w02": (("while suppressing attention to noise tokens '2' (w02 > 10)", SUMMARY),),
    "half": (("exhibit redundancy (~50% of heads are \"failed\")", SUMMARY),
             ("Individual attention heads learn to produce linearly separable representations for the counting task",
              SUMMARY)),
    "r": (("Model accuracy strongly correlates with a weighted sum of head separation accuracies (Pearson correlation "
           "r = 0.72), confirming ensemble-like behavior", SUMMARY),
          ("Model accuracy can be predicted from a weighted sum of individual head separation accuracies, confirming "
           "ensemble-like behavior.", SUMMARY)),
    "aggregate": ((C["aggregate"], SUMMARY),  # the abstract's words, quoted by the summary as an evidence anchor
                  ("The output layer must non-uniformly aggregate head contributions to simultaneously satisfy "
                   "counting and [EOS] prediction tasks", SUMMARY),
                  ("The output layer aggregates head contributions non-uniformly to simultaneously satisfy semantic "
                   "(counting) and syntactic ([EOS] prediction) constraints.", SUMMARY),
                  ("that the output layer must non-uniformly aggregate to satisfy both semantic and syntactic "
                   "constraints", SUMMARY),
                  ("Heads individually learn to solve the main task, but their outputs need to be aggregated in a "
                   "non-uniform way to solve the auxiliary task of predicting the '[EOS]' token.", ABSTRACT)),
    "finding": (("attention heads behave as a pseudo-ensemble, all solving the same subtask", SUMMARY),
                ("Attention heads in small transformers solving a counting task behave as pseudo-ensembles", SUMMARY),
                ("functioning as a pseudo-ensemble", SUMMARY),
                ("Attention heads behave as a pseudo-ensemble on the semantics of the counting task", ABSTRACT)),
    "conditional": (("Heads in our model seem to implement nested conditional statements that exploit the if-else "
                     "nature of the QK circuits.", POST),
                    ("This allows the model to learn to write more specific information conditional on attending to "
                     "certain tokens, given that it can implicitly rule out the existence of other tokens elsewhere in "
                     "the context.", POST)),
    "fully_attended": (("they distribute important source tokens between them", POST),
                       ("heads implementing interference schema will tend to learn QK circuits such that they "
                        "distribute tokens amongst themselves and don’t leave crucial information unattended to.", POST)),
    "caption": (("and constructively interfere to produce the correct answer.", POST),),
    "strict": (("this “conditional dependence” relies on heads implementing an “all or nothing” approach to attention.",
                POST),
               ("Heads do not generally* spread their attention across multiple interesting tokens, but instead move "
                "through the hierarchy of features in their QK circuits and attend to the most “interesting” (still a "
                "poorly defined term!) one present.", POST)),
    "reversed": (("In 2-head models, this manifests as reversed “preference orderings” over source tokens", POST),),
}  # fmt: skip


def form_of(entry: ClaimEntry, reading: Reading) -> str:
    return FORM_OF_READING.get((entry.key, reading.name), entry.form)


def entries(task: str) -> tuple[ClaimEntry, ...]:
    return tuple(e for e in REGISTRY if e.task == task)
