"""hc.attribute: gradient estimates of patches against exact patching (hc.patch, itself checked against
TransformerLens), the QK fix on a saturated head, and the false-negative bound against a full sweep."""

from __future__ import annotations

import sys
from pathlib import Path

import plotly.graph_objects as go
import pytest
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

import headcoop as hc
from headcoop.analysis.engine.verification import clopper_pearson

sys.path.insert(0, str(Path(__file__).parent))
from test_any_model import N_CTX, SHAPES, VOCAB, build  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")


def _count01(n_layers=1):
    model = hc.Count01(max_len=6).model(seed=0, n_heads=4, d_model=8, d_head=2, n_layers=n_layers)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.W_Q.mul_(4)
            block.attn.W_K.mul_(4)
    clean, corrupt = model.task.patching_inputs(n=6, seed=1)
    return model, clean, corrupt


def _inputs(seed=2, batch=6):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (batch, N_CTX), generator=gen), torch.randint(
        0, VOCAB, (batch, N_CTX), generator=gen
    )


def _metric(logits):
    return logits[:, -1, 1].mean() - logits[:, -1, 2].mean()


@pytest.mark.parametrize("direction", ["denoise", "noise"])
@pytest.mark.parametrize("positions", ["each", "all"])
@pytest.mark.parametrize("method", ["atp", "atp*", "ig"])
def test_z_attribution_is_exact_where_the_metric_is_linear_in_z(direction, positions, method):
    """One layer, attention only, the task's logit difference: the metric is linear in z, so every method's
    estimate equals exact patching (hc.patch), cell by cell and in the same layout."""
    model, clean, corrupt = _count01()
    exact = hc.patch(model, clean=clean, corrupt=corrupt, component="z", positions=positions, direction=direction)
    ours = hc.attribute(model, clean=clean, corrupt=corrupt, component="z", positions=positions, direction=direction,
                        method=method, verify=0, sample=0)  # fmt: skip
    assert ours.dims == exact.dims and ours.coords == exact.coords
    assert (exact.values - exact.values.flatten()[0]).abs().max() > 1e-3  # the patches differ: not vacuous
    torch.testing.assert_close(ours.values, exact.values, atol=1e-5, rtol=1e-5)
    assert (ours.clean_value, ours.corrupt_value) == pytest.approx((exact.clean_value, exact.corrupt_value), abs=1e-6)


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("component", ["z", "q", "k", "v", "pattern", "resid_pre", "attn_out", "mlp_out"])
def test_verified_values_are_exact_patching(shape, component):
    """verify='all': the exact column is hc.patch's sweep on every shape; the estimate differs from it where
    the model is not linear (so the comparison tests something), and its correlation is reported."""
    model = build(shape)
    clean, corrupt = _inputs()
    if component == "mlp_out" and model.cfg.attn_only:
        with pytest.raises(ValueError, match="needs a model with MLPs"):
            hc.attribute(model, clean=clean, corrupt=corrupt, metric=_metric, component=component)
        return
    ours = hc.attribute(model, clean=clean, corrupt=corrupt, metric=_metric, component=component, verify="all")
    exact = hc.patch(model, clean=clean, corrupt=corrupt, metric=_metric, component=component, positions="each")
    torch.testing.assert_close(ours.exact, exact.values, atol=1e-5, rtol=1e-5)
    assert bool(ours.verified.all()) and ours.values.shape == exact.values.shape
    recall = ours.recall(10)  # NaN where many patches change nothing and tie at the 10th place
    assert (recall != recall or 0 <= recall <= 1) and set(ours.correlation()) == {"pearson", "spearman", "cells"}


@pytest.mark.parametrize("shape", ["attn-only", "rotary-partial"])
@pytest.mark.parametrize("component", ["q", "k"])
@pytest.mark.parametrize("positions", ["each", "all"])
def test_the_qk_fix_is_exact_in_one_attention_only_layer(shape, component, positions):
    """With one attention-only layer the metric is linear in the pattern, so AtP*'s QK fix (exact pattern,
    linearised from there) equals exact patching of q and k, rotary included; plain AtP does not."""
    model = build(shape, n_layers=1)
    with torch.no_grad():  # sharp patterns (the softmax far from linear) and heads that matter
        model.blocks[0].attn.W_Q.mul_(6)
        model.blocks[0].attn.W_K.mul_(3)
        model.blocks[0].attn.W_O.mul_(10)
    clean, corrupt = _inputs()
    exact = hc.patch(model, clean=clean, corrupt=corrupt, metric=_metric, component=component, positions=positions)
    star = hc.attribute(model, clean=clean, corrupt=corrupt, metric=_metric, component=component, positions=positions,
                        method="atp*", verify=0, sample=0)  # fmt: skip
    plain = hc.attribute(model, clean=clean, corrupt=corrupt, metric=_metric, component=component, positions=positions,
                         method="atp", verify=0, sample=0)  # fmt: skip
    torch.testing.assert_close(star.values, exact.values, atol=1e-4, rtol=1e-4)
    assert float((exact.values - exact.corrupt_value).abs().max()) > 0.1  # patches that matter
    assert float((plain.values - exact.values).abs().max()) > 1e-2
    assert any("QK fix: the pattern" in a for a in star.assumptions)


def _saturated() -> tuple[HookedTransformer, torch.Tensor, torch.Tensor]:
    """One head whose query (Q, token 3) attends by key scores A (0) 10, B (1) -10, C (2) 5, D (4) 4, E (5) 4.5;
    A and B carry the value 1, E 0.5, the others 0, written to logit 0. Corrupt 'C B E Q' attends to C and E.
    Patching the clean key of A at position 1 (clean 'C A D Q') moves the attention to B's value: an effect
    near 0.8, while the corrupt run's gradient there is about e^-15 (the softmax is saturated), so AtP
    gives it ~0 and ranks the key at position 2 (E to D, an effect near -0.05) first."""
    cfg = HookedTransformerConfig(n_layers=1, d_model=6, n_heads=1, d_head=1, d_vocab=6, n_ctx=4, attn_only=True,
                                  normalization_type=None, seed=0)  # fmt: skip
    model = HookedTransformer(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.W_E.copy_(torch.eye(6))
        attn = model.blocks[0].attn
        attn.W_Q[0, 3, 0] = 1.0
        attn.W_K[0, :, 0] = torch.tensor([10.0, -10.0, 5.0, 0.0, 4.0, 4.5])
        attn.W_V[0, :, 0] = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0, 0.5])
        attn.W_O[0, 0, 0] = 1.0
        model.W_U[0, 0] = 1.0
    return model, torch.tensor([[2, 0, 4, 3]]), torch.tensor([[2, 1, 5, 3]])


def test_a_saturated_head_is_missed_by_atp_recovered_by_atp_star_and_caught_by_the_bound():
    model, clean, corrupt = _saturated()

    def metric(logits):
        return logits[:, -1, 0].mean()

    exact = hc.patch(model, clean=clean, corrupt=corrupt, metric=metric, component="k", positions="each")
    effect = exact.values - exact.corrupt_value
    assert float(effect[0, 1, 0]) > 0.7 and -0.1 < float(effect[0, 2, 0]) < -0.01
    plain = hc.attribute(
        model, clean=clean, corrupt=corrupt, metric=metric, component="k", method="atp", verify=1, sample=3
    )
    assert abs(float(plain.effect[0, 1, 0])) < 1e-4  # AtP: a false negative
    assert bool(plain.top[0, 2, 0]) and not bool(plain.top[0, 1, 0])
    # the random sample (here every other cell) holds the missed one: the bound says one cell was missed
    assert plain.missed["above"] == 1 and plain.missed["estimate"] == pytest.approx(1.0) and plain.missed["high"] >= 1
    star = hc.attribute(
        model, clean=clean, corrupt=corrupt, metric=metric, component="k", method="atp*", verify=1, sample=3
    )
    assert float(star.effect[0, 1, 0]) == pytest.approx(float(effect[0, 1, 0]), abs=1e-4)
    assert bool(star.top[0, 1, 0]) and star.missed["above"] == 0  # AtP* ranks it first and misses nothing


def test_the_false_negative_estimate_is_the_true_count_when_every_other_cell_is_sampled():
    model = build("gelu-LN")
    clean, corrupt = _inputs(seed=5)
    full = hc.attribute(model, clean=clean, corrupt=corrupt, metric=_metric, component="z", verify="all")
    truth_effect = (full.exact - full.target_value).abs().reshape(-1)
    order = torch.argsort(full.score.reshape(-1), descending=True, stable=True)
    k = 5
    threshold = float(truth_effect[order[:k]].min())
    truth = int((truth_effect[order[k:]] > threshold).sum())
    n = full.score.numel()
    checked = hc.attribute(model, clean=clean, corrupt=corrupt, metric=_metric, component="z", verify=k, sample=n - k)
    assert checked.missed["threshold"] == pytest.approx(threshold, abs=1e-6)
    assert checked.missed["estimate"] == pytest.approx(truth) and checked.missed["rest"] == n - k
    assert checked.missed["low"] <= truth <= checked.missed["high"]
    some = hc.attribute(model, clean=clean, corrupt=corrupt, metric=_metric, component="z", verify=k, sample=10, seed=3)
    assert int(some.sampled.sum()) == 10 and int(some.top.sum()) == k and int(some.verified.sum()) == k + 10
    again = hc.attribute(
        model, clean=clean, corrupt=corrupt, metric=_metric, component="z", verify=k, sample=10, seed=3
    )
    assert torch.equal(again.sampled, some.sampled)  # the seed fixes the sample


def _bisected_clopper_pearson(above, n, level=0.95):
    """The interval headcoop computed by bisection on the binomial tail before it used scipy: the reference
    the library's numbers must equal."""
    import math

    alpha = 1 - level

    def tail_le(p, m):
        if p <= 0:
            return 1.0
        if p >= 1:
            return 0.0 if m < n else 1.0
        return sum(math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * math.log(p)
                            + (n - i) * math.log1p(-p)) for i in range(m + 1))  # fmt: skip

    def solve(f, want):
        lo, hi = 0.0, 1.0
        for _ in range(80):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if f(mid) > want else (lo, mid)
        return (lo + hi) / 2

    low = 0.0 if above == 0 else solve(lambda p: tail_le(p, above - 1), 1 - alpha / 2)
    high = 1.0 if above == n else solve(lambda p: tail_le(p, above), alpha / 2)
    return low, high


def test_clopper_pearson_is_unchanged_from_the_bisection():
    for above, n in [(0, 20), (1, 20), (5, 20), (20, 20), (3, 200), (17, 40), (0, 1), (1, 1)]:
        assert clopper_pearson(above, n) == pytest.approx(_bisected_clopper_pearson(above, n), abs=1e-9)
    assert clopper_pearson(0, 0) == (0.0, 1.0)


def test_clopper_pearson_matches_scipy():
    beta = pytest.importorskip("scipy.stats").beta
    for above, n in [(0, 20), (1, 20), (5, 20), (20, 20), (3, 200)]:
        low, high = clopper_pearson(above, n)
        want_low = 0.0 if above == 0 else beta.ppf(0.025, above, n - above + 1)
        want_high = 1.0 if above == n else beta.ppf(0.975, above + 1, n - above)
        assert (low, high) == pytest.approx((want_low, want_high), abs=1e-6)


@pytest.mark.parametrize("n_layers", [2, 3])
@pytest.mark.parametrize("component", ["z", "v", "attn_out", "mlp_out", "resid_pre"])
def test_graddrop_ranks_by_the_layers_dropped_one_at_a_time(component, n_layers):
    """AtP*'s score, hand-computed for every component kind: the larger of |estimate| and the sum over blocks
    of |estimate with that block's output detached| / (L - 1), here from plain hooks (`detach` on the block's
    attn_out and mlp_out). A last-block node scores exactly |AtP| (measured before the fix: attn_out and
    mlp_out scored L/(L-1) |AtP|, their gradient hook skipped), and no node scores below |AtP|."""
    model = build("gelu-LN") if n_layers == 2 else _three_layers()
    clean, corrupt = _inputs()
    star = hc.attribute(model, clean=clean, corrupt=corrupt, metric=_metric, component=component, method="atp*",
                        verify=0, sample=0)  # fmt: skip
    assert any("GradDrop" in a for a in star.assumptions)
    _, cache = model.run_with_cache(clean)
    names = [f"blocks.{lay}.attn.hook_{component}" if component in ("z", "v") else f"blocks.{lay}.hook_{component}"
             for lay in range(n_layers)]  # fmt: skip

    def estimate(drop):
        acts = {}

        def keep(act, hook):
            act.retain_grad()
            acts[hook.name] = act
            return act

        def stop(act, hook):
            return act.detach()  # no gradient through this block's output

        hooks = [("blocks.0.hook_resid_pre", lambda x, hook: x.detach().requires_grad_(True))]
        hooks += [(name, keep) for name in names]
        if drop is not None:
            hooks += [(f"blocks.{drop}.hook_attn_out", stop), (f"blocks.{drop}.hook_mlp_out", stop)]
        _metric(model.run_with_hooks(corrupt, fwd_hooks=hooks)).backward()
        out = []
        for name in names:
            grad = acts[name].grad if acts[name].grad is not None else torch.zeros_like(acts[name])
            out.append(((cache[name] - acts[name].detach()) * grad).sum(-1).sum(0))
        return torch.stack(out)

    plain = estimate(None)
    dropped = sum(estimate(drop).abs() for drop in range(n_layers)) / (n_layers - 1)
    torch.testing.assert_close(star.values - star.target_value, plain, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(star.score, torch.maximum(dropped, plain.abs()), atol=1e-5, rtol=1e-4)
    if component != "resid_pre":  # a last-block output: no dropped block lies on its path, so exactly |AtP|
        torch.testing.assert_close(star.score[-1], plain[-1].abs(), atol=1e-5, rtol=1e-4)


def _three_layers():
    cfg = HookedTransformerConfig(n_layers=3, d_model=16, d_head=4, n_heads=4, d_mlp=32, n_ctx=N_CTX, d_vocab=VOCAB,
                                  act_fn="gelu", normalization_type="LN", seed=0)  # fmt: skip
    return HookedTransformer(cfg)


def test_graddrop_does_not_sink_a_node_whose_effect_runs_through_a_later_block():
    """A layer-0 head read only by layer 1 of a two-layer model: every dropped term is 0, so GradDrop alone
    would rank it last; its score is |estimate| (module docstring)."""
    model = build("gelu-LN")
    clean, corrupt = _inputs()
    star = hc.attribute(
        model, clean=clean, corrupt=corrupt, metric=_metric, component="z", method="atp*", verify=0, sample=0
    )
    plain = hc.attribute(
        model, clean=clean, corrupt=corrupt, metric=_metric, component="z", method="atp", verify=0, sample=0
    )
    assert bool((star.score >= plain.score - 1e-6).all())


def test_user_hooks_are_honoured_by_the_verification():
    model, clean, corrupt = _count01(n_layers=2)
    with hc.ablate(model, heads=(0, 1), how="zero"):
        ours = hc.attribute(model, clean=clean, corrupt=corrupt, component="z", verify="all")
        exact = hc.patch(model, clean=clean, corrupt=corrupt, component="z", positions="each")
    torch.testing.assert_close(ours.exact, exact.values, atol=1e-5, rtol=1e-5)
    assert exact.method.startswith("reference") and ours.method.startswith("reference")
    assert any("hooks installed" in a for a in ours.assumptions)


def test_result_table_plot_and_repr():
    model, clean, corrupt = _count01(n_layers=2)
    result = hc.attribute(model, clean=clean, corrupt=corrupt, method="atp*", verify=4, sample=3)
    frame = result.to_dataframe()
    assert {"name", "layer", "pos", "head", "estimate", "score", "exact", "verified", "top", "sampled"} <= set(
        frame.columns
    )
    assert int(frame.verified.sum()) == 7 and int(frame.top.sum()) == 4
    fig = result.plot()
    assert isinstance(fig, go.Figure) and "GradDrop" in fig.layout.title.text
    assert "assumes" in repr(result) and "missed outside the top" in repr(result)
    assert result.cost["estimate"] > 0 and result.cost["verification"] == 9
    with pytest.raises(ValueError, match="verify='all'"):
        result.recall(5)


def test_bad_arguments_are_named():
    model, clean, corrupt = _count01()
    with pytest.raises(ValueError, match="method"):
        hc.attribute(model, clean=clean, corrupt=corrupt, method="eap")
    with pytest.raises(ValueError, match="verify"):
        hc.attribute(model, clean=clean, corrupt=corrupt, verify=-1)
    with pytest.raises(ValueError, match="steps"):
        hc.attribute(model, clean=clean, corrupt=corrupt, method="ig", steps=0)
    with pytest.raises(ValueError, match="component"):
        hc.attribute(model, clean=clean, corrupt=corrupt, component="mlp_in")
    with pytest.raises(ValueError, match="no head axis"):
        hc.attribute(model, clean=clean, corrupt=corrupt, component="resid_pre", head=0)


def test_recall_is_undetermined_where_the_exact_top_k_ties():
    """Count01's query at '=' is the same token in clean and corrupt runs: every q patch changes nothing, so
    no top 10 exists and recall@10 is NaN, not a number drawn from the tie order."""
    model, clean, corrupt = _count01()
    exact = hc.patch(model, clean=clean, corrupt=corrupt, component="q", positions="each")
    assert float((exact.values - exact.corrupt_value).abs().max()) == 0.0
    result = hc.attribute(model, clean=clean, corrupt=corrupt, component="q", verify="all")
    compared = result.compare(exact)
    assert compared["recall@10"] != compared["recall@10"] and compared["missed"] == []
    assert result.recall(10) != result.recall(10)
    with pytest.raises(ValueError, match="do not match"):
        result.compare(exact.values[:, :2])


def test_graddrop_can_be_turned_off():
    model = build("gelu-LN")
    clean, corrupt = _inputs()
    fix_only = hc.attribute(model, clean=clean, corrupt=corrupt, metric=_metric, component="k", method="atp*",
                            graddrop=False, verify=0, sample=0)  # fmt: skip
    with_drop = hc.attribute(model, clean=clean, corrupt=corrupt, metric=_metric, component="k", method="atp*",
                             verify=0, sample=0)  # fmt: skip
    torch.testing.assert_close(fix_only.values, with_drop.values)  # the same QK-fixed estimate
    torch.testing.assert_close(fix_only.score, fix_only.effect.abs())
    assert not torch.allclose(with_drop.score, fix_only.score)  # GradDrop ranks differently
    assert any("graddrop=False" in a for a in fix_only.assumptions)
    assert with_drop.cost["estimate"] > fix_only.cost["estimate"]
    with pytest.raises((TypeError, ValueError), match="graddrop"):
        hc.attribute(model, clean=clean, corrupt=corrupt, metric=_metric, method="atp*", graddrop="yes")


def test_the_estimator_argument_and_its_older_name():
    """`estimator=` names the estimate (as hc.interactions's estimator=); `method=` is a deprecated alias of it,
    and the two disagreeing is an error naming both."""
    model = build("gelu-LN")
    clean, corrupt = _inputs()
    new = hc.attribute(model, clean=clean, corrupt=corrupt, metric=_metric, estimator="atp*", verify=0, sample=0)
    with pytest.warns(DeprecationWarning, match="estimator="):
        old = hc.attribute(model, clean=clean, corrupt=corrupt, metric=_metric, method="atp*", verify=0, sample=0)
    torch.testing.assert_close(new.score, old.score)
    assert new.estimator == old.estimator == "atp*"
    with pytest.raises(ValueError, match="method='ig' and estimator='atp\\*'"):
        hc.attribute(model, clean=clean, corrupt=corrupt, metric=_metric, method="ig", estimator="atp*")


@pytest.mark.parametrize("estimator, component", [("atp", "z"), ("atp*", "z"), ("atp*", "q"), ("ig", "resid_pre")])
def test_estimates_in_parts_within_the_memory_budget_equal_the_whole_batch(estimator, component):
    """Issue 51, item 8: a budget too small for the batch runs the gradient passes in parts (a named metric is a
    mean over inputs; GradDrop's magnitudes are taken after the parts add up): the estimates, scores and the
    target's metric are the whole batch's."""
    from headcoop.tasks.base import Batch

    cfg = HookedTransformerConfig(n_layers=2, d_model=16, d_head=4, n_heads=3, d_mlp=32, n_ctx=8, d_vocab=11,
                                  act_fn="gelu", normalization_type="LN", positional_embedding_type="standard", seed=4)  # fmt: skip
    model = HookedTransformer(cfg).eval()
    gen = torch.Generator().manual_seed(3)
    n, width = 6, 7
    clean_t = torch.randint(0, 11, (n, width), generator=gen)
    corrupt_t = clean_t.clone()
    corrupt_t[:, 2] = (clean_t[:, 2] + 4) % 11
    answer, wrong, last = (
        torch.randint(0, 11, (n,), generator=gen),
        torch.randint(0, 11, (n,), generator=gen),
        torch.full((n,), width - 1),
    )
    common = dict(loss_pos=last[:, None], answer_pos=last, labels=torch.zeros(n, dtype=torch.long))
    clean = Batch(tokens=clean_t, targets=answer[:, None], answer=answer, wrong=wrong, **common)
    corrupt = Batch(tokens=corrupt_t, targets=wrong[:, None], answer=wrong, wrong=answer, **common)
    kw = dict(clean=clean, corrupt=corrupt, metric="logit_diff", estimator=estimator, component=component, verify=2,
              sample=2, progress=False)  # fmt: skip
    whole, parts = hc.attribute(model, **kw), hc.attribute(model, memory_budget_mb=1e-5, **kw)
    assert (whole.cost["parts"], parts.cost["parts"]) == (1, n)
    assert float(whole.score.abs().max()) > 1e-4
    torch.testing.assert_close(parts.values, whole.values, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(parts.score, whole.score, rtol=1e-5, atol=1e-6)
    assert parts.target_value == pytest.approx(whole.target_value, abs=1e-9)
    assert int(whole.verified.sum()) == 4 and torch.equal(parts.verified, whole.verified)
    torch.testing.assert_close(parts.exact, whole.exact, rtol=1e-5, atol=1e-6, equal_nan=True)
