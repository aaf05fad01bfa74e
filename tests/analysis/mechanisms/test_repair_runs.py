"""Composition's and backup's runs (`repair.HookedRuns`): started at the first layer they change, from a run that
equals them below it, they give the numbers of the same runs from the tokens (plain hooks on hook_z), on
several architectures; a hook on the model sends every run back to the tokens."""

from __future__ import annotations

import pytest
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

from headcoop.analysis.mechanisms.evidence import Evidence
from headcoop.analysis.mechanisms.repair import HookedRuns, backup, composition


def model_of(kind: str) -> HookedTransformer:
    extra = dict(normalization_type="LN", positional_embedding_type="standard")
    if kind == "rms-rotary":
        extra = dict(normalization_type="RMS", positional_embedding_type="rotary", rotary_dim=8)
    elif kind == "attn-only":
        extra = dict(normalization_type=None, positional_embedding_type="standard")
    cfg = HookedTransformerConfig(n_layers=3, d_model=32, d_head=8, n_heads=2, d_mlp=None if kind == "attn-only" else 64,
                                  attn_only=kind == "attn-only", d_vocab=30, n_ctx=10, act_fn="gelu", seed=2, **extra)  # fmt: skip
    return HookedTransformer(cfg).eval()


def read(runs: HookedRuns, model, tokens, players, repl):
    k, n = len(players), len(tokens)
    answer, wrong = torch.arange(n) % 30, (torch.arange(n) + 1) % 30
    cross = [(m, i, j) for m, (i, j) in enumerate([(a, b) for a in range(k) for b in range(a + 1, k)])
             if players[i][0] != players[j][0]]  # fmt: skip
    v = torch.zeros(2 + 2 * k + k * (k - 1), n, dtype=torch.float64)
    logits = runs.clean()[0]
    v[0] = logits[torch.arange(n), answer] - logits[torch.arange(n), wrong]
    ev = Evidence(v, v.clone(), v.clone(), k, [(a, b) for a in range(k) for b in range(a + 1, k)], False)
    comp = composition(runs, "mean", players, cross, repl, ev, "logit_diff", answer, wrong)
    direct = torch.ones(k, dtype=torch.float64)
    th = dict(min_share=0.1, majority=0.5)
    rows, compensation, held = backup(runs, players, [f"P{i}" for i in range(k)], cross, repl, "mean", answer, wrong,
                                      direct, "logit_diff", wrong, logits, th, 0.01)  # fmt: skip
    return comp, rows, compensation, held


@pytest.mark.parametrize("kind", ["ln-mlp", "rms-rotary", "attn-only"])
def test_runs_started_at_their_layer_equal_runs_from_the_tokens(kind):
    model = model_of(kind)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 30, (6, 10), generator=gen)
    pos = torch.full((6,), 9)
    players = [(0, 1), (1, 0), (2, 1)]
    repl = {p: torch.randn(6, 10, 8, generator=gen) for p in players}
    fast = HookedRuns(model, tokens, pos, players)
    slow = HookedRuns(model, tokens, pos, players)
    slow.from_tokens = True
    assert not fast.from_tokens
    calls = [0]
    plain = model.blocks[0].forward

    def counted(*args, **kwargs):  # layer 0 runs only in the runs from the tokens
        calls[0] += 1
        return plain(*args, **kwargs)

    model.blocks[0].forward = counted
    with torch.no_grad():
        a = read(fast, model, tokens, players, repl)
        fast_calls, calls[0] = calls[0], 0
        b = read(slow, model, tokens, players, repl)
    assert fast_calls < calls[0], (fast_calls, calls[0])
    assert a[0].keys() == b[0].keys() and len(a[0]) == 3
    for m in a[0]:
        assert a[0][m][:2] == b[0][m][:2]
        assert a[0][m][2] == pytest.approx(b[0][m][2], abs=1e-5) and a[0][m][3] == pytest.approx(b[0][m][3], abs=1e-5)
    assert [r["backs_up"] for r in a[1]] == [r["backs_up"] for r in b[1]]
    torch.testing.assert_close(a[2], b[2], atol=1e-5, rtol=1e-5)
    for key in a[3]:
        torch.testing.assert_close(a[3][key][0], b[3][key][0], atol=1e-5, rtol=1e-5)


def test_a_hook_on_the_model_sends_every_run_to_the_tokens():
    model = model_of("ln-mlp")
    tokens = torch.randint(0, 30, (2, 10))
    model.blocks[0].hook_resid_pre.add_hook(lambda x, hook: x)
    try:
        assert HookedRuns(model, tokens, torch.full((2,), 9), [(0, 0), (2, 1)]).from_tokens
    finally:
        model.reset_hooks()


@pytest.mark.parametrize("kind", ["ln-mlp", "rms-rotary", "attn-only"])
def test_the_players_dla_equals_hc_dla_s_columns(kind):
    from headcoop.analysis.mechanisms.evidence import head_dla, player_dla

    model = model_of(kind)
    tokens = torch.randint(0, 30, (5, 10), generator=torch.Generator().manual_seed(3))
    pos = torch.tensor([9, 8, 7, 9, 5])
    players = [(2, 1), (0, 0), (1, 1)]
    with torch.no_grad():
        every, mine = head_dla(model, tokens, pos), player_dla(model, tokens, pos, players)
    assert mine.shape == (5, 3, 30) and mine.dtype == torch.float64
    for i, (lay, h) in enumerate(players):
        torch.testing.assert_close(mine[:, i], every[:, lay, h], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("heads", [["L0H0", "L1H1", "L2H0", "L2H1"], ["L0H0", "L0H1", "L1H0", "L1H1", "L2H0", "L2H1"]])
def test_the_interaction_column_is_hc_interactions_exact_index_under_the_same_ablation(heads):
    """Up to 5 heads the index is read from the zero reading's own coalitions; above, from one game over every
    coalition: both equal hc.interactions' exact index under zero ablation."""
    import headcoop as hc

    model = model_of("ln-mlp")
    gen = torch.Generator().manual_seed(4)
    tokens = torch.randint(0, 30, (24, 10), generator=gen)
    answer = torch.randint(0, 30, (24,), generator=gen)
    batch = hc.Batch.from_answers(tokens, answer, (answer + 1) % 30)
    result = hc.cooperation(model, inputs=batch, heads=heads, how="zero", metric="logit_diff", progress=False)
    want = hc.interactions(model, tokens=batch, heads=heads, metric="logit_diff", how="zero", estimator="exact")
    for row in result.pairs.itertuples():
        i, j = heads.index(row.head_a), heads.index(row.head_b)
        assert row.interaction == pytest.approx(float(want.interaction[i, j]), abs=1e-5)


def test_standing_is_stands_word_and_share_on_random_votes():
    import random

    from headcoop.analysis.mechanisms.words import Reading, stand, standing

    rng = random.Random(0)
    pool = ["redundant", "undetermined", "division", "unseen", "inactive"]
    for _ in range(400):
        n = rng.randint(1, 12)
        readings = [Reading(rng.choice(["zero", "mean", "resample"]), 0, rng.choice([None, "role"]),
                            rng.choice([0.5, 1.0, 2.0])) for _ in range(n)]  # fmt: skip
        words = [rng.choice(pool) for _ in range(n)]
        agree = rng.choice([0.5, 0.9, 1.0])
        assert standing(words, readings, agree) == stand(words, readings, agree)[:2]
