"""Resumable sweeps: names, grids, skipping finished runs, ignoring half-written ones, the CLI."""

import json
import os
import subprocess
import sys

import pandas as pd
import pytest
import torch

import headcoop as hc
import headcoop.training.chunk_locks as claims_module
import headcoop.training.sweeps as sweep_module
from headcoop.cli import build_parser
from headcoop.storage import checkpoints
from headcoop.storage.checkpoints import META, WEIGHTS
from headcoop.training.sweeps import expand_grid, run_name, sweep

FAST = dict(steps=3, batch_size=16, warmup=1, progress=False)
GRID = {"n_heads": [1, 2], "d_model": [4], "d_head": [2]}
SEEDS = [0, 1]
NAMES = [f"count01-L1-H{h}-d4-dh2-s{s}" for h in (1, 2) for s in SEEDS]


class Counter:
    """Wraps train_many, recording which runs it was asked to train."""

    def __init__(self):
        self.calls = []

    def __call__(self, task, items, seeds, **kw):
        self.calls.append([(item["n_heads"], seed) for item, seed in zip(items, seeds)])
        return hc.train_many(task, items, seeds=seeds, **kw)


def test_grid_forms_and_names():
    task = hc.Count01()
    product = expand_grid(task, {"n_heads": [1, 2], "d_head": [1, 3]})
    assert product == [{"n_heads": 1, "d_head": 1}, {"n_heads": 1, "d_head": 3},
                       {"n_heads": 2, "d_head": 1}, {"n_heads": 2, "d_head": 3}]  # fmt: skip
    assert expand_grid(task, [{"n_heads": 4}, {"d_model": 8}]) == [{"n_heads": 4}, {"d_model": 8}]
    assert run_name(task, {}, 0) == "count01-L1-H16-d32-dh2-s0"
    assert run_name(hc.SkipPair(), {"d_head": 1}, 3) == "skip-pair-L1-H2-dh1-s3"
    with pytest.raises(ValueError, match=r"unknown count01 model setting\(s\) \['heads'\].*valid ones"):
        expand_grid(task, {"heads": [1]})
    with pytest.raises(ValueError, match="the grid is empty"):
        expand_grid(task, [])
    with pytest.raises(TypeError, match="list of dicts or a dict of lists"):
        expand_grid(task, "n_heads")


def test_sweep_table_checkpoints_and_equivalence(tmp_path):
    task = hc.Count01()
    table = sweep(task, GRID, SEEDS, tmp_path, **FAST)
    assert isinstance(table, pd.DataFrame) and list(table["name"]) == NAMES
    assert {"n_heads", "d_model", "d_head", "seed", "answer_acc", "both_acc", "path"} <= set(table.columns)
    for row in table.itertuples():
        model = hc.load(row.path)
        assert model.checkpoint_meta["sweep"] == {"grid": {"n_heads": row.n_heads, "d_model": 4, "d_head": 2},
                                                  "seed": row.seed}  # fmt: skip
        assert model.train_settings["seed"] == row.seed
        assert model.checkpoint_meta["metrics"]["answer_acc"] == row.answer_acc
        # the same model as hc.train_many on its own
        (alone,) = hc.train_many(task, [dict(n_heads=row.n_heads, d_model=4, d_head=2)], seeds=[row.seed], **FAST)
        for p, q in zip(model.parameters(), alone.parameters()):
            torch.testing.assert_close(p, q, atol=1e-6, rtol=0)


@pytest.mark.parametrize("chunk", [1, 8])
def test_interrupted_sweep_resumes_without_redoing_work(tmp_path, monkeypatch, chunk):
    task = hc.Count01()
    real_save, saved = sweep_module.save, []

    def save_then_die(model, path, **kw):
        if saved:
            raise KeyboardInterrupt("killed")
        saved.append(real_save(model, path, **kw))
        return saved[-1]

    monkeypatch.setattr(sweep_module, "save", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        sweep(task, GRID, SEEDS, tmp_path, chunk=chunk, **FAST)
    assert [p.name for p in saved] == NAMES[:1]
    assert sorted(p.name for p in tmp_path.iterdir()) == NAMES[:1]  # the failed save left no temp dir
    first_mtime = (tmp_path / NAMES[0] / WEIGHTS).stat().st_mtime_ns

    monkeypatch.setattr(sweep_module, "save", real_save)
    counter = Counter()
    monkeypatch.setattr(sweep_module, "train_many", counter)
    table = sweep(task, GRID, SEEDS, tmp_path, chunk=chunk, **FAST)
    trained = [run for call in counter.calls for run in call]
    assert trained == [(1, 1), (2, 0), (2, 1)]
    assert all(len(call) <= chunk for call in counter.calls)
    assert (tmp_path / NAMES[0] / WEIGHTS).stat().st_mtime_ns == first_mtime
    assert list(table["name"]) == NAMES and table["answer_acc"].notna().all()
    for name in NAMES:
        hc.load(tmp_path / name)

    # a third run has nothing left to do, and gives the same table
    counter.calls.clear()
    again = sweep(task, GRID, SEEDS, tmp_path, chunk=chunk, **FAST)
    assert counter.calls == []
    assert list(table["status"]) == ["finished before"] + ["trained"] * 3
    assert list(again["status"]) == ["finished before"] * 4
    pd.testing.assert_frame_equal(again.drop(columns="status"), table.drop(columns="status"))


def test_half_written_checkpoints_do_not_count(tmp_path, monkeypatch):
    task = hc.Count01()
    grid = [{"n_heads": 1, "d_model": 4, "d_head": 2}]
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    leftover = tmp_path / f".{NAMES[0]}.tmp-{checkpoints._HOST}-{dead.pid}-k1ll3d"  # what a killed save leaves
    leftover.mkdir()
    (leftover / checkpoints.MARKER).write_text(f"host {dead.pid}")
    (leftover / WEIGHTS).write_bytes(b"\x00" * 10)
    partial = tmp_path / NAMES[1]  # a folder of the run holding only an empty one of its files
    partial.mkdir()
    (partial / WEIGHTS).write_bytes(b"")
    unrelated = tmp_path / ".keep.me"
    unrelated.mkdir()
    counter = Counter()
    monkeypatch.setattr(sweep_module, "train_many", counter)
    with pytest.raises(ValueError, match=f"{NAMES[1]}.*headcoop.json is missing beside weights.safetensors"):
        sweep(task, grid, SEEDS, tmp_path, **FAST)  # not provably headcoop's: refused before any training
    assert counter.calls == []
    (partial / WEIGHTS).unlink()
    table = sweep(task, grid, SEEDS, tmp_path, **FAST)
    assert counter.calls == [[(1, 0), (1, 1)]]
    assert not leftover.exists() and unrelated.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*NAMES[:2], ".keep.me"])
    assert len(table) == 2
    hc.load(partial)


def test_a_run_folder_holding_a_users_file_is_never_replaced(tmp_path):
    task = hc.Count01()
    (tmp_path / NAMES[0]).mkdir()
    (tmp_path / NAMES[0] / META).write_text("{my notes, not json")
    with pytest.raises(ValueError, match=f"{NAMES[0]}.*not a headcoop checkpoint's JSON"):
        sweep(task, [{"n_heads": 1, "d_model": 4, "d_head": 2}], SEEDS, tmp_path, **FAST)
    assert (tmp_path / NAMES[0] / META).read_text() == "{my notes, not json"


def test_settings_mismatch_and_bad_input(tmp_path):
    task = hc.Count01()
    grid = [{"n_heads": 1, "d_model": 4, "d_head": 2}]
    sweep(task, grid, [0], tmp_path, **FAST)
    with pytest.raises(ValueError, match="other settings.*Use another out folder"):
        sweep(task, grid, [0], tmp_path, **dict(FAST, steps=4))
    with pytest.raises(ValueError, match="other settings"):
        sweep(hc.Count01(positional=True), grid, [0], tmp_path, **FAST)
    with pytest.raises(ValueError, match="seeds repeat"):
        sweep(task, grid, [0, 0], tmp_path, **FAST)
    with pytest.raises(TypeError, match="each seed must be an int, got '0'"):
        sweep(task, grid, ["0"], tmp_path, **FAST)
    with pytest.raises(ValueError, match="same model"):
        sweep(task, [{"n_heads": 16}, {}], [0], tmp_path, **FAST)
    with pytest.raises(ValueError, match="chunk must be >= 1, got 0"):
        sweep(task, grid, [0], tmp_path, chunk=0, **FAST)


def test_cli(tmp_path, capsys):
    parser = build_parser()
    argv = ["sweep", "skip-pair", "--heads", "1", "2", "--d-head", "1", "--seeds", "0", "--steps", "2",
            "--batch-size", "8", "--warmup", "1", "--no-progress", "--out", str(tmp_path)]  # fmt: skip
    args = parser.parse_args(argv)
    assert args.func(args) == 0
    printed = capsys.readouterr().out
    assert "skip-pair-L1-H1-dh1-s0" in printed and "signal_acc" in printed
    table = pd.read_csv(tmp_path / "sweep.csv")
    assert list(table["n_heads"]) == [1, 2] and list(table["seed"]) == [0, 0]
    assert hc.load(tmp_path / "skip-pair-L1-H2-dh1-s0").cfg.n_heads == 2
    with pytest.raises(ValueError, match="count01 only"):
        args = parser.parse_args([*argv, "--positional"])
        args.func(args)


SWEEP_WORKER = """
import json, os, signal, sys
import headcoop as hc
from headcoop.training import sweeps
out, mode = sys.argv[1], sys.argv[2]
grid = {"n_heads": [1, 2], "d_model": [4], "d_head": [1, 2]}
if mode == "die-after-first-save":
    real_save = sweeps.save
    def save_then_die(*args, **kwargs):
        real_save(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)
    sweeps.save = save_then_die
print("ready", flush=True)
sys.stdin.readline()  # start together
table = hc.sweep(hc.Count01(max_len=6), grid, [0, 1], out, steps=20, batch_size=16, warmup=1, chunk=1, progress=False,
                 poll_s=0.05)
print(json.dumps(dict(zip(table["name"], table["status"]))), flush=True)
"""


def _start_workers(tmp_path, out, modes):
    script = tmp_path / "worker.py"
    script.write_text(SWEEP_WORKER)
    procs = [subprocess.Popen([sys.executable, str(script), str(out), mode], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for mode in modes]  # fmt: skip
    for proc in procs:
        assert proc.stdout.readline().strip() == "ready"
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    return procs


@pytest.mark.slow
def test_two_sweeps_into_one_folder_train_each_run_once(tmp_path):
    out = tmp_path / "out"
    procs = _start_workers(tmp_path, out, ["normal", "normal"])
    statuses = []
    for proc in procs:
        stdout, _ = proc.communicate(timeout=900)
        assert proc.returncode == 0
        statuses.append(json.loads(stdout.strip().splitlines()[-1]))
    names = sorted(statuses[0])
    assert len(names) == 8 and sorted(statuses[1]) == names
    for name in names:
        pair = sorted([statuses[0][name], statuses[1][name]])
        assert pair == ["trained", "trained by another sweep"], (name, pair)  # exactly one sweep trained it
        hc.load(out / name)
    assert sorted(p.name for p in out.iterdir()) == names  # no claims, no temporary folders


@pytest.mark.slow
def test_a_killed_sweeps_claims_are_taken_over(tmp_path):
    out = tmp_path / "out"
    (proc,) = _start_workers(tmp_path, out, ["die-after-first-save"])
    proc.communicate(timeout=900)
    assert proc.returncode == -9
    claims = sorted(p.name for p in (out / claims_module.CLAIMS).iterdir())
    assert len(claims) == 1  # the killed sweep held the claim of the run it was training next
    table = sweep(
        hc.Count01(max_len=6),
        {"n_heads": [1, 2], "d_model": [4], "d_head": [1, 2]},
        [0, 1],
        out,
        steps=20,
        batch_size=16,
        warmup=1,
        chunk=1,
        progress=False,
    )
    assert list(table["status"]).count("finished before") == 1 and list(table["status"]).count("trained") == 7
    assert not (out / claims_module.CLAIMS).exists()


def test_a_full_disk_ends_the_sweep_with_one_clear_error(tmp_path, monkeypatch):
    import errno

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoints, "save_file", full)
    with pytest.raises(OSError, match="sweep stopped: no space left on the device .* run the same sweep again"):
        sweep(hc.Count01(), GRID, SEEDS, tmp_path, **FAST)
    assert list(tmp_path.iterdir()) == []


SWEEP_FORK_KILLER = """
import json, os, sys
import torch
import headcoop as hc
from headcoop.storage import checkpoints
from headcoop.training import sweeps
torch.set_num_threads(1)
root, points = sys.argv[1], int(sys.argv[2])
task, grid = hc.Count01(max_len=6), {"n_heads": [1, 2], "d_model": [4], "d_head": [1, 2]}
settings = dict(steps=5, batch_size=8, warmup=1, chunk=1, progress=False, poll_s=0.01)
from line_killer import LineKiller
killer = LineKiller([checkpoints.__file__, sweeps.__file__])
lines = killer.run(lambda: hc.sweep(task, grid, [0, 1], os.path.join(root, "probe"), **settings))
seen = {"lines": lines, "bad": [], "kept": 0}
for kill_at in range(lines // (points + 1), lines, lines // (points + 1)):
    out = os.path.join(root, f"k{kill_at}")
    pid = os.fork()
    if pid == 0:
        killer.run(lambda: hc.sweep(task, grid, [0, 1], out, **settings), kill_at)
        os._exit(0)
    os.waitpid(pid, 0)
    finished = []
    for name in (os.listdir(out) if os.path.isdir(out) else []):
        try:
            hc.load(os.path.join(out, name))
            finished.append(name)
        except (FileNotFoundError, ValueError, NotADirectoryError):
            pass
    table = hc.sweep(task, grid, [0, 1], out, **settings)
    status = dict(zip(table["name"], table["status"]))
    for name in table["name"]:
        hc.load(os.path.join(out, name))
        want = "finished before" if name in finished else "trained"
        if status[name] != want:
            seen["bad"].append([kill_at, name, status[name], want])
    if sorted(os.listdir(out)) != sorted(table["name"]):
        seen["bad"].append([kill_at, sorted(os.listdir(out))])
    seen["kept"] += len(finished)
print(json.dumps(seen))
"""


@pytest.mark.slow
def test_sweeps_killed_at_many_points_resume_without_retraining(tmp_path):
    """A forked sweep is SIGKILLed at 8 points spread over the lines headcoop.training.sweeps and headcoop.storage.checkpoints
    execute; the rerun loads only whole checkpoints, keeps every finished run and trains the rest."""
    script = tmp_path / "sweep_killer.py"
    script.write_text(SWEEP_FORK_KILLER)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path), "8"], capture_output=True, text=True,
                          timeout=900, env=dict(os.environ, PYTHONPATH=os.path.dirname(__file__)))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["bad"] == [] and seen["lines"] > 100
    assert seen["kept"] > 0  # some kills came after runs had finished


def test_claims_from_another_machine_are_leases(tmp_path):
    """A claim written by a sweep on another machine sharing the folder counts while its lease is renewed
    (mtime younger than lease_s) and is taken over once it lapses; a sweep renews the claims it holds."""
    import time

    out = tmp_path / "out"
    grid = {"n_heads": [1], "d_model": [4], "d_head": [2]}
    (name,) = [run_name(hc.Count01(), grid_point, 0) for grid_point in expand_grid(hc.Count01(), grid)]
    claims = claims_module.Claims(out, lease_s=300)
    (out / claims_module.CLAIMS).mkdir(parents=True)
    claim = out / claims_module.CLAIMS / name
    claim.write_text("another-machine 4242:777")
    assert claims.alive(name)
    old = time.time() - 301
    os.utime(claim, (old, old))
    assert not claims.alive(name)
    table = sweep(hc.Count01(), grid, [0], out, **FAST)  # the lapsed claim is taken over and the run trained
    assert list(table["status"]) == ["trained"]
    assert not (out / claims_module.CLAIMS).exists()

    mine = claims_module.Claims(tmp_path / "other", lease_s=300)
    (tmp_path / "other").mkdir()
    assert mine.take("run")
    os.utime(mine.folder / "run", (old, old))
    mine.renew()
    assert time.time() - (mine.folder / "run").stat().st_mtime < 60
    mine.release_all()
    assert not mine.folder.exists()
