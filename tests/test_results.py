"""result.save(path) / hc.load_result(path): every analysis result round-trips (fields, repr, table), in plain
files (JSON, safetensors, parquet; no pickle), and a save never replaces a folder it did not write."""

import dataclasses
import importlib
import json
import os
import pkgutil
import re

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import attn_only_2l_like
from transformer_lens import FactoredMatrix

import headcoop as hc
from headcoop.storage.results import Result


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
        "PairMap": hc.pair_map(two, task.clean, method="screen", verify=3, sample=4, named=1),
        "PairMap exact": hc.pair_map(count01, heads=[0, 1, 2, 3], named=0),
        "EdgeResult": edges,
        "Circuit": circuit,
        "FaithfulnessResult": hc.faithfulness(two, edges, clean=clean, corrupt=corrupt, metric=_metric, random=2),
        "CircuitStability": hc.circuit_stability(two, clean, corrupt, _metric, k=4, hows=("corrupt", "zero"), draws=2),
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
    assert {name.split(" ")[0] for name in results} == _result_classes(), (
        "every Result subclass needs a round trip here"
    )
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
    with pytest.raises(ValueError, match="refusing"):
        hc.load_result(folder)
    folder = results["Preferences"].save(tmp_path / "damaged")
    (folder / "tensors.safetensors").write_bytes(b"\x00" * 10)
    with pytest.raises(ValueError, match="damaged"):
        hc.load_result(folder)
    (folder / "result.json").write_text("{not json")
    with pytest.raises(ValueError, match="damaged"):
        hc.load_result(folder)
    from headcoop.storage.results import save_result

    with pytest.raises(TypeError, match="headcoop analysis result"):
        save_result({"a": 1}, tmp_path / "x")


def _killed_save(result, target, step: str, fallback: bool) -> int:
    """Save `result` to `target` in a forked child process that dies (os._exit(9)) at `step` of the save; the
    child's exit status."""
    import headcoop.storage.results as R

    pid = os.fork()
    if pid == 0:  # the child: no return from here
        try:
            R._step = lambda name: os._exit(9) if name == step else None
            if fallback:
                R.exchange = lambda a, b: False  # no atomic swap: the old result is moved aside between two renames
            result.save(target)
        finally:
            os._exit(0)
    return os.waitpid(pid, 0)[1] >> 8


@pytest.mark.parametrize("fallback", [False, True])
def test_a_killed_save_leaves_the_old_result_or_the_new_one(results, tmp_path, fallback):
    """Issue 47, item 4: a kill at any step of a save leaves a loadable result at the path (the old or the new),
    and the next load tidies what the killed save left beside it."""
    steps = ["staged", "written", "swapped", "done"] + (["moved aside"] if fallback else [])
    for step in steps:
        target = tmp_path / f"at-{step.replace(' ', '-')}"
        results["PatchResult"].save(target)
        assert _killed_save(results["DLAResult"], target, step, fallback) == 9, step
        loaded = hc.load_result(target)
        assert type(loaded).__name__ in ("PatchResult", "DLAResult"), step
        if step in ("swapped", "done"):
            assert type(loaded).__name__ == "DLAResult", step
        left = [p.name for p in tmp_path.iterdir() if p.name.startswith(f".{target.name}.")]
        assert left == [], (step, left)


def test_a_save_never_deletes_a_file_its_result_json_does_not_name(results, tmp_path):
    folder = results["PatchResult"].save(tmp_path / "saved")
    (folder / "table-notes.parquet").write_bytes(b"my own notes")
    with pytest.raises(ValueError, match="will not replace"):
        results["DLAResult"].save(folder)
    assert (folder / "table-notes.parquet").read_bytes() == b"my own notes"
    assert type(hc.load_result(folder)).__name__ == "PatchResult"


def test_a_save_refuses_links_and_names_a_bad_place(results, tmp_path):
    real = results["PatchResult"].save(tmp_path / "real")
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(ValueError, match="symbolic link"):
        results["DLAResult"].save(link)
    assert type(hc.load_result(real)).__name__ == "PatchResult"
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="symbolic link to nothing"):
        results["DLAResult"].save(dangling)
    file = tmp_path / "a-file"
    file.write_text("x")
    with pytest.raises(OSError, match="cannot save a result to"):
        results["DLAResult"].save(file / "inside")
    with pytest.raises(OSError, match="cannot save a result to"):
        results["DLAResult"].save(tmp_path / ("x" * 300))


def _tampered(results, tmp_path, name, change):
    folder = results["Preferences"].save(tmp_path / name)
    meta = json.loads((folder / "result.json").read_text())
    change(meta)
    (folder / "result.json").write_text(json.dumps(meta))
    return folder


def test_loading_builds_only_headcoops_result_classes_from_inside_the_folder(results, tmp_path):
    """Issue 47, item 5: a class found by an explicit registry, never by a lookup path (TransformerLens's config
    reseeds every generator when built); tables only from the folder itself; tampered files name the field."""
    for name in (
        "headcoop.storage.checkpoints:HookedTransformerConfig",
        "headcoop.analysis:attribution.pd.NamedAgg",
        "headcoop.storage.results:Result.__init_subclass__",
        "os:system",
        3,
    ):
        folder = _tampered(results, tmp_path, f"class-{abs(hash(str(name)))}",
                           lambda meta: meta["value"].__setitem__("__dataclass__", name))  # fmt: skip
        with pytest.raises(ValueError, match="refusing"):
            hc.load_result(folder)
    torch.manual_seed(5)
    expected = torch.rand(1)
    torch.manual_seed(5)
    folder = _tampered(results, tmp_path, "config", lambda meta: meta["value"].__setitem__(
        "__dataclass__", "headcoop.storage.checkpoints:HookedTransformerConfig"))  # fmt: skip
    with pytest.raises(ValueError, match="refusing"):
        hc.load_result(folder)
    assert torch.equal(torch.rand(1), expected)  # nothing reseeded the process
    outside = tmp_path / "outside.parquet"
    results["PatchResult"].to_dataframe().to_parquet(outside)
    for table in ("../outside.parquet", str(outside), "table-0.parquet/../../outside.parquet"):
        folder = results["EdgeResult"].save(tmp_path / f"tables-{abs(hash(table))}")
        assert "table-0.parquet" in (folder / "result.json").read_text()
        text = (folder / "result.json").read_text()
        (folder / "result.json").write_text(re.sub(r'"table-\d+\.parquet"', json.dumps(table), text, count=1))
        with pytest.raises(ValueError, match="inside its own folder"):
            hc.load_result(folder)
    folder = _tampered(results, tmp_path, "no-value", lambda meta: meta.pop("value"))
    with pytest.raises(ValueError, match="no 'value' field"):
        hc.load_result(folder)
    folder = _tampered(results, tmp_path, "unknown", lambda meta: meta["value"]["fields"].__setitem__("extra", 1))
    with pytest.raises(ValueError, match="no field 'extra'"):
        hc.load_result(folder)
    for depth in (900, 100_000):  # deeper than the decoder recurses, then deeper than JSON parses
        folder = results["Preferences"].save(tmp_path / f"deep-{depth}")
        meta = json.loads((folder / "result.json").read_text())
        deep = '{"__tuple__": [' * depth + "1" + "]}" * depth
        (folder / "result.json").write_text(
            f'{{"format": "{meta["format"]}", "version": {meta["version"]}, "value": {deep}}}'
        )
        with pytest.raises(ValueError, match="too deeply|damaged"):
            hc.load_result(folder)


def test_the_registry_knows_every_result_module():
    from headcoop.storage.results import REGISTRY, RESULT_MODULES

    classes = _result_classes()
    assert classes <= set(REGISTRY)
    assert {REGISTRY[name].__module__ for name in classes} <= set(RESULT_MODULES)


def test_a_tampered_set_or_bfloat16_value_is_named_damaged(results, tmp_path):
    folder = _tampered(results, tmp_path, "set", lambda meta: meta["value"]["fields"].__setitem__(
        next(iter(meta["value"]["fields"])), {"__set__": [[1, 2]]}))  # fmt: skip
    with pytest.raises(ValueError, match="damaged"):
        hc.load_result(folder)
    from safetensors.torch import save_file

    folder = results["ExactEvaluation"].save(tmp_path / "bf16")
    meta = json.loads((folder / "result.json").read_text())
    meta["value"]["fields"][next(iter(meta["value"]["fields"]))] = {"__ndarray__": "bf"}
    (folder / "result.json").write_text(json.dumps(meta))
    save_file({"bf": torch.ones(3, dtype=torch.bfloat16)}, str(folder / "tensors.safetensors"))
    with pytest.raises(ValueError, match="damaged"):
        hc.load_result(folder)
