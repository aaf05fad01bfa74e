"""Issue 47's cases (reliability, round four), each with the behaviour it now has: bounded and finite numeric
arguments refused with the value named, the MIB export's file handling, the report's one-head page, and
HEADCOOP_PROGRESS's documented values."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from helpers import attn_only_2l_like
from test_edges import _inputs, metric  # the edge tests' inputs and metric

import headcoop as hc

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def scored():
    model = attn_only_2l_like(seed=3, attn_only=False, d_mlp=16, positional_embedding_type="standard")
    clean, corrupt = _inputs(model)
    return model, clean, corrupt, hc.edges(model, clean=clean, corrupt=corrupt, metric=metric)


def test_edges_arguments_are_bounded_and_named(scored):
    model, clean, corrupt, _ = scored
    cases = [
        (dict(estimator="eap-ig", steps=10**7), ValueError, "steps must be in 1..1000"),
        (dict(seed=-1), ValueError, "seed"),
        (dict(seed="1"), TypeError, "seed"),
        (dict(memory_budget_mb=float("nan")), ValueError, "memory_budget_mb must be finite"),
        (dict(memory_budget_mb="a"), TypeError, "memory_budget_mb"),
        (dict(memory_budget_mb=float("inf")), ValueError, "memory_budget_mb"),
        (dict(memory_budget_mb=0), ValueError, "memory_budget_mb must be > 0"),
        (dict(memory_budget_mb=-1, estimator="exact"), ValueError, "memory_budget_mb must be > 0"),
    ]
    for kwargs, error, match in cases:
        with pytest.raises(error, match=match):
            hc.edges(model, clean=clean, corrupt=corrupt, metric=metric, **kwargs)


def test_circuits_and_faithfulness_refuse_bad_values(scored):
    model, clean, corrupt, edges = scored
    with pytest.raises(ValueError, match="threshold must be finite"):
        hc.circuit(edges, threshold=float("nan"))
    with pytest.raises(TypeError, match="threshold must be a number"):
        hc.circuit(edges, threshold=True)
    with pytest.raises(TypeError, match="threshold must be a number"):
        hc.circuit(edges, threshold="a")
    with pytest.raises(TypeError, match="hc.circuit takes an EdgeResult"):
        hc.circuit(None)
    with pytest.raises(ValueError, match="k must be >= 1"):
        edges.plot(k=-1)
    with pytest.raises(TypeError, match="k must be an int"):
        edges.plot(k="a")
    for kwargs, error, match in [(dict(sizes="a"), TypeError, "sizes"), (dict(sizes=[2.5]), TypeError, r"sizes\[0\]"),
                                 (dict(sizes=[True]), TypeError, r"sizes\[0\]"), (dict(seed=-1), ValueError, "seed"),
                                 (dict(memory_budget_mb=0), ValueError, "memory_budget_mb")]:  # fmt: skip
        with pytest.raises(error, match=match):
            hc.faithfulness(model, edges, clean=clean, corrupt=corrupt, metric=metric, **kwargs)
    three = attn_only_2l_like(seed=3, n_layers=3, attn_only=False, d_mlp=16, positional_embedding_type="standard")
    with pytest.raises(ValueError, match="not of this model's graph"):
        hc.faithfulness(three, edges, clean=clean, corrupt=corrupt, metric=metric)
    with pytest.raises(ValueError, match="at least 2 reference inputs"):
        hc.faithfulness(model, hc.circuit(edges, k=3), clean=clean[:1], corrupt=corrupt[:1], metric=metric,
                        how="resample")  # fmt: skip


def test_the_mib_export_writes_valid_files_only(scored, tmp_path):
    model, clean, corrupt, edges = scored
    with pytest.raises(TypeError, match="EdgeResult"):
        hc.export_mib([1, 2], tmp_path / "a.json", model)
    with pytest.raises(TypeError, match="file name"):
        hc.export_mib(edges, 3, model)
    other = attn_only_2l_like(seed=3, n_layers=3, attn_only=False, d_mlp=16, positional_embedding_type="standard")
    with pytest.raises(ValueError, match="not scored on this model"):
        hc.export_mib(edges, tmp_path / "b.json", other)
    with pytest.raises(ValueError, match="not in the graph"):
        hc.export_mib(edges, tmp_path / "c.json", model, circuit=hc.circuit([("L0H0", "L9H9", "q")]))
    import dataclasses

    broken = dataclasses.replace(edges, frame=edges.frame.assign(score=float("nan")))
    with pytest.raises(ValueError, match="NaN or inf"):
        hc.export_mib(broken, tmp_path / "d.json", model)
    mine = tmp_path / "mine.json"
    mine.write_text("{}")
    os.chmod(mine, 0o644)
    hc.export_mib(edges, mine, model, overwrite=True)
    assert oct(mine.stat().st_mode & 0o777) == oct(0o644) and json.loads(mine.read_text())["edges"]
    stale = tmp_path / f".fresh.json.mib-{2**22 + 7}.tmp"  # a killed export's file (no such process)
    stale.write_text("partial")
    hc.export_mib(edges, tmp_path / "fresh.json", model)
    assert not stale.exists() and [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_bench_and_cooperation_arguments(scored):
    with pytest.raises(ValueError, match="weight_noise must be finite"):
        hc.bench("post", weight_noise=float("nan"))
    with pytest.raises(TypeError, match="weight_noise must be a number"):
        hc.bench("post", weight_noise="a")
    model = hc.bench("post")
    for kwargs, error, match in [(dict(how=3), TypeError, "how must be"), (dict(thresholds="role=0.1"), TypeError, "thresholds"),
                                 (dict(band=None), TypeError, "band"), (dict(band=(float("inf"), 2)), ValueError, r"band\[0\]"),
                                 (dict(outputs=[]), ValueError, "non-empty"), (dict(outputs=[1.5, 2]), TypeError, r"outputs\[0\]")]:  # fmt: skip
        with pytest.raises(error, match=match):
            hc.cooperation(model, **kwargs)


def test_qk_ov_tokens_are_checked():
    model = hc.load("count01")
    for bad, error in (("abc", TypeError), ([[1, 2], [3]], ValueError), (3, TypeError)):
        with pytest.raises(error, match="tokens"):
            hc.qk(model, head=0, tokens=bad)
        with pytest.raises(error, match="tokens"):
            hc.ov(model, head=0, tokens=bad)


@pytest.mark.parametrize("value, on", [("0", False), ("off", False), ("disable", False), ("none", False), ("1", True),
                                       ("yes", True), ("", False), ("maybe", False)])  # fmt: skip
def test_headcoop_progress_takes_documented_values(value, on):
    code = "import warnings, headcoop.display.progress as p; print(p.progress_enabled())"
    done = subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True,
                          env={**os.environ, "HEADCOOP_PROGRESS": value}, timeout=120)  # fmt: skip
    assert done.stdout.strip() == str(on), done.stderr
    assert ("is not one of" in done.stderr) == (value in ("", "maybe"))


def test_the_report_leaves_cooperation_out_for_one_head(tmp_path):
    from headcoop.reporting.page import report

    page = report(hc.load("count01"), out=tmp_path / "one.html", heads=["L0H1"], sections=["overview", "cooperation"],
                  progress=False)  # fmt: skip
    text = page.read_text()
    assert "cooperation is a word about pairs of heads" in text


def test_the_cli_refuses_a_nan_budget_and_a_meta_device(tmp_path, capsys):
    from headcoop.cli import main

    for args, match in ((["--budget", "nan"], "--budget must be 0"), (["--device", "meta"], "holds no values")):
        assert main(["report", "count01", "--out", str(tmp_path / "r.html"), *args]) != 0
        assert match in capsys.readouterr().err
    assert not (tmp_path / "r.html").exists()


def test_faithfulness_with_nothing_to_recover_says_so(scored):
    """Issue 47, item 3: clean == corrupt gave a CPR of float noise (0.39); now NaN with a warning naming why."""
    model, clean, _, edges = scored
    with pytest.warns(UserWarning, match="nothing for a circuit to recover"):
        result = hc.faithfulness(model, edges, clean=clean, corrupt=clean, metric=metric, random=0)
    assert result.cpr != result.cpr and result.to_dataframe().faithfulness.isna().all()


def test_a_result_path_with_a_nul_is_refused(tmp_path, scored):
    *_, edges = scored
    with pytest.raises(OSError, match="cannot save a result to"):
        edges.save(str(tmp_path / "bad\x00name"))


def test_a_pickled_hugging_face_weights_file_with_code_is_refused_by_headcoop(tmp_path):
    """Issue 47, item 9: a malicious pytorch_model.bin got torch's weights_only message; headcoop's names the file."""
    from headcoop.models.bridge import load_folder

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
                                                      "n_layer": 1, "n_embd": 8, "n_head": 2, "vocab_size": 11}))  # fmt: skip

    class Payload:
        def __reduce__(self):
            return (os.system, ("echo ran > " + str(tmp_path / "ran"),))

    torch.save({"x": Payload()}, tmp_path / "pytorch_model.bin")
    with pytest.raises(ValueError, match="refusing .*pytorch_model.bin.*nothing in it was run"):
        load_folder(tmp_path)
    assert not (tmp_path / "ran").exists()
