"""headcoop.studies.skip_pair against brute force: every ordered sequence of a short SkipPair task, the model's own
attention patterns and hooks, plain-torch circuits, and scipy's Kendall tau."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from scipy.stats import kendalltau
from transformer_lens.utilities import get_act_name

import headcoop as hc
from headcoop.studies import skip_pair as M
from headcoop.tasks.skip_pair import NOISE, PAIRS, SIGNAL


@pytest.fixture(scope="module")
def short():
    """SkipPair with 5 tokens (4 context positions) and a briefly trained 2-head model."""
    task = hc.SkipPair(seq_len=5)
    model = hc.train(task, task.model(seed=0, n_heads=2, d_head=3), steps=60, progress=False)
    return task, model


@pytest.fixture(scope="module")
def model10():
    task = hc.SkipPair()
    return hc.train(task, task.model(seed=1, n_heads=2, d_head=2), steps=40, progress=False)


def brute_signal(task):
    """Every ordered signal sequence as the sampler draws it: two distinct positions (ordered), a and b
    independent, noise independent; returns tokens, probabilities, pair index."""
    L = task.seq_len
    rows, probs, pair = [], [], []
    positions = list(itertools.permutations(range(L - 1), 2))
    for p, q in positions:
        for a, b in itertools.product(SIGNAL, SIGNAL):
            rest = [i for i in range(L - 1) if i not in (p, q)]
            for noise in itertools.product(NOISE, repeat=len(rest)):
                seq = [0] * L
                seq[p], seq[q] = a, b
                for i, t in zip(rest, noise):
                    seq[i] = t
                rows.append(seq)
                probs.append(1 / len(positions) / 16 / len(NOISE) ** len(rest))
                pair.append(PAIRS.index(tuple(sorted((a, b)))))
    return torch.tensor(rows), torch.tensor(probs, dtype=torch.float64), torch.tensor(pair)


def test_contexts_weights_and_shapes():
    task = hc.SkipPair()
    sig = M.contexts(task, "signal")
    assert sig.tokens.shape == (10 * math.comb(13, 6), 10)
    for i in range(10):
        assert sig.weight[sig.pair == i].sum().item() == pytest.approx(1.0, abs=1e-12)
    assert ((sig.tokens[:, :-1] >= 1) & (sig.tokens[:, :-1] <= 4)).sum(1).eq(2).all()
    assert sig.tokens[:, -1].eq(0).all()
    assert torch.equal(sig.answer, torch.tensor([task.mapping[PAIRS[i]] for i in sig.pair.tolist()]))
    noise = M.contexts(task, "noise")
    assert noise.tokens.shape == (7 * math.comb(15, 6), 10)
    assert noise.weight.sum().item() == pytest.approx(1.0, abs=1e-12)
    assert noise.tokens.min() >= 5
    one = M.contexts(task, "signal", pair=(4, 1))
    assert one.pair.eq(PAIRS.index((1, 4))).all() and one.answer.eq(3).all()


def test_exact_evaluate_matches_every_ordered_sequence(short):
    task, model = short
    result = M.exact_evaluate(model).as_dict()
    tokens, probs, pair = brute_signal(task)
    with torch.no_grad():
        logits = model(tokens)[:, -1].double()
    answer = torch.tensor([task.mapping[PAIRS[i]] for i in pair.tolist()])
    right = (logits.argmax(-1) == answer).double()
    accs = []
    for i, (a, b) in enumerate(PAIRS):
        rows = pair == i
        acc = (right[rows] * probs[rows]).sum() / probs[rows].sum()
        assert result[f"acc_{a}{b}"] == pytest.approx(acc.item(), abs=1e-9)
        assert result[f"all_{a}{b}"] == right[rows].min().item()
        accs.append(acc.item())
    assert result["signal_acc"] == pytest.approx(sum(accs) / 10, abs=1e-9)
    noise = torch.tensor(list(itertools.product(NOISE, repeat=task.seq_len)))
    with torch.no_grad():
        logp = model(noise)[:, -1].double().log_softmax(-1)[:, list(NOISE)]
    assert result["noise_loss"] == pytest.approx((-logp.mean()).item(), abs=1e-5)
    assert result["noise_loss_optimum"] == pytest.approx(math.log(7))


def test_exact_evaluate_agrees_with_sampled_evaluate(model10):
    exact = M.exact_evaluate(model10).as_dict()
    sampled = hc.evaluate(model10, n=2000)
    assert exact["signal_acc"] == pytest.approx(sampled["signal_acc"], abs=0.03)
    assert exact["noise_loss"] == pytest.approx(sampled["noise_loss"], abs=0.05)


def test_last_logits_fast_path_matches_forward(model10):
    ctx = M.contexts(model10.task, "signal", pair=(2, 3))
    fast = M.last_logits(model10, ctx.tokens, chunk=500)
    with torch.no_grad():
        slow = model10(ctx.tokens)[:, -1].double()
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)


def test_read_off_scores_and_orderings_match_hooks(model10):
    scores = M.read_off_scores(model10)
    tokens = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8, 9, 0]])
    _, cache = model10.run_with_cache(tokens)
    hooked = cache[get_act_name("attn_scores", 0)][0, :, -1, :4]  # [head, key 1..4]
    torch.testing.assert_close(scores, hooked, atol=1e-5, rtol=1e-5)
    for h in range(2):
        want = tuple(sorted(SIGNAL, key=lambda t: -hooked[h, t - 1].item()))
        assert M.preference_order(model10, h) == want


def test_split_attention_matches_pattern(model10):
    split = M.split_attention(model10)
    for j, (a, b) in enumerate(M.DISTINCT_PAIRS):
        tokens = torch.tensor([[a, 5, 6, b, 7, 7, 11, 9, 5, 0]])
        _, cache = model10.run_with_cache(tokens)
        pattern = cache[get_act_name("pattern", 0)][0, :, -1]  # [head, key]
        pa, pb = pattern[:, 0], pattern[:, 3]
        torch.testing.assert_close(split[:, j], torch.minimum(pa, pb) / (pa + pb), atol=1e-5, rtol=1e-4)


def test_conditional_contributions_plain_torch(model10):
    got = M.conditional_contributions(model10)
    cols = [model10.task.mapping[p] for p in PAIRS]
    a = model10.blocks[0].attn
    for h in range(2):
        for i, t in enumerate(SIGNAL):
            want = ((model10.W_E[t] @ a.W_V[h] + a.b_V[h]) @ a.W_O[h] @ model10.W_U)[cols]
            torch.testing.assert_close(got[h, i], want.detach(), atol=1e-5, rtol=1e-5)


def test_pair_contributions_match_every_ordered_sequence(short):
    task, model = short
    got = M.pair_contributions(model).double()
    tokens, probs, pair = brute_signal(task)
    _, cache = model.run_with_cache(tokens)
    z = cache[get_act_name("z", 0)][:, -1]  # [n, head, d_head]
    per_head = torch.einsum("nhd,hdm,mv->nhv", z, model.blocks[0].attn.W_O, model.W_U).double()
    cols = [task.mapping[p] for p in PAIRS]
    for i in range(10):
        rows = pair == i
        w = probs[rows] / probs[rows].sum()
        want = (per_head[rows][..., cols] * w[:, None, None]).sum(0)
        torch.testing.assert_close(got[i], want, atol=1e-4, rtol=1e-4)


def test_kendall_and_relations():
    for first, second in [((1, 2, 3, 4), (4, 3, 2, 1)), ((2, 1, 4, 3), (1, 2, 3, 4)), ((3, 1, 2, 4), (1, 4, 2, 3))]:
        rank = lambda o: [o.index(t) for t in SIGNAL]  # noqa: E731
        assert M.kendall_tau(first, second) == pytest.approx(kendalltau(rank(first), rank(second)).statistic)
    assert M.compare_orderings((1, 2, 3, 4), (1, 2, 3, 4)) == "equal"
    assert M.compare_orderings((1, 2, 3, 4), (4, 3, 2, 1)) == "reversed"
    assert M.compare_orderings((1, 2, 3, 4), (4, 3, 1, 2)) == "partly reversed"  # tau = -2/3
    assert M.compare_orderings((1, 2, 3, 4), (2, 1, 3, 4)) == "partly equal"  # tau = 2/3
    assert M.compare_orderings((1, 2, 3, 4), (3, 4, 1, 2)) == "partly reversed"  # tau = -1/3
    assert M.compare_orderings((1, 2, 3, 4), (2, 4, 1, 3)) == "partly equal"  # tau = 0


def test_consistent_completions():
    order = (3, 1, 4, 2)
    assert [PAIRS[i] for i in M.consistent_completions(order, 3)] == [(1, 3), (2, 3), (3, 3), (3, 4)]
    assert [PAIRS[i] for i in M.consistent_completions(order, 1)] == [(1, 1), (1, 2), (1, 4)]
    assert [PAIRS[i] for i in M.consistent_completions(order, 2)] == [(2, 2)]


def test_pushed_up_and_constructive():
    contrib = torch.zeros(10, 2, 10)
    for p in range(10):
        contrib[p, :, p] = 5.0  # both heads push the right completion
    contrib[3, 0, 7] = contrib[3, 1, 7] = 4.0  # pair 3: a second completion pushed by both
    contrib[5, 0, 2] = 4.0  # pair 5: only one head pushes another completion
    ok = M.constructive_pairs(contrib)
    assert ok.tolist() == [p != 3 for p in range(10)]
    assert M.pushed_up(contrib)[5, 0, 2] and not M.pushed_up(contrib)[5, 1, 2]
    shifted = contrib - 100.0
    assert torch.equal(M.constructive_pairs(shifted), ok)  # centered: a common shift changes nothing
    assert not M.constructive_pairs(shifted, centered=False).any()


def test_bad_input(model10):
    count = hc.Count01().model(seed=0, n_heads=2, d_model=8, d_head=2)
    with pytest.raises(ValueError, match="SkipPair models"):
        M.exact_evaluate(count)
    with pytest.raises(ValueError, match="no headcoop task"):
        M.conditional_contributions(hc.SkipPair().model(seed=0).__class__(model10.cfg))
    with pytest.raises(IndexError, match=r"heads 0\.\.1"):
        M.preference_order(model10, head=2)
    with pytest.raises(IndexError, match=r"layers 0\.\.0"):
        M.read_off_scores(model10, layer=1)
    with pytest.raises(ValueError, match="valid values are"):
        M.contexts(hc.SkipPair(), kind="both")
    with pytest.raises(ValueError, match="not a pair of signal tokens"):
        M.contexts(hc.SkipPair(), pair=(0, 5))
    with pytest.raises(ValueError, match="signal contexts only"):
        M.contexts(hc.SkipPair(), "noise", pair=(1, 2))
    with pytest.raises(ValueError, match="permutations"):
        M.kendall_tau((1, 2, 3), (1, 2, 4))
    two = hc.SkipPair().model(seed=0, n_layers=2, n_heads=2, d_head=2)
    with pytest.raises(ValueError, match="one-layer"):
        M.exact_evaluate(two)
    moved = hc.SkipPair().model(seed=0, n_heads=2, d_head=2)
    with torch.no_grad():
        moved.W_pos[3, 0] = 1.0
    with pytest.raises(ValueError, match="W_pos"):
        M.pair_contributions(moved)


def test_sampled_pair_contributions_average_dla_over_the_sampled_contexts(short):
    task, model = short
    got = M.pair_contributions(model, n=64, seed=5)
    cols = [task.mapping[p] for p in PAIRS]
    for i, pair in enumerate(PAIRS):
        batch = task.sample(64, seed=5 + i, pair=pair)
        _, cache = model.run_with_cache(batch.tokens)
        z = cache[get_act_name("z", 0)][:, -1]
        want = torch.einsum("nhd,hdm,mv->nhv", z, model.blocks[0].attn.W_O, model.W_U)[..., cols].mean(0)
        torch.testing.assert_close(got[i], want, atol=1e-4, rtol=1e-4)
    # a Monte Carlo estimate of the exact average: close with many samples
    torch.testing.assert_close(M.pair_contributions(model, n=4096), M.pair_contributions(model), atol=0.05, rtol=0.05)
    with pytest.raises(ValueError, match="n"):
        M.pair_contributions(model, n=0)


def test_sampled_pair_contributions_work_where_enumeration_cannot():
    task = hc.SkipPair(seq_len=50)
    model = task.model(seed=0, n_heads=2, d_head=2)
    with pytest.raises(ValueError):
        M.pair_contributions(moved := task.model(seed=1, n_layers=2, n_heads=2, d_head=2))
    assert M.pair_contributions(moved, n=8).shape == (10, 2, 10)
    assert M.pair_contributions(model, n=8).isfinite().all()


def _contexts(task, a: int, b: int, n: int = 32, seed: int = 0) -> torch.Tensor:
    """n contexts holding signal tokens a and b (at positions 2 and 5), noise elsewhere, the read-off 0 last."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.tensor(NOISE)[torch.randint(len(NOISE), (n, task.seq_len), generator=g)]
    tokens[:, 2], tokens[:, 5], tokens[:, -1] = a, b, 0
    return tokens


@pytest.mark.parametrize("name", ["skip-pair", "skip-pair-dhead1"])
def test_registry_measures_of_a_model_match_plain_transformer_lens(name):
    """The per-model numbers behind the registry's new SkipPair rows (experiments/skip_pair/exp_runs.py), recomputed
    from a plain TransformerLens forward: which token each head attends to in real contexts (the cover of a pair),
    each head's direct logit effect on the completions in (x, x) contexts of its least favourite x, and the value
    vectors read off hook_v."""
    from experiments.skip_pair.exp_runs import covered_pairs, least_favourite_alone, value_cos_max

    model = hc.load(name)
    task = M.skip_pair_task(model)
    orders = [M.preference_order(model, h) for h in range(model.cfg.n_heads)]
    covered = fully = 0
    for a, b in M.DISTINCT_PAIRS:
        _, cache = model.run_with_cache(_contexts(task, a, b))
        pattern = cache[get_act_name("pattern", 0)][:, :, -1].mean(0)  # [head, key]
        pa, pb = pattern[:, 2], pattern[:, 5]
        preferred = {a if x > y else b for x, y in zip(pa.tolist(), pb.tolist())}
        covered += preferred == {a, b}
        fully += preferred == {a, b} and bool((torch.minimum(pa, pb) / (pa + pb) <= 0.1).all())
    assert covered_pairs(orders, M.split_attention(model)) == (covered, fully)
    completions = M.completions(task)
    hits = 0
    for h, order in enumerate(orders):
        x = order[-1]
        _, cache = model.run_with_cache(_contexts(task, x, x))
        z = cache[get_act_name("z", 0)][:, -1, h]  # [batch, d_head]
        direct = (z @ model.W_O[0, h] @ model.W_U)[:, completions].mean(0)
        hits += int(direct.argmax()) == PAIRS.index((x, x))
    assert least_favourite_alone(orders, M.conditional_contributions(model)) == hits
    _, cache = model.run_with_cache(torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8, 9, 0]]))
    v = cache[get_act_name("v", 0)][0, :4]  # [signal token, head, d_head]
    unit = v / v.norm(dim=-1, keepdim=True)
    cos = torch.einsum("ihd,jhd->hij", unit, unit).abs()
    off = ~torch.eye(4, dtype=torch.bool)
    assert value_cos_max(model) == pytest.approx(float(cos[:, off].max()), abs=1e-5)
