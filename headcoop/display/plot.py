"""Plot helpers shared by every analysis: plotly figures, never shown. A rendering leaf: numpy and plotly only.

`heatmap` and `bar` hold the styling in one place; analysis results call them from their `.plot()`.
Every figure uses the one `headcoop` plotly template registered here (simple_white, with visible
reference lines). circuitsvis attention views live in `headcoop.display.views`.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio

TEMPLATE = "headcoop"
# simple_white draws shapes (add_vline / add_hline reference lines) with width 0: give them a width.
pio.templates[TEMPLATE] = go.layout.Template(
    pio.templates["simple_white"],
    layout=dict(shapedefaults=dict(line=dict(width=1.5, color="#555"))),
)


# a result's text as a notebook shows it: at most MAX_LINES lines of WIDTH characters, the rest one call away
WIDTH, MAX_LINES = 110, 10
CELL = 80  # a table cell's text in a preview: longer reasons are cut, whole in to_dataframe()


def brief(text: str, width: int = WIDTH, max_lines: int = MAX_LINES) -> str:
    """`text` wrapped at `width` and cut to `max_lines` lines, the last saying how to read the rest; a text of
    several paragraphs keeps the first line of its last one (a result's one-line header, e.g. "Cooperation(")."""
    paragraphs = [textwrap.wrap(p, width=width, break_long_words=False, break_on_hyphens=False) or [""]
                  for p in text.splitlines()]  # fmt: skip
    lines = [line for wrapped in paragraphs for line in wrapped]
    if len(lines) <= max_lines:
        return "\n".join(lines)
    header = paragraphs[-1][0] if len(paragraphs) > 1 else None
    kept = lines[: max_lines - 1 - (header is not None)]
    rest = len(lines) - len(kept) - (header is not None)
    return "\n".join(
        kept
        + ([header] if header is not None else [])
        + [
            f"... {rest} more lines: print(repr(result)) shows them all; result.to_dataframe() has every row with its reasons"
        ]
    )


def cut(value, limit: int = CELL):
    """A table cell for a preview: text longer than `limit` cut with an ellipsis, anything else as it is."""
    if isinstance(value, str) and len(value) > limit:
        return value[: limit - 1].rstrip() + "…"
    return value


class Displayed:
    """What every analysis result shares: as the last expression of a Jupyter cell it shows its short repr,
    a compact table (`to_dataframe()`, the first rows) and its figure (`plot()`), the figure through plotly's
    own renderer (in a classic notebook its offline mode, which sends plotly.js once per kernel; in
    JupyterLab and VS Code the plotly mimetype their front ends draw); elsewhere, the repr.
    Analysis results inherit it through `headcoop.storage.results.Result`, which adds `save(path)`."""

    display_rows = 12

    def to_dataframe(self):
        """The result's table (each result class defines it)."""
        raise NotImplementedError

    def plot(self):
        """The result's figure (each result class defines it)."""
        raise NotImplementedError

    def _repr_html_(self) -> str:
        """The repr (at most 10 lines, `brief`) and the first rows of the table as HTML, long text cells cut
        (the figure is `plot()`; the whole text and table are one call away)."""
        import html

        frame = self.to_dataframe()
        preview = frame.head(self.display_rows)
        preview = preview.apply(lambda column: column.map(cut)) if len(preview) else preview
        shown = preview.to_html(float_format=lambda v: f"{v:.4g}", max_cols=12)
        more = (
            f"<p>{len(frame)} rows; <code>.to_dataframe()</code> has them all, with every reason whole</p>"
            if len(frame) > self.display_rows or not preview.equals(frame.head(self.display_rows))
            else ""
        )
        return f"<div><pre>{html.escape(brief(repr(self)))}</pre>{shown}{more}</div>"

    def _ipython_display_(self) -> None:
        """In a Jupyter kernel: the repr and table (`_repr_html_`), then the figure through plotly's renderer."""
        from IPython.display import display

        if not in_kernel():  # a terminal IPython: plotly's default renderer would open a browser
            print(brief(repr(self)))
            return
        display({"text/html": self._repr_html_(), "text/plain": brief(repr(self))}, raw=True)
        display(self.plot())


def notebook_renderer() -> str | None:
    """In a Jupyter kernel, make plotly's default renderer one whose figures survive export: plotly 7 picks
    "plotly_mimetype" there, which JupyterLab and VS Code draw but `jupyter nbconvert --to html` drops (every
    figure vanishes from the exported page). "plotly_mimetype+notebook" keeps the mimetype and adds the notebook
    HTML, with plotly.js inlined once per kernel (offline). Left alone where the user chose one (the
    PLOTLY_RENDERER variable, or any default other than plotly's own in a kernel). Returns the renderer set, or
    None."""
    if not in_kernel() or os.environ.get("PLOTLY_RENDERER") or pio.renderers.default != "plotly_mimetype":
        return None
    pio.renderers.default = "plotly_mimetype+notebook"
    return pio.renderers.default


def in_kernel() -> bool:
    """Whether this process is a Jupyter kernel (where plotly's renderer draws in the notebook)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


def _to_numpy(values) -> np.ndarray:
    if hasattr(values, "detach"):  # a torch tensor, without importing torch here
        values = values.detach().float().cpu().numpy()
    return np.asarray(values, dtype=float)


def heatmap(
    z,
    x: Sequence | None = None,
    y: Sequence | None = None,
    title: str = "",
    zmid: float | None = 0.0,
    colorscale: str = "RdBu",
    xlabel: str = "",
    ylabel: str = "",
) -> go.Figure:
    """A plotly heatmap of a 2-D array-like `z` [len(y), len(x)] (row i is y[i], column j is x[j]).

    `x`/`y` label the columns/rows (default 0..n-1; labels are shown as categories, in order, top row
    first). `zmid` centres a diverging colorscale (None: plotly picks the range); "RdBu" is drawn
    reversed so positive is red and negative blue. NaN entries are left blank. Returns a go.Figure.
    """
    z = _to_numpy(z)
    if z.ndim != 2:
        raise ValueError(f"heatmap needs a 2-D array, got shape {z.shape}")
    x = [str(v) for v in (range(z.shape[1]) if x is None else x)]
    y = [str(v) for v in (range(z.shape[0]) if y is None else y)]
    if len(x) != z.shape[1] or len(y) != z.shape[0]:
        raise ValueError(f"labels ({len(y)} rows, {len(x)} columns) do not match the array shape {z.shape}")
    # Duplicate labels would merge categories; make them unique but keep their text recognisable.
    x, y = _unique(x), _unique(y)
    # Reversed colour scale so positive is red, negative is blue.
    trace = go.Heatmap(z=z, x=x, y=y, colorscale=colorscale, reversescale=colorscale == "RdBu", zmid=zmid)
    fig = go.Figure(trace)
    title, top = wrapped_title(title)
    fig.update_layout(title=title, xaxis_title=xlabel, yaxis_title=ylabel, template=TEMPLATE, margin=dict(t=top))
    fig.update_xaxes(type="category", **crowded_ticks(x))
    fig.update_yaxes(type="category", autorange="reversed", automargin=True)
    return fig


def crowded_ticks(labels: Sequence[str], width_px: int = 700) -> dict:
    """x-axis settings that keep tick labels from overlapping: slanted (and room made for them) when the labels,
    side by side, would be wider than the plot (about 7 px a character)."""
    if sum(len(str(label)) + 1 for label in labels) * 7 <= width_px:
        return {}
    return dict(tickangle=-45, automargin=True)


def bar(values, labels: Sequence, title: str = "", ylabel: str = "", xlabel: str = "", error=None) -> go.Figure:
    """A plotly bar chart of a 1-D array-like `values` [n] labelled by `labels` [n] (optional `error` bars [n])."""
    values = _to_numpy(values)
    if values.ndim != 1 or len(labels) != len(values):
        raise ValueError(f"bar needs 1-D values matching {len(labels)} labels, got shape {values.shape}")
    error_y = None if error is None else dict(type="data", array=_to_numpy(error))
    fig = go.Figure(go.Bar(x=_unique([str(v) for v in labels]), y=values, error_y=error_y))
    fig.update_layout(title=title, xaxis_title=xlabel, yaxis_title=ylabel, template=TEMPLATE)
    fig.update_xaxes(type="category")
    return fig


def save_figure(
    fig: go.Figure, folder: Path, name: str, png: bool = True, width: int = 900, height: int = 600, scale: float = 1.0
) -> list[str]:
    """Write folder/name.html (plotly.js from its CDN; the div id is `name`, so rerunning rewrites nothing that
    did not change) and, when `png` and kaleido can export here, folder/name.png. Returns the file names written;
    a failed PNG export is reported and skipped."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    fig.write_html(folder / f"{name}.html", include_plotlyjs="cdn", div_id=name)
    written = [f"{name}.html"]
    if not png:
        return written
    if os.path.exists("/usr/bin/chromium"):
        os.environ.setdefault("BROWSER_PATH", "/usr/bin/chromium")  # kaleido 1.x drives a Chromium
    try:
        fig.write_image(folder / f"{name}.png", width=width, height=height, scale=scale)
        written.append(f"{name}.png")
    except Exception as error:  # kaleido missing or no browser: HTML only
        print(f"  (PNG export of {name} failed: {type(error).__name__}: {str(error)[:120]}; HTML only)")
    return written


def wrapped_title(title: str, width: int = 70) -> tuple[str, int]:
    """`title` with its `<sup>` subtitle (the stated assumptions) broken into lines of at most `width`
    characters, and the top margin in pixels those lines need, so no line is cut off or overlaps the plot."""
    head, sep, sub = title.partition("<br><sup>")
    if not sep:
        return title, 80
    lines = textwrap.wrap(sub.removesuffix("</sup>"), width) or [""]
    return head + "".join(f"<br><sup>{line}</sup>" for line in lines), 80 + 18 * len(lines)


def _unique(labels: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        n = seen.get(label, 0)
        seen[label] = n + 1
        out.append(label if n == 0 else f"{label} ({n})")
    return out


notebook_renderer()  # on import: figures drawn after `import headcoop` survive a notebook's export
