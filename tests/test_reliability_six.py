"""Reliability round six (issue 76), the saved results a colleague reads: each case found by the round, with the
error or the right result it now gives."""

from __future__ import annotations

import json
import os
import stat
import threading

import pytest
import torch

import headcoop as hc
from headcoop.storage import results as storage


@pytest.fixture(scope="module")
def result():
    return hc.ov(hc.load("count01"), head=3)


def test_every_saved_file_takes_the_folders_usual_mode(result, tmp_path):
    old = os.umask(0o022)
    try:
        folder = result.save(tmp_path / "r")
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir()}
    assert set(modes.values()) == {0o644}, modes  # tensors.safetensors was 0600


def test_a_bare_value_in_result_json_is_not_a_result(result, tmp_path):
    folder = result.save(tmp_path / "r")
    meta = json.loads((folder / storage.META).read_text())
    for bare in (3, [1, 2], "x"):
        meta["value"] = bare
        (folder / storage.META).write_text(json.dumps(meta))
        with pytest.raises(ValueError, match="holds a bare .*not a headcoop result"):
            hc.load_result(folder)


@pytest.mark.parametrize("path", [None, b"/tmp/r", 3])
def test_a_path_that_is_not_a_str_or_path_is_named(result, path):
    with pytest.raises(TypeError, match="a str or Path"):
        result.save(path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads and writes every folder")
def test_a_dead_writers_leftover_in_a_folder_the_reader_cannot_write_does_not_block_loading(result, tmp_path):
    folder = result.save(tmp_path / "shared" / "r")
    leftover = folder.with_name(f".r.partial-{2**22 + 12345}-0123abcd")
    leftover.mkdir()
    (leftover / storage.META).write_text("{}")
    os.chmod(folder.parent, 0o555)
    try:
        assert type(hc.load_result(folder)).__name__ == type(result).__name__
    finally:
        os.chmod(folder.parent, 0o755)


def test_a_dead_writers_leftover_is_skipped_where_removing_it_is_refused(result, tmp_path, monkeypatch):
    """The same case as the reader sees it as root (who may write anywhere): removing the leftover raises
    PermissionError, and the result still loads."""
    folder = result.save(tmp_path / "r")

    def refuse(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(storage, "clean_leftovers", refuse)
    assert type(hc.load_result(folder)).__name__ == type(result).__name__


def test_two_first_saves_of_one_new_path_both_end_whole(result, tmp_path):
    """Two threads save to one new folder at once: neither fails with "Directory not empty"; the folder ends as
    one whole result."""
    target = tmp_path / "r"
    errors = []
    barrier = threading.Barrier(2)
    real = storage._step

    def step(name):
        if name == "written":
            barrier.wait(timeout=30)  # both staged and written before either renames
        real(name)

    def save():
        try:
            result.save(target)
        except BaseException as err:  # noqa: BLE001 (reported below)
            errors.append(err)

    storage._step = step
    try:
        threads = [threading.Thread(target=save) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        storage._step = real
    assert errors == []
    assert type(hc.load_result(target)).__name__ == type(result).__name__
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".r.")]  # no leftover beside it


def test_the_users_thread_count_holds_from_python(monkeypatch):
    """HEADCOOP_THREADS=1 sets the count inside a long analysis (`fitted_threads`, as hc.pair_map runs), and a
    value that is not a positive integer is refused by name; the count comes back after."""
    import torch

    from headcoop.threads import fitted_threads

    before = torch.get_num_threads()
    monkeypatch.setenv("HEADCOOP_THREADS", "1")
    with fitted_threads() as used:
        assert used == 1 and torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    monkeypatch.setenv("HEADCOOP_THREADS", "abc")
    with pytest.raises(ValueError, match="HEADCOOP_THREADS must be a positive integer, got 'abc'"):
        with fitted_threads():
            pass
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("window, error", [(-1.0, ValueError), (float("nan"), ValueError), ("0.1", TypeError),
                                           (True, TypeError)])  # fmt: skip
def test_idle_cores_names_a_bad_window(window, error):
    from headcoop.threads import idle_cores

    with pytest.raises(error, match="window_s"):
        idle_cores(window)


def test_python_dash_m_headcoop_is_the_command_line():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "headcoop", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "report" in out.stdout


def test_a_report_into_a_folder_the_user_cannot_write_is_refused_before_any_work(tmp_path, monkeypatch):
    """The report names the folder it cannot write, before it builds the page (which took 76-112 s): the check
    is `os.access` on the folder, here as a non-root user sees it (this suite may run as root, who writes
    anywhere)."""
    from headcoop import paths

    locked = tmp_path / "locked"
    locked.mkdir()
    real = os.access
    monkeypatch.setattr(paths.os, "access", lambda p, mode: False if str(p) == str(locked) else real(p, mode))
    with pytest.raises(PermissionError, match="the folder .*locked.* is not writable"):
        hc.report(hc.load("count01"), out=locked / "sub" / "report.html")
    assert list(locked.iterdir()) == []  # refused at the argument check: nothing was created


# --- issue 76, item 5 -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("heads, text", [
    ((0, 3), r"heads=\(0, 3\) is one head, L0H3 .*\[\(0, 0\), \(0, 3\)\]"),
    (["L0H3", "L0H3"], "names L0H3 2 times"),
    (["L0H3"], "is one head, L0H3"),
])  # fmt: skip
def test_cooperation_says_how_it_read_heads_that_give_fewer_than_two(heads, text):
    model = hc.load("count01")
    with pytest.raises(ValueError, match=text):
        hc.cooperation(model, heads=heads)
    with pytest.raises(ValueError, match=text):
        hc.pair_map(model, heads=heads)


def test_loading_onto_a_device_this_machine_lacks_is_named_before_any_read(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="no CUDA device on this machine.*device='cpu'"):
        hc.load("count01", device="cuda")
    with pytest.raises(RuntimeError, match="no CUDA device"):
        hc.load_gguf("a-name-that-is-checked-later", device="cuda")


def test_an_mib_export_under_a_regular_file_is_named(tmp_path):
    model = hc.load("count01")
    edges = hc.edges(model, estimator="eap")
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="notes.txt"):
        hc.export_mib(edges, tmp_path / "notes.txt" / "circuit.json", model)
    assert (tmp_path / "notes.txt").read_text() == "mine"
