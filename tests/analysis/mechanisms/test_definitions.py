"""The definitions the results pages print are generated from the code's rule objects (issue 49): the
committed page holds them verbatim, and a change to a threshold, a rule or a word's source changes them."""

from pathlib import Path

from headcoop.analysis.mechanisms import definitions as defs
from headcoop.analysis.mechanisms import words
from headcoop.analysis.mechanisms.references import KINDS

PAGE = Path(__file__).resolve().parents[3] / "docs" / "results" / "cooperation.md"


def test_the_page_holds_the_codes_definitions_verbatim():
    page = PAGE.read_text(encoding="utf-8")
    assert defs.definitions() in page
    assert defs.definitions() in (PAGE.parent / "planted.md").read_text(encoding="utf-8")
    assert "AND on at least half" not in page  # the earlier instrument's superposition rule, no longer run


def test_every_rule_threshold_ablation_and_word_is_defined():
    rules = defs.rules()
    text = defs.definitions()
    assert len(rules) == 7 and rules[0].startswith('"unseen"') and rules[-1].startswith("otherwise")
    assert "*unseen* (an abstention" in text and '"unseen"' not in text  # our terms in italics, not quotes
    for word in words.MECHANISMS:
        assert f'"{word}"' in " ".join(rules), word
    assert set(words.THRESHOLD_MEANINGS) == set(words.THRESHOLDS)
    assert set(defs.ABLATION_MEANINGS) == set(KINDS)
    for name, value in words.THRESHOLDS.items():
        assert f"`{name}` = {value:g}: {words.THRESHOLD_MEANINGS[name]}" in text
    for word, source in words.WORD_SOURCES.items():
        assert f"*{word}*: {defs.as_terms(source)}" in text


def test_a_changed_threshold_or_vote_share_changes_the_definitions(monkeypatch):
    before = defs.definitions()
    assert "at least 90% of the votes" in before and "x0.5 and x2" in before
    assert "at least 80% of the votes" in defs.definitions(agree=0.8)
    monkeypatch.setitem(words.THRESHOLDS, "role", 0.2)
    after = defs.definitions()
    assert "`role` = 0.2:" in after and after != before
    assert after not in PAGE.read_text(
        encoding="utf-8"
    )  # the page would then be stale, and this test's first check fail
