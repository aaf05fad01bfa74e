"""The definitions a results page prints, generated from the objects the code reads its words with
(issue 49): the rule order (`words.py`'s docstring), the thresholds (`THRESHOLDS` with `THRESHOLD_MEANINGS`),
the ablation kinds (`references.KINDS`), the family's band and vote, and each word's source
(`WORD_SOURCES`). A page renders `definitions()`; a test checks the committed page holds it verbatim, so the
page cannot describe another instrument than the one that ran.
"""

from __future__ import annotations

import re

from headcoop.analysis.mechanisms import words
from headcoop.analysis.mechanisms.axes import necessity_classes
from headcoop.analysis.mechanisms.references import KINDS
from headcoop.analysis.mechanisms.words import THRESHOLD_MEANINGS, THRESHOLDS, WORD_SOURCES, WRITE_READINGS_FAMILY

ABLATION_MEANINGS = {
    "zero": "the head's z (before W_O) set to 0",
    "mean": "its mean z over a reference sample (512 task inputs per draw), aligned by the offset from the "
    "answer position, not by index",
    "resample": "its z on another reference input, aligned the same way; a reading abstains where the answers "
    "lost are the injected input's answers",
}


OUR_TERMS = (*words.MECHANISMS, words.ABSTAIN, "universal", "same computation")


def as_terms(text: str) -> str:
    """`text` with our own terms in italics instead of quotation marks: on a results page quotation marks
    mean the sources' words, verbatim."""
    for term in OUR_TERMS:
        text = text.replace(f'"{term}"', f"*{term}*").replace(f"'{term}'", f"*{term}*")
    return text


def rules() -> list[str]:
    """The pair word's rules in the order `pair_word` applies them, one string each, as `words.py` states
    them (its module docstring's numbered list, whitespace joined)."""
    doc = words.__doc__ or ""
    body = doc.split("in this order:", 1)[1]
    items = re.split(r"\n\s*\d+\.\s+", "\n" + body.strip())
    return [" ".join(item.split()) for item in items if item.strip()]


def definitions(agree: float = 0.9, factors: tuple[float, float] = (0.5, 2.0)) -> str:
    """Markdown defining `hc.cooperation`'s words as the code reads them at the given vote share (`agree`)
    and band (`factors`), the defaults of `hc.cooperation`: nested bullets, one line each."""
    game = " ".join((necessity_classes.__doc__ or "").split())
    lines = [
        "- **The 2 x 2 game of a pair** on one input: the metric with both heads, only one, only the other, "
        "neither (each ablated head replaced as its ablation says); the other heads as in the full model, or "
        "ablated too (*isolated*, see `min_share`). `necessity_classes`: "
        + game
        + " Under mean and resample, an input where replacing a head does what the head does (zeroing it "
        "changes the metric in a coalition of the game and replacing it does not: a resampled input with the "
        "head's own token, a mean that carries the head's effect there) shows nothing about that head, and is "
        "left out of the inputs where the pair matters (`replaced_inputs`; the pair table's `unseen`)."
    ]
    lines += ["- **Pair words**, in the order `hc.cooperation` tries them (`headcoop/analysis/mechanisms/words.py`):"]
    lines += [f"  {i}. {as_terms(rule)}" for i, rule in enumerate(rules(), 1)]
    lines.append("- **Thresholds** (the default, each also read at " + " and ".join(f"x{f:g}" for f in factors) + "):")
    lines += [f"  - `{name}` = {value:g}: {THRESHOLD_MEANINGS[name]}" for name, value in THRESHOLDS.items()]
    lines.append("- **Ablations** (each kind one equal vote; a kind that cannot see a pair has no vote):")
    lines += [f"  - *{kind}*: {ABLATION_MEANINGS[kind]}" for kind in KINDS]
    lines.append(
        f"- **The family and the vote**: every ablation kind and reference draw, at the default thresholds, "
        f"each threshold at x{factors[0]:g} and x{factors[1]:g}, the other readings of *writes to* "
        f"({', '.join(WRITE_READINGS_FAMILY)}), and the universal reading of *... only constructively interfere on the correct token*. "
        f"Within a kind every reading counts alike; a word stands where at least {agree:.0%} of the votes "
        "give it, else the pair is *undetermined* and `flips_under` names the word and the readings where it "
        "holds least. A **model's** word under one reading is the word of more than half of its active, "
        "seen pairs."
    )
    lines.append("- **Where each word comes from** (`WORD_SOURCES`; text in double quotes is verbatim):")
    lines += [f"  - *{w}*: {as_terms(text)}" for w, text in WORD_SOURCES.items()]
    return "\n".join(lines)


__all__ = ["ABLATION_MEANINGS", "OUR_TERMS", "as_terms", "rules", "definitions"]
