"""hc.interactions: coalition values against hc.ablate + a forward pass, Shapley values and interaction
indices against brute force over permutations, the Shapley properties, and the verdicts on games whose
answer is known."""

import dataclasses
import itertools
import math

import pytest
import torch
from helpers import attn_only_2l_like

import headcoop as hc
from headcoop.analysis.games.coalitions import CoalitionGame, all_masks
from headcoop.analysis.games.interactions import exact_shapley

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@torch.no_grad()
def brute_value(model, players, active, tokens, metric, how, reference):
    """v(S) the slow way: hc.ablate the players outside S, run the model, score it."""
    off = [f"L{lay}H{h}" for (lay, h), on in zip(players, active) if not on]
    if not off:
        return float(metric(model(tokens)))
    with hc.ablate(model, heads=off, how=how, reference=reference):
        return float(metric(model(tokens)))


@pytest.mark.parametrize("how", ["zero", "mean", "resample"])
@pytest.mark.parametrize("shape", ["one-layer", "two-layer-mlp"])
def test_coalition_values_match_ablation(how, shape):
    if shape == "one-layer":
        model = hc.Count01(max_len=6).model(seed=0, n_heads=3, d_model=6, d_head=2)
        batch = model.task.sample(40, seed=1)
        tokens, reference = batch, model.task.sample(30, seed=2).tokens
        players = [(0, 0), (0, 1), (0, 2)]
    else:
        model = attn_only_2l_like(attn_only=False, d_mlp=16, act_fn="gelu")
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(0, model.cfg.d_vocab, (20, 8), generator=gen)
        tokens = hc.contrast(ids, ids.flip(0), ids[:, 1], ids[:, 2]).clean
        reference = torch.randint(0, model.cfg.d_vocab, (16, 8), generator=gen)
        players = [(0, 1), (1, 0), (1, 3)]
    rows = torch.arange(len(tokens))
    reference = None if how == "zero" else reference

    def accuracy(logits):
        return (logits[rows, tokens.answer_pos].argmax(-1) == tokens.answer).double().mean()

    def logit_diff(logits):
        at = logits[rows, tokens.answer_pos]
        return (at[rows, tokens.answer] - at[rows, tokens.wrong]).double().mean()

    masks = all_masks(len(players))
    for name, metric in (("accuracy", accuracy), ("logit_diff", logit_diff)):
        game = CoalitionGame(model, players, tokens=tokens, metric=name, how=how, reference=reference, seed=0)
        assert game.linear == (shape == "one-layer")
        got = game.values(masks)
        want = torch.tensor([brute_value(model, players, m.tolist(), tokens.tokens, metric, how, reference)
                             for m in masks], dtype=torch.float64)  # fmt: skip
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-6)
    callable_game = CoalitionGame(model, players, tokens=tokens, metric=logit_diff, how=how, reference=reference)
    assert not callable_game.linear
    torch.testing.assert_close(callable_game.values(masks), want, atol=1e-5, rtol=1e-6)
    # the in-library reference (hc.ablate + one forward pass per coalition) and every path through the switch
    methods = ("reference", "layered", "stacked") + (("linear",) if shape == "one-layer" else ())
    got = {m: CoalitionGame(model, players, tokens=tokens, metric="logit_diff", how=how, reference=reference,
                            method=m).values(masks) for m in methods}  # fmt: skip
    torch.testing.assert_close(got["reference"], want, atol=1e-6, rtol=1e-6)
    for m in methods[1:]:
        torch.testing.assert_close(got[m], got["reference"], atol=1e-5, rtol=1e-6, msg=m)
    if shape != "one-layer":
        with pytest.raises(ValueError, match="method='linear' needs a one-layer"):
            CoalitionGame(model, players, tokens=tokens, metric="logit_diff", how=how, reference=reference,
                          method="linear")  # fmt: skip
    with pytest.raises(ValueError, match="unknown method|method"):
        CoalitionGame(model, players, tokens=tokens, metric="logit_diff", how=how, reference=reference, method="fast")


def brute_shapley(values: dict, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Shapley values by averaging over all n! orders; interaction indices from the defining sum."""
    phi = torch.zeros(n, dtype=torch.float64)
    for order in itertools.permutations(range(n)):
        current = frozenset()
        for player in order:
            phi[player] += values[current | {player}] - values[current]
            current = current | {player}
    phi /= math.factorial(n)
    inter = torch.zeros(n, n, dtype=torch.float64)
    for i, j in itertools.combinations(range(n), 2):
        others = [k for k in range(n) if k not in (i, j)]
        for size in range(len(others) + 1):
            for s in itertools.combinations(others, size):
                s = frozenset(s)
                w = math.factorial(size) * math.factorial(n - size - 2) / math.factorial(n - 1)
                inter[i, j] += w * (values[s | {i, j}] - values[s | {i}] - values[s | {j}] + values[s])
        inter[j, i] = inter[i, j]
    return phi, inter


@pytest.mark.parametrize("n", [2, 4, 6])
def test_exact_shapley_equals_brute_force(n):
    gen = torch.Generator().manual_seed(n)
    values = torch.randn(2**n, generator=gen, dtype=torch.float64)
    by_set = {frozenset(i for i in range(n) if s >> i & 1): values[s] for s in range(2**n)}
    phi, inter = exact_shapley(values, n)
    want_phi, want_inter = brute_shapley(by_set, n)
    torch.testing.assert_close(phi, want_phi)
    torch.testing.assert_close(inter, want_inter)
    assert float(phi.sum()) == pytest.approx(float(values[-1] - values[0]))  # efficiency


def test_games_with_known_answers():
    """OR of two players (either suffices): redundant, I = -1. AND (both needed): synergistic, I = +1.
    A sum: every interaction 0, Shapley = each player's own value."""
    n = 3
    sets = [frozenset(i for i in range(n) if s >> i & 1) for s in range(2**n)]
    games = {
        "or": [float(bool(s & {0, 1})) for s in sets],
        "and": [float({0, 1} <= s) for s in sets],
        "sum": [float(sum([2.0, -1.0, 0.5][i] for i in s)) for s in sets],
    }
    _, inter = exact_shapley(torch.tensor(games["or"], dtype=torch.float64), n)
    assert float(inter[0, 1]) == pytest.approx(-1.0) and float(inter[0, 2]) == 0.0
    _, inter = exact_shapley(torch.tensor(games["and"], dtype=torch.float64), n)
    assert float(inter[0, 1]) == pytest.approx(1.0)
    phi, inter = exact_shapley(torch.tensor(games["sum"], dtype=torch.float64), n)
    torch.testing.assert_close(phi, torch.tensor([2.0, -1.0, 0.5], dtype=torch.float64))
    assert float(inter.abs().max()) < 1e-12


def test_shipped_count01_redundant_on_accuracy_independent_on_logit_diff():
    """The linear logit difference of a one-layer model is additive over heads: every interaction is 0
    and the pairs are independent; accuracy thresholds the sum, and the heads substitute for each other."""
    model = hc.load("count01")
    batch = model.task.sample(256, seed=3)
    linear = hc.interactions(model, batch, metric="logit_diff")
    assert float(linear.interaction.abs().max()) <= 1e-6 * abs(linear.v_full - linear.v_empty)
    assert set(linear.verdicts.values()) == {"independent"} and linear.model_verdict == "independent"
    assert float(linear.shapley.sum()) == pytest.approx(linear.v_full - linear.v_empty, rel=1e-6)
    accuracy = hc.interactions(model, batch, metric="accuracy")
    assert accuracy.model_verdict == "redundant" and "redundant" in accuracy.verdicts.values()
    assert float(accuracy.shapley.sum()) == pytest.approx(accuracy.v_full - accuracy.v_empty, abs=1e-9)


def test_symmetric_and_dummy_heads():
    """A copy of head 0 gets head 0's Shapley value; a head with W_O = 0 gets 0 and no interactions."""
    model = hc.Count01(max_len=6).model(seed=4, n_heads=3, d_model=6, d_head=2)
    attn = model.blocks[0].attn
    with torch.no_grad():
        for name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V"):
            getattr(attn, name)[1] = getattr(attn, name)[0]
        attn.W_O[2] = 0.0
    result = hc.interactions(model, model.task.sample(64, seed=0), metric="loss", how="zero")
    assert float(result.shapley[0]) == pytest.approx(float(result.shapley[1]), abs=1e-9)
    assert float(result.shapley[2]) == 0.0 and float(result.interaction[2].abs().max()) == 0.0


def test_sampled_estimates_agree_with_exact():
    model = attn_only_2l_like(seed=1)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, model.cfg.d_vocab, (24, 8), generator=gen)
    hc.contrast(ids, ids.flip(0), ids[:, 3], ids[:, 4]).attach(model)
    heads = [f"L{lay}H{h}" for lay in range(2) for h in range(4)]
    exact = hc.interactions(model, heads=heads, metric="logit_diff", estimator="exact")
    sampled = hc.interactions(model, heads=heads, metric="logit_diff", estimator="kernelshap", budget=240, top_pairs=None,
                              pair_samples=200, seed=3)  # under 2^8 coalitions: sampled, not enumerated  # fmt: skip
    assert (
        "sampled" in repr(sampled)
        and "exact instead" not in repr(sampled)
        and "sampled" in sampled.plot().layout.title.text
    )
    assert ((sampled.shapley - exact.shapley).abs() <= 4 * sampled.shapley_se + 1e-6).all()
    scale = abs(exact.v_full - exact.v_empty)
    assert float((sampled.interaction - exact.interaction).abs().max()) <= 0.25 * scale


def test_result_protocol_and_bad_input():
    model = hc.Count01(max_len=6).model(seed=0, n_heads=3, d_model=6, d_head=2)
    result = hc.interactions(model, metric="prob")
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.shapley = None
    frame = result.to_dataframe()
    assert len(frame) == 3 and set(frame.verdict) <= {"redundant", "synergistic", "independent"}
    assert list(result.shapley_dataframe().index) == ["L0H0", "L0H1", "L0H2"]
    assert "<table" in result._repr_html_()
    with pytest.raises(ValueError, match="unknown metric"):
        hc.interactions(model, metric="f1")
    with pytest.raises(ValueError, match="unknown how 'scale'"):
        hc.interactions(model, how="scale")
    with pytest.raises(ValueError, match="unknown method"):
        hc.interactions(model, method="fast")
    with pytest.raises(IndexError, match="heads 0..2"):
        hc.interactions(model, heads=[0, 5])


def test_coalition_values_honour_hooks_installed_after_the_game_was_built():
    """A game built outside hc.ablate and evaluated inside it sees the outer ablation, as a forward pass does."""
    model = attn_only_2l_like(attn_only=False, d_mlp=16, act_fn="gelu")
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, model.cfg.d_vocab, (12, 8), generator=gen)
    tokens = hc.contrast(ids, ids.flip(0), ids[:, 1], ids[:, 2]).clean
    rows = torch.arange(len(tokens))
    players = [(0, 1), (1, 0), (1, 3)]
    game = CoalitionGame(model, players, tokens=tokens, metric="logit_diff", how="zero")
    assert game.layered

    def logit_diff(logits):
        at = logits[rows, tokens.answer_pos]
        return (at[rows, tokens.answer] - at[rows, tokens.wrong]).double().mean()

    masks = all_masks(len(players))
    reference = torch.randint(0, model.cfg.d_vocab, (10, 8), generator=gen)
    with hc.ablate(model, heads="L1H2", how="mean", reference=reference):
        got = game.values(masks)
        want = torch.tensor([brute_value(model, players, m.tolist(), tokens.tokens, logit_diff, "zero", None)
                             for m in masks], dtype=torch.float64)  # fmt: skip
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-6)
    assert "hooks installed" in game.method
    assert not torch.allclose(got, game.values(masks))  # outside the ablation the values differ


@pytest.mark.parametrize("how", ["zero", "mean"])
def test_a_game_whose_players_all_sit_after_layer_0_equals_the_ablation_loop(how):
    """Players [L1H0, L1H1] only (no player in layer 0: the layered path once took torch.unique of an empty
    prefix and crashed): every coalition's value equals hc.ablate's forward pass."""
    import itertools

    from headcoop.analysis.games.coalitions import CoalitionGame

    model = hc.Count01(max_len=6).model(seed=0, n_heads=2, d_model=8, d_head=2, n_layers=2)
    batch = hc.Count01(max_len=6).sample(16, seed=1)
    players = [(1, 0), (1, 1)]

    def metric(logits):
        return logits[:, -1, 4].mean() - logits[:, -1, 5].mean()

    reference = batch.tokens if how == "mean" else None
    game = CoalitionGame(model, players, tokens=batch.tokens, metric=metric, how=how, reference=reference)
    masks = torch.tensor(list(itertools.product([False, True], repeat=2)))
    for mask, value in zip(masks, game.values(masks)):
        off = [f"L{a}H{b}" for (a, b), on in zip(players, mask.tolist()) if not on]
        if off:
            with hc.ablate(model, heads=off, how=how, reference=reference):
                want = float(metric(model(batch.tokens)))
        else:
            want = float(metric(model(batch.tokens)))
        assert float(value) == pytest.approx(want, abs=1e-5), mask.tolist()


def test_the_old_method_spelling_warns_and_reads_as_the_estimator():
    """hc.interactions(method=...) is the old spelling of estimator= (issue 46: `method` names one thing)."""
    model = hc.Count01(max_len=6).model(seed=0, n_heads=3, d_model=8, d_head=2)
    batch = model.task.sample(32, seed=1)
    new = hc.interactions(model, batch, metric="logit_diff", how="zero", estimator="exact")
    with pytest.warns(DeprecationWarning, match="now estimator="):
        old = hc.interactions(model, batch, metric="logit_diff", how="zero", method="exact")
    torch.testing.assert_close(old.interaction, new.interaction, rtol=0, atol=0)
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="unknown method 'fast'"):
        hc.interactions(model, batch, metric="logit_diff", method="fast")
    with (
        pytest.warns(DeprecationWarning),
        pytest.raises(ValueError, match="estimator='svarm' contradicts method='exact'"),
    ):
        hc.interactions(model, batch, metric="logit_diff", method="exact", estimator="svarm")


@pytest.mark.parametrize("how", ["zero", "mean"])
def test_layered_path_in_pieces_equals_the_reference(how):
    """Issue 51: the layered path takes every coalition in one chunk (their shared prefixes computed once) and
    runs each block a few states at a time within the memory budget. With a budget so small that every block
    runs one state at a time, the values and the row logits `hc.cooperation` reads equal hc.ablate + one
    forward pass per coalition."""
    model = attn_only_2l_like(attn_only=False, d_mlp=16, act_fn="gelu")
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, model.cfg.d_vocab, (12, 8), generator=gen)
    tokens = hc.contrast(ids, ids.flip(0), ids[:, 1], ids[:, 2]).clean
    reference = None if how == "zero" else torch.randint(0, model.cfg.d_vocab, (10, 8), generator=gen)
    players = [(0, 1), (1, 0), (1, 3)]
    masks = all_masks(len(players))
    tiny = CoalitionGame(model, players, tokens=tokens, metric="logit_diff", how=how, reference=reference,
                         method="layered", memory_budget_mb=1e-4)  # fmt: skip
    ref = CoalitionGame(model, players, tokens=tokens, metric="logit_diff", how=how, reference=reference,
                        method="reference")  # fmt: skip
    torch.testing.assert_close(tiny.values(masks), ref.values(masks), atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(tiny.row_logits(masks), ref.row_logits(masks), atol=1e-5, rtol=1e-6)
    assert tiny.method.startswith("layer by layer")


def test_layered_passes_counts_the_blocks_the_layered_path_runs(monkeypatch):
    """Issue 51: the report predicts a game's cost from `layered_passes`, which must count what the layered
    path runs: the block rows of `values`, over one pass's rows (every layer of the batch)."""
    from transformer_lens.components import TransformerBlock

    from headcoop.analysis.games.coalitions import layered_passes
    from headcoop.analysis.mechanisms.cooperation import coalition_masks

    model = attn_only_2l_like(attn_only=False, d_mlp=16, act_fn="gelu")
    tokens = torch.randint(0, model.cfg.d_vocab, (6, 8), generator=torch.Generator().manual_seed(0))
    batch = hc.contrast(tokens, tokens.flip(0), tokens[:, 1], tokens[:, 2]).clean
    players = [(0, 1), (1, 0), (1, 3)]
    rows = [0]
    plain = TransformerBlock.forward

    def counted(self, resid_pre, *args, **kwargs):
        rows[0] += resid_pre.shape[0] * resid_pre.shape[1]
        return plain(self, resid_pre, *args, **kwargs)

    for masks in (all_masks(3), coalition_masks(3, [(0, 1), (0, 2), (1, 2)])):
        game = CoalitionGame(model, players, tokens=batch, metric="logit_diff", how="zero", method="layered")
        monkeypatch.setattr(TransformerBlock, "forward", counted)
        rows[0] = 0
        game.values(masks)
        monkeypatch.setattr(TransformerBlock, "forward", plain)
        ran = rows[0] / (6 * 8 * model.cfg.n_layers)
        # the last layer runs only each input's read row for keys and values at every row: the block count is
        # that of the layers before it; layered_passes counts the last layer's states as whole blocks
        before_last = layered_passes(model, players, masks) - len(torch.unique(masks, dim=0)) / model.cfg.n_layers
        assert ran == pytest.approx(before_last), (ran, before_last)
