"""What the sources ask and what we found (issue 49): one or two plain sentences per question, each with its
key number and a link to the evidence, built from the tables (`count01_answer.csv`, `skip_pair_answer.csv`)
so a page's first screen states the answer. Used by cooperation.md, count01.md, skip_pair.md and
robustness.md."""

from __future__ import annotations

import re
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
    """The Count01 paper's question in its own sense (issue 71: "on the semantics of the counting task"), from
    `count01_answer.csv`: how many of the paper's one-layer models compute the same function on the counts by
    counterfactual edits of the counts (the noise token apart), with the number that decides it; how the heads
    weigh the noise token, reported apart; the two-layer models beside, past the paper. At most 60 words; what
    the answer rests on goes in its details."""
    one = answer[answer.layers == 1]
    two = answer[answer.layers == 2]
    shipped = one[one.model == "shipped"].iloc[0]
    if "function_kind" not in answer:  # a table from before issue 71
        return Answer("The Count01 paper asks", f'"{PSEUDO_ENSEMBLE}".', _by_edits(one, two, shipped), link,
                      _quiet(one, shipped))  # fmt: skip
    return Answer("The Count01 paper asks", f'"{PSEUDO_ENSEMBLE}" (its answer: "{ON_THE_COUNTS}").',
                  _on_the_counts(one, two, shipped), link, _count01_details(one, two, shipped))  # fmt: skip


ON_THE_COUNTS = "on the semantics of the counting task, attention heads behave as a pseudo-ensemble"
FUNCTION = "same function on the counts (pseudo-ensemble)"


def _kinds(t: pd.DataFrame) -> str:
    return ", ".join(f"{n} {w}" for w, n in t.function_word.value_counts().items())


def _on_the_counts(one: pd.DataFrame, two: pd.DataFrame, shipped) -> str:
    """The answer sentence: the word and its count over the one-layer models, the number that decides it, the
    noise token apart, the two-layer models beside."""
    same = one[one.function_word == FUNCTION]
    rest = one[one.function_word != FUNCTION]
    lead = "A pseudo-ensemble" if len(same) > len(one) / 2 else "Not a pseudo-ensemble" if len(rest) - \
        int(rest.function_word.isin(["undetermined", "not measurable"]).sum()) >= len(one) / 2 else "Undetermined"  # fmt: skip
    text = (f"{lead}: same function on the counts in {len(same)} of {len(one)} one-layer models"
            + (f" ({_kinds(rest)})" if len(rest) else "")
            + f", by counterfactual edits of the counts, the noise token '2' apart (shipped: {int(shipped.deciding_heads)} "
            f"heads, |cos| >= {shipped.edit_cos_min:.3f}).")  # fmt: skip
    noisy = one[one.noise_cos_min < 0.9]
    if len(noisy):
        text += (f" The heads weigh the noise token differently in {len(noisy)} of {len(one)} (|cos| down to "
                 f"{noisy.noise_cos_min.min():.2f}).")  # fmt: skip
    if len(two):
        text += f" Two layers, past the paper: {_kinds(two)}."
    return text


def _count01_details(one: pd.DataFrame, two: pd.DataFrame, shipped) -> str:
    """What the Count01 answer rests on: the edits, the readings, the undetermined models and what flips them,
    the heads' split of the counts, positions, the correlation on the inputs, and what ablation can say."""
    same = one[one.function_word == FUNCTION]
    parts = [f"the task declares the counts of 1s and 0s its semantics (the paper's \"semantics of the counting "
             f"task\") and the noise token '2' and the digits' positions its other features; the edits of the first "
             f"{int(shipped.edit_inputs)} of 64 strings: every substitution, insertion and deletion of a digit "
             f"({int(shipped.semantic_edits):,} move a count in the shipped model); per string the noise token's "
             f"fitted part is taken out, and heads respond in proportion string by string at |cos| >= 0.9 with 90% "
             f"on one direction, the floor and the tolerance each read at x0.5 and x2"]  # fmt: skip
    if len(same):
        parts.append(f"the {len(same)} models' deciding heads respond at |cos| {same.edit_cos_min.min():.3f}-"
                     f"{same.edit_cos_min.max():.3f}")  # fmt: skip
    for row in one[one.function_word != FUNCTION].itertuples():
        flips = re.search(r"\(the readings disagree: (.*?)\)\. On the task's inputs", str(row.summary))
        parts.append(f"{row.model}: {row.function_word} at |cos| >= {row.edit_cos_min:.3f}"
                     + (f" (the readings disagree: {_grouped(flips.group(1))})" if flips else "")
                     + (f"; specialised: {row.specialised}" if isinstance(row.specialised, str) and row.specialised else ""))  # fmt: skip
    parts.append(f"where an edit is made changes at most {one.position_max.max():.1%} of a deciding head's response")
    parts.append(f"on the task's inputs alone the pushes correlate as one in {int((one.same_word == SAME).sum())} of "
                 f"{len(one)} one-layer models")  # fmt: skip
    if len(two):
        parts.append(f"the two-layer models (zero ablation alone, for time): {_kinds(two)}, |cos| >= "
                     f"{two.edit_cos_min.min():.2f}")  # fmt: skip
    return "; ".join(parts) + ". " + _quiet(one, shipped)


def _grouped(flips: str) -> str:
    """ "w1 under a; w2 under b; w1 under c" -> "w1 under a, c; w2 under b": each word once, with its readings."""
    by_word: dict[str, list[str]] = {}
    for part in flips.split("; "):
        word, _, reading = part.rpartition(" under ")
        by_word.setdefault(word or part, []).append(reading)
    return "; ".join(f"{w} under {', '.join(r)}" for w, r in by_word.items())


def _by_edits(one: pd.DataFrame, two: pd.DataFrame, shipped) -> str:
    """The answer of a table from before issue 71 (every single-token substitution, the measures apart)."""
    same = one[one.function_word == "same function (pseudo-ensemble)"]
    return (f"By counterfactual edits (every single-token substitution), a pseudo-ensemble in {len(same)} of "
            f"{len(one)} one-layer models ({_kinds(one)}); this table predates issue 71's answer on the counts.")  # fmt: skip


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
    opposes the answer by the family vote, with the single-ablation readings that name a competitor as its
    exceptions) and Table 1 (reading c: heads trained together end worse). At most 60 words; the threshold and
    the negative direct effects go in its details."""
    one = summary[(summary.metric == "accuracy") & (summary.how == "family")]
    heads = int((one.heads_supports + one.heads_competes + one.heads_inactive + one.heads_undetermined).sum())
    competing = int(one.heads_competes.sum())
    two = ", ".join(f"{int(r.heads_competes)}/{int(r.heads_supports + r.heads_competes + r.heads_inactive + r.heads_undetermined)}"
                    for r in two_layer.itertuples())  # fmt: skip
    text = (("Cooperate at inference" if competing == 0 else "Some compete at inference")
            + f", by the family vote: {competing} of {heads} one-layer heads push against the answer"
            + (f" (two layers: {two})" if two else "") + ("; the earlier instrument's tables" if legacy else "") + ".")  # fmt: skip
    exceptions = _exceptions(head_table)
    if exceptions:
        text += f" Under single ablations: {exceptions}."
    if table1 is not None:
        t = table1.set_index("metric")
        s_d, l_d = float(t.loc["s_acc", "isolated_minus_joint"]), float(t.loc["l_acc_head", "isolated_minus_joint"])
        text += (f" In training, mixed: trained alone minus together, s_acc {s_d:+.3f}, the head's own push "
                 f"{l_d:+.3f} (Table 1).")  # fmt: skip
    details = ("a head competes where its mean total effect opposes the answer beyond a tenth of its fair share "
               "with a 95% interval that excludes 0 (the role threshold); the family vote needs 90% of zero, mean "
               "and resample readings" + _below_threshold(head_table))  # fmt: skip
    return Answer("The Count01 paper's title asks", f'"{TITLE}"', text, link, details + ".")


def _exceptions(heads: pd.DataFrame | None) -> str:
    """The heads a single ablation reading calls competing (one-layer models, accuracy), with their total effect
    and its 95% interval: "under mean ablation seed 3's L0H9 competes (total effect -0.40, 95% interval -0.48 to
    -0.32)"."""
    if heads is None or "role" not in heads or "how" not in heads:
        return ""
    found = heads[(heads.how != "family") & (heads.role == "competes")]
    return "; ".join(f"under {r.how} ablation {r.model}'s {r.head} competes (total effect {r.total_effect:+.2f}, 95% "
                     f"interval {r.total_low:+.2f} to {r.total_high:+.2f})" for r in found.itertuples()) or \
        "no single ablation reading names a competitor"  # fmt: skip


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
        f"; {len(negative)} of {len(one)} heads (family rows) have a negative direct effect, each within that "
        f"threshold or its interval"
        if len(negative)
        else ""
    )


def skip_pair(answer: pd.DataFrame, link: str) -> Answer:
    """The SkipPair post's claim in its own sense (issue 71), from `skip_pair_answer.csv`: the first word is the
    post's defining property as measured on the shipped d_head 5 model (conditional writes, among the inputs
    that can show it), the ablation vote beside it as a second reading; the interference sentence and d_head 1
    in the details. At most 60 words."""
    five = answer[answer.d_head == 5].iloc[0]
    one = answer[answer.d_head == 1].iloc[0]
    favoured = getattr(five, "favoured", five.default_reading)
    share = getattr(five, "favoured_share", five.agreement)
    edge = str(getattr(five, "knife_edge", "") or "")
    edge = "" if edge == "nan" else edge
    word = five.mechanism if five.mechanism != "undetermined" else f"undetermined, {favoured} favoured"
    holds = _holds(five) == "holds"
    text = (f"{'Yes' if holds else 'No'}, by the post's definition, in the shipped d_head 5 model: each head's "
            f"writes depend on a token it does "
            f"not attend to on {five.conditional_a:.0%} / {five.conditional_b:.0%} of the inputs that can show it. "
            f"Second reading, the ablation vote on the shipped d_head 5 model: {word} ({share:.0%} of votes; a word "
            f"needs 90%).")  # fmt: skip
    kinds = "; ".join(f"{h} {getattr(five, f'vote_{h}'):.0%}" for h in ("zero", "mean", "resample")
                      if pd.notna(getattr(five, f"vote_{h}", float("nan"))))  # fmt: skip
    details = (f"the inputs that can show the property are {five.shown_a:.0%} / "
               f"{five.shown_b:.0%} of those where the pair matters; the vote is the mean of the ablation kinds that "
               f"see the pair ({kinds})"
               + (f"; knife edge: {edge}" if edge else "; no single group of readings flips it")
               + f"; the heads attend to different sources on {five.distributed:.0%} of the inputs where the pair "
               f"matters; the post's interference sentence, judged apart: the answer is the only completion both "
               f"write to on {five.only_answer:.0%} of the inputs where both write several ({five.multi:.0%} of the "
               f"inputs where the pair matters). At d_head 1 the defining property {_holds(one)}: {_defining(one)}; "
               f"the vote: {one.mechanism} ({one.agreement:.0%}); the answer is the only shared completion on "
               f"{one.only_answer:.0%}.")  # fmt: skip
    return Answer("The SkipPair post asks", f'is this superposition, "{SUPERPOSITION}"?', text, link, details)


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
