"""The result of `hc.cooperation`: every pair's word, every head's role, the readings behind them, and the
summary that answers the sources' questions first."""

from __future__ import annotations

import dataclasses

import pandas as pd
import plotly.graph_objects as go
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from headcoop.analysis.mechanisms.words import INPUT_CLASSES, MECHANISMS
from headcoop.storage.results import Result


@dataclasses.dataclass(frozen=True, repr=False)
class Cooperation(Result):
    """The word of every pair of heads and the role of every head, each with the share of readings that
    agree (module docstring).

    pairs: one row per pair (`to_dataframe`); head_table: one row per head; backup: one row per (earlier,
    later) head pair and ablation; readings: one row per reading (its model word and word counts); words:
    [pair, reading] the word of each pair under each reading; roles {head: role}; mechanism and agreement
    (the model's word and its share of readings); shares {word: share of pairs}; metric, how (the primary
    reading, whose evidence `per_input` shows), hows (the family), method; flips and by_ablation (what
    flips the model's word, each ablation's word); input_class [pair, batch] (the primary reading's 2 x 2
    classes), input_multi [pair, batch] (both heads write to several consistent completions) and
    input_superposed [pair, batch] (and the answer is the only one both write to); summary: the first line
    of the repr, what the heads do on the sources' terms; same: one row per head of the same-computation
    axis (push std, whether active, correlation with the other active heads, class weights); same_word:
    "same computation (pseudo-ensemble)", "different subtasks" or why neither can be said; same_numbers:
    {active, r_min, r_median, share (on one direction), push ("direct" or "total (...)")}; function: one row per
    head of the counterfactual-edit axis (`edits.py`: its push, "direct" or "total"; its response to the edits
    of the task's semantic features, whether it decides, its sign, the share of its response that changes with
    where an edit is made, its response to each semantic feature alone, and per substitution, insertion,
    deletion and position); function_word: "same function on <the task's semantics> (pseudo-ensemble)",
    "different functions on ...", "different functions on ... that agree on the task's inputs", "undetermined"
    or "not measurable"; function_numbers: {kind, scope, semantic (the features), deciding heads, edits,
    semantic_edits, inputs, cos_min / cos_median / share (input by input), pooled_cos_min, r_min and share_inputs
    on the task's inputs, position_max, specialised, other: per other feature how alike the heads respond to
    its edits and whether its part could be taken out}."""

    heads: tuple[str, ...]
    pairs: pd.DataFrame
    head_table: pd.DataFrame
    backup: pd.DataFrame
    readings: pd.DataFrame
    words: pd.DataFrame
    compensation: Float[Tensor, "head head"]
    roles: dict
    mechanism: str
    agreement: float
    flips: str
    by_ablation: str
    shares: dict
    metric: str
    how: str
    hows: tuple[str, ...]
    method: str
    thresholds: dict
    agree: float
    v_full: float
    v_empty: float
    input_class: Int[Tensor, "pair batch"]
    input_superposed: Bool[Tensor, "pair batch"]
    input_multi: Bool[Tensor, "pair batch"]
    summary: str = ""
    same: pd.DataFrame | None = None
    same_word: str = ""
    same_numbers: dict | None = None
    function: pd.DataFrame | None = None
    function_word: str = ""
    function_numbers: dict | None = None

    @property
    def threshold(self) -> float:
        """The role threshold (a share of a head's fair share of the heads' absolute effects)."""
        return self.thresholds["role"]

    def per_input(self) -> pd.DataFrame:
        """One row per (pair, input) under the primary reading: head_a, head_b, input, context, class (the
        pair's 2 x 2 game: not_needed, or, and, a_only, b_only, shared, other) and superposed (both heads
        write to several consistent completions and push up only the answer together)."""
        n_pairs, n_inputs = self.input_class.shape
        pairs = self.pairs.loc[self.pairs.index.repeat(n_inputs), ["head_a", "head_b", "context"]].reset_index(
            drop=True
        )
        pairs.insert(2, "input", torch.arange(n_inputs).repeat(n_pairs).numpy())
        pairs["class"] = pd.Categorical.from_codes(self.input_class.flatten().long().numpy(), INPUT_CLASSES)
        pairs["superposed"] = self.input_superposed.flatten().numpy()
        return pairs

    def to_dataframe(self) -> pd.DataFrame:
        """One row per pair: head_a, head_b, mechanism (the word that stands), agreement (share of readings
        giving the pair's most common word), flips_under (the most common word other than "undetermined", its
        share of readings and the group of readings where it holds least), by_ablation (each ablation's most
        common word and its share), reason;
        the primary reading's axes: context, matters, or / and / a_only / b_only / shared (shares of the
        inputs where the pair matters), unseen (the share of those left out: a replacement there does what its
        head does), additive_ld; knife_edge (the groups of readings whose removal alone changes the word, with
        the word and vote without them); shown_a / shown_b (the share of those inputs that can show whether a
        head's writes are conditional: conditional_a / conditional_b are among them); multi, only_answer,
        distributed, rank_a, rank_b (writes and attention); composition (share of the earlier head's effect through the later one);
        interaction (Shapley interaction index, NaN above max_exact heads) and interaction_full."""
        return self.pairs.copy()

    def plot(self, title: str | None = None) -> go.Figure:
        """A heatmap of every pair's word (hover: agreement and reason) with each head's role on the axes."""
        from headcoop.display.plot import TEMPLATE

        n = len(self.heads)
        code = {m: k for k, m in enumerate(MECHANISMS)}
        z: list[list[int | None]] = [[None] * n for _ in range(n)]
        text = [[""] * n for _ in range(n)]
        for row in self.pairs.itertuples():
            i, j = self.heads.index(row.head_a), self.heads.index(row.head_b)
            z[i][j] = z[j][i] = code[row.mechanism]
            text[i][j] = text[j][i] = (f"{row.head_a} & {row.head_b}: {row.mechanism} "
                                       f"({row.agreement:.0%} of readings; {row.reason})")  # fmt: skip
        colours = [
            "#e45756",
            "#4c78a8",
            "#72b7b2",
            "#b279a2",
            "#ff9da6",
            "#f58518",
            "#54a24b",
            "#9d755d",
            "#eeeeee",
            "#bab0ac",
        ]
        scale = []
        for k, colour in enumerate(colours):
            scale += [(k / len(colours), colour), ((k + 1) / len(colours), colour)]
        labels = [f"{h} ({self.roles[h]})" for h in self.heads]
        fig = go.Figure(go.Heatmap(z=z, x=labels, y=labels, text=text, hoverinfo="text", zmin=-0.5,
                                   zmax=len(MECHANISMS) - 0.5, colorscale=scale,
                                   colorbar=dict(tickvals=list(range(len(MECHANISMS))), ticktext=list(MECHANISMS))))  # fmt: skip
        fig.update_yaxes(autorange="reversed", automargin=True)
        fig.update_xaxes(automargin=True)
        fig.update_layout(template=TEMPLATE, margin=dict(l=140), title=title or (
            f"Mechanism of each pair of heads: {self.mechanism} ({self.agreement:.0%} of {len(self.readings)} "
            f"readings; {self.metric})<br><sup>readings: {', '.join(self.hows)} ablation x reference draws x "
            f"threshold bands; direct effects by DLA with the final norm's scale frozen</sup>"))  # fmt: skip
        return fig

    def __repr__(self) -> str:
        counts = self.pairs["mechanism"].value_counts().to_dict()
        shown = ", ".join(f"{counts[m]} {m}" for m in MECHANISMS if m in counts)
        competing = [h for h, r in self.roles.items() if r == "competes"]
        flips = f"; {self.flips}" if self.flips else ""
        return (f"{self.summary}\n" if self.summary else "") + (f"Cooperation({len(self.heads)} heads, {self.metric}: {self.mechanism} in {self.agreement:.0%} of "
                f"{len(self.readings)} readings{flips}; by ablation: {self.by_ablation}; pairs {shown}; competing heads: {', '.join(competing) or 'none'}; "
                f"{self.method}))")  # fmt: skip


__all__ = ["Cooperation"]
