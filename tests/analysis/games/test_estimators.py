"""Shapley values and interactions above the exact limit, on shapiq (headcoop.analysis.games.estimators): the game
as a shapiq.Game, headcoop's exact path against shapiq's exact computer, the sampled estimators against the
exact values within their standard errors, and the top-pairs-only interactions."""

from __future__ import annotations

import itertools

import pytest
import torch
from helpers import attn_only_2l_like

import headcoop as hc
from headcoop.analysis.games.coalitions import CoalitionGame, all_masks
from headcoop.analysis.games.estimators import HeadGame, pair_interactions, shapiq_exact, shapiq_shapley
from headcoop.analysis.games.interactions import exact_shapley


def game_of(n_heads_per_layer: int, seed: int = 0, how: str = "zero"):
    model = attn_only_2l_like(seed=seed, n_heads=n_heads_per_layer, d_head=4)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.cfg.d_vocab, (16, 8), generator=gen)
    hc.contrast(ids, ids.flip(0), ids[:, 3], ids[:, 4]).attach(model)
    players = [(lay, h) for lay in range(2) for h in range(n_heads_per_layer)]
    return model, CoalitionGame(model, players, metric="logit_diff", how=how)


def test_exact_path_matches_shapiq_exact_computer_at_10_heads():
    _, game = game_of(5)
    head_game = HeadGame(game)
    phi_shapiq, sii_shapiq = shapiq_exact(head_game)
    assert head_game.evaluated == 2**10
    values = game.values(all_masks(10)).cpu()
    phi, inter = exact_shapley(values, 10)
    assert torch.allclose(phi, phi_shapiq, atol=1e-9) and torch.allclose(inter, sii_shapiq, atol=1e-9)
    assert float(inter.abs().max()) > 1e-3  # a two-layer model with norms: the heads interact
    assert float(phi.sum()) == pytest.approx(float(values[-1] - values[0]), abs=1e-9)  # efficiency


@pytest.fixture(scope="module")
def fourteen():
    model, game = game_of(7, seed=2)
    values = game.values(all_masks(14)).cpu()
    phi, inter = exact_shapley(values, 14)
    return model, game, phi, inter, abs(float(values[-1] - values[0]))


@pytest.mark.parametrize("estimator", ["kernelshap", "svarm", "permutation"])
def test_shapiq_estimators_fall_within_their_standard_errors(fourteen, estimator):
    _, game, phi, _, scale = fourteen
    head_game = HeadGame(game)
    estimate, se = shapiq_shapley(head_game, estimator, budget=6000, repeats=4, seed=0)
    assert 5000 <= head_game.evaluated <= 6200  # the stated budget, give or take shapiq's rounding
    assert (se > 0).all()
    assert ((estimate - phi).abs() <= 4 * se + 1e-3 * scale).all(), float(((estimate - phi).abs() / se).max())


def test_the_permutation_estimator_is_shapiqs_and_old_knobs_still_mean_what_they_meant(fourteen):
    """estimator="permutation" is shapiq's PermutationSamplingSV run for run (headcoop's own antithetic sampler is
    gone); max_permutations=k is budget=k (n + 1) and target_se is ignored, each with a DeprecationWarning."""
    import shapiq

    model, game, phi, _, scale = fourteen
    estimate, se = shapiq_shapley(HeadGame(game), "permutation", budget=4 * 300, repeats=4, seed=5)
    runs = []
    for r in range(4):
        values = shapiq.PermutationSamplingSV(14, random_state=5 + r).approximate(300, HeadGame(game))
        runs.append([values.values[values.interaction_lookup[(i,)]] for i in range(14)])
    torch.testing.assert_close(estimate, torch.tensor(runs, dtype=torch.float64).mean(0), rtol=0, atol=1e-12)
    heads = [f"L{lay}H{h}" for lay in range(2) for h in range(7)]
    with pytest.warns(DeprecationWarning, match="max_permutations=40.*budget=600"):
        old = hc.interactions(model, heads=heads, metric="logit_diff", how="zero", max_permutations=40,
                              estimator="permutation", top_pairs=1, screen_budget=200, pair_samples=4)  # fmt: skip
    new = hc.interactions(model, heads=heads, metric="logit_diff", how="zero", budget=600,
                          estimator="permutation", top_pairs=1, screen_budget=200, pair_samples=4)  # fmt: skip
    torch.testing.assert_close(old.shapley, new.shapley, rtol=0, atol=0)
    with (
        pytest.warns(DeprecationWarning, match="target_se"),
        pytest.warns(DeprecationWarning, match="permutation-shapiq"),
    ):
        hc.interactions(model, heads=heads, metric="logit_diff", how="zero", budget=600, target_se=0.1,
                        estimator="permutation-shapiq", top_pairs=1, screen_budget=200, pair_samples=4)  # fmt: skip


def test_pair_interactions_are_unbiased_within_their_errors(fourteen):
    _, game, _, inter, _ = fourteen
    pairs = [(0, 1), (0, 8), (3, 12)]
    estimate, se = pair_interactions(game, 14, pairs, samples=400, seed=0)
    exact = torch.tensor([float(inter[i, j]) for i, j in pairs], dtype=torch.float64)
    assert ((estimate - exact).abs() <= 4 * se + 1e-9).all()


def test_interactions_above_the_limit_estimate_the_top_pairs_only(fourteen):
    model, _, phi, inter, scale = fourteen
    heads = [f"L{lay}H{h}" for lay in range(2) for h in range(7)]
    result = hc.interactions(model, heads=heads, metric="logit_diff", how="zero", estimator="kernelshap", top_pairs=5,
                             screen_budget=4000, pair_samples=200, budget=6000)  # fmt: skip
    frame = result.to_dataframe()
    estimated = frame[frame.verdict != "not estimated"]
    assert len(estimated) == 5 and frame.interaction.isna().sum() == 91 - 5
    assert result.model_verdict == "undetermined"  # it weighs every pair
    assert "top 5 of 91 pairs only" in repr(result) and "not estimated" in repr(result)
    for row in estimated.itertuples():
        i, j = heads.index(row.head_a), heads.index(row.head_b)
        assert abs(row.interaction - float(inter[i, j])) <= 4 * row.interaction_se + 1e-9
    # the screening finds the strongest pairs: the exact top pair is among the 5 estimated
    upper = [(abs(float(inter[i, j])), heads[i], heads[j]) for i, j in itertools.combinations(range(14), 2)]
    best = max(upper)
    assert (best[1], best[2]) in set(zip(estimated.head_a, estimated.head_b))
    assert ((result.shapley - phi).abs() <= 4 * result.shapley_se + 1e-3 * scale).all()
    assert result.plot().layout.title.text  # NaN cells plot


def test_bad_estimator_settings():
    model, _ = game_of(2)
    with pytest.raises(ValueError, match="unknown estimator 'bogus'"):
        hc.interactions(model, metric="logit_diff", estimator="bogus")
    with pytest.warns(DeprecationWarning, match="now estimator="):
        with pytest.raises(ValueError, match="estimator='exact' contradicts method='sampled'"):
            hc.interactions(model, metric="logit_diff", method="sampled", estimator="exact")
    with pytest.raises(ValueError, match="top_pairs must be >= 1"):
        hc.interactions(model, metric="logit_diff", estimator="kernelshap", top_pairs=0)
    with pytest.raises(ValueError, match="budget must be >= 2"):
        hc.interactions(model, metric="logit_diff", estimator="kernelshap", budget=1)


def test_cooperation_above_the_limit_reads_the_top_pairs_only(fourteen):
    model = fourteen[0]
    batch = model.task.clean
    full = hc.cooperation(model, inputs=batch, metric="logit_diff", how="zero", max_exact=16)
    top = hc.cooperation(model, inputs=batch, metric="logit_diff", how="zero", max_exact=10, top_pairs=4,
                         screen_budget=3000)  # fmt: skip
    assert len(full.pairs) == 91 and len(top.pairs) == 4
    assert "per-input evidence for the top 4 of 91 pairs" in repr(top)
    merged = top.pairs.merge(full.pairs, on=["head_a", "head_b"], suffixes=("_top", "_all"))
    assert len(merged) == 4
    # the per-input evidence of a pair does not depend on which other pairs are read
    assert list(merged.mechanism_top) == list(merged.mechanism_all)
    assert torch.allclose(
        torch.tensor(merged.interaction_full_top.to_numpy()), torch.tensor(merged.interaction_full_all.to_numpy())
    )
    # and the pairs read are among the strongest by the exact interaction index
    strongest = full.pairs.reindex(full.pairs.interaction.abs().sort_values(ascending=False).index).head(10)
    assert len(set(zip(top.pairs.head_a, top.pairs.head_b)) & set(zip(strongest.head_a, strongest.head_b))) >= 3
    assert top.input_class.shape[0] == 4
