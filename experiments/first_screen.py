"""The first screen (issue 71): each source's question answered in one sentence of at most 40 words, with its
number and a link to the evidence, written into README.md and docs/index.md between markers from the same
tables the result pages read (`docs/results/cooperation/`), so the three never disagree.

    python -m experiments.first_screen          # rewrite the blocks (after a results regeneration)
    python -m experiments.first_screen --check  # exit 1 where a block differs from the tables

Sources are cited by their public identity: the Count01 paper is arXiv 2502.06923, "Do Attention Heads Compete
or Cooperate during Counting?"; the SkipPair post is "An OV-Coherent Toy Model of Attention Head Superposition".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "results"
BEGIN = "<!-- answers: written by python -m experiments.first_screen from docs/results/cooperation/ -->"
END = "<!-- /answers -->"
WORDS = 40
# where each answer's evidence is, from the repository root
EVIDENCE = {
    "count01": "docs/results/cooperation.md#1-count01-a-pseudo-ensemble-or-heads-that-solve-the-task-only-in-conjunction",
    "compete": "docs/results/cooperation.md#3-compete-which-heads-push-against-the-answer",
    "skip_pair": "docs/results/cooperation.md#2-skippair-superposition-or-a-division-of-labour",
}
SAME = "same function on the counts (pseudo-ensemble)"


def sentences(results: Path = RESULTS) -> list[tuple[str, str, str]]:
    """[(source, the answer in one sentence, evidence key)] from the answer tables."""
    folder = results / "cooperation"
    answer = pd.read_csv(folder / "count01_answer.csv")
    one = answer[answer.layers == 1]
    same = int((one.function_word == SAME).sum())
    open_ = int(one.function_word.isin(["undetermined", "not measurable"]).sum())
    lead = "yes" if same > len(one) / 2 else "no" if len(one) - same - open_ >= len(one) / 2 else "undetermined"
    noisy = one[one.noise_cos_min < 0.9]
    count01 = (f"on the counts, {lead}: the same function in {same} of {len(one)} one-layer models"
               + (f", {open_} undetermined" if open_ else "") + ", by counterfactual edits of the counts, the noise "
               "token apart" + (f" (weighed differently in {len(noisy)})" if len(noisy) else "") + ".")  # fmt: skip
    mech = pd.read_csv(folder / "count01_mechanisms.csv")
    fam = mech[(mech.metric == "accuracy") & (mech.how == "family")]
    heads = int((fam.heads_supports + fam.heads_competes + fam.heads_inactive + fam.heads_undetermined).sum())
    competing = int(fam.heads_competes.sum())
    table = pd.read_csv(folder / "count01_heads.csv")
    single = table[(table.how != "family") & (table.role == "competes")]
    compete = (f"cooperate at inference: {competing} of {heads} one-layer heads push against the answer by the family "
               f"vote ({len(single)} under a single ablation alone).")  # fmt: skip
    sp = pd.read_csv(folder / "skip_pair_answer.csv")
    five = sp[sp.d_head == 5].iloc[0]
    holds = min(five.conditional_a, five.conditional_b) >= 0.5
    vote = five.favoured_share if "favoured_share" in sp else five.agreement
    skip = (f"{'yes' if holds else 'no'} by the post's definition: each head's writes depend on a token it does not "
            f"attend to on {five.conditional_a:.0%} / {five.conditional_b:.0%} of the inputs that can show it "
            f"(the ablation vote: {vote:.0%}, short of 90%).") if vote < 0.9 else \
        (f"{'yes' if holds else 'no'} by the post's definition: each head's writes depend on a token it does not "
         f"attend to on {five.conditional_a:.0%} / {five.conditional_b:.0%} of the inputs that can show it.")  # fmt: skip
    return [
        ("Do the heads act as a pseudo-ensemble (arXiv 2502.06923)?", count01, "count01"),
        ("Do they compete or cooperate (the same paper's title)?", compete, "compete"),
        ('Is it superposition ("An OV-Coherent Toy Model of Attention Head Superposition")?', skip, "skip_pair"),
    ]


def block(folder: str, results: Path = RESULTS) -> str:
    """The marked block for a file in `folder` ("" for README.md, "docs/" for docs/index.md): its links relative
    to it."""
    lines = [BEGIN]
    for question, answer, key in sentences(results):
        link = EVIDENCE[key].removeprefix(folder)
        lines.append(f"- **{question}** {answer[0].upper()}{answer[1:]} ([evidence]({link}))")
    return "\n".join(lines + [END])


def words(sentence: str) -> int:
    """The words of an answer sentence, as a reader counts them (a number or a share is one word)."""
    return len(sentence.split())


FILES = {REPO / "README.md": "", REPO / "docs" / "index.md": "docs/"}


def updated(path: Path, folder: str, results: Path = RESULTS) -> str:
    text = path.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{path} has no answers block ({BEGIN} ... {END})")
    head, rest = text.split(BEGIN, 1)
    return head + block(folder, results) + rest.split(END, 1)[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 where a block differs from the tables")
    args = parser.parse_args(argv)
    stale = []
    for path, folder in FILES.items():
        new = updated(path, folder)
        if new != path.read_text(encoding="utf-8"):
            stale.append(path.name)
            if not args.check:
                path.write_text(new, encoding="utf-8")
    print(("stale: " if args.check else "rewrote: ") + (", ".join(stale) or "nothing"))
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
