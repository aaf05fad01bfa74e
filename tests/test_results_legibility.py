"""docs/results/: the summaries can be read (issue 49). No cell of a summary table (the claims table and any
table before the first numbered section) is longer than `CELL_LIMIT` characters; a cut cell sends the reader
to the full text below the table, which holds every reading."""

import re
from pathlib import Path

import pytest

from headcoop.display.pages import CELL_LIMIT, Claim, claims_in_full, claims_table, shorten

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
PAGES = sorted(RESULTS.glob("*.md"))


SUMMARIES = ("## Summary", "## Setup at a glance", "## What the sources ask")


def summary_cells(text: str) -> list[tuple[int, str]]:
    """(line, cell) of every table cell in the page's summary: before the first section, and in the
    sections headed by one of SUMMARIES (the claims table, the setup at a glance, the answers first)."""
    out, inside = [], True
    for number, line in enumerate(text.split("\n"), 1):
        if line.startswith("## "):
            inside = line.startswith(SUMMARIES)
        if inside and line.startswith("|") and not set(line) <= set("|:- "):
            out += [(number, cell.strip()) for cell in line.strip().strip("|").split("|")]
    return out


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_no_summary_cell_is_longer_than_the_limit(page):
    long = [(n, len(c)) for n, c in summary_cells(page.read_text(encoding="utf-8")) if len(c) > CELL_LIMIT]
    assert not long, f"{page.name}: cells over {CELL_LIMIT} characters at (line, length) {long}"


def test_a_long_verdict_is_cut_at_a_clause_and_given_in_full_below():
    reading = "R1, zero ablation: holds [default setup only; threshold not banded: the defaults]"
    full = "typical; " + "; ".join([reading] * 8)
    claim = Claim("1", "heads behave as a pseudo-ensemble", "62% redundant", "typical; favoured: holds.", full)
    short = Claim("2", "a short claim", "3 of 4", "holds")
    cell = claims_table([claim, short]).frame.iloc[0]["verdict"]
    assert cell == "typical; favoured: holds."
    below = claims_in_full([claim, short])
    assert len(below) == 1 and full in below[0] and "62% redundant" in below[0]  # the short claim needs no detail
    cut = shorten(full)
    assert (
        len(cut) <= CELL_LIMIT and cut.endswith("(in full below the table)") and full.startswith(cut.split(" ...")[0])
    )
    assert shorten("fits") == "fits"


def test_summary_cells_sees_a_long_cell():  # the check above can fail
    text = "# t\n\n| a | b |\n|:--|:--|\n| x | " + "y" * (CELL_LIMIT + 1) + " |\n\n## 1. Later\n| " + "z" * 400 + " |\n"
    assert max(len(c) for _, c in summary_cells(text)) == CELL_LIMIT + 1  # the later section is not a summary
    text += "## Summary: claims\n| " + "w" * 500 + " |\n"
    assert max(len(c) for _, c in summary_cells(text)) == 500


ANSWERED = ("cooperation.md", "count01.md", "skip_pair.md", "robustness.md")


@pytest.mark.parametrize("name", ANSWERED)
def test_each_source_page_answers_first_and_its_links_resolve(name):
    """The answers come on the first screen (before the setup and the claims table), and each evidence link
    names a heading that exists on the page it points to."""
    from headcoop.display.pages import anchor

    text = (RESULTS / name).read_text(encoding="utf-8")
    headings = [line for line in text.split("\n") if line.startswith("## ")]
    assert headings[0] == "## What the sources ask and what we found", headings[:2]
    section = text.split("## What the sources ask and what we found", 1)[1].split("\n## ", 1)[0]
    links = re.findall(r"\[evidence\]\(([^)]*)\)", section)
    assert links and len(links) == section.count("**Found:**")
    for link in links:
        page, _, target = link.partition("#")
        shown = (RESULTS / page).read_text(encoding="utf-8") if page else text
        anchors = {anchor(line[3:]) for line in shown.split("\n") if line.startswith("## ")}
        assert "#" + target in anchors, link


def test_anchor_follows_githubs_rule():
    from headcoop.display.pages import anchor

    assert anchor("1. Count01: a pseudo-ensemble, or heads?") == "#1-count01-a-pseudo-ensemble-or-heads"
    assert (
        anchor("3. Compete: which heads push against the answer?") == "#3-compete-which-heads-push-against-the-answer"
    )


@pytest.mark.parametrize("name", ANSWERED)
def test_each_answer_is_at_most_60_words_with_its_details_below(name):
    """Issue 71: the answer on each page is at most 60 words; what it rests on follows as its details."""
    text = (RESULTS / name).read_text(encoding="utf-8")
    section = text.split("## What the sources ask and what we found", 1)[1].split("\n## ", 1)[0]
    for line in section.splitlines():
        if "**Found:**" in line:
            answer = line.split("**Found:** ", 1)[1].rsplit(" ([evidence](", 1)[0]
            assert len(answer.split()) <= 60, (name, len(answer.split()), answer)


def test_the_first_screen_answers_each_source_in_one_sentence_in_step_with_the_tables():
    """README.md and docs/index.md answer each source's question in at most 40 words, with its number, from the
    tables the pages read (`python -m experiments.first_screen` writes them; --check fails where they differ)."""
    from experiments import first_screen

    for question, answer, _ in first_screen.sentences():
        assert first_screen.words(answer) <= first_screen.WORDS, (question, answer)
        assert re.search(r"\d", answer), answer
    for path, folder in first_screen.FILES.items():
        assert first_screen.updated(path, folder) == path.read_text(encoding="utf-8"), path
    assert "arXiv 2502.06923" in first_screen.block("")
