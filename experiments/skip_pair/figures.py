"""The SkipPair reproduction's figure files: HTML always, PNG when kaleido can export (the figures
themselves are built by headcoop.studies.skip_pair_figures)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

import headcoop as hc
from headcoop.display.plot import save_figure
from headcoop.studies.skip_pair_figures import (
    capacity_figure,
    conditional_figure,
    pair_figure,
    qk_figure,
    relation_figure,
    split_figure,
)  # fmt: skip

SHIPPED = ("skip-pair", "skip-pair-dhead1")
PNG = True  # run_all --no-png turns PNG export off


def save(fig: go.Figure, folder: Path, name: str, width: int = 1000, height: int = 500) -> list[str]:
    """NAME.html and, unless run_all --no-png, NAME.png (at 1.5x); the files written."""
    return save_figure(fig, folder, name, png=PNG, width=width, height=height, scale=1.5)


def write_all(folder: Path, runs: pd.DataFrame, shipped: pd.DataFrame) -> list[str]:
    """Every figure of the reproduction into `folder`; returns the file names."""
    models = {name: hc.load(name) for name in SHIPPED}
    written = save(qk_figure(models), folder, "qk_scores", height=450)
    for name, model in models.items():
        written += save(conditional_figure(model, name), folder, f"conditional_contributions_{name}", 1300, 450)
        written += save(pair_figure(model, name), folder, f"pair_contributions_{name}", 1300, 550)
    written += save(capacity_figure(runs), folder, "capacity_map", 1100, 450)
    written += save(split_figure(runs), folder, "split_attention", 1300, 450)
    written += save(relation_figure(runs), folder, "orderings_by_d_head", 800, 450)
    return written
