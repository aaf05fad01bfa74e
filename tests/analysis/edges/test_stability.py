"""hc.edges(how=...) (an edge ablated by the one ablation, noising) and hc.circuit_stability (a method's circuit
over every reading: ablation x input draw)."""

import pytest
import torch

import headcoop as hc
from headcoop.models.tl import HookedTransformer, HookedTransformerConfig

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")


def _setup(norm=None):
    cfg = HookedTransformerConfig(n_layers=2, n_heads=2, d_model=16, d_head=4, d_mlp=32, d_vocab=10, n_ctx=6,
                                  act_fn="relu", normalization_type=norm, seed=0)  # fmt: skip
    model = HookedTransformer(cfg).eval()
    gen = torch.Generator().manual_seed(0)
    clean, corrupt = torch.randint(10, (8, 6), generator=gen), torch.randint(10, (8, 6), generator=gen)
    return model, clean, corrupt, lambda logits: logits[:, -1, 3].mean() - logits[:, -1, 4].mean()


@pytest.mark.parametrize("how", ["corrupt", "mean", "zero", "resample"])
def test_an_exact_edge_score_under_each_ablation_is_the_faithfulness_run_without_that_edge(how):
    """The reference: hc.faithfulness of the whole graph but one edge, under the same ablation, is the clean run
    with that edge carrying the ablated value (no norm: the faithfulness run recomputes norms, the edge patch
    freezes them)."""
    model, clean, corrupt, metric = _setup()
    result = hc.edges(model, clean, corrupt, metric, estimator="exact", direction="noise", how=how)
    frame = result.to_dataframe()
    names = list(zip(frame.writer, frame.reader, frame.via))
    full = None
    for i in range(0, len(names), 7):
        run = hc.faithfulness(model, hc.circuit(names[:i] + names[i + 1 :]), clean, corrupt, metric, how=how)
        full = run.full
        assert abs(run.frame.metric.iloc[0] - full - frame.score.iloc[i]) < 1e-5, names[i]
    assert how == "corrupt" or how.split()[0] in repr(result)
    if how != "corrupt":  # the ablation moves the scores: zero is not the corrupt reading
        other = hc.edges(model, clean, corrupt, metric, estimator="exact", direction="noise").to_dataframe()
        assert (other.score - frame.score).abs().max() > 1e-4


def test_an_ablation_other_than_corrupt_needs_noising_and_a_known_name():
    model, clean, corrupt, metric = _setup()
    with pytest.raises(ValueError, match='direction="noise"'):
        hc.edges(model, clean, corrupt, metric, how="mean")
    with pytest.raises(ValueError, match="how"):
        hc.edges(model, clean, corrupt, metric, direction="noise", how="average")


def test_stability_counts_each_edge_over_the_readings_and_spreads_faithfulness():
    model, clean, corrupt, metric = _setup("LN")
    s = hc.circuit_stability(model, clean, corrupt, metric, k=6, draws=2, progress=False)
    assert len(s.readings) == 8 and set(s.readings.how) == {"corrupt", "mean", "zero", "resample"}
    assert (s.edges.selected == (s.edges.share * 8).round()).all() and s.edges.share.max() <= 1.0
    # every reading's circuit has k edges: the selections add up
    assert int(s.edges.selected.sum()) == 6 * 8
    for r in s.readings[s.readings.draw == 0].itertuples():  # a reading's faithfulness: its own circuit's
        scores = hc.edges(model, clean, corrupt, metric, direction="noise", how=r.how)
        want = hc.faithfulness(model, hc.circuit(scores, k=6), clean, corrupt, metric, how=r.how)
        assert abs(want.frame.faithfulness.iloc[0] - r.faithfulness) < 1e-6
    spread = s.spread
    assert spread["min"] <= spread["median"] <= spread["max"]
    band = s.band
    assert (band["min"] <= band["median"] + 1e-12).all() and (band["median"] <= band["max"] + 1e-12).all()
    assert band.set_index("edges").loc[6, "min"] == pytest.approx(spread["min"])
    fig = s.plot()
    assert "min-max over readings" in [t.name for t in fig.data]
    assert "readings" in repr(s) and "median" in repr(s)


def test_stability_draws_from_the_task_and_takes_explicit_draws():
    model = hc.load("skip-pair")
    s = hc.circuit_stability(model, k=4, hows=("corrupt", "zero"), draws=2, progress=False)
    assert len(s.readings) == 4
    clean, corrupt = model.task.patching_inputs(n=32, seed=5)
    t = hc.circuit_stability(model, k=4, hows=("mean",), draws=[(clean, corrupt, None)], progress=False)
    assert len(t.readings) == 1 and t.readings.draw.tolist() == [0]


def test_stability_rejects_bad_readings():
    model, clean, corrupt, metric = _setup()
    with pytest.raises(ValueError, match="hows"):
        hc.circuit_stability(model, clean, corrupt, metric, hows="zero")
    with pytest.raises(ValueError, match="hows"):
        hc.circuit_stability(model, clean, corrupt, metric, hows=("zero", "half"))
    with pytest.raises(ValueError, match="k=999"):
        hc.circuit_stability(model, clean, corrupt, metric, k=999, hows=("zero",), draws=1)
    with pytest.raises(ValueError, match="triples"):
        hc.circuit_stability(model, draws=[(clean, corrupt)])
    with pytest.raises(ValueError, match="clean= and corrupt="):
        hc.circuit_stability(model, clean, None, metric)


def test_the_ablated_run_is_the_reference_run_with_autograd():
    """`ablated_run` (what SIIT's edge strictness trains through) gives `reference_run`'s logits, with a gradient."""
    from headcoop.analysis.edges.exact import writer_outputs
    from headcoop.analysis.edges.faithfulness import ablated_run, reference_run
    from headcoop.analysis.edges.graph import graph

    model, clean, corrupt, _ = _setup("LN")
    writers, readers, _ = graph(model)
    keep = torch.rand(len(writers), len(readers), generator=torch.Generator().manual_seed(1)) < 0.5
    with torch.no_grad():
        _, cache = model.run_with_cache(corrupt)
    reference = writer_outputs(model, cache, writers)
    slow = reference_run(model, clean, keep, writers, readers, reference)
    fast = ablated_run(model, clean, keep, writers, readers, reference)
    assert torch.allclose(slow, fast) and fast.requires_grad and not slow.requires_grad
    fast[:, -1, 3].sum().backward()
    grad = model.blocks[0].attn.W_Q.grad
    assert grad is not None and float(grad.abs().sum()) > 0


@pytest.mark.parametrize("how", ["mean", "zero", "resample"])
def test_an_ablated_edge_score_is_the_same_on_the_hooked_reference_path(how):
    """With a user's hook installed hc.edges steps aside to canonical path patching: the same scores."""
    model, clean, corrupt, metric = _setup("LN")
    fast = hc.edges(model, clean, corrupt, metric, estimator="exact", direction="noise", how=how, progress=False)
    model.add_hook("blocks.0.hook_resid_mid", lambda x, hook: x)
    try:
        slow = hc.edges(model, clean, corrupt, metric, estimator="exact", direction="noise", how=how, progress=False)
    finally:
        model.reset_hooks()
    assert slow.method.startswith("reference") and not fast.method.startswith("reference")
    assert (fast.to_dataframe().score - slow.to_dataframe().score).abs().max() < 1e-5
