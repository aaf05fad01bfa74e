"""The Tracr bench (experiments/tracr): the committed checkpoints of Tracr-compiled programs and their ground
truth, read by every circuit analysis. Needs no jax: the checkpoints are committed (build.py made them)."""

import warnings

import numpy as np
import pytest

import headcoop as hc
from experiments.tracr.common import NAMES, inputs, load, metric_for
from experiments.tracr.run_all import auc, exercised

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")


@pytest.mark.parametrize("name", NAMES)
def test_the_checkpoint_and_its_truth_agree_with_the_weights(name):
    model, info = load(name)
    truth = info["truth"]
    assert model.cfg.attention_dir == "bidirectional" and model.cfg.normalization_type is None
    assert model.checkpoint_meta["metrics"]["agree"] == model.checkpoint_meta["metrics"]["inputs"] == 64
    for component in truth["empty"]:  # an empty component's weights are all zero
        if component.startswith("MLP"):
            assert float(model.blocks[int(component[3:])].mlp.W_out.abs().max()) == 0.0
        else:
            layer, head = map(int, component[1:].split("H"))
            assert float(model.blocks[layer].attn.W_O[head].abs().max()) == 0.0
    assert set(truth["nodes"]) <= set(truth["writes"]) and not set(truth["nodes"]) & set(truth["empty"])
    for writer, reader, via in truth["edges"]:  # a true edge shares a direction
        assert set(truth["writes"][writer]) & set(truth["reads"][f"{reader}.{via}"])


@pytest.mark.parametrize("name", NAMES)
def test_every_analysis_runs_and_empty_components_have_exactly_no_effect(name):
    model, info = load(name)
    clean, corrupt = inputs(info, n=16)
    metric = metric_for(model, info, clean)
    exact = hc.edges(model, clean=clean, corrupt=corrupt, metric=metric, estimator="exact").to_dataframe()
    empty = set(info["truth"]["empty"])
    from_empty = exact[exact.writer.isin(empty)]
    assert (from_empty.score == 0).all()
    for component in ("z", "mlp_out"):
        patched = hc.patch(model, clean=clean, corrupt=corrupt, metric=metric, component=component, positions="all")
        values = patched.values - patched.corrupt_value
        for i, v in np.ndenumerate(values.numpy()):
            node = f"MLP{i[0]}" if component == "mlp_out" else f"L{i[0]}H{i[1]}"
            if node in empty:
                assert v == 0.0, node
    for method in ("eap", "eap-ig"):
        hc.edges(model, clean=clean, corrupt=corrupt, metric=metric, estimator=method, verify=3, sample=3)
    hc.attribute(model, clean=clean, corrupt=corrupt, metric=metric, component="z", positions="all", estimator="atp*")
    hc.dla(model, clean)


@pytest.mark.parametrize("name", NAMES)
def test_exact_scores_rank_the_true_nodes_first_and_the_true_circuit_is_faithful(name):
    """Exact edge scores, summed per node, rank every true node these inputs can show above every other component
    (ROC AUC 1.0 where both classes exist); the true circuit recovers the whole model (faithfulness 1)."""
    model, info = load(name)
    clean, corrupt = inputs(info, n=32, seed=1)
    metric = metric_for(model, info, clean)
    frame = hc.edges(model, clean=clean, corrupt=corrupt, metric=metric, estimator="exact").to_dataframe()
    _, shown = exercised(model, info, clean, corrupt)
    nodes = frame.assign(a=frame.score.abs()).groupby("writer").a.sum().drop(["embed", "pos_embed"], errors="ignore")
    components = [f"L{lay}H{h}" for lay in range(model.cfg.n_layers) for h in range(model.cfg.n_heads)]
    components += [f"MLP{lay}" for lay in range(model.cfg.n_layers)]
    true = set(info["truth"]["nodes"])
    assert shown <= true - {"embed", "pos_embed"}  # the shown true nodes are counted as the true nodes are
    keep = [c for c in components if c in shown or c not in true]
    score = nodes.reindex(keep).fillna(0.0)
    value = auc([c in true for c in keep], score)
    assert np.isnan(value) or value == 1.0
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        faith = hc.faithfulness(model, hc.circuit(info["truth"]["edges"]), clean=clean, corrupt=corrupt, metric=metric)
    if abs(faith.full - faith.empty) <= 1e-6:  # shuffle_dyck here: 0.50000006 against 0.49999979, float noise
        assert np.isnan(faith.frame.faithfulness.iloc[0]) and any(
            "nothing for a circuit to recover" in str(w.message) for w in said
        )
    else:
        assert faith.frame.faithfulness.iloc[0] == pytest.approx(1.0, abs=1e-4)


def test_a_circuit_missing_a_shown_true_edge_loses_faithfulness():
    """The truth can fail: drop from the true circuit of sort_unique the true edges these inputs show, one at a
    time, and some drop costs faithfulness."""
    model, info = load("sort_unique")
    clean, corrupt = inputs(info, n=32, seed=2)
    metric = metric_for(model, info, clean)
    shown, _ = exercised(model, info, clean, corrupt)
    true = [tuple(e) for e in info["truth"]["edges"]]
    losses = []
    for edge in sorted(shown):
        kept = [e for e in true if e != edge]
        losses.append(
            1
            - hc.faithfulness(
                model, hc.circuit(kept), clean=clean, corrupt=corrupt, metric=metric
            ).frame.faithfulness.iloc[0]
        )
    assert max(losses) > 0.1


def test_loading_an_unknown_program_names_the_known_ones():
    with pytest.raises(ValueError, match="reverse"):
        load("parity")


@pytest.mark.parametrize("name", NAMES)
def test_no_edge_outside_the_truth_moves_the_metric(name):
    """Exact edge patching gives every false edge (its reader reads none of its writer's directions) exactly 0,
    so no false edge ranks above a true edge that moves the metric; EAP agrees on the false edges."""
    model, info = load(name)
    clean, corrupt = inputs(info, n=16, seed=3)
    metric = metric_for(model, info, clean)
    true = {tuple(e) for e in info["truth"]["edges"]}
    for method in ("exact", "eap"):
        frame = hc.edges(model, clean=clean, corrupt=corrupt, metric=metric, estimator=method).to_dataframe()
        false = [(w, r, v) not in true for w, r, v in zip(frame.writer, frame.reader, frame.via)]
        assert float(frame.score[false].abs().max()) == 0.0, method
    assert float(frame.score[[not f for f in false]].abs().max()) > 0
