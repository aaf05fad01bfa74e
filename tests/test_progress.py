"""Progress on long calls: one tqdm bar per call the user made, advanced by the engine's runs, a one-line
estimate (with the argument that makes the call cheaper) before a call predicted to be long, and off with a
flag (the tests run with HEADCOOP_PROGRESS=0, see conftest.py)."""

import pytest
import torch
from helpers import attn_only_2l_like

import headcoop as hc
from headcoop.display import progress


def _metric(logits):
    return logits[:, -1, 4].mean() - logits[:, -1, 7].mean()


@pytest.fixture
def model_and_inputs():
    model = attn_only_2l_like()
    gen = torch.Generator().manual_seed(0)
    clean = torch.randint(0, model.cfg.d_vocab, (4, 6), generator=gen)
    corrupt = clean.clone()
    corrupt[:, 1] = (clean[:, 1] + 2) % model.cfg.d_vocab
    return model, clean, corrupt


@pytest.fixture
def shown(monkeypatch):
    """Bars drawn at once (no 2 s delay), in this test only."""
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    monkeypatch.setattr(progress, "_enabled", True)


def test_a_call_shows_one_bar_of_its_runs(model_and_inputs, shown, capsys):
    model, clean, corrupt = model_and_inputs
    hc.patch(model, clean=clean, corrupt=corrupt, metric=_metric, positions="each", progress=True)
    err = capsys.readouterr().err
    assert "hc.patch" in err and "48/48" in err  # 8 heads x 6 positions, every run counted
    inputs = hc.contrast(clean, corrupt, [4] * 4, [7] * 4).clean
    hc.cooperation(model, inputs=inputs, heads=["L0H0", "L1H1"], metric="logit_diff", reference=inputs, draws=1,
                   progress=True)  # fmt: skip
    err = capsys.readouterr().err
    assert "hc.cooperation" in err and "hc.interactions" not in err  # the inner call shares the outer bar


def test_progress_is_off_by_flag_process_wide_and_per_call(model_and_inputs, shown, capsys):
    model, clean, corrupt = model_and_inputs
    hc.patch(model, clean=clean, corrupt=corrupt, metric=_metric, progress=False)
    assert capsys.readouterr().err == ""
    hc.set_progress(False)
    try:
        hc.patch(model, clean=clean, corrupt=corrupt, metric=_metric)
        assert capsys.readouterr().err == ""
        hc.patch(model, clean=clean, corrupt=corrupt, metric=_metric, progress=True)  # the call's own choice wins
        assert "hc.patch" in capsys.readouterr().err
    finally:
        hc.set_progress(True)
    with pytest.raises(TypeError, match="progress must be True, False or None"):
        hc.patch(model, clean=clean, corrupt=corrupt, metric=_metric, progress="yes")
    with pytest.raises(TypeError, match="set_progress takes True or False"):
        hc.set_progress(1)


def test_a_long_call_says_so_first_with_the_cheaper_argument(model_and_inputs, shown, monkeypatch, capsys):
    model, clean, corrupt = model_and_inputs
    monkeypatch.setattr(progress, "LONG_S", 0.0)  # every call counts as long
    monkeypatch.setattr(progress, "ESTIMATE_AFTER_S", 0.0)
    hc.patch(model, clean=clean, corrupt=corrupt, metric=_metric, positions="each", progress=True)
    lines = [line for line in capsys.readouterr().err.splitlines() if "about" in line]
    assert len(lines) == 1, lines  # one line, once
    assert lines[0].startswith("hc.patch: about") and "runs on this machine" in lines[0]
    assert "positions='all', or hc.attribute (gradient estimates, verified), is cheaper" in lines[0]
    monkeypatch.setattr(progress, "LONG_S", 1e9)  # a short call: no estimate
    hc.patch(model, clean=clean, corrupt=corrupt, metric=_metric, positions="each", progress=True)
    assert "about" not in capsys.readouterr().err


def test_every_long_analysis_takes_a_progress_argument():
    import inspect

    for name in ("patch", "path_patch", "attribute", "edges", "faithfulness", "interactions", "cooperation"):
        parameter = inspect.signature(getattr(hc, name)).parameters.get("progress")
        assert parameter is not None and parameter.default is None, name


def test_a_sampled_estimate_announces_its_runs_before_the_first_batch(model_and_inputs, shown, monkeypatch, capsys):
    """shapiq asks for coalitions batch by batch; the estimate counts every run the call will make."""
    model, clean, corrupt = model_and_inputs
    monkeypatch.setattr(progress, "LONG_S", 0.0)
    monkeypatch.setattr(progress, "ESTIMATE_AFTER_S", 0.0)
    tokens = hc.contrast(clean, corrupt, [4] * 4, [7] * 4).clean
    hc.interactions(model, tokens, metric="logit_diff", how="zero", estimator="kernelshap", budget=200, top_pairs=2, screen_budget=100,
                    pair_samples=4, progress=True)  # fmt: skip
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "about" in line]
    assert "for 342 runs" in line and "budget=" in line  # 2 + 200 + 100 + 2 x (4 x 4 + 4)


def test_cooperations_bar_counts_its_edits_and_ends_at_the_total_it_announced(model_and_inputs, shown, capsys):
    """Issue 72: the function axis's edits are in the bar (in forward passes of the batch), announced before any
    run, so the bar reaches its total when the call ends, not minutes before."""
    import re

    from headcoop.analysis.mechanisms.edits import plan_edits

    model, clean, corrupt = model_and_inputs
    inputs = hc.contrast(clean, corrupt, [4] * 4, [7] * 4).clean
    players = [(0, 0), (1, 1)]
    edits = plan_edits(model, inputs, players)
    assert edits["forwards"] >= 1
    hc.cooperation(model, inputs=inputs, heads=["L0H0", "L1H1"], metric="logit_diff", reference=inputs, draws=1,
                   progress=True)  # fmt: skip
    counts = re.findall(r"(\d+)/(\d+)", capsys.readouterr().err)
    done, total = (int(x) for x in counts[-1])
    assert done == total, counts[-3:]
