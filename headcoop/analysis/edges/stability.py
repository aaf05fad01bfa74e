"""How stable a method's circuit is across readings: the same method's top-k circuit recomputed under every
ablation that defines "outside the circuit" (`ABLATIONS`) and every draw of the inputs, with each edge's share
of the readings that select it and the circuit's faithfulness over them (min, median, max).

A reading is (ablation, draw). The edge scores of a reading are `hc.edges(..., direction="noise", how=ablation)`
(the clean run with one edge carrying the ablated value: the reading `hc.faithfulness` ablates by), its circuit
their top k, its faithfulness `hc.faithfulness(..., how=ablation)` of that circuit, on the draw's inputs. Draws:
draw 0 is the inputs as given; draw d > 0 pairs each clean input with a corrupt input of a seeded permutation
(the contrast and the resample reference change; the clean inputs, and so a metric closed over them, do not,
nor does the mean of the corrupt inputs or zero: those readings repeat), or with no inputs given the model's task
draws fresh ones (its patching inputs of seed + d), or the caller gives the draws as a list of (clean, corrupt,
metric).
"""

from __future__ import annotations

import dataclasses
from typing import cast

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch

from headcoop.analysis.edges.faithfulness import Circuit, circuit, faithfulness
from headcoop.analysis.edges.scores import edges
from headcoop.analysis.engine.inputs import as_tokens, check_choice, require_model, require_task
from headcoop.analysis.vocabulary import ABLATIONS, EDGE_ESTIMATORS, EdgeEstimator
from headcoop.checks import check_int, check_seed
from headcoop.display.progress import done, expect, with_progress
from headcoop.models.tl import HookedTransformer
from headcoop.storage.results import Result


@dataclasses.dataclass(frozen=True, repr=False)
class CircuitStability(Result):
    """edges: one row per edge selected in some reading (writer, reader, via, `selected` readings, `share` of
    them); readings: one row per reading (how, draw, faithfulness of its top-k circuit, `not_in_every_reading`: how
    many of its edges some other reading leaves out); curves: the faithfulness of each reading's top edges per circuit size
    (how, draw, edges, fraction, faithfulness); k: the circuit size; estimator: the method."""

    edges: pd.DataFrame
    readings: pd.DataFrame
    curves: pd.DataFrame
    k: int
    estimator: str

    COLUMNS = {"edges": ("writer", "reader", "selected", "share"), "readings": ("how", "draw", "faithfulness"),
               "curves": ("how", "draw", "edges", "fraction", "faithfulness")}  # fmt: skip

    def __post_init__(self):
        """Every field checked (a loaded folder may have been edited): ValueError / TypeError naming it."""
        if isinstance(self.k, bool) or not isinstance(self.k, (int, np.integer)) or self.k < 1:
            raise ValueError(f"CircuitStability.k must be an int >= 1 (the circuit's size), got {self.k!r}")
        if not isinstance(self.estimator, str):
            raise TypeError(f"CircuitStability.estimator must be a method name, got {self.estimator!r}")
        for name, needed in self.COLUMNS.items():
            table = getattr(self, name)
            if not isinstance(table, pd.DataFrame):
                raise TypeError(f"CircuitStability.{name} must be a table (DataFrame), got {type(table).__name__}")
            missing = [c for c in needed if c not in table.columns]
            if missing:
                raise ValueError(f"CircuitStability.{name} lacks the columns {missing} (it has {list(table.columns)[:6]}): "
                                 "the result was built or edited wrongly")  # fmt: skip
        for name in ("readings", "curves"):
            faith = getattr(self, name).faithfulness
            if not pd.api.types.is_numeric_dtype(faith):
                raise TypeError(f"CircuitStability.{name}.faithfulness must hold numbers, got {faith.dtype}")

    @property
    def spread(self) -> dict:
        """The top-k circuit's faithfulness over the readings: min, median, max."""
        f = self.readings.faithfulness
        return dict(min=float(f.min()), median=float(f.median()), max=float(f.max()))

    @property
    def band(self) -> pd.DataFrame:
        """Per circuit size: the faithfulness's min, median and max over the readings."""
        g = self.curves.groupby(["edges", "fraction"]).faithfulness
        return pd.DataFrame(dict(min=g.min(), median=g.median(), max=g.max())).reset_index()

    def to_dataframe(self) -> pd.DataFrame:
        return self.edges.copy()

    def __repr__(self) -> str:
        n = len(self.readings)
        always = int((self.edges.share == 1.0).sum())
        s = self.spread
        faith = self.readings.faithfulness
        if faith.notna().any():
            worst = self.readings.loc[faith.idxmin()]
            said = (f"faithfulness min {s['min']:.3f} ({worst.how}, draw {int(worst.draw)}), median {s['median']:.3f}, "
                    f"max {s['max']:.3f}")  # fmt: skip
        else:  # clean and corrupt score the same: faithfulness (a share of that difference) is undefined
            said = "faithfulness undefined in every reading (the clean and corrupt runs score the same)"
        return (f"CircuitStability({self.estimator} top-{self.k} circuit over {n} readings "
                f"({', '.join(dict.fromkeys(self.readings.how))} x {self.readings.draw.nunique()} draws): "
                f"{always} of its edges selected in every reading, {len(self.edges) - always} in some; {said})")  # fmt: skip

    def plot(self) -> go.Figure:
        """The faithfulness curve's median over the readings with its min-max band, each ablation's first draw
        dotted, and a line at the circuit's size k."""
        b = self.band
        fig = go.Figure()
        fig.add_trace(go.Scatter(x=list(b.fraction) + list(b.fraction[::-1]), y=list(b["max"]) + list(b["min"][::-1]),
                                 fill="toself", fillcolor="rgba(31,119,180,0.2)", line=dict(width=0),
                                 name="min-max over readings", hoverinfo="skip"))  # fmt: skip
        fig.add_trace(go.Scatter(x=b.fraction, y=b["median"], mode="lines+markers", name="median",
                                 line=dict(color="#1f77b4")))  # fmt: skip
        for how in dict.fromkeys(self.readings.how):
            part = self.curves[(self.curves.how == how) & (self.curves.draw == 0)]
            fig.add_trace(go.Scatter(x=part.fraction, y=part.faithfulness, mode="lines", name=f"{how}, draw 0",
                                     line=dict(dash="dot", width=1)))  # fmt: skip
        fig.add_hline(y=1.0, line_dash="dot", line_color="grey")
        at_k = self.curves.fraction[self.curves.edges == self.k]
        if len(at_k):
            fig.add_vline(x=float(at_k.iloc[0]), line_dash="dash", line_color="grey", annotation_text=f"k={self.k}")
        s = self.spread
        fig.update_layout(title=f"Faithfulness of {self.estimator}'s top edges over {len(self.readings)} readings "
                                f"(ablation x draw)<br><sup>top-{self.k} circuit: min {s['min']:.3f}, median "
                                f"{s['median']:.3f}, max {s['max']:.3f}; edge scores and ablation by the same reading "
                                "(noising)</sup>", xaxis_title="fraction of edges kept", yaxis_title="faithfulness")  # fmt: skip
        return fig


def _draws(model, clean, corrupt, metric, draws, seed: int) -> list[tuple]:
    """The readings' inputs: a list of (clean, corrupt, metric)."""
    if isinstance(draws, (list, tuple)):
        if not draws or any(not isinstance(d, (list, tuple)) or len(d) != 3 for d in draws):
            raise ValueError("draws= as a list takes (clean, corrupt, metric) triples, one per draw")
        return [tuple(d) for d in draws]
    n = check_int("draws", draws, 1)
    if clean is None and corrupt is None:  # the model's task: draw d is its patching inputs of seed + d
        task = require_task(model, "hc.circuit_stability's clean and corrupt inputs")
        return [(*task.patching_inputs(seed=seed + d), metric) for d in range(n)]
    if clean is None or corrupt is None:
        raise ValueError("hc.circuit_stability needs clean= and corrupt= (or neither, with a task attached, or "
                         "draws= as (clean, corrupt, metric) triples)")  # fmt: skip
    corrupt_tokens = as_tokens(model, corrupt)
    gen = torch.Generator().manual_seed(seed)
    out = [(clean, corrupt, metric)]
    for _ in range(1, n):
        out.append((clean, corrupt_tokens[torch.randperm(len(corrupt_tokens), generator=gen)], metric))
    return out


@with_progress("hc.circuit_stability", cheaper="fewer draws= or hows= is cheaper")
def circuit_stability(
    model: HookedTransformer,
    clean=None,
    corrupt=None,
    metric=None,
    k: int = 10,
    estimator: EdgeEstimator = "eap",
    hows: tuple[str, ...] = ABLATIONS,
    draws: int | list = 3,
    sizes: list[int] | None = None,
    seed: int = 0,
    progress: bool | None = None,
) -> CircuitStability:
    """The top-k circuit of `estimator` under every reading (ablation in `hows` x input draw; module docstring):
    each edge's share of readings selecting it and the faithfulness's spread. clean, corrupt, metric: as
    `hc.edges`; draws: how many (draw 0 the inputs as given, the others seeded re-pairings of the corrupt inputs)
    or a list of (clean, corrupt, metric); sizes: the curve's circuit sizes (default 0, 1, 2, 4, ... and k).
    Returns a CircuitStability (`.plot()`: the faithfulness curve's median with its min-max band)."""
    require_model(model, "circuit_stability")
    check_choice("estimator", estimator, EDGE_ESTIMATORS)
    if isinstance(hows, str) or not hows:
        raise ValueError(f"hows= is a non-empty list of ablations from {ABLATIONS}, got {hows!r}")
    for how in hows:
        check_choice("hows", how, ABLATIONS)
    k, seed = check_int("k", k, 1), check_seed(seed)
    selected: dict[tuple, int] = {}
    readings, curves = [], []
    inputs = _draws(model, clean, corrupt, metric, draws, seed)
    for d, (c, x, m) in enumerate(inputs):
        for how in hows:
            scores = edges(model, c, x, m, estimator=estimator, direction="noise", how=how, progress=False)
            n_edges = len(scores.frame)
            if k > n_edges:
                raise ValueError(f"k={k} is more than the model's {n_edges} edges")
            top = circuit(scores, k=k)
            for e in top.edges:
                selected[e] = selected.get(e, 0) + 1
            grid = sorted({*(sizes or [2**i for i in range(int(np.log2(n_edges)) + 1)]), k})
            curve = faithfulness(model, scores, c, x, m, how=how, sizes=grid, random=0, progress=False)
            frame = curve.frame
            readings.append(dict(how=how, draw=d, faithfulness=float(frame.faithfulness[frame.edges == k].iloc[0]),
                                 circuit=top))  # fmt: skip
            curves += [dict(how=how, draw=d, edges=int(r.edges), fraction=float(r.fraction),
                            faithfulness=float(r.faithfulness)) for r in frame.itertuples()]  # fmt: skip
            if len(readings) == 1:  # every reading runs alike: the bar's total from the first, so it stops growing
                expect(done() * len(inputs) * len(hows))
    n = len(readings)
    table = pd.DataFrame(
        [dict(writer=w, reader=r, via=v, selected=s, share=s / n) for (w, r, v), s in selected.items()]
    )
    table = table.sort_values(
        ["share", "writer", "reader", "via"], ascending=[False, True, True, True], ignore_index=True
    )
    always = {tuple(e) for e in table[table.share == 1.0][["writer", "reader", "via"]].itertuples(index=False)}
    for r in readings:
        r["not_in_every_reading"] = len(cast(Circuit, r.pop("circuit")).edges - always)
    return CircuitStability(table, pd.DataFrame(readings), pd.DataFrame(curves), k, estimator)


__all__ = ["circuit_stability", "CircuitStability"]
