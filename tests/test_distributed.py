"""Sweeps on a real Dask LocalCluster with worker processes (and a process pool): results bit-identical
to the serial sweep, a worker killed mid-chunk survived without retraining what it saved, two sweeps into
one folder at once, bad input named."""

import json
import multiprocessing
import os
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import cloudpickle
import pytest
import torch

import headcoop as hc
from headcoop.training.executors import dask_client

distributed = pytest.importorskip("distributed", reason="the [dist] extra (Dask) is not installed")
import sweep_killer  # noqa: E402

pytestmark = pytest.mark.slow  # the slow tier: `pytest -m "not slow"` leaves it out while working

cloudpickle.register_pickle_by_value(sweep_killer)

TASK = hc.Count01(max_len=6)
GRID = {"n_heads": [1, 2], "d_model": [4], "d_head": [1, 2]}
SEEDS = [0, 1]
TRAIN = dict(steps=20, batch_size=16, warmup=1, progress=False)


@pytest.fixture(scope="module")
def client():
    with dask_client(workers=2) as client:
        assert len(client.scheduler_info()["workers"]) == 2
        yield client
        client.cluster.close()


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    out = tmp_path_factory.mktemp("serial")
    table = hc.sweep(TASK, GRID, SEEDS, out, **TRAIN)
    return out, table


def weights(folder):
    model = hc.load(folder)
    return {name: p.detach().clone() for name, p in model.state_dict().items()}


def same_weights(a, b) -> bool:
    wa, wb = weights(a), weights(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_dask_sweep_equals_the_serial_sweep_bit_for_bit(client, serial, tmp_path):
    serial_out, serial_table = serial
    pids = set(client.run(os.getpid).values())
    assert os.getpid() not in pids and len(pids) == 2  # worker processes, not threads of this one
    table = hc.sweep(TASK, GRID, SEEDS, tmp_path, executor=client, **TRAIN)
    assert list(table["status"]) == ["trained"] * 8
    assert list(table["name"]) == list(serial_table["name"])
    for name in table["name"]:
        assert same_weights(serial_out / name, tmp_path / name), name
    metric_columns = [c for c in serial_table.columns if c not in ("path", "status")]
    assert table[metric_columns].equals(serial_table[metric_columns])
    again = hc.sweep(TASK, GRID, SEEDS, tmp_path, executor=client, **TRAIN)  # a rerun trains nothing
    assert list(again["status"]) == ["finished before"] * 8
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(table["name"])  # no claims, no temp folders


def test_a_process_pool_gives_the_same_weights(serial, tmp_path):
    serial_out, _ = serial
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        table = hc.sweep(TASK, GRID, SEEDS, tmp_path, executor=pool, threads=1, **TRAIN)
    assert list(table["status"]) == ["trained"] * 8
    assert all(same_weights(serial_out / n, tmp_path / n) for n in table["name"])


def test_a_worker_killed_mid_chunk_loses_only_that_chunk(client, serial, tmp_path):
    serial_out, _ = serial
    out, marker = tmp_path / "out", tmp_path / "killed.json"
    table = hc.sweep(TASK, GRID, SEEDS, out, executor=sweep_killer.Killing(client, marker), chunk=2, **TRAIN)
    killed = json.loads(marker.read_text())
    assert killed["pid"] not in client.run(os.getpid).values()  # that worker process is gone (restarted)
    assert list(table["status"]) == ["trained"] * 8
    stat = os.stat(out / killed["name"] / hc.storage.checkpoints.WEIGHTS)
    assert (stat.st_ino, stat.st_mtime_ns) == (killed["inode"], killed["mtime_ns"])  # saved once, not retrained
    assert all(same_weights(serial_out / n, out / n) for n in table["name"])
    assert sorted(p.name for p in out.iterdir()) == sorted(table["name"])


def test_a_process_pool_survives_a_killed_worker(serial, tmp_path):
    """A ProcessPoolExecutor breaks when a worker dies: the sweep sends the lost chunks to a new pool of the
    same size, keeps the run the dead worker had saved, and ends bit-identical to the serial sweep."""
    serial_out, _ = serial
    out, marker = tmp_path / "out", tmp_path / "killed.json"
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn"), initializer=sweep_killer.arm,
                             initargs=(str(marker),)) as pool:  # fmt: skip
        table = hc.sweep(TASK, GRID, SEEDS, out, executor=pool, chunk=2, **TRAIN)
    killed = json.loads(marker.read_text())
    assert list(table["status"]) == ["trained"] * 8
    stat = os.stat(out / killed["name"] / hc.storage.checkpoints.WEIGHTS)
    assert (stat.st_ino, stat.st_mtime_ns) == (killed["inode"], killed["mtime_ns"])  # saved once, not retrained
    assert all(same_weights(serial_out / n, out / n) for n in table["name"])
    assert sorted(p.name for p in out.iterdir()) == sorted(table["name"])


def test_with_no_retries_left_the_lost_runs_are_failed_with_the_reason(tmp_path):
    """retries=0 and a killed worker: the runs it had not saved are "failed" with the reason, never
    "trained"; every run called trained loads; the next sweep trains what failed."""
    out, marker = tmp_path / "out", tmp_path / "killed.json"
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=sweep_killer.arm,
                             initargs=(str(marker),)) as pool:  # fmt: skip
        with pytest.warns(UserWarning, match="run\\(s\\) failed"):
            table = hc.sweep(TASK, GRID, SEEDS, out, executor=pool, chunk=2, retries=0, **TRAIN)
    failed = table[table.status == "failed"]
    assert len(failed) >= 1 and all("its worker died" in r for r in failed.reason)
    for _, row in table[table.status == "trained"].iterrows():
        hc.load(row.path)
    again = hc.sweep(TASK, GRID, SEEDS, out, **TRAIN)
    assert set(again.status) <= {"finished before", "trained"} and "failed" not in set(again.status)


class LyingExecutor:
    """A real thread pool whose chunks report their runs trained but delete one's weights afterwards."""

    def __init__(self, pool):
        self.pool = pool

    def submit(self, fn, job):
        def lie():
            results = fn(job)
            (Path(job.out) / job.runs[0][2] / hc.storage.checkpoints.WEIGHTS).unlink()
            return results

        return self.pool.submit(lie)


def test_a_run_is_trained_only_if_its_checkpoint_loads(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool, pytest.warns(UserWarning, match="failed"):
        table = hc.sweep(TASK, {"n_heads": [1], "d_model": [4], "d_head": [1]}, [0, 1], tmp_path,
                         executor=LyingExecutor(pool), chunk=2, **TRAIN)  # fmt: skip
    assert list(table.status) == ["failed", "trained"]
    assert "does not load" in table.reason[0]


def test_a_failing_chunk_is_one_error_naming_its_runs(client, tmp_path):
    with pytest.raises(RuntimeError, match=r"chunk of runs \['count01-L1-H1-d4-dh1-s0'.*diverged.*resume"):
        hc.sweep(TASK, {"n_heads": [1], "d_model": [4], "d_head": [1]}, [0], tmp_path, executor=client,
                 steps=5, batch_size=16, warmup=1, lr=1e30, progress=False)  # fmt: skip


DASK_AND_SERIAL = """
import json, sys
import headcoop as hc
from headcoop.training.executors import dask_client

if __name__ == "__main__":  # Dask's worker processes import this file again
    out, mode = sys.argv[1], sys.argv[2]
    grid = {"n_heads": [1, 2], "d_model": [4], "d_head": [1, 2]}
    client = dask_client(workers=1) if mode == "dask" else None
    print("ready", flush=True)
    sys.stdin.readline()  # start together
    table = hc.sweep(hc.Count01(max_len=6), grid, [0, 1], out, steps=20, batch_size=16, warmup=1, chunk=1,
                     progress=False, poll_s=0.05, executor=client)
    print(json.dumps(dict(zip(table["name"], table["status"]))), flush=True)
"""


def test_a_dask_sweep_and_a_serial_sweep_into_one_folder_at_once(tmp_path, serial):
    serial_out, _ = serial
    script, out = tmp_path / "two.py", tmp_path / "out"
    script.write_text(DASK_AND_SERIAL)
    procs = [subprocess.Popen([sys.executable, str(script), str(out), mode], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for mode in ("dask", "serial")]  # fmt: skip
    for proc in procs:
        assert proc.stdout.readline().strip() == "ready"
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    statuses = []
    for proc in procs:
        stdout, _ = proc.communicate(timeout=900)
        assert proc.returncode == 0
        statuses.append(json.loads(stdout.strip().splitlines()[-1]))
    for name in statuses[0]:
        pair = [statuses[0][name], statuses[1][name]]
        assert pair.count("trained") == 1, (name, pair)  # exactly one sweep trained it; the other found it
        assert same_weights(serial_out / name, out / name)
    assert sorted(p.name for p in out.iterdir()) == sorted(statuses[0])


def test_bad_executors_and_devices(tmp_path):
    with pytest.raises(TypeError, match="executor must have a submit"):
        hc.sweep(TASK, GRID, SEEDS, tmp_path, executor=object(), **TRAIN)
    with pytest.raises(ValueError, match="retries"):
        hc.sweep(TASK, GRID, SEEDS, tmp_path, retries=-1, **TRAIN)
    with pytest.raises(ValueError, match="workers must be an int"):
        dask_client(workers=0)
    with pytest.raises(ValueError, match="exactly one of"):
        dask_client()
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="no CUDA device"):
            hc.sweep(TASK, GRID, SEEDS, tmp_path, device="cuda", **TRAIN)


def test_without_dask_the_message_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "dask.distributed", None)
    with pytest.raises(ImportError, match=r'pip install "headcoop\[dist\]"'):
        dask_client(workers=1)


def test_cli_on_a_running_scheduler_and_on_local_workers(client, tmp_path, capsys):
    from headcoop.cli import main

    grid = {"n_heads": [1], "d_model": [4], "d_head": [1]}
    hc.sweep(hc.Count01(), grid, [0, 1], tmp_path / "serial", **TRAIN)
    flags = ["sweep", "count01", "--heads", "1", "--d-model", "4", "--d-head", "1", "--seeds", "0", "1",
             "--steps", "20", "--batch-size", "16", "--warmup", "1", "--no-progress"]  # fmt: skip
    assert main([*flags, "--scheduler", client.scheduler.address, "--out", str(tmp_path / "a")]) == 0
    assert "2 runs in" in capsys.readouterr().out
    assert main([*flags, "--workers", "1", "--out", str(tmp_path / "b")]) == 0
    names = sorted(p.name for p in (tmp_path / "serial").iterdir() if p.is_dir())
    assert len(names) == 2
    for name in names:
        assert same_weights(tmp_path / "serial" / name, tmp_path / "a" / name)
        assert same_weights(tmp_path / "serial" / name, tmp_path / "b" / name)
    assert main([*flags, "--workers", "0", "--out", str(tmp_path / "c")]) == 2
    assert "workers must be an int >= 1, got 0" in capsys.readouterr().err


def test_cli_refuses_a_missing_device_in_one_line(tmp_path, capsys):
    from headcoop.cli import main

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    code = main(["sweep", "count01", "--heads", "1", "--steps", "2", "--device", "cuda", "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "torch finds no CUDA device" in err
