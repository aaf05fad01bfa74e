"""The claims tables quote their sources word for word: every `the ... says` entry of the Count01 and
SkipPair pages appears verbatim in the source document the project works from (../shared/seeds, beside
the repository; the check is skipped where that folder is absent, e.g. in a clone elsewhere)."""

import re
from pathlib import Path

import pytest

from experiments.cooperation.quotes import QUOTES as COOPERATION
from experiments.count01.quotes import QUOTES as COUNT01
from experiments.skip_pair.quotes import QUOTES as SKIP_PAIR

SEEDS = Path(__file__).resolve().parents[2] / "shared" / "seeds"
RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"


@pytest.mark.skipif(not SEEDS.is_dir(), reason=f"the source documents are not at {SEEDS}")
@pytest.mark.parametrize(("quotes", "source"), [
    (COUNT01, "count01-paper-summary.md"), (SKIP_PAIR, "ov-coherent-skip-pair-post.md"),
    *(({key: quote}, source) for key, (quote, source) in COOPERATION.items()),
])  # fmt: skip
def test_every_quote_is_in_its_source(quotes, source):
    text = " ".join((SEEDS / source).read_text(encoding="utf-8").split())
    missing = [key for key, quote in quotes.items() if " ".join(quote.split()) not in text]
    assert not missing, f"not verbatim in {source}: {missing}"


@pytest.mark.parametrize(("quotes", "page"), [(COUNT01, "count01.md"), (SKIP_PAIR, "skip_pair.md"),
                                              ({k: q for k, (q, _) in COOPERATION.items()}, "cooperation.md")])  # fmt: skip
def test_the_pages_show_the_quotes(quotes, page):
    text = (RESULTS / page).read_text(encoding="utf-8")
    assert all(quote in text for quote in quotes.values())


@pytest.mark.skipif(not SEEDS.is_dir(), reason=f"the source documents are not at {SEEDS}")
@pytest.mark.parametrize(("page", "source"), [("count01.md", "count01-paper-summary.md"),
                                              ("skip_pair.md", "ov-coherent-skip-pair-post.md")])  # fmt: skip
def test_setup_tables_quote_their_sources(page, source):
    import re

    text = (RESULTS / page).read_text(encoding="utf-8")
    table = text.split("## Setup at a glance", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[-2] for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    quotes = [q for row in rows[1:] for q in re.findall(r'"([^"]+)"', row)]
    assert len(quotes) >= 3
    source_text = " ".join((SEEDS / source).read_text(encoding="utf-8").split())
    missing = [q for q in quotes if q not in source_text]
    assert not missing, f"not verbatim in {source}: {missing}"


QUOTED = re.compile(r"""(?<![\w'])'([^'\n]{1,300}?)'(?![\w])|"([^"\n]{1,400}?)"|“([^”\n]{1,400}?)”""")


@pytest.mark.skipif(not SEEDS.is_dir(), reason=f"the source documents are not at {SEEDS}")
@pytest.mark.parametrize("page", sorted(p.name for p in RESULTS.glob("*.md")))
def test_every_quoted_phrase_on_the_pages_is_verbatim(page):
    """Every phrase of two words or more in quotation marks (double, single or curly) on a results page,
    prose and tables alike, appears word for word in a source document (case included; runs of whitespace
    count as one space). Code spans are not quotes. A paraphrase has no quotation marks."""
    seeds = " ".join(" ".join(p.read_text(encoding="utf-8").split()) for p in sorted(SEEDS.glob("*.md")))
    text = re.sub(r"`[^`\n]*`", "", (RESULTS / page).read_text(encoding="utf-8"))
    quoted = {next(g for g in m.groups() if g is not None) for m in QUOTED.finditer(text)}
    missing = sorted(q for q in quoted if len(q.split()) >= 2 and " ".join(q.split()) not in seeds)
    assert not missing, f"{page}: quoted but not verbatim in ../shared/seeds: {missing}"


SOURCE_LINE = re.compile(r"^\*\*(Paper|Post)\*\*")
# words a line giving the source's words may use beside its quotes: who says it, where, and the joints
ATTRIBUTION = {
    "paper",
    "post",
    "the",
    "summary",
    "abstract",
    "title",
    "section",
    "quoted",
    "by",
    "its",
    "answer",
    "and",
    "of",
    "in",
    "table",
    "1",
    "6.2",
    "6.1",
}


@pytest.mark.parametrize("page", sorted(p.name for p in RESULTS.glob("*.md")))
def test_source_lines_quote_and_do_not_paraphrase(page):
    """A line that gives the source's words (`**Paper**` / `**Post**`) quotes them: beside its quotation marks it
    holds only attribution (who, where) and joints, so no paraphrase beside the source's name can harden (or
    soften) what the source says; the quotes themselves are checked verbatim by the test above."""
    lines = [line for line in (RESULTS / page).read_text(encoding="utf-8").splitlines() if SOURCE_LINE.match(line)]
    for line in lines:
        rest = re.sub(r"`[^`\n]*`", "", QUOTED.sub(" ", line))
        words = [w for w in re.findall(r"[a-z0-9][\w.']*", rest.lower()) if w not in ATTRIBUTION]
        assert QUOTED.search(line) and not words, (
            f"{page}: paraphrase beside the source's name: {words} in {line[:120]}"
        )
