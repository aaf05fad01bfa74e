"""Shapley values and pairwise interactions of heads above the exact limit, on shapiq.

The batched coalition game (`CoalitionGame`) is a `shapiq.Game` (`HeadGame`): shapiq's exact computer and
approximators read it directly, and every coalition they ask for goes through headcoop's batched engine.

- Exact (`exact`): headcoop enumerates the 2^n coalitions (`interactions.exact_shapley`); the tests check it
  against shapiq's `ExactComputer` at 10 heads.
- Shapley values above the limit (`shapiq_shapley`): shapiq's estimators, "kernelshap" (KernelSHAP, paired),
  "svarm" (SVARM) or "permutation" (permutation sampling; headcoop's own antithetic sampler, which this
  replaced, is gone). shapiq gives no error estimate, so the budget is split into `repeats` independent runs
  of different seeds: the estimate is their mean, its standard error the spread of the runs / sqrt(repeats).
  The default, KernelSHAP, was measured best (`benchmarks/shapley_estimators.py`, docs/benchmarks.md
  "Cooperation at 144 heads": the smallest RMSE and largest error at every budget on a 144-head game).
- Pairwise interactions above the limit (`top_interactions`): shapiq's SVARM-IQ, whose every sampled
  coalition updates every pair's estimate, screens all pairs at a budget; the `top` pairs by |estimate|
  are then estimated again with headcoop's per-pair sampler (`pair_samples` draws of the pair's Shapley
  interaction weighting, 4 coalitions each), which gives each a standard error. Other pairs are NaN and the
  result says so.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any

import numpy as np
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from headcoop.analysis.vocabulary import SHAPLEY_ESTIMATORS, ShapleyEstimator
from headcoop.tasks.base import generator

SHAPIQ_CLASSES = {"kernelshap": "KernelSHAP", "svarm": "SVARM", "permutation": "PermutationSamplingSV"}


@functools.cache
def _game_class():
    """shapiq.Game's subclass for headcoop games, built on first use: importing shapiq takes seconds (numba),
    which every `import headcoop` would otherwise pay."""
    import shapiq

    class HeadGame(shapiq.Game):
        """A headcoop coalition game as a `shapiq.Game` (see `HeadGame`)."""

        head_game = True

        def __init__(self, game, names: list[str] | None = None):
            self.game = game
            self.evaluated = 0
            self.span = (float("inf"), float("-inf"))  # the smallest and largest value seen
            super().__init__(n_players=len(game.players), normalize=False, player_names=names)

        def value_function(self, coalitions: np.ndarray) -> np.ndarray:
            masks = torch.as_tensor(np.asarray(coalitions, dtype=bool))
            self.evaluated += len(masks)
            values = self.game.values(masks).cpu().numpy().astype(np.float64)
            if len(values):
                self.span = (min(self.span[0], float(values.min())), max(self.span[1], float(values.max())))
            return values

    return HeadGame


def HeadGame(game, names: list[str] | None = None):  # noqa: N802 (a class, built lazily)
    """A headcoop coalition game as a `shapiq.Game`: value_function(coalitions [m, n] bools) -> [m] values
    (float64), evaluated by `CoalitionGame.values`, batched. `evaluated` counts the coalitions asked for,
    `span` holds the smallest and largest value seen.
    Not normalised: v(empty) stays as it is (Shapley values and interactions do not depend on it)."""
    return _game_class()(game, names)


def masks_values(game, masks: Bool[Tensor, "coalition player"]) -> Float[Tensor, " coalition"]:
    """v of each coalition, through a HeadGame (counted) or a CoalitionGame."""
    if getattr(game, "head_game", False):
        return torch.from_numpy(game(masks.numpy()))
    return game.values(masks).cpu()


def shapiq_exact(game: Any) -> tuple[Tensor, Tensor]:
    """(Shapley values [n], Shapley interaction index [n, n]) by shapiq's ExactComputer (2^n coalitions)."""
    import shapiq

    n = game.n_players
    computer = shapiq.ExactComputer(game, n_players=n)
    sv, sii = computer("SV", order=1), computer("SII", order=2)
    phi = torch.tensor([sv.values[sv.interaction_lookup[(i,)]] for i in range(n)], dtype=torch.float64)
    inter = torch.zeros(n, n, dtype=torch.float64)
    for i, j in itertools.combinations(range(n), 2):
        inter[i, j] = inter[j, i] = sii.values[sii.interaction_lookup[(i, j)]]
    return phi, inter


def min_budget_per_run(n: int) -> int:
    """The fewest coalitions one shapiq run may take on n players: 4n + 2. Measured on a 20-player game of
    range 1 (KernelSHAP, paired sampling, 8 seeds): at 2n + 2 = 42 coalitions its regression is singular
    (values up to 7.3e15), from 50 on the largest value is 0.24; SVARM and permutation sampling stay below
    0.35 from 42 on. The floor keeps a margin above the singular point."""
    return 4 * n + 2


def check_budget(n: int, budget: int, repeats: int) -> None:
    """ValueError when `budget` split into `repeats` shapiq runs leaves a run fewer coalitions than
    `min_budget_per_run(n)`, naming the budget that would do."""
    floor = min_budget_per_run(n)
    if budget // repeats < floor:
        raise ValueError(
            f"budget={budget} in repeats={repeats} runs gives {budget // repeats} coalitions per run; the shapiq "
            f"estimators need at least 4n + 2 = {floor} per run with {n} heads (below it KernelSHAP's regression is "
            f"singular): give budget >= {floor * repeats} or fewer repeats"
        )


def check_estimate(shapley: Tensor, se: Tensor, v_full: float, v_empty: float, span: tuple[float, float],
                   what: str) -> None:  # fmt: skip
    """ValueError when a sampled estimate is no estimate: a value not finite, a value or a standard error
    larger than the game's range (the largest of |v(N) - v(empty)| and the spread of every coalition value
    seen, `span`), or the values' sum (efficiency: v(N) - v(empty)) off by more than that range."""
    scale = max(abs(v_full - v_empty), span[1] - span[0] if span[1] >= span[0] else 0.0, 1e-12)
    total, largest = float(shapley.sum()), float(shapley.abs().max())
    largest_se = float(torch.nan_to_num(se, nan=0.0).max())
    if (
        not bool(torch.isfinite(shapley).all())
        or largest > scale
        or largest_se > scale
        or abs(total - (v_full - v_empty)) > scale
    ):
        raise ValueError(
            f"{what}: the sampled Shapley values are not an estimate (largest |value| {largest:.3g}, largest "
            f"standard error {largest_se:.3g}, sum {total:.3g} against v(N) - v(empty) = {v_full - v_empty:.3g}; the "
            f"game's range is {scale:.3g}); raise the budget or use another estimator="
        )


def shapiq_shapley(game: Any, estimator: str, budget: int, repeats: int, seed: int) -> tuple[Tensor, Tensor]:
    """Shapley values by one of shapiq's approximators: `repeats` independent runs of budget // repeats
    coalitions each (seeds seed..seed+repeats-1); returns (mean [n], standard error of the mean [n]).
    ValueError when a run would get fewer than `min_budget_per_run` coalitions (`check_budget`)."""
    import shapiq

    n = game.n_players
    check_budget(n, budget, repeats)
    runs = []
    approximator: Any
    for r in range(repeats):
        if estimator == "kernelshap":
            approximator = shapiq.KernelSHAP(n, pairing_trick=True, random_state=seed + r)
        elif estimator == "svarm":
            approximator = shapiq.SVARM(n, random_state=seed + r)
        elif estimator == "permutation":
            approximator = shapiq.PermutationSamplingSV(n, random_state=seed + r)
        else:
            raise ValueError(f"unknown estimator {estimator!r}; valid values are {list(SHAPLEY_ESTIMATORS)}")
        values = approximator.approximate(budget // repeats, game)
        runs.append([values.values[values.interaction_lookup[(i,)]] for i in range(n)])
    table = torch.tensor(runs, dtype=torch.float64)
    se = (
        table.std(0, unbiased=True) / repeats**0.5
        if repeats > 1
        else torch.full((n,), float("nan"), dtype=torch.float64)
    )
    return table.mean(0), se


def pair_interactions(game, n: int, pairs: list[tuple[int, int]], samples: int, seed: int) -> tuple[Tensor, Tensor]:
    """Each pair's Shapley interaction index by sampling its weighting directly: S = the players before the
    pair in a random order of the others with the pair as one block; the mean of
    v(S+ij) - v(S+i) - v(S+j) + v(S) over `samples` draws. Returns (estimate [len(pairs)], standard error)."""
    gen = generator(seed + 1)
    masks = []
    for i, j in pairs:
        others = [k for k in range(n) if k not in (i, j)]
        for _ in range(samples):
            cut = int(torch.randint(0, len(others) + 1, (1,), generator=gen))
            chosen = torch.randperm(len(others), generator=gen)[:cut]
            base = torch.zeros(n, dtype=torch.bool)
            base[[others[p] for p in chosen.tolist()]] = True
            for add in ((), (i,), (j,), (i, j)):
                m = base.clone()
                m[list(add)] = True
                masks.append(m)
    if not masks:
        return torch.zeros(0, dtype=torch.float64), torch.zeros(0, dtype=torch.float64)
    v = masks_values(game, torch.stack(masks)).view(len(pairs), samples, 4)
    delta = v[..., 3] - v[..., 1] - v[..., 2] + v[..., 0]
    se = delta.std(1, unbiased=True) / samples**0.5 if samples > 1 else torch.full((len(pairs),), float("nan"))
    return delta.mean(1), se.double()


def screen_pairs(game: Any, budget: int, seed: int) -> Tensor:
    """Every pair's interaction index estimated by shapiq's SVARM-IQ at `budget` coalitions (each sampled
    coalition updates every pair): [n, n], symmetric, for ranking pairs only (no error estimate)."""
    import shapiq

    n = game.n_players
    values = shapiq.SVARMIQ(n, max_order=2, index="SII", random_state=seed).approximate(budget, game)
    out = torch.zeros(n, n, dtype=torch.float64)
    for (i, j), k in ((key, k) for key, k in values.interaction_lookup.items() if len(key) == 2):
        out[i, j] = out[j, i] = values.values[k]
    return out


def top_interactions(game: Any, top: int, screen_budget: int, samples: int, seed: int
                     ) -> tuple[Tensor, Tensor, list[tuple[int, int]]]:  # fmt: skip
    """The `top` pairs by |SVARM-IQ estimate| (`screen_pairs`), each estimated again by `pair_interactions`.
    Returns (interaction [n, n]: NaN off the top pairs, standard error [n, n], the top pairs)."""
    n = game.n_players
    screened = screen_pairs(game, screen_budget, seed)
    upper = torch.triu_indices(n, n, 1)
    order = screened[upper[0], upper[1]].abs().argsort(descending=True)[:top]
    pairs = [(int(upper[0, k]), int(upper[1, k])) for k in order]
    estimate, se = pair_interactions(game, n, pairs, samples, seed)
    inter = torch.full((n, n), float("nan"), dtype=torch.float64)
    errors = torch.full((n, n), float("nan"), dtype=torch.float64)
    inter.fill_diagonal_(0.0)
    for (i, j), value, err in zip(pairs, estimate.tolist(), se.tolist()):
        inter[i, j] = inter[j, i] = value
        errors[i, j] = errors[j, i] = err
    return inter, errors, pairs


__all__ = ["HeadGame", "SHAPLEY_ESTIMATORS", "ShapleyEstimator", "shapiq_shapley",
           "shapiq_exact", "pair_interactions", "screen_pairs", "top_interactions"]  # fmt: skip
