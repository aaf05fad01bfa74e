"""Plot helpers shared by every analysis: plotly figures (never shown) and the circuitsvis attention view.

`heatmap` and `bar` hold the styling in one place; analysis results call them from their `.plot()`.
`attention` renders circuitsvis's AttentionHeads view with the JavaScript bundle inlined, so it works
with no network (circuitsvis itself puts a CDN import in `str(view)` and probes google.com to decide).
"""

from __future__ import annotations

import html
import json
import os
import uuid
from collections.abc import Sequence
from pathlib import Path

import circuitsvis
import numpy as np
import plotly.graph_objects as go
import torch
from circuitsvis.utils.convert_props import convert_props
from circuitsvis.utils.render import RenderedHTML
from transformer_lens import HookedTransformer
from transformer_lens.utilities import get_act_name

from headcoop.analysis.common import as_tokens, check_layer, head_names, require_task, token_labels
from headcoop.tasks.base import Batch


def _to_numpy(values) -> np.ndarray:
    if isinstance(values, torch.Tensor):
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
    fig.update_layout(title=title, xaxis_title=xlabel, yaxis_title=ylabel, template="simple_white")
    fig.update_xaxes(type="category")
    fig.update_yaxes(type="category", autorange="reversed")
    return fig


def bar(values, labels: Sequence, title: str = "", ylabel: str = "", xlabel: str = "", error=None) -> go.Figure:
    """A plotly bar chart of a 1-D array-like `values` [n] labelled by `labels` [n] (optional `error` bars [n])."""
    values = _to_numpy(values)
    if values.ndim != 1 or len(labels) != len(values):
        raise ValueError(f"bar needs 1-D values matching {len(labels)} labels, got shape {values.shape}")
    error_y = None if error is None else dict(type="data", array=_to_numpy(error))
    fig = go.Figure(go.Bar(x=_unique([str(v) for v in labels]), y=values, error_y=error_y))
    fig.update_layout(title=title, xaxis_title=xlabel, yaxis_title=ylabel, template="simple_white")
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


def _unique(labels: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        n = seen.get(label, 0)
        seen[label] = n + 1
        out.append(label if n == 0 else f"{label} ({n})")
    return out


# --- circuitsvis attention view -------------------------------------------------------------------------

_BUNDLE = Path(circuitsvis.__file__).parent / "dist" / "cdn" / "iife.js"


class AttentionView(RenderedHTML):
    """Self-contained HTML (circuitsvis bundle inlined): Jupyter renders it, `str()` gives the same HTML,
    `save(path)` writes a standalone page. Never touches the network."""

    def __init__(self, source: str):
        super().__init__(local_src=source, cdn_src=source)

    def _repr_html_(self) -> str:
        return self.local_src

    def __html__(self) -> str:
        return self.local_src

    def __str__(self) -> str:
        return self.local_src

    def save(self, path: str | Path) -> Path:
        """Write a standalone HTML page; returns the path."""
        path = Path(path)
        head = "<!DOCTYPE html>\n<html><head><meta charset='utf-8'></head><body>\n"
        path.write_text(f"{head}{self.local_src}\n</body></html>\n", encoding="utf-8")
        return path


def _offline_html(views: list[tuple[str, dict]]) -> str:
    """One div per (heading, AttentionHeads props) and a single script: the bundle, then one render each."""
    bundle = _BUNDLE.read_text(encoding="utf-8").replace("</script>", "")
    divs, calls = [], []
    for heading, props in views:
        div_id = "circuits-vis-" + uuid.uuid4().hex[:13]
        divs.append(f"<h4 style='margin: 10px 0 0 0;'>{html.escape(heading)}</h4>")
        divs.append(f"<div id='{div_id}' style='margin: 15px 0;'></div>")
        js_props = convert_props(props).replace("</", "<\\/")
        calls.append(f"CircuitsVis.render({json.dumps(div_id)}, CircuitsVis.AttentionHeads, {js_props});")
    script = "\n".join([bundle, *calls])
    return "\n".join(divs) + f'\n<script crossorigin type="module">\n{script}\n</script>'


@torch.no_grad()
def attention(
    model: HookedTransformer,
    tokens=None,
    layer: int = 0,
    example: int = 0,
    max_examples: int = 1,
    trim: bool = True,
) -> AttentionView:
    """circuitsvis AttentionHeads view of every head of `layer`, labelled with the task's token strings
    and head names ("L0H3"), for examples `example` .. `example + max_examples - 1` of `tokens`.

    tokens: a Batch, text(s) or [batch, pos] / [pos] ids; default the task's clean patching batch.
    trim:   for a Batch, cut each example after its last loss position (drops right padding).
    Only the shown examples are run through the model (patterns [head, q_pos, k_pos] each).
    Renders offline: the returned AttentionView's HTML holds the JS bundle and no CDN URL.
    """
    layer = check_layer(model, layer)
    if tokens is None:
        tokens = require_task(model, "tokens").patching_inputs()[0]
    ids = as_tokens(model, tokens)
    n = ids.shape[0]
    if not isinstance(example, int) or not -n <= example < n:
        raise IndexError(f"example {example!r} is out of range: there are examples 0..{n - 1}")
    if not isinstance(max_examples, int) or max_examples < 1:
        raise ValueError(f"max_examples must be a positive int, got {max_examples!r}")
    rows = list(range(example % n, min(example % n + max_examples, n)))
    ends = [ids.shape[1]] * len(rows)
    if trim and isinstance(tokens, Batch):
        ends = [int(tokens.loss_pos[r].max()) + 1 for r in rows]
    name = get_act_name("pattern", layer)
    _, cache = model.run_with_cache(ids[rows], names_filter=lambda hook: hook == name)
    patterns = cache[name]  # [example, head, q_pos, k_pos]
    names = [h for h in head_names(model) if h.startswith(f"L{layer}H")]
    views = []
    for i, (row, end) in enumerate(zip(rows, ends)):
        labels = token_labels(model, ids[row, :end])
        props = dict(
            attention=patterns[i, :, :end, :end].float().cpu(),
            tokens=labels,
            attentionHeadNames=names,
            maskUpperTri=model.cfg.attention_dir == "causal",
        )
        views.append((f"layer {layer}, example {row}: {' '.join(labels)}", props))
    return AttentionView(_offline_html(views))
