"""Issue 51: one vocabulary. Every analysis that takes a metric takes the same names and a callable,
resolved by one function (`copies.measure`); a time budget means the same in the API and on the CLI."""

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
