"""A result's text as a notebook shows it (issue 77, item 2): at most 10 lines of at most 110 characters, table
cells cut to 80, the whole text and every reason one call away."""

from __future__ import annotations

import re
from html import unescape

import pytest

import headcoop as hc
from headcoop.display.plot import brief


@pytest.fixture(scope="module")
def coop():
    return hc.cooperation(hc.planted("mixed"), n=64, draws=1, progress=False)


def test_a_long_result_shows_ten_short_lines_and_says_where_the_rest_is(coop):
    assert len(repr(coop)) > 1500  # the whole text, one call away
    html = coop._repr_html_()
    shown = unescape(re.search(r"<pre>(.*?)</pre>", html, re.S).group(1)).splitlines()
    assert len(shown) <= 10 and max(len(line) for line in shown) <= 110
    assert "print(repr(result))" in shown[-1] and shown[-2].startswith("Cooperation(")
    cells = [unescape(c) for c in re.findall(r"<td>(.*?)</td>", html, re.S)]
    assert cells and max(len(c) for c in cells) <= 80
    assert "every reason whole" in html


def test_brief_keeps_a_short_text_whole():
    assert brief("one line") == "one line"
    text = "\n".join(f"line {i}" for i in range(10))
    assert brief(text) == text
    eleven = brief("\n".join(f"line {i}" for i in range(11)))
    shown = eleven.splitlines()  # the last paragraph's first line (a result's header) is kept
    assert shown[:8] == [f"line {i}" for i in range(8)] and shown[8] == "line 10" and "2 more lines" in shown[9]


def test_a_terminal_ipython_prints_the_brief_text(coop, capsys, monkeypatch):
    import headcoop.display.plot as plot

    monkeypatch.setattr(plot, "in_kernel", lambda: False)
    coop._ipython_display_()
    printed = capsys.readouterr().out.strip().splitlines()
    assert 1 < len(printed) <= 10
