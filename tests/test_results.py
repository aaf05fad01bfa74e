"""result.save(path) / hc.load_result(path): every analysis result round-trips (fields, repr, table), in plain
files (JSON, safetensors, parquet; no pickle), and a save never replaces a folder it did not write."""

import dataclasses
import importlib
import json
import pkgutil

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import attn_only_2l_like
from transformer_lens import FactoredMatrix

import headcoop as hc
from headcoop.results import Result


def _metric(logits):
    return logits[:, -1, 4].mean() - logits[:, -1, 7].mean()


@pytest.fixture(scope="module")
def results():
    """One instance of every result class, from real runs on small models."""
    from headcoop.studies.count01 import head_metrics
    from headcoop.studies.skip_pair import exact_evaluate, preferences

    torch.manual_seed(0)
    two = attn_only_2l_like(seed=0, attn_only=False, d_mlp=16, normalization_type="LN")
    gen = torch.Generator().manual_seed(0)
    clean = torch.randint(0, two.cfg.d_vocab, (8, 6), generator=gen)
    corrupt = clean.clone()
    corrupt[:, 2] = (clean[:, 2] + 3) % two.cfg.d_vocab
    task = hc.contrast(clean, corrupt, answer=[4] * 8, wrong=[7] * 8, labels=[0, 1] * 4)
    count01, skip = hc.load("count01"), hc.load("skip-pair")
    edges = hc.edges(two, clean=clean, corrupt=corrupt, metric=_metric, estimator="eap", verify=4)
    circuit = hc.circuit(edges, 6)
    out = {
        "PatchResult": hc.patch(two, clean=clean, corrupt=corrupt, metric=_metric, positions="each"),
        "PatchResult (heads=)": hc.patch(two, clean=clean, corrupt=corrupt, metric=_metric, heads=["L0H1", "L1H2"]),
        "AttributionResult": hc.attribute(two, clean=clean, corrupt=corrupt, metric=_metric, verify=3, sample=3),
        "DLAResult": hc.dla(count01),
        "QKTable": hc.qk(two, "L0H1"),
        "QKTable (tokens=)": hc.qk(two, "L1H0", positional=False, tokens=[3, 5, 9]),
        "OVTable": hc.ov(count01, head=3),
        "ProbeResult": hc.probe(two, task.clean, task.clean.labels, site="z", layer=None),
        "PathPatchResult": hc.path_patch(two, clean=clean, corrupt=corrupt, metric=_metric),
        "CompositionScores": hc.composition(two),
        "Interactions": hc.interactions(count01, heads=[0, 1, 2, 3, 4], metric="accuracy"),
        "Cooperation": hc.cooperation(skip, metric="accuracy"),
        "EdgeResult": edges,
        "Circuit": circuit,
        "FaithfulnessResult": hc.faithfulness(two, edges, clean=clean, corrupt=corrupt, metric=_metric, random=2),
        "EdgeAblationResult": hc.ablate_edges(two, clean, [("L0H1", "L1H2", "q")], [corrupt], _metric),
        "HeadMetrics": head_metrics(count01, n=256),
        "ExactEvaluation": exact_evaluate(skip),
        "Preferences": preferences(skip),
    }
    return out


def _result_classes() -> set[str]:
    """Every Result subclass in headcoop's modules (a new one without a round trip here fails the test)."""
    import headcoop

    for info in pkgutil.walk_packages(headcoop.__path__, "headcoop."):
        if info.name.split(".")[-1] in ("cli", "__main__"):
            continue
        importlib.import_module(info.name)
    found, stack = set(), [Result]
    while stack:
        for cls in stack.pop().__subclasses__():
            if cls.__module__.startswith("headcoop."):
                found.add(cls.__name__)
            stack.append(cls)
    return found


def _same(a, b, where: str) -> None:
    assert type(a) is type(b), f"{where}: {type(a).__name__} came back as {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, where
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True, msg=where)
    elif isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b, err_msg=where)
    elif isinstance(a, pd.DataFrame):
        pd.testing.assert_frame_equal(a, b, check_exact=True, obj=where)
    elif isinstance(a, FactoredMatrix):
        _same(a.A, b.A, where + ".A")
        _same(a.B, b.B, where + ".B")
    elif dataclasses.is_dataclass(a):
        for field in dataclasses.fields(a):
            _same(getattr(a, field.name), getattr(b, field.name), f"{where}.{field.name}")
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for key in a:
            _same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and a != a:
        assert b != b, where
    else:
        assert a == b, where


def test_every_result_class_round_trips(results, tmp_path):
    assert {name.split(" ")[0] for name in results} == _result_classes(), "every Result subclass needs a round trip here"
    for name, result in results.items():
        folder = result.save(tmp_path / name.replace(" ", "_").replace("=", "").replace("(", "").replace(")", ""))
        back = hc.load_result(folder)
        _same(result, back, name)
        assert repr(back) == repr(result), name
        pd.testing.assert_frame_equal(back.to_dataframe(), result.to_dataframe(), obj=name)
        files = {p.name for p in folder.iterdir()}
        assert "result.json" in files and all(f in ("result.json", "tensors.safetensors") or f.endswith(".parquet")
                                              for f in files), (name, files)  # fmt: skip
        assert json.loads((folder / "result.json").read_text())["format"] == "headcoop-result"
    # what a loaded result still does: draw itself, and look up its table
    back = hc.load_result(tmp_path / "QKTable_tokens")
    assert back.token_ids == (3, 5, 9) and back.plot().data


def test_a_save_replaces_only_a_result_it_wrote(results, tmp_path, capsys):
    result = results["PatchResult"]
    target = tmp_path / "mine"
    target.mkdir()
    (target / "notes.txt").write_text("my notes")
    with pytest.raises(ValueError, match="not a headcoop result.*will not replace"):
        result.save(target)
    assert (target / "notes.txt").read_text() == "my notes" and len(list(target.iterdir())) == 1
    file = tmp_path / "file.txt"
    file.write_text("keep")
    with pytest.raises(ValueError, match="is a file"):
        result.save(file)
    assert file.read_text() == "keep"
    kept = result.save(tmp_path / "kept")
    assert "replaced" not in capsys.readouterr().out
    results["DLAResult"].save(kept)  # a result there: replaced, and said
    assert "replaced the headcoop result" in capsys.readouterr().out
    assert type(hc.load_result(kept)).__name__ == "DLAResult"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "no staging folder left behind"


def test_loading_refuses_what_is_not_a_sound_result(results, tmp_path):
    with pytest.raises(ValueError, match="not a saved headcoop result"):
        hc.load_result(tmp_path)
    folder = results["Preferences"].save(tmp_path / "prefs")
    meta = json.loads((folder / "result.json").read_text())
    meta["value"]["__dataclass__"] = "os:system"
    (folder / "result.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="not headcoop's: refusing"):
        hc.load_result(folder)
    folder = results["Preferences"].save(tmp_path / "damaged")
    (folder / "tensors.safetensors").write_bytes(b"\x00" * 10)
    with pytest.raises(ValueError, match="damaged"):
        hc.load_result(folder)
    (folder / "result.json").write_text("{not json")
    with pytest.raises(ValueError, match="damaged"):
        hc.load_result(folder)
    from headcoop.results import save_result

    with pytest.raises(TypeError, match="headcoop analysis result"):
        save_result({"a": 1}, tmp_path / "x")
