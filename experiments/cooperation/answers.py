"""What the sources ask and what we found (issue 49): one or two plain sentences per question, each with its
key number and a link to the evidence, built from the tables (`count01_answer.csv`, `skip_pair_answer.csv`)
so a page's first screen states the answer. Used by cooperation.md, count01.md, skip_pair.md and
robustness.md."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from experiments.cooperation.quotes import TITLE
from headcoop.display.pages import Answer, anchor

SAME = "same computation (pseudo-ensemble)"
PSEUDO_ENSEMBLE = ("whether the attention heads behave as a pseudo-ensemble, all solving the same subtask, or they "
                   "perform different subtasks")  # fmt: skip
SUPERPOSITION = ("the information copied from an attended-to token depends on the information at source tokens to "
                 "which it is not attending")  # fmt: skip


# the cooperation.md sections that hold each answer's evidence (page.py titles its sections with these)
EVIDENCE = {
    "count01": "1. Count01: a pseudo-ensemble, or heads that solve the task only in conjunction?",
    "skip_pair": "2. SkipPair: superposition, or a division of labour?",
    "compete": "3. Compete: which heads push against the answer?",
}


def count01(answer: pd.DataFrame, link: str) -> Answer:
    """The Count01 paper's question, from `count01_answer.csv`: how many models compute one function by
    counterfactual edits (issue 59; the shipped model's numbers first), the rest, the two-layer models, the
    correlation on the task's own inputs beside it, and what ablation can say."""
    one = answer[answer.layers == 1]
    two = answer[answer.layers == 2]
    shipped = one[one.model == "shipped"].iloc[0]
    same = one[one.same_word == SAME]
    others = one[one.same_word != SAME]
    if "function_word" in answer:
        return Answer(
            "The Count01 paper asks", f'"{PSEUDO_ENSEMBLE}".', _by_edits(one, two, shipped) + _quiet(one, shipped), link
        )
    text = (f"A pseudo-ensemble, measured directly (no ablation), in {len(same)} of {len(one)} one-layer models: in the "
            f"shipped model the {int(shipped.active_heads)} heads that push the answer correlate per input at r >= "
            f"{shipped.r_min:.3f}, {shipped.one_direction:.1%} of their push on one direction"
            + (f"; in the other {len(others)}, r {others.r_min.min():.2f}-{others.r_min.max():.2f} (undetermined)" if len(others) else "")
            + (f". The {len(two)} two-layer models perform different subtasks (r >= {two.r_min.min():.2f})" if len(two) else "")
            + ". ")  # fmt: skip
    return Answer("The Count01 paper asks", f'"{PSEUDO_ENSEMBLE}".', text + _quiet(one, shipped), link)


FUNCTION = "same function (pseudo-ensemble)"


def _by_edits(one: pd.DataFrame, two: pd.DataFrame, shipped) -> str:
    """The answer by counterfactual edits (a function is what changes under an edit), the correlation on the
    task's inputs beside it."""
    same = one[one.function_word == FUNCTION]
    counts = lambda t: ", ".join(f"{w} {n}" for w, n in t.function_word.value_counts().items())  # noqa: E731
    text = (f"By counterfactual edits (every single-token substitution; heads of one function respond in "
            f"proportion), a pseudo-ensemble in {len(same)} of {len(one)} one-layer models ({counts(one)}): in the "
            f"shipped model the {int(shipped.deciding_heads)} heads that decide respond at |cos| >= "
            f"{shipped.edit_cos_min:.3f}, {shipped.edit_one_direction:.1%} of the response on one direction")  # fmt: skip
    open_ = one[one.function_word == "undetermined"]
    if len(open_):
        at_floor = [r.model for r in open_.itertuples() if "functions under direct, floor x0.5" in r.summary
                    or "functions under total, floor x0.5" in r.summary]  # fmt: skip
        text += (f"; undetermined in {len(open_)} ({', '.join(open_.model)}): at the default floor their deciding heads "
                 f"respond at |cos| {open_.edit_cos_min.min():.2f}-{open_.edit_cos_min.max():.2f}"
                 + (f", and in {len(at_floor)} of them ({', '.join(at_floor)}) heads between 5% and 10% of the largest "
                    "response, admitted at half the activity floor, respond otherwise" if at_floor else ""))  # fmt: skip
    split = one[(one.function_word.str.startswith("different")) & (one.same_word == SAME)]
    if len(split):
        text += (f"; {len(split)} ({', '.join(split.model)}) correlate as one on the task's inputs (r >= "
                 f"{split.r_min.min():.2f}) while the edits separate their functions (|cos| down to "
                 f"{split.edit_cos_min.min():.2f})")  # fmt: skip
    if len(two):
        text += (
            f". The {len(two)} two-layer models: {counts(two)} (|cos| >= {two.edit_cos_min.min():.2f}; decided on "
            f"the heads active on both their direct push and their total effect, {', '.join(str(int(x)) for x in two.deciding_heads)} heads)"
        )
    return text + (f". On the task's inputs alone the pushes correlate as one in {int((one.same_word == SAME).sum())} of "
                   f"{len(one)} one-layer models. ")  # fmt: skip


def _quiet(one: pd.DataFrame, shipped) -> str:
    """Whether ablation can ask the question: the kinds under which no pair matters on `min_share` or more of
    the inputs in the full model, with the largest share any pair reaches (the threshold named, not an absolute)."""
    quiet = [
        h for h in ("zero", "mean") if f"pairs_matter_full_{h}" in one and (one[f"pairs_matter_full_{h}"] == 0).all()
    ]
    if not quiet:
        return ""
    floor = float(one.min_share.iloc[0]) if "min_share" in one else 0.1
    largest = [c for c in (f"largest_matters_full_{h}" for h in quiet) if c in one]
    most = f"; the largest share any pair reaches: {one[largest].max().max():.1%}" if largest else ""
    return (
        f"Ablation cannot ask it: under {' and '.join(quiet)} ablation no pair changes the answer on "
        f"{floor:.0%} or more of the inputs of the full model in any of them{most} (shipped margin >= "
        f"{_margin(shipped.summary)} logits)."
    )


def _margin(summary: str) -> str:
    import re

    found = re.search(r"margin is >= ([\d.]+) logits", summary)
    return found.group(1) if found else "n/a"


def compete(summary: pd.DataFrame, two_layer: pd.DataFrame, table1: pd.DataFrame | None, link: str,
            legacy: bool = False, head_table: pd.DataFrame | None = None) -> Answer:  # fmt: skip
    """The Count01 paper's title question, from the mechanism tables (reading a: a head whose total effect
    opposes the answer, over the reading family) and Table 1 (reading c: heads trained together end worse)."""
    one = summary[(summary.metric == "accuracy") & (summary.how == "family")]
    heads = int((one.heads_supports + one.heads_competes + one.heads_inactive + one.heads_undetermined).sum())
    competing = int(one.heads_competes.sum())
    two = ", ".join(f"{int(r.heads_competes)}/{int(r.heads_supports + r.heads_competes + r.heads_inactive + r.heads_undetermined)}"
                    for r in two_layer.itertuples())  # fmt: skip
    text = (
        ("Cooperate at inference: no head" if competing == 0 else f"{competing} heads") + " of the one-layer models "
        "pushes against the answer beyond a tenth of its fair share with 95% confidence (the role threshold; "
        f"{competing} of {heads} heads over the reading family; two layers: {two}"
        + ("; the earlier instrument's tables" if legacy else "")
        + ")"
        + _below_threshold(head_table)
        + "."
    )
    if table1 is not None:
        t = table1.set_index("metric")
        s_d, l_d = float(t.loc["s_acc", "isolated_minus_joint"]), float(t.loc["l_acc_head", "isolated_minus_joint"])
        text += (
            f" Whether they compete in training is mixed: trained alone minus together, s_acc {s_d:+.3f} but the "
            f"head's own push {l_d:+.3f} (the paper's Table 1)."
        )
    return Answer("The Count01 paper's title asks", f'"{TITLE}"', text, link)


def lead(word: str, favoured: str, knife_edge: str, wanted: str) -> str:
    """The hedge that opens an answer, by a stated rule: "Yes" where `wanted` stands, "No" where another word
    stands, "On a knife edge" where nothing stands but removing one group of readings makes `wanted` stand,
    else "Undetermined" (a `favoured` word short of the vote is named, never rounded up)."""
    if word == wanted:
        return "Yes"
    if word != "undetermined":
        return "No"
    return "On a knife edge" if f": {wanted} " in f"{knife_edge} " else "Undetermined"


def _holds(row) -> str:
    """The defining property's verdict: both heads' writes conditional on a majority of the inputs that can
    show it (the word's rule 5a)."""
    return "holds" if min(row.conditional_a, row.conditional_b) >= 0.5 else "does not hold"


def _defining(row) -> str:
    """The post's defining property on one pair: the share of the inputs that can show it where each head's
    writes are conditional, and how many of the inputs where the pair matters can show it."""
    return (
        f"each head's writes depend on a token it does not attend to on {row.conditional_a:.0%} / "
        f"{row.conditional_b:.0%} of the inputs that can show it ({row.shown_a:.0%} / {row.shown_b:.0%} of the "
        "inputs where the pair matters)"
    )


def _below_threshold(heads: pd.DataFrame | None) -> str:
    """The heads whose direct push opposes the answer though no role reading calls them competing."""
    if heads is None or "direct_effect" not in heads:
        return ""
    one = heads[heads.how == "family"] if "how" in heads else heads
    negative = one[one.direct_effect < 0]
    return (
        f"; {len(negative)} of {len(one)} heads have a negative direct effect, each within that threshold or "
        f"its interval"
        if len(negative)
        else ""
    )


def skip_pair(answer: pd.DataFrame, link: str) -> Answer:
    """The SkipPair post's claim, by its own definition of superposition, from `skip_pair_answer.csv`: the
    word over the reading family with its vote and knife edges, then the defining property (conditional
    writes) and the interference sentence (only the answer shared) as two findings, each with its share and
    denominator; the same for d_head 1."""
    five = answer[answer.d_head == 5].iloc[0]
    one = answer[answer.d_head == 1].iloc[0]
    favoured = getattr(five, "favoured", five.default_reading)
    share = getattr(five, "favoured_share", five.agreement)
    edge = str(getattr(five, "knife_edge", "") or "")
    edge = "" if edge == "nan" else edge
    word = five.mechanism if five.mechanism != "undetermined" else f"undetermined, {favoured} favoured"
    kinds = "; ".join(f"{h} {getattr(five, f'vote_{h}'):.0%}" for h in ("zero", "mean", "resample")
                      if pd.notna(getattr(five, f"vote_{h}", float("nan"))))  # fmt: skip
    text = (f"{lead(five.mechanism, favoured, edge, 'superposition')}, on the shipped d_head 5 model: {word} "
            f"({share:.0%} of votes, the mean of the kinds that see the pair: {kinds}; a word needs 90%"
            + (f"; knife edge: {edge}" if edge else "; no single group of readings flips it") + "). "
            f"The post's defining property {_holds(five)}: {_defining(five)}; the heads attend to different sources on "
            f"{five.distributed:.0%}. Its interference sentence, judged apart: the answer is the only completion both "
            f"write to on {five.only_answer:.0%} of the inputs where both write several ({five.multi:.0%} of the "
            f"inputs where the pair matters). At d_head 1: {one.mechanism} ({one.agreement:.0%} of votes); the "
            f"defining property {_holds(one)}: {_defining(one)}, and the answer is the only shared completion on {one.only_answer:.0%}.")  # fmt: skip
    return Answer("The SkipPair post asks", f'is this superposition, "{SUPERPOSITION}"?', text, link)


def from_tables(results: Path, questions: tuple[str, ...], page: str = "") -> list[Answer]:
    """The answers to `questions` (keys of EVIDENCE) from the tables under `results` (docs/results), each
    linked to its section of cooperation.md (`page`: the path to it from the page shown, "" on itself); a
    question whose tables are missing (a quick run) is left out."""
    folder = results / "cooperation"
    load = lambda name: pd.read_csv(folder / f"{name}.csv") if (folder / f"{name}.csv").exists() else None  # noqa: E731
    link = lambda key: page + anchor(EVIDENCE[key])  # noqa: E731
    out = []
    for key in questions:
        if key == "count01" and (table := load("count01_answer")) is not None:
            out.append(count01(table, link(key)))
        elif key == "skip_pair" and (table := load("skip_pair_answer")) is not None:
            out.append(skip_pair(table, link(key)))
        elif key == "compete" and (summary := load("count01_mechanisms")) is not None:
            two = load("two_layer_mechanisms")
            table1 = results / "count01" / "table1.csv"
            out.append(compete(summary, two if two is not None else summary.iloc[:0],
                               pd.read_csv(table1) if table1.exists() else None, link(key),
                               legacy="independent" in summary.columns, head_table=load("count01_heads")))  # fmt: skip
    return out
