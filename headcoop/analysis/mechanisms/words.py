"""The mechanism words, each its source's defining property (issue 48), and the rules that read them from
the axes under one reading; how a family of readings votes (each ablation kind one equal vote).

A reading is an ablation (a kind and a draw of its reference) and a threshold setting; a pair's word under
a reading comes from `pair_word`, in this order:

1. "unseen" (an abstention, not a word): the ablation cannot see a head of the pair (its replacement is
   what the head writes anyway; or the head writes nothing the metric reads while its replacement does,
   where nothing but the logits reads the head; or its replacement does what the head does: where zeroing
   the head changes the metric on at least `min_share` of inputs, the replacement's mean effect against
   the head zeroed equals the head's own within the role threshold, carries at least 1 - `cutoff` of it,
   or outdoes it the same way, so the head would read reversed), or, for resample, the answers lost are
   the injected input's answers (decided once per draw, at the default majority, for every threshold
   reading of the draw). The same test in the other coalitions of the pair's 2 x 2 game (the head zeroed
   or replaced with its partner removed, alone, or alone beside its partner) makes the words a replacement
   there could fake ("inactive", "redundant", a mixture with an either-alone part; "competition" is read
   from the full model) abstain. An abstaining reading does not vote: its kind votes with the readings
   that see the pair, and a kind none of whose readings see it has no vote (`cannot see: <why>`, with the
   counts);
2. "inactive": a head of the pair changes the metric neither with its partner present nor without it;
3. "competition": one head's total effect supports the answer, the other's opposes it;
4. "composition": at least `composition` of the earlier head's total effect runs through the later one;
5. "superposition": (a) both heads' writes are conditional (`conditional_writes`) on a majority of the
   inputs that show it (at least `min_share` of the inputs where the pair matters), (b) both write several
   consistent completions on a majority of the inputs where the pair matters, and the answer is the only
   one both write to on a majority (in the "universal" reading, on all) of those, (c) they attend to different
   important tokens (not noise, not the read-off token) on a majority of the inputs where the pair
   matters, (d) both support, each changes the metric within the pair (partner present or removed) on at
   least `min_share`, and each one's own removal (its partner present) changes it on at least `own` of the
   inputs where the pair matters (conjunction needs the same);
6. necessity among the inputs where the pair matters: "redundant" (either alone: OR), "division" (one
   head alone on each input, different heads on different inputs), "conjunction" (both needed: AND or
   shared), each on at least `mixture` of those inputs; "mixture" where the leading one holds on less and
   another on at least 1 - `mixture` (its shares stated); on a continuous metric that is additive over the two heads by
   construction, "not testable";
7. otherwise "undetermined", with what conflicts.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

MECHANISMS = ("superposition", "redundant", "division", "conjunction", "mixture", "composition", "competition",
              "not testable", "inactive", "undetermined")  # fmt: skip
ABSTAIN = "unseen"
ROLES = ("supports", "competes", "inactive", "undetermined")
INPUT_CLASSES = ("not_needed", "or", "and", "a_only", "b_only", "shared", "other")  # codes of `input_class`
CLASSES = ("or", "and", "i_only", "j_only", "shared")
# the thresholds of the rules and their defaults; each is banded at half and twice
THRESHOLDS = {"role": 0.1, "min_share": 0.1, "majority": 0.5, "division": 0.2, "cutoff": 0.2, "composition": 0.5,
              "floor": 0.1, "same": 0.1, "own": 0.25, "mixture": 0.75}  # fmt: skip
THRESHOLD_MEANINGS = {  # what each threshold decides (the pages print these: definitions.py)
    "role": "a head supports (competes) where its mean total effect, else its isolated effect, exceeds this "
    "fraction of its fair share (1/k of the summed effect sizes of the k heads) with a 95% interval "
    "that excludes 0",
    "min_share": "a pair is read in the full model where it matters on at least this share of inputs, else with "
    "every other head ablated; each head of a superposed pair must change the metric on this share",
    "majority": "the share of the inputs where the pair matters that a class (OR, AND, a part of superposition) needs",
    "division": "for division, each head alone must answer at least this share",
    "cutoff": "on a continuous metric, a head's share of the pair's effect at least 1 - cutoff is all of it, at "
    "most cutoff none of it",
    "composition": "the share of the earlier head's total effect that must run through the later head's inputs",
    "floor": "a head writes to a completion where its direct logit contribution exceeds this fraction of its "
    "largest; a head is active on the same-computation axis where its push varies at least this "
    "fraction of the most varying head's",
    "same": "same computation where the active heads' pushes correlate at r >= 1 - same pairwise and 1 - same "
    "of their variance lies on one direction; the same function on the task's semantic features where their "
    "responses to the counterfactual edits of those features are proportional input by input at |cos| >= 1 - same "
    "and 1 - same of the response lies on one direction",
    "mixture": "a necessity word (redundant, division, conjunction) needs this share of the inputs where the pair "
    "matters; below it, a mixture with its shares where a second one holds on at least 1 - mixture of "
    "them, else undetermined",
    "own": "superposition and conjunction need each head's own removal (its partner present) to change the metric "
    "on at least this share of the inputs where the pair matters (a pair where one head does the work is "
    "not a pair mechanism)",
}
# the readings of "writes to" besides the default (above `floor` of the head's largest write), and the
# universal reading of "only ... on the correct token"
WRITE_READINGS_FAMILY = ("positive", "centered")

WORD_SOURCES = {  # text in double quotes is verbatim from ../shared/seeds (tests/analysis/mechanisms/test_cooperation.py checks it)
    "superposition": 'The SkipPair post defines it: "the information copied from an attended-to token depends on the '
    'information at source tokens to which it is not attending"; and: "In contexts where both heads '
    'write to multiple outputs, they will only constructively interfere on the correct token."; '
    '"they distribute important source tokens between them, and constructively interfere to produce '
    'the correct answer".',
    "redundant": "Either head alone gives the answer where the pair matters (OR), measured in the full model "
    "where any pair matters there. One reading of the Count01 paper's \"whether the attention heads "
    'behave as a pseudo-ensemble, all solving the same subtask"; the direct reading is the model-level '
    "'same computation' axis.",
    "division": "Our word, no source defines it: each input is answered by one head alone, different heads for "
    "different inputs (i-only and j-only). It is read input by input; the Count01 paper's alternative "
    'is read over the task ("they can only solve the original task in conjunction"), and a division '
    "can meet it there: in the bench's count-subtasks pair each head alone answers about half of the "
    "inputs (49% / 51%), no more than a constant answer does (51%), so over the task neither solves it "
    "alone, while on every input one of them does.",
    "conjunction": "Both heads are needed on most inputs where the pair matters (AND on the user's metric): the "
    "Count01 paper's alternative, \"they perform different subtasks, meaning that they can only solve "
    'the original task in conjunction".',
    "composition": "Elhage et al. 2021 (A Mathematical Framework for Transformer Circuits): a later head reads an "
    "earlier head's output through its query, key or value (Q-, K- and V-composition), as a "
    "previous-token head feeds an induction head.",
    "competition": "One head's total effect on the metric supports the answer, the other's opposes it: the Count01 "
    'paper\'s title asks "Do Attention Heads Compete or Cooperate during Counting?" and defines neither.',
    "mixture": "Our word, no source defines it: no necessity word holds on at least `mixture` of the inputs where "
    "the pair matters, and two hold on substantial shares, each stated (e.g. either alone on 57%, both "
    "needed on 43%).",
    "not testable": "The metric is continuous and additive over the two heads by construction (logits linear in "
    "their outputs), so either-alone and both-needed cannot occur on it: which head is needed "
    "cannot be measured.",
    "inactive": "A head of the pair changes the metric neither with its partner present nor with it removed.",
    "undetermined": "The axes conflict, or the readings disagree (flips_under names where).",
    "same computation": 'The Count01 paper: "whether the attention heads behave as a pseudo-ensemble, all solving the '
    'same subtask, or they perform different subtasks"; measured without ablation: the '
    "heads' per-input pushes correlate, lie on one direction, and weigh each class alike.",
    "backs up": "McGrath et al. 2023 (The Hydra Effect): later heads compensate when an earlier one is ablated; "
    "Rushing & Nanda 2024 (self-repair): part of that compensation is the final LayerNorm's rescaling, "
    "which is split off here.",
}


@dataclasses.dataclass(frozen=True)
class Reading:
    """One reading of the family: an ablation kind, a draw of its reference, and one threshold (or write
    reading) at a factor."""

    how: str
    draw: int
    threshold: str | None = None
    factor: float = 1.0

    @property
    def label(self) -> str:
        where = self.how if self.how == "zero" else f"{self.how} draw {self.draw}"
        if self.threshold is None:
            return where
        if self.threshold.startswith("writes ") or self.threshold == "universal":
            return f"{where}, {self.threshold}"
        return f"{where}, {self.threshold} x{self.factor:g}"


def band(thresholds: dict, factors: tuple[float, float]) -> list[tuple[str | None, float, dict]]:
    """The threshold readings: the defaults, each threshold at each factor (a share at most (1 + default)
    / 2), each other reading of "writes to", and the universal reading of "... only constructively interfere on the correct token"."""
    base = dict(thresholds, writes="floor", universal=False)
    out: list[tuple[str | None, float, dict]] = [(None, 1.0, base)]
    for name, value in thresholds.items():
        for factor in factors:
            changed = dict(base)
            changed[name] = min(value * factor, (1 + value) / 2) if value < 1 else value * factor
            out.append((name, factor, changed))
    for reading in WRITE_READINGS_FAMILY:
        out.append((f"writes {reading}", 1.0, dict(base, writes=reading)))
    out.append(("universal", 1.0, dict(base, universal=True)))
    return out


def superposition_word(a: str, b: str, th: dict, sp: dict) -> tuple[str, str] | None:
    """("superposition", reason) when the four parts hold (module docstring, rule 5), else None. sp: the
    pair's shares: cond_a, cond_b (conditional writes among inputs showing it), shown_a, shown_b (the share
    of inputs showing it), multi, only (writes), distributed (important sources), moves_a, moves_b (the share
    of the inputs where the pair matters on which each head changes the metric, partner present or removed),
    own_a, own_b (removed with its partner present: its own removal)."""
    only_needed = 1.0 - 1e-9 if th["universal"] else th["majority"]
    parts = [
        (min(sp["shown_a"], sp["shown_b"]) >= th["min_share"] and min(sp["cond_a"], sp["cond_b"]) >= th["majority"]),
        sp["multi"] >= th["majority"] and sp["only"] >= only_needed,
        sp["distributed"] >= th["majority"],
        min(sp["moves_a"], sp["moves_b"]) >= th["min_share"]
        and min(sp.get("own_a", 1.0), sp.get("own_b", 1.0)) >= th["own"],
    ]
    if not all(parts):
        return None
    return "superposition", (f"conditional writes on {sp['cond_a']:.0%} / {sp['cond_b']:.0%}, only the answer "
                             f"together on {sp['only']:.0%} of {sp['multi']:.0%}, sources distributed on "
                             f"{sp['distributed']:.0%}")  # fmt: skip


def necessity_word(a: str, b: str, th: dict, s: dict, additive_by_construction: bool,
                   moves: tuple[float, float] = (1.0, 1.0)) -> tuple[str, str]:  # fmt: skip
    """(word, reason) from the shares of the 2 x 2 classes among the inputs where the pair matters; moves: the
    share of those inputs where each head's own removal (its partner present) changes the metric (conjunction
    needs `own` of each).
    A word that holds on less than `mixture` of those inputs is stated as a "mixture" with its shares."""
    needed = s["and"] + s["shared"]
    split = s["i_only"] + s["j_only"] if min(s["i_only"], s["j_only"]) >= th["division"] else 0.0
    parts = [(share, text) for share, text in ((s["or"], "either alone"), (split, "one head alone (division)"),
                                              (needed, "both needed")) if share > 0]  # fmt: skip
    ranked = sorted(parts, reverse=True)
    top = ranked[0][0] if ranked else 0.0
    if th["majority"] <= top < th["mixture"]:
        shares = ", ".join(f"{text} on {share:.0%}" for share, text in ranked)
        if len(ranked) > 1 and ranked[1][0] >= 1 - th["mixture"]:
            return "mixture", shares
        return "undetermined", (f"{shares}: below the {th['mixture']:.0%} a word needs, and no second part of "
                                f"{1 - th['mixture']:.0%} to make a mixture")  # fmt: skip
    if s["or"] >= th["majority"]:
        return "redundant", f"either alone answers {s['or']:.0%}"
    if s["i_only"] >= th["division"] and s["j_only"] >= th["division"] and s["i_only"] + s["j_only"] >= th["majority"]:
        return "division", f"{a} alone on {s['i_only']:.0%}, {b} alone on {s['j_only']:.0%}"
    if needed >= th["majority"]:
        if additive_by_construction:
            return "not testable", "the metric is additive over these heads by construction"
        if min(moves) < th["own"]:
            return "undetermined", (f"both needed on {needed:.0%}, but {a if moves[0] < moves[1] else b}'s own removal "
                                    f"changes the metric on only {min(moves):.0%} of them: one head does the work")  # fmt: skip
        return "conjunction", f"both needed on {needed:.0%}"
    shown = ", ".join(f"{c} {v:.0%}" for c, v in s.items() if v > 0)
    return "undetermined", f"the evidence conflicts ({shown or 'no class'})"


def blind_reason(reasons: list[str]) -> str:
    """The most common reason among abstaining readings, with the head it names."""
    return Counter(reasons).most_common(1)[0][0] if reasons else "no reading can see it"


def by_ablation(words: list[str], readings: list[Reading], reasons: list[str] | None = None) -> str:
    """Per ablation, its most common word and that word's share of the ablation's seeing readings; where some
    or all of its readings abstain, "cannot see: <why>" with their count."""
    parts = []
    reasons = reasons or [""] * len(words)
    for how in dict.fromkeys(r.how for r in readings):
        mine = [(w, why) for w, r, why in zip(words, readings, reasons) if r.how == how]
        seen = [w for w, _ in mine if w != ABSTAIN]
        blind = [why for w, why in mine if w == ABSTAIN]
        note = (
            f"cannot see: {blind_reason(blind)}" if any(blind) else "cannot see it"
        ) + f" ({len(blind)} of {len(mine)} readings)"
        if not seen:
            parts.append(f"{how}: {note}")
            continue
        word, count = Counter(seen).most_common(1)[0]
        parts.append(f"{how}: {word}" + ("" if count == len(seen) else f" {count / len(seen):.0%}")
                     + (f" ({note})" if blind else ""))  # fmt: skip
    return "; ".join(parts)


def model_word(words: list[str]) -> str:
    """The model's word under one reading: the word of more than half of its active, seen pairs."""
    active = [w for w in words if w not in ("inactive", ABSTAIN)]
    if not active:
        return ABSTAIN if all(w == ABSTAIN for w in words) else "undetermined"
    word, count = Counter(active).most_common(1)[0]
    return word if count > len(active) / 2 else "undetermined"


def vote(words: list[str], readings: list[Reading]) -> dict[str, float]:
    """{word: share} with each ablation kind one equal vote: within a kind each seeing reading counts alike and
    an abstaining one not at all (it cannot see the pair: the vote is left to the readings that can); a kind
    whose readings all abstain has no vote."""
    kinds: dict[str, list[str]] = {}
    for w, r in zip(words, readings):
        if w != ABSTAIN:
            kinds.setdefault(r.how, []).append(w)
    voting = kinds
    shares: dict[str, float] = {}
    for ws in voting.values():
        for w, c in Counter(ws).items():
            shares[w] = shares.get(w, 0.0) + c / len(ws) / len(voting)
    return shares


def stand(words: list[str], readings: list[Reading], agree: float, reasons: list[str] | None = None
          ) -> tuple[str, float, str]:  # fmt: skip
    """(the word that stands, the share of votes giving the most common word, what flips it). What flips
    it: the candidate (the most common word other than "undetermined") and the group of readings (an
    ablation, or a threshold at a factor) where it holds least often, e.g. "redundant: 0% under resample";
    an ablation that cannot see the pair is named as such, with why (`reasons`: each reading's reason)."""
    shares = vote(words, readings)
    reasons = reasons or [""] * len(words)
    blind = [h for h in dict.fromkeys(r.how for r in readings)
             if all(w == ABSTAIN for w, r in zip(words, readings) if r.how == h)]  # fmt: skip
    why = {h: blind_reason([x for w, r, x in zip(words, readings, reasons) if r.how == h and x]) for h in blind}
    blind_note = "; ".join(f"{h} cannot see it" + (f": {why[h]}" if any(reasons) else "") for h in blind)
    if not shares:
        return "undetermined", 0.0, blind_note or "no reading can see it"
    word, share = max(shares.items(), key=lambda kv: (kv[1], kv[0] != "undetermined"))
    candidates = sorted((w for w in shares if w != "undetermined"), key=lambda w: -shares[w])
    if share >= 1.0 - 1e-12 or not candidates:
        return word, share, blind_note
    cand = candidates[0]
    groups: dict[str, list[bool]] = {}
    for r, w in zip(readings, words):
        if w == ABSTAIN:
            continue
        groups.setdefault(r.how, []).append(w == cand)
        if r.threshold is not None:
            key = r.threshold if r.factor == 1.0 else f"{r.threshold} x{r.factor:g}"
            groups.setdefault(key, []).append(w == cand)
    held = {g: sum(v) / len(v) for g, v in groups.items()}
    ablations = {r.how for r in readings}
    worst = min(held, key=lambda g: (held[g], g not in ablations, list(held).index(g)))  # ablations named first
    flip = f"{cand} in {shares[cand]:.0%} of votes, {held[worst]:.0%} under {worst}"
    return (word if share >= agree else "undetermined"), share, "; ".join(x for x in (flip, blind_note) if x)


def standing(words: list[str], readings: list[Reading], agree: float) -> tuple[str, float]:
    """`stand`'s (word, share) alone, without what flips it (what `knife_edges` asks of each group)."""
    shares = vote(words, readings)
    if not shares:
        return "undetermined", 0.0
    word, share = max(shares.items(), key=lambda kv: (kv[1], kv[0] != "undetermined"))
    if share >= 1.0 - 1e-12 or all(w == "undetermined" for w in shares):
        return word, share
    return (word if share >= agree else "undetermined"), share


def knife_edges(words: list[str], readings: list[Reading], agree: float) -> str:
    """The groups of readings whose removal alone changes the word that stands (a knife edge), each with the
    word and vote without it, e.g. "without universal: superposition 91%"; "" where none does. Groups: each
    ablation kind, and each threshold or write reading at each factor (`stand`'s groups)."""
    word = standing(words, readings, agree)[0]
    keys = [r.how if r.threshold is None else r.threshold if r.factor == 1.0 else f"{r.threshold} x{r.factor:g}"
            for r in readings]  # fmt: skip
    groups = list(dict.fromkeys([r.how for r in readings] + [k for k, r in zip(keys, readings) if r.threshold]))
    out = []
    for g in groups:
        keep = [x for x, (r, k) in enumerate(zip(readings, keys)) if r.how != g and k != g]
        if not keep or len(keep) == len(readings):
            continue
        other, share = standing([words[x] for x in keep], [readings[x] for x in keep], agree)
        if other != word:
            out.append(f"without {g}: {other} {share:.0%}")
    return "; ".join(out)


__all__ = ["MECHANISMS", "ABSTAIN", "ROLES", "INPUT_CLASSES", "CLASSES", "THRESHOLDS", "THRESHOLD_MEANINGS", "WORD_SOURCES", "Reading",
           "band", "superposition_word", "necessity_word", "blind_reason", "by_ablation", "model_word", "vote", "stand", "standing", "knife_edges"]  # fmt: skip
