"""Q-, K- and V-composition scores between heads of different layers (Elhage et al. 2021), from
TransformerLens's `all_composition_scores`: static, weights-only evidence of which later head reads which
earlier head's output (causal evidence: `hc.patch`, `hc.interactions`).

The score of a sender head A (layer a) and a receiver head B (layer b > a) is
||W_OV^A W^B|| / (||W_OV^A|| ||W^B||) (Frobenius norms), with W^B = W_QK^B for Q-composition, its
transpose for K, W_OV^B for V. A model with LayerNorm / RMSNorm is scored on a copy with the norm weights
folded into the following weights (`process_weights_(fold_ln=True)`), as the paper's analysis does; the
norm's per-input scale is not part of any weight and is left out (stated in `assumptions`). Rotary
positions rotate q and k per position pair and are left out of Q/K scores too.
"""

from __future__ import annotations

import copy
import dataclasses

import pandas as pd
import plotly.graph_objects as go
import torch

from headcoop.analysis.engine.inputs import check_choice, require_model
from headcoop.analysis.vocabulary import MODES, Mode, head_name
from headcoop.checks import check_finite
from headcoop.models.bridge import is_bridge
from headcoop.models.tl import HookedTransformer
from headcoop.storage.results import Result


@dataclasses.dataclass(frozen=True, repr=False)
class CompositionScores(Result):
    """scores: {mode: [layer, head, layer, head]} (sender first; zero unless the receiver's layer is later);
    heads: names in (layer, head) order; assumptions: what the scores leave out, in words."""

    scores: dict
    n_layers: int
    n_heads: int
    assumptions: tuple[str, ...] = ()

    def to_dataframe(self) -> pd.DataFrame:
        """One row per (sender, receiver in a later layer, mode): sender, receiver, mode, score."""
        rows = []
        for mode, s in self.scores.items():
            for a in range(self.n_layers):
                for b in range(a + 1, self.n_layers):
                    for i in range(self.n_heads):
                        for j in range(self.n_heads):
                            rows.append(dict(sender=head_name(a, i), receiver=head_name(b, j), mode=mode,
                                             score=float(s[a, i, b, j])))  # fmt: skip
        return pd.DataFrame(rows, columns=["sender", "receiver", "mode", "score"])

    def plot(self, title: str | None = None) -> go.Figure:
        """One heatmap per mode: senders (rows) x receivers in later layers (columns)."""
        from plotly.subplots import make_subplots

        from headcoop.display.plot import TEMPLATE

        modes = list(self.scores)
        fig = make_subplots(rows=1, cols=len(modes), subplot_titles=[f"{m}-composition" for m in modes])
        frame = self.to_dataframe()
        top = float(frame.score.max()) if len(frame) else 1.0
        for col, mode in enumerate(modes, 1):  # one colour scale for every panel: equal colours, equal scores
            part = frame[frame["mode"] == mode].pivot(index="sender", columns="receiver", values="score")
            fig.add_heatmap(z=part.to_numpy(), x=list(part.columns), y=list(part.index), coloraxis="coloraxis",
                            row=1, col=col)  # fmt: skip
            fig.update_yaxes(autorange="reversed", row=1, col=col)
        fig.update_layout(coloraxis=dict(colorscale="Viridis", cmin=0, cmax=top or 1.0, colorbar=dict(title="score")))
        held = "<br><sup>" + "; ".join(self.assumptions) + "</sup>" if self.assumptions else ""
        fig.update_layout(title=(title or "Composition scores (weights only)") + held, template=TEMPLATE)
        return fig

    def __repr__(self) -> str:
        frame = self.to_dataframe()
        top = frame.sort_values("score", ascending=False).head(3)
        shown = "; ".join(f"{r.sender}->{r.receiver} {r['mode']} {r.score:.3f}" for _, r in top.iterrows())
        held = f"; {'; '.join(self.assumptions)}" if self.assumptions else ""
        return f"CompositionScores({len(frame)} pairs x modes; strongest: {shown or 'none (one layer)'}{held})"


def _refuse_silent_heads(model: HookedTransformer) -> None:
    """ValueError naming heads whose OV or QK circuit is zero: their composition scores divide by a zero norm
    (NaN), so no score could say anything about them."""
    ov = model.OV.AB.flatten(-2).norm(dim=-1)  # [layer, head]
    qk = model.QK.AB.flatten(-2).norm(dim=-1)
    silent = [head_name(a, b) for a, b in ((ov == 0) | (qk == 0)).nonzero().tolist()]
    if silent:
        raise ValueError(
            f"composition: heads {silent} have a zero OV or QK circuit (W_V W_O or W_Q W_K^T is all zeros), so "
            "their composition scores are 0/0; remove those heads' zeroing, or compare the other heads' weights directly"
        )


@torch.no_grad()
def composition(model: HookedTransformer, mode: Mode | None = None) -> CompositionScores:
    """Q-, K- and V-composition scores of every head pair across layers (module docstring); `mode` picks one
    ("Q", "K" or "V"), None all three."""
    require_model(model, "composition")
    check_finite(model, "hc.composition")
    modes = MODES if mode is None else (check_choice("mode", mode, MODES),)
    scored = model
    assumptions = []
    if is_bridge(model):  # compatibility mode has folded the norm weights already
        assumptions.append("norm weights folded in (the Bridge's compatibility mode); each input's norm scale left out")
    elif model.cfg.normalization_type in ("LN", "RMS"):
        scored = copy.deepcopy(model)
        scored.process_weights_(fold_ln=True, center_writing_weights=False, center_unembed=False)
        assumptions.append("norm weights folded in; each input's norm scale left out")
    elif model.cfg.normalization_type in ("LNPre", "RMSPre"):
        assumptions.append("each input's norm scale left out")
    if model.cfg.positional_embedding_type == "rotary":
        assumptions.append("rotary rotation of q and k left out")
    _refuse_silent_heads(scored)
    scores = {m: scored.all_composition_scores(m).detach().float().cpu() for m in modes}
    return CompositionScores(scores=scores, n_layers=model.cfg.n_layers, n_heads=model.cfg.n_heads,
                             assumptions=tuple(assumptions))  # fmt: skip
