"""Issue 61's cases (reliability, round five), each with the behaviour it now has: one step cap for every
integrated-gradients estimate, budgets clamped to the machine, the report's page written as the shell would let
the user (mode and owner kept, read-only refused, dead partial files cleared), killed saves' leftovers cleaned
and malformed pids left alone."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import torch

import headcoop as hc
from headcoop.analysis.games.coalitions import CoalitionGame
from headcoop.checks import MAX_STEPS, check_memory_budget, machine_memory_mb
from headcoop.storage.folders import replace_file
from headcoop.storage.owners import PID_MAX, parse_pid, pid_alive

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def count01():
    model = hc.Count01().model(seed=0, n_heads=2, d_model=8, d_head=4)
    clean, corrupt = model.task.patching_inputs(8)
    return model, clean, corrupt


# item 2: one step cap


def test_attribute_caps_its_integrated_gradient_steps_as_edges_does(count01):
    model, clean, corrupt = count01
    for steps in (10**7, MAX_STEPS + 1, 0):
        with pytest.raises(ValueError, match=f"steps must be in 1..{MAX_STEPS}"):
            hc.attribute(model, clean=clean, corrupt=corrupt, estimator="ig", steps=steps, progress=False)
    with pytest.raises(TypeError, match="steps"):
        hc.attribute(model, clean=clean, corrupt=corrupt, estimator="ig", steps=2.5, progress=False)


# item 5: budgets the code can use


def test_a_budget_beyond_the_machine_is_clamped_with_a_warning_and_gives_the_same_numbers(count01):
    model, clean, corrupt = count01
    ceiling = machine_memory_mb()
    with pytest.warns(UserWarning, match="more than this machine has"):
        assert check_memory_budget(1e303) == ceiling
    assert check_memory_budget(64) == 64.0
    for bad, error in ((float("nan"), ValueError), (float("inf"), ValueError), (0, ValueError), ("1e3", TypeError)):
        with pytest.raises(error, match="memory_budget_mb"):
            check_memory_budget(bad)
    calls = [lambda b: hc.patch(model, clean=clean, corrupt=corrupt, memory_budget_mb=b, progress=False).values,
             lambda b: hc.attribute(model, clean=clean, corrupt=corrupt, memory_budget_mb=b, progress=False).values,
             lambda b: CoalitionGame(model, [(0, 0), (0, 1)], tokens=clean, metric="logit_diff", how="zero",
                                     memory_budget_mb=b).values(torch.tensor([[1, 0], [0, 1], [0, 0]]))]  # fmt: skip
    for call in calls:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            huge = call(1e303)
        assert any("more than this machine has" in str(w.message) for w in caught)
        torch.testing.assert_close(huge, call(256.0), equal_nan=True)


# item 3: the report's write


def test_replacing_a_private_file_keeps_it_private_and_clears_dead_partials(tmp_path):
    target = tmp_path / "r.html"
    target.write_text("the user's")
    os.chmod(target, 0o600)
    dead = tmp_path / f".r.html.{PID_MAX - 1}.partial"  # a killed report's partial page (no such process)
    dead.write_text("half a page")
    alien = tmp_path / ".r.html.99999999999.partial"  # not a pid: not ours to judge, left alone
    alien.write_text("someone's")
    replace_file(target, "<html>", "report")
    assert target.read_text() == "<html>" and (target.stat().st_mode & 0o777) == 0o600
    assert not dead.exists() and alien.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_as_another_user_a_read_only_file_is_refused_as_the_shell_refuses_it(tmp_path):
    """The user's read-only report in a shared folder: another user's shell gets "Permission denied", and so
    does headcoop's write (run in a real second process as uid 65534)."""
    os.chmod(tmp_path, 0o777)
    target = tmp_path / "r.html"
    target.write_text("the user's")
    os.chmod(target, 0o644)
    # imported as root (the interpreter lives in root's folders), then the process becomes uid 65534 for good
    code = (
        "import os, sys; from pathlib import Path; import headcoop.storage.owners; from headcoop.storage.folders import replace_file\n"
        "os.setgid(65534); os.setuid(65534)\n"
        "try:\n replace_file(Path(sys.argv[1]), 'x', 'report')\nexcept PermissionError as e:\n print('refused:', e)"
    )
    shell = subprocess.run(["sh", "-c", f"echo x > {target}"], capture_output=True, text=True,
                           preexec_fn=lambda: os.setuid(65534))  # fmt: skip
    ours = subprocess.run([sys.executable, "-c", code, str(target)], capture_output=True, text=True)
    assert shell.returncode != 0 and "Permission denied" in shell.stderr
    assert "refused:" in ours.stdout and "Permission denied" in ours.stdout, ours.stdout + ours.stderr
    assert target.read_text() == "the user's"


def test_the_report_goes_through_the_shared_write(tmp_path):
    """`hc.report` onto the user's 0600 file keeps it 0600 (it was left 0644)."""
    model = hc.Count01().model(seed=0, n_heads=2, d_model=4, d_head=2)
    out = tmp_path / "r.html"
    out.write_text("old")
    os.chmod(out, 0o600)
    hc.report(model, out=out, examples=1, progress=False)
    assert (out.stat().st_mode & 0o777) == 0o600 and "<html" in out.read_text(encoding="utf-8").lower()


# item 4: killed saves


def test_pids_out_of_range_are_no_pids():
    assert parse_pid("123") == 123
    for text in ("99999999999", "0", "", "-1", "12a", str(PID_MAX + 1)):
        assert parse_pid(text) is None
    assert not pid_alive(10**12)  # no OverflowError


def test_a_killed_save_leaves_nothing_the_next_save_keeps_and_crafted_names_crash_nothing(tmp_path, count01):
    model, clean, corrupt = count01
    result = hc.patch(model, clean=clean, corrupt=corrupt, progress=False)
    path = tmp_path / "r"
    staging = tmp_path / f".r.partial-{PID_MAX - 1}-0123abcd"  # a dead writer's folder, killed inside safetensors
    staging.mkdir()
    (staging / ".headcoop-result-save").write_text("host 4194303")
    (staging / ".tmpAb12_z").write_bytes(b"\0" * 1024)
    crafted = [tmp_path / ".r.old-99999999999-0123abcd", tmp_path / ".r.partial-99999999999-0123abcd"]
    for folder in crafted:
        folder.mkdir()
    mib = tmp_path / ".c.json.mib-abc.tmp"
    mib.write_text("someone's")
    result.save(path)
    assert not staging.exists()
    assert all(folder.exists() for folder in crafted)  # malformed pids: left alone, no crash
    loaded = hc.load_result(path)
    torch.testing.assert_close(loaded.values, result.values)
    assert mib.exists()


# item 6: callable metrics for cooperation


def _answer_margin(model):
    batch = model.task.mechanism_inputs(64, seed=0)
    rows = torch.arange(len(batch))

    def margin(logits):
        at = logits[rows, batch.answer_pos]
        return at[rows, batch.answer] - at.mean(-1)

    return batch, margin


def test_cooperation_refuses_callable_metrics_it_cannot_read_by_name():
    model = hc.bench("unequal")
    batch, margin = _answer_margin(model)
    rows = torch.arange(len(batch))
    cases = [(lambda lg: margin(lg) - margin(lg).mean(), ValueError, "couples the inputs"),
             (lambda lg: torch.softmax(margin(lg), 0), ValueError, "couples the inputs"),
             (lambda lg: torch.where(rows == 3, float("inf"), margin(lg)), ValueError, "inf on input 3"),
             (lambda lg: torch.where(rows == 5, float("nan"), margin(lg)), ValueError, "nan on input 5"),
             (lambda lg: margin(lg).to(torch.complex64), TypeError, "complex"),
             (lambda lg: None, TypeError, "NoneType"), (lambda lg: "good", TypeError, "str"),
             (lambda lg: {"a": 1}, TypeError, "dict")]  # fmt: skip
    for metric, error, match in cases:
        with pytest.raises(error, match=match):
            hc.cooperation(model, inputs=batch, metric=metric, how="zero", progress=False)
    ok = hc.cooperation(model, inputs=batch, metric=margin, how="zero", progress=False)
    assert len(ok.pairs) == 1


def test_loss_interaction_takes_the_words_sign():
    """With metric="loss" the words read the loss negated (higher is better); the interaction index now has the
    sign of interaction_full (it had the opposite one)."""
    model = hc.bench("and-junk")
    result = hc.cooperation(model, n=128, how="zero", metric="loss", progress=False)
    row = result.pairs.iloc[0]
    assert row.interaction * row.interaction_full > 0, (row.interaction, row.interaction_full)


# item 7: circuit stability's results, loaded folders


@pytest.fixture(scope="module")
def stability():
    from analysis.edges.test_stability import _setup

    model, clean, _, metric = _setup()
    # clean == corrupt: every faithfulness is NaN (a share of a zero difference)
    return hc.circuit_stability(model, clean, clean, metric, k=4, hows=("corrupt",), draws=2, progress=False)


def test_stability_with_every_faithfulness_undefined_still_shows_itself(stability):
    assert stability.readings.faithfulness.isna().all()
    assert "faithfulness undefined in every reading" in repr(stability)
    assert all(v != v for v in stability.spread.values())
    stability.plot()
    assert len(stability.band)


def _tamper(folder, edit):
    import json

    meta = json.loads((folder / "result.json").read_text())
    edit(meta["value"]["fields"])
    (folder / "result.json").write_text(json.dumps(meta))


def test_a_tampered_stability_folder_is_refused_by_field(stability, tmp_path):
    cases = [(lambda f: f.update(k="4"), "k must be an int"), (lambda f: f.update(k=-3), "k must be an int"),
             (lambda f: f.update(estimator=3), "estimator"),
             (lambda f: f.update(edges=f["readings"]), "edges lacks the columns"),
             (lambda f: f.update(k={"__float__": "abc"}), "'__float__': 'abc'")]  # fmt: skip
    for i, (edit, match) in enumerate(cases):
        folder = tmp_path / f"s{i}"
        stability.save(folder)
        _tamper(folder, edit)
        with pytest.raises((ValueError, TypeError), match=match):
            hc.load_result(folder)
    folder = tmp_path / "linked"
    stability.save(folder)
    outside = tmp_path / "outside.parquet"
    (folder / "table-0.parquet").rename(outside)
    (folder / "table-0.parquet").symlink_to(outside)
    with pytest.raises(ValueError, match="is a link"):
        hc.load_result(folder)
    with pytest.raises(TypeError, match="load_result takes the folder"):
        hc.load_result(None)


# item 8: what round four left unclear


@pytest.mark.parametrize("kind", ["folder", "fifo", "dangling"])
def test_report_checks_out_before_importing_torch(tmp_path, kind):
    """`headcoop report --out` onto a folder, a FIFO or a dangling link is refused before torch is imported
    (it took 5-95 s to say so)."""
    out = tmp_path / "r.html"
    if kind == "folder":
        out.mkdir()
    elif kind == "fifo":
        os.mkfifo(out)
    else:
        out.symlink_to(tmp_path / "nowhere")
    code = (
        "import sys; from headcoop.cli import main\n"
        f"code = main(['report', 'count01', '--out', {str(out)!r}, '--no-progress'])\n"
        "print('torch imported' if 'torch' in sys.modules else 'torch not imported', code)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "torch not imported 2" in done.stdout, done.stdout + done.stderr
    assert {"folder": "is a folder", "fifo": "special file", "dangling": "does not exist"}[kind] in done.stderr


def test_every_bench_tasks_completions_hold_its_answers():
    from headcoop.tasks.bench import BENCH

    for which in BENCH:
        task = hc.bench(which).task
        completions = task.completions()
        if completions is not None:
            assert bool(torch.isin(task.sample(512, seed=1).answer, completions).all()), which


def test_integrated_gradient_steps_are_counted_by_the_bar(count01, monkeypatch):
    """Each step of hc.attribute's "ig" and hc.edges' "eap-ig" is a run the bar counts, so a long call's cost is
    announced (`progress.advance` extrapolates the first second's runs) and its total is known."""
    import headcoop.analysis.edges.scores as scores
    import headcoop.analysis.nodes.attribution as attribution
    import headcoop.display.progress as progress

    model, clean, corrupt = count01
    for module, call in ((attribution, lambda: hc.attribute(model, clean=clean, corrupt=corrupt, estimator="ig",
                                                            steps=7, progress=True)),
                         (scores, lambda: hc.edges(model, clean=clean, corrupt=corrupt, estimator="eap-ig", steps=7,
                                                   progress=True))):  # fmt: skip
        counted = {"more": 0, "done": 0}
        original = progress.advance

        def watched(done=0, more=0, original=original, counted=counted):
            counted["more"] += more
            counted["done"] += done
            original(done, more)

        monkeypatch.setattr(module, "advance", watched)
        call()
        assert counted["more"] >= 7 and counted["done"] >= 7, counted
