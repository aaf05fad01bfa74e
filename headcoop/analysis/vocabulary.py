"""The analysis layer's vocabulary in one module (as auto-circuit's `types.py`): what a head is and how it is
named, and every choice an analysis takes, each a `Literal` with the tuple of its values beside it.

Every analysis module imports its choices from here, so a name means one thing everywhere: `How` is what
`hc.ablate` does to a head (zero, mean, resample or scale), `AblationHow` how a coalition game replaces an
absent player (zero, mean or resample), and so on. Head names ("L0H3") are built by `head_name` only.
"""

from __future__ import annotations

from typing import Literal, get_args

Head = tuple[int, int]  # (layer, head)


def head_name(layer: int, head: int) -> str:
    """The field's name of a head: 'L{layer}H{head}' ("L0H3")."""
    return f"L{layer}H{head}"


def layer_name(layer: int) -> str:
    """A layer's name: 'L{layer}' ("L1")."""
    return f"L{layer}"


# hc.ablate: what happens to an ablated head's output z
How = Literal["zero", "mean", "resample", "scale"]
HOWS: tuple[str, ...] = get_args(How)
# coalition games (hc.interactions): how a head outside the coalition is replaced
AblationHow = Literal["zero", "mean", "resample"]
ABLATION_HOWS: tuple[str, ...] = get_args(AblationHow)
# which path computes a coalition game's values (the reference: hc.ablate + one forward pass per coalition)
GameMethod = Literal["auto", "linear", "layered", "stacked", "reference"]
GAME_METHODS: tuple[str, ...] = get_args(GameMethod)
PairMethod = Literal["auto", "exact", "screen"]  # hc.pair_map: exact where the budget allows, or the screen
PAIR_METHODS: tuple[str, ...] = get_args(PairMethod)
# the named metrics of coalition games
MetricName = Literal["logit_diff", "accuracy", "loss", "prob"]
METRIC_NAMES: tuple[str, ...] = get_args(MetricName)

# hc.patch: the activation patched, at which positions, in which direction
Component = Literal["z", "q", "k", "v", "pattern", "resid_pre", "attn_out", "mlp_out"]
COMPONENTS: tuple[str, ...] = get_args(Component)
# the components with no head axis: one [batch, pos, d_model] activation per layer
RESID_COMPONENTS: tuple[str, ...] = ("resid_pre", "attn_out", "mlp_out")
Positions = Literal["all", "each"]
POSITIONS: tuple[str, ...] = get_args(Positions)
Direction = Literal["denoise", "noise"]
DIRECTIONS: tuple[str, ...] = get_args(Direction)

# hc.patch: which path computes the patched runs (the reference: one forward pass per patch)
PatchMethod = Literal["auto", "head-local", "stacked", "reference"]
PATCH_METHODS: tuple[str, ...] = get_args(PatchMethod)

# hc.attribute: how the patches are estimated
AttributionMethod = Literal["atp", "atp*", "ig"]
ATTRIBUTION_METHODS: tuple[str, ...] = get_args(AttributionMethod)

# hc.path_patch: the receiver input an edge goes through, and the path computing it
Via = Literal["q", "k", "v"]
VIAS: tuple[str, ...] = get_args(Via)
PathMethod = Literal["auto", "stacked", "reference"]
PATH_METHODS: tuple[str, ...] = get_args(PathMethod)

# hc.composition: Q-, K- or V-composition
Mode = Literal["Q", "K", "V"]
MODES: tuple[str, ...] = get_args(Mode)

# hc.probe: the activation a probe reads
Site = Literal["z", "q", "k", "v", "result", "resid_pre", "resid_post", "attn_out", "embed"]
SITES: tuple[str, ...] = get_args(Site)
HEAD_SITES, RESID_SITES = SITES[:5], SITES[5:]

# TransformerLens norm modules
NormKind = Literal["LN", "LNPre", "RMS", "RMSPre"]

TieRule = Literal["argmax", "none"]  # accuracy at a tie for the top logit: argmax's token order, or no answer
TIE_RULES: tuple[str, ...] = get_args(TieRule)

# the engine: which path computes copies of a run ("local": the specification's shortcut, then the row-wise
# suffix; "stacked": the model's blocks on stacked copies; "reference": one plain forward pass per copy)
Path = Literal["local", "stacked", "reference"]
PATHS: tuple[str, ...] = get_args(Path)

# hc.edges: how each edge is scored (gradient estimates, or every edge patched exactly)
EdgeEstimator = Literal["eap", "eap-ig", "exact"]
EDGE_ESTIMATORS: tuple[str, ...] = get_args(EdgeEstimator)
# hc.faithfulness: what an edge outside the circuit carries
Ablation = Literal["corrupt", "mean", "zero", "resample"]
ABLATIONS: tuple[str, ...] = get_args(Ablation)

# hc.interactions: shapiq's Shapley estimators
ShapleyEstimator = Literal["kernelshap", "svarm", "permutation"]
SHAPLEY_ESTIMATORS: tuple[str, ...] = get_args(ShapleyEstimator)
# hc.interactions' estimator: exact enumeration, a shapiq sampling estimator, or "auto" (exact up to max_exact)
InteractionEstimator = Literal["auto", "exact", "kernelshap", "svarm", "permutation"]
INTERACTION_ESTIMATORS: tuple[str, ...] = get_args(InteractionEstimator)

# hc.cooperation: the ablations a reading is taken under, and the readings of "writes to"
ReadingHow = Literal["zero", "mean", "resample", "mean-aligned"]
READING_HOWS: tuple[str, ...] = get_args(ReadingHow)
WriteReading = Literal["positive", "centered", "half_answer"]
WRITE_READINGS: tuple[str, ...] = get_args(WriteReading)
