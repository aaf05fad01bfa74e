"""The figures of cooperation.md (issue 49), each written as HTML and PNG into docs/results/cooperation/:
the same-computation evidence for the shipped Count01 model (every head's per-input push against the
string's evidence, and their pairwise correlations), and the pair words of the SkipPair checkpoints per
ablation. `python -m experiments.cooperation.figures` redraws them (seconds)."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

import headcoop as hc
from headcoop.display.plot import TEMPLATE, save_figure

OUT = Path(__file__).resolve().parents[2] / "docs" / "results" / "cooperation"


@torch.no_grad()
def count01_same(out: Path = OUT, n: int = 512, seed: int = 3) -> dict:
    """The shipped Count01 model's heads' pushes on logit('5') - logit('4') at '=' (their direct logit
    contributions) against the string's share of '1' minus its share of '0', and the heads' pairwise
    Pearson r over the strings; heads `hc.cooperation` counts as active drawn in colour. Returns the
    numbers the page quotes (r_min over active heads, the active heads)."""
    model, task = hc.load("count01"), hc.Count01()
    batch = task.sample(n, seed=seed)
    four, five = (task.vocab.index(t) for t in ("4", "5"))
    dla = hc.dla(model, batch.tokens, pos=batch.answer_pos).heads()[:, 0]  # [batch, head, vocab]
    push = (dla[..., five] - dla[..., four]).double().numpy()  # [batch, head]
    tokens = batch.tokens.numpy()
    ones, zeros = (tokens == task.vocab.index("1")).sum(1), (tokens == task.vocab.index("0")).sum(1)
    evidence = (ones - zeros) / np.maximum(ones + zeros, 1)
    same = hc.cooperation(model, inputs=batch, how="zero", max_exact=2).same
    active = same.active.to_numpy()
    names = list(same.index)
    r = np.corrcoef(push.T)
    fig = make_subplots(rows=1, cols=2, column_widths=[0.55, 0.45], horizontal_spacing=0.12,
                        subplot_titles=("each head's push against the evidence", "pairwise r of the pushes (active heads; scale 0.8-1)"))  # fmt: skip
    order = np.argsort(evidence)
    for h, name in enumerate(names):
        fig.add_trace(go.Scatter(x=evidence[order], y=push[order, h], mode="markers", name=name,
                                 marker=dict(size=4, color=None if active[h] else "lightgrey"),
                                 showlegend=False), row=1, col=1)  # fmt: skip
    shown = [i for i in range(len(names)) if active[i]]
    fig.add_trace(go.Heatmap(z=r[np.ix_(shown, shown)], x=[names[i] for i in shown], y=[names[i] for i in shown],
                             zmin=0.8, zmax=1, colorscale="Viridis", colorbar=dict(title="r"),
                             hovertemplate="%{y} with %{x}: r = %{z:.3f}<extra></extra>"), row=1, col=2)  # fmt: skip
    upper = r[np.ix_(shown, shown)][np.triu_indices(len(shown), 1)]
    fig.update_layout(template=TEMPLATE, title=f"Count01 (shipped): {len(shown)} heads push as one function, r >= "
                      f"{upper.min():.3f}<br><sup>direct logit contributions at '=' (final norm's scale as run), "
                      f"{n} strings; grey: heads hc.cooperation counts as inactive</sup>", height=520)  # fmt: skip
    fig.update_xaxes(title_text="share of '1' minus share of '0'", row=1, col=1)
    fig.update_yaxes(title_text="push on logit('5') - logit('4')", row=1, col=1)
    save_figure(fig, out, "count01_same", width=1100, height=520)
    return dict(r_min=float(upper.min()), active=len(shown))


def count01_pairs(out: Path = OUT, n: int = 512, seed: int = 3) -> dict:
    """Every pair of the shipped Count01 model's heads: the word the default `hc.cooperation` call gives it
    (colour) and the share of the votes its most common word has (the cell's text), on 512 fixed strings."""
    model, task = hc.load("count01"), hc.Count01()
    pairs = hc.cooperation(model, inputs=task.sample(n, seed=seed), max_exact=2).pairs
    heads = sorted(
        set(pairs.head_a) | set(pairs.head_b), key=lambda h: (int(h[1 : h.index("H")]), int(h[h.index("H") + 1 :]))
    )
    index = {h: i for i, h in enumerate(heads)}
    words = [w for w in WORD_ORDER if w in set(pairs.mechanism)]
    code = np.full((len(heads), len(heads)), np.nan)
    text = np.full((len(heads), len(heads)), "", dtype=object)
    for row in pairs.itertuples():
        i, j = index[row.head_a], index[row.head_b]
        for a, b in ((i, j), (j, i)):
            code[a, b] = words.index(row.mechanism)
            text[a, b] = f"{row.agreement:.0%}"
    palette = [
        "#1f77b4",
        "#2ca02c",
        "#ff7f0e",
        "#9467bd",
        "#8c564b",
        "#d62728",
        "#7f7f7f",
        "#bcbd22",
        "#cccccc",
        "#17becf",
    ]
    scale = []
    for k, _ in enumerate(words):  # a stepped colour scale: one flat band per word
        lo, hi = k / len(words), (k + 1) / len(words)
        scale += [[lo, palette[WORD_ORDER.index(words[k])]], [hi, palette[WORD_ORDER.index(words[k])]]]
    fig = go.Figure(go.Heatmap(z=code, x=heads, y=heads, text=text, texttemplate="%{text}", colorscale=scale,
                               zmin=-0.5, zmax=len(words) - 0.5, textfont=dict(size=8),
                               colorbar=dict(tickvals=list(range(len(words))), ticktext=words, title="word"),
                               hovertemplate="%{y} & %{x}: %{text} of the votes<extra></extra>"))  # fmt: skip
    counts = pairs.mechanism.value_counts()
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(template=TEMPLATE, height=700, width=800,
                      title="Count01 (shipped): the word of every pair of heads, with the share of votes<br><sup>"
                      + ", ".join(f"{w} {int(counts[w])}" for w in words) + f" of {len(pairs)} pairs; the default "
                      "reading family; a cell: the share of the votes of the pair's most common reading, undetermined included; a word stands "
                      "at 90%</sup>")  # fmt: skip
    save_figure(fig, out, "count01_pairs", width=800, height=700)
    return {w: int(counts[w]) for w in words}


WORD_ORDER = ("superposition", "redundant", "division", "conjunction", "composition", "competition", "not testable",
              "inactive", "undetermined", "cannot see")  # fmt: skip


def skip_pair_words(out: Path = OUT, draws: int = 4) -> dict:
    """The pair word of each shipped SkipPair checkpoint under every reading of the default family, as shares
    per ablation kind: a bar per (model, ablation), stacked by word, with the 90% a word needs marked."""
    fig = go.Figure()
    labels, shares, counted = [], {w: [] for w in WORD_ORDER}, {}
    for name in ("skip-pair", "skip-pair-dhead1"):
        result = hc.cooperation(hc.load(name), draws=draws)
        how = dict(zip(result.readings.reading, result.readings.how))  # reading label -> ablation kind
        said = result.words.iloc[0].replace({"unseen": "cannot see"})  # the pair's word per reading
        counted[name] = len(said)
        for kind in dict.fromkeys(how.values()):
            part = said[[label for label in said.index if how[label] == kind]]
            labels.append(f"{name}<br>{kind}")
            counts = part.value_counts(normalize=True)
            for w in WORD_ORDER:
                shares[w].append(float(counts.get(w, 0.0)))
    for w in WORD_ORDER:
        if any(shares[w]):
            fig.add_trace(go.Bar(name=w, x=labels, y=shares[w]))
    fig.add_hline(
        y=0.9, line_dash="dot", annotation_text="a word needs 90% of the votes", annotation_position="bottom left"
    )
    fig.update_layout(template=TEMPLATE, barmode="stack", yaxis_title="share of the kind's readings", yaxis_range=[0, 1],
                      title="SkipPair checkpoints: the pair's word under each reading, per ablation kind<br><sup>"
                      "accuracy on the task's mechanism inputs; every reference draw and threshold reading of the "
                      "default family</sup>")  # fmt: skip
    save_figure(fig, out, "skip_pair_words", width=900, height=520)
    return counted


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    print(count01_same(args.out), count01_pairs(args.out), skip_pair_words(args.out))
