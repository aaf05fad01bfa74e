"""SkipPair figures (plotly, never shown): QK preferences, conditional and per-pair logit contributions of
the shipped-style models, and the capacity, split-attention and ordering pictures of a table of runs
(one row per model, as `experiments/skip_pair` writes runs.csv)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from headcoop.display.plot import TEMPLATE
from headcoop.studies import skip_pair as M
from headcoop.tasks.skip_pair import PAIRS, SIGNAL, SkipPair


def completion_labels(task: SkipPair) -> list[str]:
    return [f"{{{a},{b}}}→{task.mapping[(a, b)]}" for a, b in PAIRS]


def qk_figure(models: dict) -> go.Figure:
    """QK score from the read-off token 0 to each signal key, per head, per shipped model."""
    fig = make_subplots(1, len(models), subplot_titles=list(models))
    for col, (name, model) in enumerate(models.items(), 1):
        scores = M.read_off_scores(model)
        for h in range(scores.shape[0]):
            order = ">".join(map(str, M.preference_order(model, h)))
            fig.add_bar(x=[str(t) for t in SIGNAL], y=scores[h].numpy(), name=f"{name} H{h}: {order}", row=1, col=col)
        fig.update_xaxes(title_text="key (signal token)", type="category", row=1, col=col)
    fig.update_yaxes(title_text="QK score from read-off 0", row=1, col=1)
    fig.update_layout(title="Attention scores from '0' to each signal token for each head", template=TEMPLATE,
                      barmode="group")  # fmt: skip
    return fig


def conditional_figure(model, name: str) -> go.Figure:
    """Each head's OV logit effect on every completion (columns) given it attends to a signal token
    (rows, most preferred first); boxes mark the completions consistent with the head's ordering."""
    task = model.task
    contrib = M.conditional_contributions(model).numpy()  # [head, 4, 10]
    labels = completion_labels(task)
    n_heads = contrib.shape[0]
    fig = make_subplots(1, n_heads, subplot_titles=[f"H{h}" for h in range(n_heads)], horizontal_spacing=0.12)
    zmax = float(np.abs(contrib).max())
    for h in range(n_heads):
        order = M.preference_order(model, h)
        rows = [SIGNAL.index(t) for t in order]
        z = contrib[h, rows]
        marks = [["■" if j in M.consistent_completions(order, t) else "" for j in range(len(PAIRS))] for t in order]
        text = [[f"{z[i, j]:.1f}{marks[i][j]}" for j in range(len(PAIRS))] for i in range(len(order))]
        fig.add_heatmap(z=z, x=labels, y=[f"attends {t} (rank {r + 1})" for r, t in enumerate(order)], text=text,
                        texttemplate="%{text}", colorscale="RdBu", reversescale=True, zmid=0, zmin=-zmax, zmax=zmax,
                        showscale=h == n_heads - 1, row=1, col=h + 1)  # fmt: skip
        fig.update_yaxes(autorange="reversed", type="category", row=1, col=h + 1)
        fig.update_xaxes(title_text="completion of pair", type="category", row=1, col=h + 1)
    fig.update_layout(
        title=f"{name}: logit contribution of each head to each pair's completion, conditional on the attended "
        "signal token<br><sup>OV effect of attending fully to the token; ■: completion consistent with the head's "
        "preference ordering</sup>",
        template=TEMPLATE, font=dict(size=10),
    )  # fmt: skip
    return fig


def pair_figure(model, name: str) -> go.Figure:
    """Each head's DLA on every completion (centered over the 10 completions), averaged over all contexts
    of each pair type (rows); '+' marks completions pushed up by that head, ★ by every head."""
    contrib = M.pair_contributions(model)
    centered = (contrib - contrib.mean(-1, keepdim=True)).numpy()
    up = M.pushed_up(contrib, centered=True)
    both = up.all(1)
    labels = completion_labels(model.task)
    rows = [f"{{{a},{b}}}" for a, b in PAIRS]
    n_heads = centered.shape[1]
    fig = make_subplots(1, n_heads, subplot_titles=[f"H{h}" for h in range(n_heads)], horizontal_spacing=0.12)
    zmax = float(np.abs(centered).max())
    for h in range(n_heads):
        n = len(PAIRS)
        text = [[("★" if both[p, c] else "+" if up[p, h, c] else "") for c in range(n)] for p in range(n)]
        fig.add_heatmap(z=centered[:, h], x=labels, y=rows, text=text, texttemplate="%{text}", colorscale="RdBu",
                        reversescale=True, zmid=0, zmin=-zmax, zmax=zmax, showscale=h == n_heads - 1,
                        row=1, col=h + 1)  # fmt: skip
        fig.update_yaxes(autorange="reversed", type="category", title_text="pair type in the context",
                         row=1, col=h + 1)  # fmt: skip
        fig.update_xaxes(title_text="completion", type="category", row=1, col=h + 1)
    fig.update_layout(
        title=f"{name}: mean direct contribution of each head per pair type<br><sup>hc.dla averaged over all "
        "contexts of the pair type, centered over the 10 completions; + pushed up by this head, ★ by every head</sup>",
        template=TEMPLATE, font=dict(size=10),
    )  # fmt: skip
    return fig


def capacity_figure(runs: pd.DataFrame) -> go.Figure:
    """Fraction of seeds right on every signal input, and mean signal accuracy, per (n_heads, d_head)."""
    grid = runs.groupby(["n_heads", "d_head"]).agg(solved=("signal_all", "mean"), acc=("signal_acc", "mean"),
                                                   n=("seed", "count")).reset_index()  # fmt: skip
    fig = make_subplots(1, 2, subplot_titles=["fraction of seeds at 100% signal accuracy", "mean signal accuracy"])
    for col, key, fmt in ((1, "solved", "{:.2f}"), (2, "acc", "{:.3f}")):
        piv = grid.pivot(index="n_heads", columns="d_head", values=key)
        n = grid.pivot(index="n_heads", columns="d_head", values="n")
        text = [[fmt.format(v) + f" (n={int(k)})" for v, k in zip(r, kr)] for r, kr in zip(piv.values, n.values)]
        fig.add_heatmap(z=piv.values, x=[str(c) for c in piv.columns], y=[str(i) for i in piv.index], text=text,
                        texttemplate="%{text}", colorscale="Viridis", zmin=0, zmax=1, showscale=col == 2,
                        row=1, col=col)  # fmt: skip
        fig.update_xaxes(title_text="d_head", type="category", row=1, col=col)
        fig.update_yaxes(title_text="n_heads", type="category", row=1, col=col)
    fig.update_layout(title="Capacity map: SkipPair accuracy over n_heads x d_head", template=TEMPLATE)
    return fig


def split_figure(runs: pd.DataFrame) -> go.Figure:
    """Per model against d_head: how many of the 6 distinct signal pairs a head splits (mean over heads), and the
    largest split value over heads and pairs; split = min(p_a, p_b) / (p_a + p_b) at the read-off."""
    fig = make_subplots(1, 2, subplot_titles=["pairs split per head (split > 0.1), of 6",
                                              "max split over heads and pairs"])  # fmt: skip
    colours = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"]
    for i, (h, part) in enumerate(runs.groupby("n_heads")):
        for col, key in ((1, "split_pairs"), (2, "split_max")):
            fig.add_box(x=part.d_head.astype(str), y=part[key], name=f"{h} head(s)", boxpoints="all", jitter=0.4,
                        marker_color=colours[i % 4], legendgroup=str(h), showlegend=col == 1,
                        row=1, col=col)  # fmt: skip
    fig.add_hline(y=0.1, line_dash="dot", line_color="black", annotation_text="threshold 0.1", row=1, col=2)
    fig.update_xaxes(title_text="d_head", type="category")
    fig.update_layout(title="Split attention between two distinct signal tokens, against d_head", boxmode="group",
                      template=TEMPLATE)  # fmt: skip
    return fig


def relation_figure(runs: pd.DataFrame) -> go.Figure:
    """How the two heads' orderings relate, per d_head, over the 2-head seeds."""
    two = runs[runs.n_heads == 2]
    counts = two.groupby(["d_head", "relation"]).size().unstack(fill_value=0)
    fig = go.Figure()
    for kind in M.ORDERING_KINDS:
        if kind in counts:
            fig.add_bar(x=counts.index.astype(str), y=counts[kind], name=kind)
    fig.update_layout(title="2-head models: relation between the heads' preference orderings", barmode="stack",
                      xaxis_title="d_head", yaxis_title="seeds", template=TEMPLATE)  # fmt: skip
    return fig
