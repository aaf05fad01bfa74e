"""The result of `hc.pair_map`: every pair's interaction, the pairs that matter named, the misses bounded."""

from __future__ import annotations

import dataclasses
import re

import pandas as pd
import plotly.graph_objects as go
import torch
from jaxtyping import Float
from torch import Tensor

from headcoop.storage.results import Result

WORD_COLOURS = {"redundant": "#1f77b4", "conjunction": "#d62728", "competition": "#ff7f0e", "composition": "#2ca02c",
                "division": "#9467bd", "superposition": "#8c564b", "independent": "#7f7f7f"}  # fmt: skip
BACKUP, AGAINST, TOGETHER = ("redundant",), ("competition",), ("conjunction", "composition")


def relative(interaction: float, effect_i: float, effect_j: float, pair: float) -> float:
    """I_ij over the largest of |pair|, |effect_i|, |effect_j| (NaN when all are 0)."""
    scale = max(abs(pair), abs(effect_i), abs(effect_j))
    return interaction / scale if scale > 0 else float("nan")


def _layer(name: str) -> int:
    found = re.match(r"L(\d+)H", name)
    if found is None:
        raise ValueError(f"{name!r} is not a head name like 'L3H5'")
    return int(found.group(1))


@dataclasses.dataclass(frozen=True, repr=False)
class PairMap(Result):
    """Every pair of heads' interaction (`headcoop.analysis.pairs.compute`).

    heads: names; interaction [head, head] I_ij (NaN where not computed exactly: the screen's unverified
    pairs), pair_effect [head, head] v(all but i, j) - v(all), effect [head] v(all but i) - v(all), v_full;
    estimate [head, head]: the screen's I^ (None when exact); exact: every pair computed; missed: the miss
    bound ({} when exact); threshold_share: a pair interacts when |I| >= threshold_share x max |effect|;
    named: the strongest interacting pairs with hc.cooperation's word, agreement, what flips it (flips_under)
    and the heads' roles; metric,
    how, ablation (in words), method (the path in words), cost {coalitions, pairs, passes, predicted_exact_s,
    seconds, screen_runs}.
    """

    heads: tuple[str, ...]
    interaction: Float[Tensor, "head head"]
    pair_effect: Float[Tensor, "head head"]
    effect: Float[Tensor, " head"]
    v_full: float
    estimate: Float[Tensor, "head head"] | None
    exact: bool
    missed: dict
    threshold_share: float
    metric: str
    how: str
    ablation: str
    method: str
    cost: dict
    named: pd.DataFrame

    display_rows = 16

    def __post_init__(self) -> None:  # a PairMap made or loaded whole: its matrices are its heads'
        k = len(self.heads)
        shapes = {"interaction": (k, k), "pair_effect": (k, k), "effect": (k,)}
        if self.estimate is not None:
            shapes["estimate"] = (k, k)
        for name, shape in shapes.items():
            value = getattr(self, name)
            if not isinstance(value, Tensor) or tuple(value.shape) != shape:
                got = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
                raise ValueError(f"a PairMap of {k} heads needs {name} of shape {list(shape)}, got {got} (a saved map "
                                 f"whose head list and matrices disagree is damaged)")  # fmt: skip

    @property
    def threshold(self) -> float:
        """The interaction a pair must reach to count: threshold_share x the largest single |effect|."""
        return self.threshold_share * float(self.effect.abs().max())

    def to_dataframe(self) -> pd.DataFrame:
        """One row per exactly computed pair, strongest |interaction| first: head_a, head_b, interaction,
        relative (I over the largest of |pair_effect|, |effect_a|, |effect_b|), effect_a, effect_b,
        pair_effect, interacts (|I| >= threshold), estimate (the screen's, NaN when exact), and the named
        pairs' word, agreement and roles."""
        rows = []
        k, threshold = len(self.heads), self.threshold
        for i in range(k):
            for j in range(i + 1, k):
                value = float(self.interaction[i, j])
                if value != value:  # NaN: not computed exactly
                    continue
                a, b, both = float(self.effect[i]), float(self.effect[j]), float(self.pair_effect[i, j])
                rows.append(dict(head_a=self.heads[i], head_b=self.heads[j], interaction=value,
                                 relative=relative(value, a, b, both), effect_a=a, effect_b=b,
                                 pair_effect=both, interacts=abs(value) >= threshold and abs(value) > 0,
                                 estimate=float("nan") if self.estimate is None else float(self.estimate[i, j])))  # fmt: skip
        frame = pd.DataFrame(rows)
        if frame.empty:
            return frame
        frame = frame.iloc[frame.interaction.abs().argsort(kind="stable")[::-1]].reset_index(drop=True)
        if not self.named.empty:
            words = self.named[["head_a", "head_b", "word", "agreement", "flips_under", "role_a", "role_b"]]
            frame = frame.merge(words, on=["head_a", "head_b"], how="left")
        return frame

    def interacting(self) -> pd.DataFrame:
        """The pairs whose |interaction| reaches the threshold (`to_dataframe` rows)."""
        frame = self.to_dataframe()
        return frame[frame.interacts] if not frame.empty else frame

    def with_words(self, model, inputs, reference, named: int, seed: int = 0) -> "PairMap":
        """This map with its `named` strongest interacting pairs read by `hc.cooperation` (the reading
        family: zero, mean and resample; its word, the share of readings that agree, the heads' roles)."""
        from headcoop.analysis.mechanisms.cooperation import cooperation

        rows = []
        read_on = self.metric if self.metric in ("accuracy", "logit_diff", "prob", "loss") else "accuracy"
        for row in self.interacting().head(named).itertuples():
            coop = cooperation(model, inputs=inputs, heads=[row.head_a, row.head_b], reference=reference,
                               metric=read_on, draws=1, seed=seed, progress=False)  # fmt: skip
            pair = coop.to_dataframe().iloc[0]
            rows.append(dict(head_a=row.head_a, head_b=row.head_b, interaction=row.interaction, relative=row.relative,
                             word=pair.mechanism, agreement=float(pair.agreement), flips_under=pair.flips_under,
                             reason=pair.reason,
                             role_a=coop.roles[row.head_a], role_b=coop.roles[row.head_b],
                             read_on=read_on if read_on == self.metric else
                             f"accuracy (the map's metric, {self.metric}, gives one number per batch)"))  # fmt: skip
        return dataclasses.replace(self, named=pd.DataFrame(rows))

    def _strongest(self, words: tuple[str, ...], count: int = 3) -> str:
        if self.named.empty:
            return "none named"
        chosen = self.named[self.named.word.isin(words)].head(count)
        return ", ".join(f"{r.head_a}+{r.head_b} ({r.interaction:+.3g})" for r in chosen.itertuples()) or "none"

    def lines(self) -> list[str]:
        """The result's first lines: how many pairs interact, the strongest backups, competitors and
        conjunctions (hc.cooperation's words), and the miss bound."""
        k, frame = len(self.heads), self.to_dataframe()
        computed = len(frame)
        above = int(frame.interacts.sum()) if computed else 0
        where = "of all" if self.exact else f"of the {computed:,} computed exactly"
        out = [f"PairMap({k} heads, {k * (k - 1) // 2:,} pairs, {self.metric}, {self.how} ablation): {above} pairs "
               f"{where} interact (|I| >= {self.threshold:.3g} = {self.threshold_share:.0%} of the largest single "
               f"head's effect)"]  # fmt: skip
        out.append(f"backups (redundant): {self._strongest(BACKUP)}; competitors: {self._strongest(AGAINST)}; "
                   f"conjunctions and compositions: {self._strongest(TOGETHER)}")  # fmt: skip
        if not self.named.empty and "read_on" in self.named and str(self.named.read_on.iloc[0]) != self.metric:
            out.append(f"the named pairs' words are read on {self.named.read_on.iloc[0]}")
        if self.exact:
            out.append("misses: none possible (every pair computed exactly)")
        elif self.missed:
            m = self.missed
            out.append(f"misses: {m['above']} of {m['sampled']} sampled screened-out pairs exceed the verified top's "
                       f"smallest |I| ({m['threshold']:.3g}): about {m['estimate']:.0f} of {m['rest']:,} pairs "
                       f"missed, at most {m['high']:.0f} (95%)")  # fmt: skip
        else:
            out.append("misses: not bounded (no pair was sampled beyond the verified top)")
        out.append(f"{self.method}; {self.ablation}; {self.cost['coalitions']:,} coalitions, "
                   f"{self.cost['passes']:.0f} forward-pass equivalents, {self.cost['seconds']:.0f} s")  # fmt: skip
        return out

    def __repr__(self) -> str:
        return "\n".join(self.lines())

    def plot(self, title: str | None = None) -> go.Figure:
        """A heads x heads heatmap of I_ij (layer boundaries marked; hover: the pair's numbers and word)."""
        from headcoop.display.plot import TEMPLATE, wrapped_title

        k = len(self.heads)
        z = self.interaction.clone()
        words = {}
        for row in self.named.itertuples() if not self.named.empty else ():
            words[(row.head_a, row.head_b)] = words[(row.head_b, row.head_a)] = f"{row.word} ({row.agreement:.0%})"
        text = [[(f"{self.heads[i]} & {self.heads[j]}: I = {float(z[i, j]):+.4g}, alone {float(self.effect[i]):+.3g} / "
                  f"{float(self.effect[j]):+.3g}, both {float(self.pair_effect[i, j]):+.3g}"
                  + (f"; {words[(self.heads[i], self.heads[j])]}" if (self.heads[i], self.heads[j]) in words else ""))
                 if i != j else self.heads[i] for j in range(k)] for i in range(k)]  # fmt: skip
        span = float(torch.nan_to_num(z, nan=0.0).abs().max()) or 1.0
        fig = go.Figure(go.Heatmap(z=z.numpy(), x=list(self.heads), y=list(self.heads), text=text,
                                   hoverinfo="text", colorscale="RdBu", reversescale=True, zmid=0,
                                   zmin=-span, zmax=span, colorbar=dict(title="I")))  # fmt: skip
        layers = [_layer(h) for h in self.heads]
        for at in [i for i in range(1, k) if layers[i] != layers[i - 1]]:
            fig.add_shape(
                type="line", x0=at - 0.5, x1=at - 0.5, y0=-0.5, y1=k - 0.5, line=dict(width=0.6, color="#444")
            )
            fig.add_shape(
                type="line", y0=at - 0.5, y1=at - 0.5, x0=-0.5, x1=k - 0.5, line=dict(width=0.6, color="#444")
            )
        how = "exact" if self.exact else "exact where computed; the rest screened out (blank)"
        text_title, top = wrapped_title(title or f"Pair interactions I = both removed - each alone ({self.metric}, "
                                        f"{self.how} ablation, {how})")  # fmt: skip
        fig.update_layout(title=text_title, template=TEMPLATE, margin=dict(t=top), width=720, height=700)
        fig.update_xaxes(type="category", showticklabels=k <= 48)
        fig.update_yaxes(type="category", autorange="reversed", showticklabels=k <= 48)
        return fig

    def graph(self, title: str | None = None) -> go.Figure:
        """The named pairs as a graph: heads at (layer, head), an edge per named pair coloured by its word."""
        from headcoop.display.plot import TEMPLATE, wrapped_title

        fig = go.Figure()
        if self.named.empty:
            fig.update_layout(title="No pair named (none reaches the threshold)", template=TEMPLATE)
            return fig
        place = {h: (_layer(h), int(h.split("H")[1])) for h in set(self.named.head_a) | set(self.named.head_b)}
        for word, group in self.named.groupby("word"):
            xs, ys = [], []
            for row in group.itertuples():
                (xa, ya), (xb, yb) = place[row.head_a], place[row.head_b]
                xs += [xa, xb, None]
                ys += [ya, yb, None]
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name=str(word),
                                     line=dict(color=WORD_COLOURS.get(str(word), "#bbbbbb"), width=3)))  # fmt: skip
        names = sorted(place)
        fig.add_trace(go.Scatter(x=[place[h][0] for h in names], y=[place[h][1] for h in names], mode="markers+text",
                                 text=names, textposition="top center", marker=dict(size=10, color="#222"),
                                 showlegend=False, hoverinfo="text"))  # fmt: skip
        text_title, top = wrapped_title(title or f"Named pairs: hc.cooperation's word for the {len(self.named)} "
                                        "strongest interacting pairs")  # fmt: skip
        fig.update_layout(title=text_title, template=TEMPLATE, margin=dict(t=top), xaxis_title="layer",
                          yaxis_title="head")  # fmt: skip
        return fig


__all__ = ["PairMap", "relative"]
