"""Plot helpers shared by every analysis: plotly figures (never shown) and the circuitsvis attention view.

`heatmap` and `bar` hold the styling in one place; analysis results call them from their `.plot()`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
import torch


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
    first). `zmid` centres a diverging colorscale (None: plotly picks the range). Returns a go.Figure.
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


def _unique(labels: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        n = seen.get(label, 0)
        seen[label] = n + 1
        out.append(label if n == 0 else f"{label} ({n})")
    return out
