"""The dense ground-truth bench (experiments/groundtruth): SIIT-trained models of the Tracr programs and an
induction model, committed; their truth re-checked here, the data-free baselines, and which true edges the
inputs show. Needs no jax."""

import numpy as np
import pytest
import torch

from experiments.groundtruth import baselines
from experiments.groundtruth.common import CONTRASTS, NAMES, SIIT, inputs, load, metric_for, shown, why_unshown
from experiments.groundtruth.siit import activations, draw, draw_source, pad_mask_hooks, run, token_mask
from experiments.tracr.run_all import auc

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")


@pytest.mark.parametrize("name", SIIT)
def test_a_siit_model_is_dense_and_its_recorded_checks_hold_again(name):
    """Every head and MLP is non-zero; re-measured on fresh inputs, the task accuracy and the strictness (every
    non-aligned node resampled at once) are what training recorded, within 0.03."""
    from experiments.tracr.common import load as load_tracr

    model, spec = load(name)
    high, info = load_tracr(name)
    assert spec["truth"] == info["truth"] and model.cfg.n_layers == high.cfg.n_layers
    for layer in range(model.cfg.n_layers):
        assert float(model.W_out[layer].abs().min()) > 0 or float(model.W_out[layer].abs().max()) > 0
        for h in range(model.cfg.n_heads):
            assert float((model.W_V[layer, h] @ model.W_O[layer, h]).abs().max()) > 1e-3
    recorded = model.checkpoint_meta["metrics"]
    assert recorded["task_accuracy"] > 0.9  # every model learned its program's outputs; its nodes: the page says
    gen = torch.Generator().manual_seed(7)
    base, lengths = draw(info, 1024, gen)
    source = draw_source(info, lengths, gen)
    pad = info["encoding"]["compiler_pad"]
    mask = token_mask(base, info)
    with torch.no_grad():
        want = run(high, base, extra=pad_mask_hooks(base, pad, high.cfg.n_layers))
        got = model(base)
        others = spec["training"]["non_aligned"]
        resampled = run(model, base, activations(model, source, others)) if others else got

    def accuracy(logits):
        if info["numerical"]:
            return float(((logits[..., 0] - want[..., 0]).abs() < 0.02)[mask].float().mean())
        return float((logits.argmax(-1) == want.argmax(-1))[mask].float().mean())

    assert abs(accuracy(got) - recorded["task_accuracy"]) < 0.03
    if others:
        assert abs(accuracy(resampled) - recorded["strict_accuracy"]) < 0.03


def test_the_induction_models_checks_reproduce_and_pass_and_a_failed_check_is_named():
    """The literature's scores, re-measured on other sequences, are those recorded, and each reaches 0.9 (issue
    63); a recorded score under 0.9 is named by the bench (the page then says the truth is not the model's)."""
    from experiments.groundtruth.induction import CHECK, HALF, SHORTEST, copying, periods, scores, sequences
    from experiments.groundtruth.induction import failures as induction_failures

    model, spec = load("induction")
    recorded, truth = model.checkpoint_meta["metrics"], spec["truth"]
    checks = scores(model, n=512, seed=3)
    heads = [f"L{layer}H{h}" for layer in range(model.cfg.n_layers) for h in range(model.cfg.n_heads)]
    for head in heads:
        for score in ("previous_token", "prefix_matching"):
            assert abs(checks[head][score] - recorded[head][score]) < 0.05, (head, score)
    assert abs(copying(model, (1, int(truth["induction_head"][-1]))) - recorded["copying"]) < 1e-6
    assert checks["second_half_accuracy"] > 0.95 and spec["passed"]
    assert induction_failures(recorded, truth) == "-"
    head = truth["induction_heads"][-1]
    weakened = {**recorded, "copying_of": {**recorded["copying_of"], head: CHECK - 0.01}}
    assert induction_failures(weakened, truth) == f"{head} copying {CHECK - 0.01:.3f}"
    ablated = recorded[
        "ablations"
    ]  # the truth's heads matter: the previous-token head alone, the induction heads together
    assert ablated[truth["previous_token_head"]] < 0.5 < 0.95 < ablated["plain"] and ablated["layer 1"] < 0.5
    tokens = sequences(64, torch.Generator().manual_seed(0))
    assert (
        (periods(tokens) >= SHORTEST) & (periods(tokens) <= HALF)
    ).all()  # every sequence repeats, at its own period


def test_the_weight_product_finds_tracr_truth_without_inputs_and_not_the_dense_truth():
    """Why the Tracr bench is only a sanity check: a score reading no input ranks its truth perfectly."""
    from experiments.tracr.common import load as load_tracr

    for name in SIIT:
        tracr_model, info = load_tracr(name)
        dense, spec = load(name)
        truth = {tuple(e) for e in info["truth"]["edges"]}
        for model, expected in ((tracr_model, True), (dense, False)):
            wp = baselines.weight_product(model)
            value = auc([k in truth for k in wp], list(wp.values()))
            assert (value == 1.0) == expected, (name, value)
    mean, lo, hi = baselines.random_auc([True] * 5 + [False] * 20)
    assert lo < mean < hi and abs(mean - 0.5) < 0.05


@pytest.mark.parametrize("name", NAMES)
def test_the_designed_contrast_shows_more_and_every_unshown_edge_has_its_reason(name):
    model, spec = load(name)
    counts = {}
    for contrast in CONTRASTS:
        clean, corrupt = inputs(spec, n=64, contrast=contrast)
        assert clean.shape == corrupt.shape
        counts[contrast] = seen = shown(spec, clean, corrupt)
    assert counts["same length"] <= counts["designed"] or len(counts["same length"]) <= len(counts["designed"])
    truth = {tuple(e) for e in spec["truth"]["edges"]}
    for edge in truth - counts["designed"]:
        assert why_unshown(spec, edge), edge
    assert shown(spec, clean, None, how="zero") >= seen  # zero ablation moves every edge a contrast moves
    if name == "reverse":  # the length: shown only when lengths differ
        assert len(counts["designed"]) > len(counts["same length"])


def test_exact_patching_ranks_the_shown_true_edges_of_hist_first():
    import headcoop as hc

    model, spec = load("hist")
    clean, corrupt = inputs(spec, n=64)
    metric = metric_for(model, spec, clean)
    frame = hc.edges(model, clean, corrupt, metric, estimator="exact").to_dataframe()
    truth, seen = {tuple(e) for e in spec["truth"]["edges"]}, shown(spec, clean, corrupt)
    keys = list(zip(frame.writer, frame.reader, frame.via))
    keep = np.array([k in seen or k not in truth for k in keys])
    value = auc(np.array([k in truth for k in keys])[keep], frame.score.to_numpy()[keep])
    assert value > 0.9


def test_loading_an_unknown_model_names_the_known_ones():
    with pytest.raises(ValueError, match="reverse"):
        load("sort")
    with pytest.raises(ValueError, match="contrast"):
        inputs(load("hist")[1], contrast="other")


def test_the_page_is_what_the_builder_writes_from_the_committed_tables(tmp_path):
    """Every number on docs/results/circuits.md comes from the tables beside it: rebuilt from them, it is the same."""
    import shutil
    from pathlib import Path

    from experiments.groundtruth import page

    results = Path(__file__).resolve().parents[3] / "docs" / "results"
    shutil.copytree(results / "circuits", tmp_path / "circuits")
    built = page.build(tmp_path, draw=False).read_text(encoding="utf-8")
    assert built == (results / "circuits.md").read_text(encoding="utf-8")
    assert "sanity check" in built and "weight product" in built
