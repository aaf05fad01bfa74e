"""The axes issue 48 added, each against a plain loop or a library (the slow, obviously correct reference),
and the family's abstentions on the models whose ablations cannot see them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import headcoop as hc
from headcoop.analysis.mechanisms.axes import class_weights, conditional_writes, containing_outputs, same_computation
from headcoop.analysis.mechanisms.references import aligned_mean, aligned_resample


def test_conditional_writes_equal_a_loop():
    g = torch.Generator().manual_seed(0)
    dla = torch.randn(40, 6, generator=g, dtype=torch.float64)
    consistent = torch.rand(40, 6, generator=g) < 0.4
    containing = consistent | (torch.rand(40, 6, generator=g) < 0.4)
    evidence, conditional = conditional_writes(dla, consistent, containing, margin=0.1)
    for b in range(40):
        cons = [dla[b, c] for c in range(6) if consistent[b, c]]
        rival = [dla[b, c] for c in range(6) if containing[b, c] and not consistent[b, c]]
        assert bool(evidence[b]) == (bool(cons) and bool(rival))
        if cons and rival:
            assert bool(conditional[b]) == bool(min(cons) - max(rival) > 0.1 * dla[b].abs().max())


def test_containing_outputs_equal_a_loop():
    tokens = torch.tensor([[1, 2, 9], [2, 3, 9], [1, 3, 9], [4, 4, 9]])
    answer, outputs, upto = torch.tensor([10, 11, 12, 13]), torch.tensor([10, 11, 12, 13]), torch.full((4,), 2)
    got = containing_outputs(torch.tensor([1, 2, 3, 4, 9]), tokens, answer, outputs, upto)
    want = [[1, 0, 1, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 0, 1], [1, 1, 1, 1]]
    assert got.tolist() == [[bool(x) for x in row] for row in want]


def test_same_computation_against_numpy():
    g = torch.Generator().manual_seed(1)
    base = torch.randn(300, generator=g, dtype=torch.float64)
    push = torch.stack([2 * base + 0.1 * torch.randn(300, generator=g, dtype=torch.float64),
                        -base + 0.3 * torch.randn(300, generator=g, dtype=torch.float64),
                        torch.randn(300, generator=g, dtype=torch.float64),
                        1e-4 * torch.randn(300, generator=g, dtype=torch.float64)])  # fmt: skip
    got = same_computation(push, floor=0.1)
    assert got["active"].tolist() == [True, True, True, False]
    np.testing.assert_allclose(got["r"].numpy(), np.corrcoef(push.numpy()), atol=1e-12)
    active = push[:3].numpy()
    centred = active - active.mean(1, keepdims=True)
    eig = np.linalg.eigvalsh(centred @ centred.T)
    assert got["share"] == pytest.approx(eig.max() / eig.sum(), abs=1e-12)
    r = np.corrcoef(active)[np.triu_indices(3, 1)]
    assert got["r_min"] == pytest.approx(r.min()) and got["r_median"] == pytest.approx(np.median(r))


def test_class_weights_against_numpy():
    g = torch.Generator().manual_seed(2)
    shares = torch.rand(100, 3, generator=g, dtype=torch.float64)
    shares = shares / shares.sum(1, keepdim=True)
    push = torch.randn(2, 100, generator=g, dtype=torch.float64)
    want = np.linalg.lstsq(shares.numpy(), push.numpy().T, rcond=None)[0].T
    np.testing.assert_allclose(class_weights(push, shares).numpy(), want, atol=1e-10)


def test_aligned_resample_equals_its_definition():
    g = torch.Generator().manual_seed(3)
    ref = torch.randn(5, 6, 2, generator=g)
    ref_ans, ans, order = (
        torch.tensor([1, 5, 3, 0, 2]),
        torch.tensor([0, 3, 5, 2, 4, 1, 2]),
        torch.tensor([2, 0, 4, 1, 3]),
    )
    out = aligned_resample(ref, ref_ans, ans, 6, order)
    mean = aligned_mean(ref[:, :, None], ref_ans, ans, 6)[:, :, 0]
    for b in range(7):
        r = int(order[b % 5])
        for p in range(6):
            at = int(ref_ans[r]) + p - int(ans[b])
            want = ref[r, at] if 0 <= at < 6 else mean[b, p]
            torch.testing.assert_close(out[b, p], want)


def test_an_ablation_that_cannot_see_a_pair_abstains_and_says_why():
    """flat: L0H1 writes the same on every input, so mean and resample leave it as it is (they abstain) and
    zero names the competition; unequal: resample injects another input's answer, so it abstains and zero
    and mean name the redundancy."""
    flat = hc.cooperation(hc.bench("flat"), n=128)
    row = flat.pairs.iloc[0]
    same = "cannot see: L0H1 writes the same whatever the input: this ablation leaves it as it is (96 of 96 readings)"
    assert row.mechanism == "competition" and row.by_ablation == f"zero: competition; mean: {same}; resample: {same}"
    assert flat.words.loc["L0H0&L0H1", "mean draw 0"] == "unseen"
    unequal = hc.cooperation(hc.bench("unequal"), n=128)
    row = unequal.pairs.iloc[0]
    assert row.mechanism == "redundant" and "resample cannot see it: resample injects" in row.flips_under
    # and where resample can see the pair it votes: a conjunction injects no winning answer (a quarter of its
    # draws carry the input's own token, so resample alone reads a mixture there: not a confident word)
    votes = hc.cooperation(hc.bench("and-junk"), n=128, how="resample")
    assert votes.pairs.mechanism[0] in ("conjunction", "undetermined")
    assert "cannot see" not in votes.pairs.by_ablation[0]


def test_identical_reference_draws_count_once():
    """A reference of one repeated input: its bootstrap draws are identical, so each kind has one reading."""
    model = hc.bench("post")
    one = model.task.sample(1, seed=4)
    reference = hc.Batch.cat([one] * 16)
    result = hc.cooperation(model, n=64, reference=reference, how=("mean", "resample"))
    assert set(result.readings.draw) == {0}
