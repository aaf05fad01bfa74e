"""Issue 51: one vocabulary. Every analysis that takes a metric takes the same names and a callable,
resolved by one function (`copies.measure`); a time budget means the same in the API and on the CLI."""

import numpy as np
import pytest
import torch

import headcoop as hc
from headcoop.analysis.vocabulary import METRIC_NAMES
from headcoop.checks import check_time_budget

NAMES = [n for n in METRIC_NAMES if n != "logits"]


@pytest.fixture(scope="module")
def setting():
    model = hc.load("count01")
    clean = model.task.sample(8, seed=0)
    return model, clean, model.task.corrupt(clean)


def _call(name, model, clean, corrupt, metric):
    if name == "interactions":
        return hc.interactions(model, tokens=clean, metric=metric, heads=["L0H0", "L0H1", "L0H2"])
    if name == "faithfulness":
        edges = hc.edges(model, clean=clean, corrupt=corrupt, metric="logit_diff")
        return hc.faithfulness(model, edges, clean=clean, corrupt=corrupt, metric=metric, sizes=[1, 10], random=1)
    return getattr(hc, name)(model, clean=clean, corrupt=corrupt, metric=metric)


GRADIENT = ("attribute", "edges")  # estimates from gradients: accuracy has none, and says so


@pytest.mark.parametrize("name", ["patch", "path_patch", "attribute", "edges", "faithfulness", "interactions"])
def test_every_metric_taking_analysis_takes_the_names_and_a_callable(name, setting):
    model, clean, corrupt = setting
    assert "logit_diff" in NAMES and "accuracy" in NAMES
    for metric in NAMES + [lambda logits: logits[:, -1, 0].mean()]:
        if name in GRADIENT and metric == "accuracy":
            with pytest.raises(ValueError, match="differentiable in the logits"):
                _call(name, model, clean, corrupt, metric)
            continue
        assert _call(name, model, clean, corrupt, metric) is not None
    with pytest.raises(ValueError, match=r"unknown metric .logitdiff.; valid values are"):
        _call(name, model, clean, corrupt, "logitdiff")


def test_named_metric_in_patching_equals_the_callable(setting):
    """hc.patch(metric="logit_diff") is the logit difference of the clean answers, as the callable spells it."""
    model, clean, corrupt = setting
    rows = torch.arange(len(clean))

    def logit_diff(logits):
        at = logits[rows, clean.answer_pos]
        return (at[rows, clean.answer] - at[rows, clean.wrong]).mean()

    named = hc.patch(model, clean=clean, corrupt=corrupt, metric="logit_diff")
    spelled = hc.patch(model, clean=clean, corrupt=corrupt, metric=logit_diff)
    assert torch.allclose(torch.as_tensor(named.values), torch.as_tensor(spelled.values), atol=1e-5)


def test_a_time_budget_means_the_same_in_the_api_and_on_the_cli():
    assert check_time_budget("budget_s", None) is None and check_time_budget("budget_s", 0) is None
    assert check_time_budget("budget_s", 30) == 30.0
    for bad in (-1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match=r"must be 0 \(no limit\) or more seconds"):
            check_time_budget("budget_s", bad)
    with pytest.raises(TypeError, match="number of seconds"):
        check_time_budget("budget_s", "60")
    from headcoop import cli

    with pytest.raises(ValueError, match=r"--budget must be 0 \(no limit\) or more seconds"):
        cli._check_report_arguments(cli.build_parser().parse_args(["report", "count01", "--budget", "-1"]))


def test_cooperation_takes_the_names_and_a_per_input_callable(setting):
    """hc.cooperation reads its words input by input: it takes every metric name, and a callable giving one value
    per input, whose words and numbers equal the named metric it spells; a mean (a scalar), a callable reading
    other positions than the answers', and a value of another type are refused by name."""
    model = setting[0]
    batch = model.task.mechanism_inputs(48, seed=0)
    rows = torch.arange(len(batch))
    heads = ["L0H0", "L0H1", "L0H2"]
    kw = dict(inputs=batch, heads=heads, progress=False, draws=1)
    for name in NAMES:
        assert hc.cooperation(model, metric=name, **kw).metric == name

    def logit_diff(logits):
        at = logits[rows, batch.answer_pos]
        return at[rows, batch.answer] - at[rows, batch.wrong]

    named, spelled = hc.cooperation(model, metric="logit_diff", **kw), hc.cooperation(model, metric=logit_diff, **kw)
    assert "custom metric (logit_diff)" in repr(spelled)
    a, b = named.to_dataframe(), spelled.to_dataframe()
    assert list(a.mechanism) == list(b.mechanism) and list(named.head_table.role) == list(spelled.head_table.role)
    numbers = [c for c in a.columns if a[c].dtype.kind == "f"]
    assert numbers and np.allclose(a[numbers].fillna(0), b[numbers].fillna(0), atol=1e-4)
    with pytest.raises(ValueError, match=r"one value per input \(\[48\] for these logits\), got shape \(\)"):
        hc.cooperation(model, metric=lambda logits: logit_diff(logits).mean(), **kw)
    with pytest.raises(ValueError, match="reads other positions too"):
        hc.cooperation(model, metric=lambda logits: logit_diff(logits) + logits[:, 0, 0], **kw)
    with pytest.raises(TypeError, match="metric must be a name .* or a callable, got int"):
        hc.cooperation(model, metric=3, **kw)
