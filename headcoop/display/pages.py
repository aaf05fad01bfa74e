"""Pages as data, rendered by templates: the rendering layer's page model (pandas, plotly, Jinja2).

A page is a list of `Section`s; a section is a title and blocks (`Text`, `Table`, `Figure`, `FigureFile`,
`Html`, `Details`) plus the `Claim`s it checks. Sections never build markup: the Jinja2 templates shipped
in `headcoop/templates/` do, with autoescaping for HTML (`report.html.j2`, CSS in `report.css`) and plain
text for markdown (`results.md.j2`, which the experiment pages extend). Markdown tables come from
`DataFrame.to_markdown`, HTML tables from `DataFrame.to_html`.

    render("results.md.j2", title=..., intro=..., sections=[Section("1. Accuracy", (Text("..."), Table(df)))])
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import jinja2
import numpy as np
import pandas as pd
from markupsafe import Markup

TEMPLATES = Path(__file__).parents[1] / "templates"  # headcoop/templates


def fmt(x: Any, digits: int = 3) -> str:
    """A number for tables and prose: ints as ints, floats with `digits` decimals (scientific beyond
    1e4 or below 1e-3), NaN and None as "n/a", strings unchanged."""
    if isinstance(x, str):
        return x
    if isinstance(x, (bool, np.bool_)):
        return str(bool(x))
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    x = float(x)
    if x != 0 and (abs(x) >= 1e4 or abs(x) < 1e-3):
        return f"{x:.{digits - 1}e}"
    return f"{x:.{digits}f}"


@dataclasses.dataclass(frozen=True)
class Text:
    """A paragraph written by headcoop: markdown on markdown pages, an HTML fragment (trusted) on HTML pages."""

    text: str
    note: bool = True  # HTML: a <p class="note"> paragraph; False: the fragment brings its own element
    kind: ClassVar[str] = "text"

    @property
    def markup(self) -> Markup:
        return Markup(self.text)


@dataclasses.dataclass(frozen=True)
class Code:
    """Preformatted text from outside headcoop's code (a docstring): always escaped."""

    text: str
    kind: ClassVar[str] = "code"


MAX_CELL = 300  # characters a table cell shows on a page; the table's CSV keeps the whole text


def clip(text: str, limit: int = MAX_CELL) -> str:
    """`text` cut to `limit` characters at a word boundary, ending in " ... (in full in the CSV)" where cut."""
    text = str(text)
    if len(text) <= limit:
        return text
    tail = " ... (in full in the CSV)"
    return text[: limit - len(tail)].rsplit(" ", 1)[0] + tail


@dataclasses.dataclass(frozen=True)
class Table:
    """A pandas table; `cell` formats every value (default `fmt` with `digits`), `index` keeps the index."""

    frame: pd.DataFrame
    digits: int = 3
    index: bool = False
    cell: Callable[[Any], str] | None = None
    kind: ClassVar[str] = "table"

    def formatted(self) -> pd.DataFrame:
        """The frame with every cell as the string it is shown as, at most `MAX_CELL` characters (`clip`)."""
        cell = self.cell or (lambda v: fmt(v, self.digits))
        frame = self.frame.copy()
        frame.columns = [str(c) for c in frame.columns]
        return frame.astype(object).apply(lambda column: column.map(lambda v: clip(cell(v))))

    def markdown(self) -> str:
        """A GitHub (pipe) markdown table, numeric columns right-aligned."""
        align = ["right" if pd.api.types.is_numeric_dtype(self.frame[c]) else "left" for c in self.frame.columns]
        if self.index:
            align.insert(0, "left")
        return self.formatted().to_markdown(index=self.index, tablefmt="pipe", disable_numparse=True, colalign=align)

    def html(self) -> Markup:
        """An HTML table (class `hc`); cells escaped."""
        return Markup(self.formatted().to_html(classes="hc", border=0, index=self.index, escape=True))


@dataclasses.dataclass(frozen=True)
class Figure:
    """A plotly figure drawn on an HTML page, `height` (and `width`, else the page's) in pixels."""

    figure: Any  # plotly.graph_objects.Figure
    height: int = 420
    width: int | None = None
    kind: ClassVar[str] = "figure"


@dataclasses.dataclass(frozen=True)
class FigureFile:
    """A figure written next to a markdown page: `folder/name.png` (when `png`) and `folder/name.html`."""

    name: str
    caption: str
    folder: str = "."
    png: bool = True
    kind: ClassVar[str] = "figure_file"


@dataclasses.dataclass(frozen=True)
class Html:
    """Markup built by a trusted renderer (circuitsvis views) and the module script that draws it."""

    markup: str
    script: str = ""
    kind: ClassVar[str] = "html"


@dataclasses.dataclass(frozen=True)
class Details:
    """Blocks in a collapsible <details> element, shown side by side (HTML pages)."""

    summary: str
    blocks: tuple = ()
    open: bool = False
    kind: ClassVar[str] = "details"


@dataclasses.dataclass(frozen=True)
class Claim:
    """One claim of a source beside what was measured: `source` is the source's words, quoted exactly (a
    verdict tests no more than they say), `measured` the numbers, `verdict` the reading in one sentence (the
    favoured reading's verdict and what flips it), `detail` every reading in full (shown below the summary
    table; "" when `verdict` says it all), `section` where the page shows the evidence."""

    section: str
    source: str
    measured: str
    verdict: str
    detail: str = ""


@dataclasses.dataclass(frozen=True)
class Answer:
    """A source's question and what we found, for a page's first screen: `source` names it, `question` is
    its words (quoted exactly), `answer` one or two plain sentences with the key number, `link` the anchor
    of the evidence on the page (or another page's path); `details`: what the answer rests on, below it."""

    source: str
    question: str
    answer: str
    link: str
    details: str = ""


def anchor(title: str) -> str:
    """The link anchor GitHub's markdown gives a heading: lower case, punctuation dropped, spaces as '-'."""
    return "#" + re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


@dataclasses.dataclass(frozen=True)
class Section:
    """One part of a page: a title (with an `anchor` for links), its blocks, and the claims it checks."""

    title: str
    blocks: tuple = ()
    anchor: str = ""
    claims: tuple[Claim, ...] = ()


CELL_LIMIT = 300  # characters in a summary table's cell (issue 49: a verdict cell is one sentence)


def shorten(text: str, limit: int = CELL_LIMIT, more: str = " ... (in full below the table)") -> str:
    """`text` if it fits in `limit` characters, else its longest prefix ending at a "; " or ". " boundary
    that fits with `more` appended (a hard cut at a word when no boundary fits)."""
    if len(text) <= limit:
        return text
    room = limit - len(more)
    cut = max(text.rfind("; ", 0, room), text.rfind(". ", 0, room))
    if cut <= 0:
        cut = text.rfind(" ", 0, room)
    return text[: cut if cut > 0 else room].rstrip(" ;.,") + more


def claims_table(claims: Sequence[Claim], source_name: str = "source") -> Table:
    """The claims as one table (section, the `source_name` says, measured here, verdict), every cell at
    most CELL_LIMIT characters: a longer measurement or verdict is cut at a clause and given in full by
    `claims_in_full` below the table."""
    frame = pd.DataFrame(
        [(c.section, c.source, shorten(c.measured), shorten(c.verdict)) for c in claims],
        columns=["section", f"the {source_name} says", "measured here", "verdict"],
    )
    return Table(frame)


def claims_in_full(claims: Sequence[Claim]) -> list[str]:
    """One markdown bullet per claim whose summary row was cut or has a `detail`: the measurement and
    every reading's verdict in full."""
    out = []
    for c in claims:
        verdict = c.detail or c.verdict
        if verdict == c.verdict and shorten(c.measured) == c.measured and shorten(c.verdict) == c.verdict:
            continue
        out.append(f'- **{c.section}, "{c.source}"**: measured: {c.measured}. Every reading: {verdict}')
    return out


def environment(*folders: str | Path) -> jinja2.Environment:
    """A Jinja2 environment reading `folders` then headcoop's templates; HTML templates autoescape."""
    loader = jinja2.FileSystemLoader([*map(str, folders), str(TEMPLATES)])
    env = jinja2.Environment(
        loader=loader,
        autoescape=jinja2.select_autoescape(["html", "html.j2"]),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.globals.update(fmt=fmt, claims_table=claims_table, claims_in_full=claims_in_full, anchor=anchor)
    return env


def render(template: str, *folders: str | Path, **context: Any) -> str:
    """Render `template` (found in `folders`, then headcoop's templates) with `context`; a markdown
    template's output has runs of blank lines folded into one."""
    text = environment(*folders).get_template(template).render(**context)
    if template.endswith(".md.j2"):
        text = re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"
    return text


def stylesheet() -> str:
    """The report's CSS (headcoop/templates/report.css)."""
    return (TEMPLATES / "report.css").read_text(encoding="utf-8")
