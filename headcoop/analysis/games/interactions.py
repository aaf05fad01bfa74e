"""Do heads cooperate, compete or superpose? Shapley values of heads and the interactions of every pair.

    result = hc.interactions(model)                    # the task's inputs and metric, mean ablation
    result = hc.interactions(model, metric="accuracy", how="zero", heads=["L0H1", "L0H4", "L0H7"])

A coalition game (`headcoop.analysis.games.coalitions`): v(S) is the metric with only the heads in S active and
every other player ablated. Reported:

- `shapley` [head]: each head's Shapley value, sum_{S not containing i} |S|!(n-|S|-1)!/n! (v(S+i) - v(S));
  they sum to v(N) - v(empty) (efficiency).
- `interaction` [head, head]: the Shapley interaction index of each pair (Grabisch & Roubens 1999),
  sum_{S not containing i, j} |S|!(n-|S|-2)!/(n-1)! (v(S+ij) - v(S+i) - v(S+j) + v(S)).
- `ablation_interaction` [head, head]: the interaction at the full model only,
  v(N) - v(N-i) - v(N-j) + v(N-i-j).

Exact by enumerating all 2^n coalitions up to `max_exact` players (16: 65,536 coalitions). Above that
(`headcoop.analysis.games.estimators`, on shapiq): Shapley values by shapiq's KernelSHAP at a budget of
coalitions (or shapiq's SVARM or permutation sampling), each with a standard error per head; and the interaction index of the `top_pairs` strongest pairs only (shapiq's
SVARM-IQ ranks every pair, then each top pair's weighting is sampled directly: a random order of the other
heads with the pair as one block, S = the heads before the block, `pair_samples` draws per pair). Both are
marked sampled in the repr and plot title; pairs not estimated are NaN.

Verdicts, with tau = `threshold` (default 0.05) times |v(N) - v(empty)|: a pair is **redundant** when its
interaction index is below -tau (on average each head substitutes for the other: removing one costs
little while the other is there), **synergistic** above +tau (on average the pair is worth more than its
parts), else **independent**. These are words about averages of the game only: any two heads that cannot
solve the task alone come out synergistic, and a division of labour and superposition both give a zero or
positive index. Which mechanism joins two heads (redundant, division, superposition, competition) is
`hc.cooperation`'s question, answered from per-input evidence. The model's verdict weighs the
pairs: redundant when the negative interactions outweigh the positive ones by more than tau in total,
synergistic in the opposite case, else independent. With the linear logit-difference metric in a
one-layer attention-only model every interaction is exactly 0: the heads' effects add.
"""

from __future__ import annotations

import dataclasses
import itertools
import warnings
from typing import cast

import pandas as pd
import plotly.graph_objects as go
import torch
from jaxtyping import Float
from torch import Tensor

from headcoop.analysis.engine.inputs import check_choice, parse_heads, require_model
from headcoop.analysis.games.coalitions import CoalitionGame, all_masks, shapley_weights
from headcoop.analysis.games.estimators import (
    HeadGame,
    check_budget,
    check_estimate,
    pair_interactions,
    shapiq_shapley,
    top_interactions,
)  # fmt: skip
from headcoop.analysis.vocabulary import INTERACTION_ESTIMATORS, AblationHow, InteractionEstimator, head_name
from headcoop.checks import check_finite, check_float, check_int, check_seed
from headcoop.display.progress import expect, with_progress
from headcoop.models.tl import HookedTransformer
from headcoop.storage.results import Result


@dataclasses.dataclass(frozen=True, repr=False)
class Interactions(Result):
    """Shapley values and pairwise interactions of heads (module docstring), built whole.

    heads: names ("L0H3"); shapley [head], shapley_se [head] (zeros when exact); interaction [head, head]
    (Shapley interaction index, symmetric, 0 on the diagonal); ablation_interaction [head, head];
    v_full = v(N), v_empty = v(empty); verdicts {("L0H1", "L0H2"): "redundant" | "synergistic" |
    "independent"}; model_verdict; metric, how, method (how the values were computed), threshold.
    """

    heads: tuple[str, ...]
    shapley: Float[Tensor, " head"]
    shapley_se: Float[Tensor, " head"]
    interaction: Float[Tensor, "head head"]
    ablation_interaction: Float[Tensor, "head head"]
    v_full: float
    v_empty: float
    verdicts: dict
    model_verdict: str
    metric: str
    how: str
    method: str
    threshold: float
    interaction_se: Float[Tensor, "head head"] | None = None  # sampled pairs' standard errors (None: exact)
    ablation: str = ""  # the definition that replaced absent heads, in words (`describe_ablation`)

    def to_dataframe(self) -> pd.DataFrame:
        """One row per pair: head_a, head_b, interaction (index), interaction_se (0 when exact),
        ablation_interaction, verdict; pairs not estimated (above the exact limit) hold NaN."""
        rows = []
        for i, j in itertools.combinations(range(len(self.heads)), 2):
            a, b = self.heads[i], self.heads[j]
            se = 0.0 if self.interaction_se is None else float(self.interaction_se[i, j])
            rows.append(dict(head_a=a, head_b=b, interaction=float(self.interaction[i, j]), interaction_se=se,
                             ablation_interaction=float(self.ablation_interaction[i, j]), verdict=self.verdicts[(a, b)]))  # fmt: skip
        columns = ["head_a", "head_b", "interaction", "interaction_se", "ablation_interaction", "verdict"]
        return pd.DataFrame(rows, columns=columns)

    def shapley_dataframe(self) -> pd.DataFrame:
        """One row per head: shapley, shapley_se."""
        return pd.DataFrame({"shapley": self.shapley.numpy(), "shapley_se": self.shapley_se.numpy()},
                            index=pd.Index(self.heads, name="head"))  # fmt: skip

    def plot(self, title: str | None = None) -> go.Figure:
        """Shapley bars (left) and the pairwise interaction index heatmap (right)."""
        from plotly.subplots import make_subplots

        from headcoop.display.plot import TEMPLATE

        fig = make_subplots(rows=1, cols=2, column_widths=[0.4, 0.6],
                            subplot_titles=["Shapley value of each head", "interaction index of each pair"])  # fmt: skip
        fig.add_bar(x=list(self.heads), y=self.shapley.numpy(), error_y=dict(array=self.shapley_se.numpy()),
                    row=1, col=1, showlegend=False)  # fmt: skip
        bound = float(self.interaction.nan_to_num().abs().max()) or 1.0
        fig.add_heatmap(z=self.interaction.numpy(), x=list(self.heads), y=list(self.heads), colorscale="RdBu",
                        reversescale=True, zmin=-bound, zmax=bound, row=1, col=2)  # fmt: skip
        fig.update_yaxes(autorange="reversed", row=1, col=2)
        title = title or (f"Heads: {self.model_verdict} overall ({self.metric}, {self.how} ablation)<br><sup>"
                          f"v(all) = {self.v_full:.4g}, v(none) = {self.v_empty:.4g}; {self.method}</sup>")  # fmt: skip
        fig.update_layout(title=title, template=TEMPLATE)
        return fig

    def __repr__(self) -> str:
        counts = {k: sum(v == k for v in self.verdicts.values())
                  for k in ("redundant", "synergistic", "independent", "not estimated")}  # fmt: skip
        missing = f", {counts['not estimated']} not estimated" if counts["not estimated"] else ""
        return (
            f"Interactions({len(self.heads)} heads, {self.metric}, {self.ablation or self.how + ' ablation'}: {self.model_verdict}; "
            f"pairs {counts['redundant']} redundant, {counts['synergistic']} synergistic, "
            f"{counts['independent']} independent{missing}; v(all) {self.v_full:.4g}, v(none) {self.v_empty:.4g}; "
            f"{self.method})"
        )


def exact_shapley(values: Float[Tensor, " coalition"], n: int) -> tuple[Tensor, Tensor]:
    """(Shapley values [n], interaction index [n, n]) from v of all 2^n coalitions (bit-indexed)."""
    ids = torch.arange(2**n)
    sizes = ((ids[:, None] >> torch.arange(n)) & 1).sum(1)
    phi = torch.zeros(n, dtype=torch.float64)
    for i in range(n):
        without = ids[(ids >> i) & 1 == 0]
        weight = shapley_weights(n, sizes[without], 1)
        phi[i] = (weight * (values[without | (1 << i)] - values[without])).sum()
    inter = torch.zeros(n, n, dtype=torch.float64)
    if n >= 2:
        for i, j in itertools.combinations(range(n), 2):
            base = ids[((ids >> i) & 1 == 0) & ((ids >> j) & 1 == 0)]
            weight = shapley_weights(n, sizes[base], 2)
            delta = (
                values[base | (1 << i) | (1 << j)] - values[base | (1 << i)] - values[base | (1 << j)] + values[base]
            )
            inter[i, j] = inter[j, i] = (weight * delta).sum()
    return phi, inter


def _ablation_interaction(game: CoalitionGame, n: int, pairs: list[tuple[int, int]]) -> Tensor:
    """v(N) - v(N-i) - v(N-j) + v(N-i-j) for each of `pairs` ([n, n], NaN for the other pairs)."""
    full = torch.ones(n, dtype=torch.bool)
    singles = sorted({p for pair in pairs for p in pair})
    masks = [full]
    for i in singles:
        m = full.clone()
        m[i] = False
        masks.append(m)
    for i, j in pairs:
        m = full.clone()
        m[[i, j]] = False
        masks.append(m)
    v = game.values(torch.stack(masks)).cpu()
    at = {i: 1 + k for k, i in enumerate(singles)}
    out = torch.full((n, n), float("nan"), dtype=torch.float64)
    out.fill_diagonal_(0.0)
    for k, (i, j) in enumerate(pairs):
        out[i, j] = out[j, i] = v[0] - v[at[i]] - v[at[j]] + v[1 + len(singles) + k]
    return out


def _estimator_of(method: str | None, estimator: str) -> InteractionEstimator:
    """The estimator, with the old `method=` spelling mapped onto it (a DeprecationWarning); ValueError where
    the two contradict or either is unknown."""
    if method is not None:
        warnings.warn('hc.interactions(method=...) is now estimator=: "exact", a sampling estimator ("kernelshap", '
                      '"svarm", "permutation") or "auto"', DeprecationWarning, stacklevel=4)  # fmt: skip
        if method not in ("auto", "exact", "sampled"):
            raise ValueError(f"unknown method {method!r}; valid values are ['auto', 'exact', 'sampled']")
        if method == "exact":
            if estimator not in ("auto", "exact"):
                raise ValueError(f"estimator={estimator!r} contradicts method='exact'")
            estimator = "exact"
        elif method == "sampled":
            if estimator == "exact":
                raise ValueError("estimator='exact' contradicts method='sampled'")
            estimator = "kernelshap" if estimator == "auto" else estimator
    check_choice("estimator", estimator, INTERACTION_ESTIMATORS)
    return cast(InteractionEstimator, estimator)  # checked by name above


MAX_EXACT = 16  # exact Shapley values up to this many heads (2^16 = 65,536 coalitions): the one source of the limit


def _checked(max_exact, threshold, target_se, max_permutations, estimator, pair_samples, seed, method, budget,
             top_pairs, screen_budget, repeats) -> InteractionEstimator:  # fmt: skip
    """hc.interactions' arguments checked by name (the deprecated ones warned about); the estimator chosen."""
    check_int("max_exact", max_exact, 1, 24)
    check_float("threshold", threshold, 0.0)
    if target_se is not None:
        check_float("target_se", target_se, 0.0)
        warnings.warn("hc.interactions(target_se=...) is ignored: shapiq's estimators run to their budget= (headcoop's "
                      "own sampler, which stopped at a target, is gone)", DeprecationWarning, stacklevel=4)  # fmt: skip
    if max_permutations is not None:
        check_int("max_permutations", max_permutations, 2)
    if estimator == "permutation-shapiq":
        warnings.warn('estimator="permutation-shapiq" is now estimator="permutation"', DeprecationWarning, stacklevel=4)
        estimator = "permutation"
    check_int("pair_samples", pair_samples, 1)
    check_seed(seed)
    estimator = _estimator_of(method, estimator)
    if budget is not None:
        check_int("budget", budget, 2)
    if top_pairs is not None:
        check_int("top_pairs", top_pairs, 1)
    if screen_budget is not None:
        check_int("screen_budget", screen_budget, 2)
    check_int("repeats", repeats, 1)
    return estimator


@with_progress("hc.interactions", cheaper="a smaller budget= (sampled) or fewer heads= is cheaper")
@torch.no_grad()
def interactions(
    model: HookedTransformer,
    tokens=None,
    heads=None,
    metric=None,
    how: AblationHow = "mean",
    method: str | None = None,
    reference=None,
    seed: int = 0,
    max_exact: int = MAX_EXACT,
    target_se: float | None = None,
    max_permutations: int | None = None,
    pair_samples: int = 64,
    threshold: float = 0.05,
    pos=None,
    estimator: InteractionEstimator = "auto",
    budget: int | None = None,
    top_pairs: int | None = 20,
    screen_budget: int | None = None,
    repeats: int = 4,
    progress: bool | None = None,
) -> Interactions:
    """Shapley values and pairwise interactions of heads (module docstring).

    tokens:  a Batch (answers known), text(s) or ids; default the task's clean patching inputs.
    heads:   the players: heads in any form `hc.ablate` takes; default every head.
    metric:  None (the task's metric), "logit_diff", "accuracy", "loss", "prob", or a callable on
             [batch, pos, vocab] logits.
    how:     how a head outside the coalition is ablated: "zero", "mean" or "resample" (as hc.ablate;
             `reference` and `seed` as there).
    estimator: "auto" (the default: "exact" up to max_exact heads, else "kernelshap"), "exact" (every
             coalition), or one of shapiq's sampling estimators (`headcoop.analysis.games.estimators`):
             "kernelshap" (paired KernelSHAP had the smallest errors at every budget measured,
             benchmarks/shapley_estimators.py), "svarm" or "permutation" (permutation sampling), at `budget`
             coalitions (default 20,000) split into `repeats`
             runs whose spread gives the standard error; each run needs at least 4n + 2 coalitions
             (ValueError below, naming the budget that would do). A budget of 2^n coalitions or more
             enumerates them exactly instead (the method says so). An estimate whose value or standard error
             exceeds the game's range, or whose sum misses v(all) - v(none) by more, is a ValueError, not a
             result. ("permutation-shapiq" is the old name of "permutation"; max_permutations and target_se
             drove headcoop's own sampler, which shapiq's replaced: max_permutations=k now means
             budget=k * (n + 1), and target_se is ignored, both with a DeprecationWarning.)
    method:  the old spelling (DeprecationWarning): "exact" is estimator="exact", "sampled" a sampling
             estimator (kernelshap unless estimator= names another), "auto" is estimator="auto".
    top_pairs: how many pairs get an interaction index: shapiq's SVARM-IQ ranks every pair at `screen_budget`
             coalitions (default max(2,000, 20 n)), and the top_pairs strongest are estimated again from
             `pair_samples` draws each, with a standard error; other pairs are NaN, their verdict "not
             estimated", and the model's verdict "undetermined". top_pairs=None estimates every pair that way
             (n (n - 1) / 2 * pair_samples * 4 coalitions).
    progress: as `hc.patch` (one bar over the call's runs, and the estimate before a long call).
    Long: exact and sampled Shapley values share the game, the screening and the pair estimates (the checks are a helper).
    """
    require_model(model, "interactions")
    check_finite(model, "hc.interactions")
    estimator = _checked(max_exact, threshold, target_se, max_permutations, estimator, pair_samples, seed, method,
                         budget, top_pairs, screen_budget, repeats)  # fmt: skip
    players = [(lay, h) for lay in range(model.cfg.n_layers) for h in range(model.cfg.n_heads)] if heads is None \
        else parse_heads(model, heads)  # fmt: skip
    n = len(players)
    if max_permutations is not None:  # headcoop's sampler's budget, in permutations of n + 1 coalitions each
        warnings.warn(f"hc.interactions(max_permutations={max_permutations}) is budget={max_permutations * (n + 1)} "
                      "(shapiq's estimators count coalitions); pass budget= instead", DeprecationWarning, stacklevel=3)  # fmt: skip
        budget = budget if budget is not None else max_permutations * (n + 1)
    exact = estimator == "exact" or (estimator == "auto" and n <= max_exact)
    sampler = "kernelshap" if estimator in ("auto", "exact") else estimator
    capped = not exact and budget is not None and n <= 24 and budget >= 2**n
    exact = exact or capped  # a budget of every coalition or more: enumerate them (the repr says so)
    if not exact:
        check_budget(n, budget if budget is not None else 20_000, repeats)
    if exact and n > 24:
        raise ValueError(
            f"estimator='exact' with {n} heads would enumerate {2**n:,} coalitions; use a sampling "
            f"estimator (estimator='kernelshap')"
        )
    game = CoalitionGame(model, players, tokens=tokens, metric=metric, how=how, reference=reference, seed=seed,
                         pos=pos)  # fmt: skip
    if exact:
        expect(2 + 2**n)
    else:  # the Shapley budget, the screening of pairs, the top pairs' draws and their ablation interactions
        pairs_estimated = n * (n - 1) // 2 if top_pairs is None else min(top_pairs, n * (n - 1) // 2)
        expect(2 + (budget if budget is not None else 20_000) + (screen_budget or max(2000, 20 * n))
               + pairs_estimated * (4 * pair_samples + 4))  # fmt: skip
    ends = game.values(torch.stack([torch.ones(n, dtype=torch.bool), torch.zeros(n, dtype=torch.bool)])).cpu()
    v_full, v_empty = float(ends[0]), float(ends[1])
    scale = abs(v_full - v_empty)
    pair_se = None
    if exact:
        values = game.values(all_masks(n)).cpu()
        shapley, inter = exact_shapley(values, n)
        se = torch.zeros(n, dtype=torch.float64)
        how_computed = f"exact over {2**n:,} coalitions; {game.method}"
        if capped:
            how_computed = f"budget {budget:,} >= 2^{n} coalitions, so exact instead of sampled: " + how_computed
        ablation = _ablation_interaction(game, n, list(itertools.combinations(range(n), 2)))
    else:
        head_game = HeadGame(game)
        shapley, se = shapiq_shapley(head_game, sampler, budget if budget is not None else 20_000, repeats, seed)
        check_estimate(
            shapley, se, v_full, v_empty, head_game.span, f"hc.interactions (estimator={sampler!r}, budget={budget})"
        )
        shapley_cost = head_game.evaluated
        if top_pairs is None or top_pairs >= n * (n - 1) // 2:
            pairs = list(itertools.combinations(range(n), 2))
            estimate, errors = pair_interactions(head_game, n, pairs, pair_samples, seed)
            inter = torch.zeros(n, n, dtype=torch.float64)
            pair_se = torch.zeros(n, n, dtype=torch.float64)
            for (i, j), value, err in zip(pairs, estimate.tolist(), errors.tolist()):
                inter[i, j] = inter[j, i] = value
                pair_se[i, j] = pair_se[j, i] = err
            pairs_text = f"every pair's interaction from {pair_samples} draws"
        else:
            screen = screen_budget if screen_budget is not None else max(2000, 20 * n)
            inter, pair_se, pairs = top_interactions(head_game, top_pairs, screen, pair_samples, seed)
            pairs_text = (f"interactions of the top {len(pairs)} of {n * (n - 1) // 2:,} pairs only (ranked by shapiq "
                          f"SVARM-IQ at {screen:,} coalitions, then {pair_samples} draws each; others not estimated)")  # fmt: skip
        ablation = _ablation_interaction(game, n, pairs)
        shapley_text = (f"Shapley from {shapley_cost:,} coalitions by {sampler}"
                        f" (shapiq, {repeats} runs), max se {float(se.max()):.3g}")  # fmt: skip
        how_computed = (
            f"sampled: {shapley_text}; {pairs_text}; {head_game.evaluated:,} coalitions in all; {game.method}"
        )
    names = tuple(head_name(lay, h) for lay, h in players)
    tau = threshold * scale
    verdicts = {}
    for i, j in itertools.combinations(range(n), 2):
        value = float(inter[i, j])
        verdicts[(names[i], names[j])] = ("not estimated" if value != value else "redundant" if value < -tau
                                          else "synergistic" if value > tau else "independent")  # fmt: skip
    upper = inter[torch.triu(torch.ones(n, n, dtype=torch.bool), 1)]
    if upper.isnan().any():  # the verdict weighs every pair; some were not estimated
        model_verdict = "undetermined"
    else:
        negative, positive = float(-upper.clamp(max=0).sum()), float(upper.clamp(min=0).sum())
        model_verdict = ("redundant" if negative - positive > tau else "synergistic" if positive - negative > tau
                         else "independent")  # fmt: skip
    metric_name = metric if isinstance(metric, str) else "the task's metric" if metric is None else "a custom metric"
    return Interactions(
        heads=names, shapley=shapley.float(), shapley_se=se.float(), interaction=inter.float(),
        ablation_interaction=ablation.float(), v_full=v_full, v_empty=v_empty, verdicts=verdicts,
        model_verdict=model_verdict, metric=metric_name, how=how, method=how_computed, threshold=threshold,
        interaction_se=None if pair_se is None else pair_se.float(), ablation=game.ablation,
    )  # fmt: skip


__all__ = ["interactions", "Interactions", "exact_shapley"]
