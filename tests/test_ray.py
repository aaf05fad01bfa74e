"""Sweeps on Ray (a real local Ray instance with worker processes): bit-identical to the serial sweep, and
a worker process killed mid-chunk is survived without retraining what it saved."""

import json
import os

import cloudpickle
import pytest
import torch

import headcoop as hc
from headcoop.training.executors import RayExecutor

pytest.importorskip("ray", reason="the [ray] extra is not installed")
import sweep_killer  # noqa: E402
from ray import cloudpickle as ray_cloudpickle  # noqa: E402  (Ray pickles with its own copy of cloudpickle)

pytestmark = pytest.mark.slow  # the slow tier: `pytest -m "not slow"` leaves it out while working

cloudpickle.register_pickle_by_value(sweep_killer)
ray_cloudpickle.register_pickle_by_value(sweep_killer)

TASK = hc.Count01(max_len=6)
GRID = {"n_heads": [1, 2], "d_model": [4], "d_head": [1]}
TRAIN = dict(steps=20, batch_size=16, warmup=1, progress=False)


def same_weights(a, b) -> bool:
    wa, wb = hc.load(a).state_dict(), hc.load(b).state_dict()
    return all(torch.equal(wa[k], wb[k]) for k in wa)


def test_ray_sweep_equals_serial_and_survives_a_killed_worker(tmp_path):
    serial = hc.sweep(TASK, GRID, [0, 1], tmp_path / "serial", **TRAIN)
    with RayExecutor(num_cpus=2) as ray_pool:
        table = hc.sweep(TASK, GRID, [0, 1], tmp_path / "ray", executor=ray_pool, threads=1, **TRAIN)
        marker = tmp_path / "killed.json"
        killed_table = hc.sweep(TASK, GRID, [0, 1], tmp_path / "killed", chunk=2, threads=1,
                                executor=sweep_killer.Killing(ray_pool, marker), **TRAIN)  # fmt: skip
    assert list(table["status"]) == ["trained"] * 4 == list(killed_table["status"])
    for name in serial["name"]:
        assert same_weights(tmp_path / "serial" / name, tmp_path / "ray" / name)
        assert same_weights(tmp_path / "serial" / name, tmp_path / "killed" / name)
    killed = json.loads(marker.read_text())
    assert killed["pid"] != os.getpid()
    stat = os.stat(tmp_path / "killed" / killed["name"] / hc.storage.checkpoints.WEIGHTS)
    assert (stat.st_ino, stat.st_mtime_ns) == (killed["inode"], killed["mtime_ns"])  # saved once, not retrained


def test_without_ray_the_message_says_what_to_install(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ImportError, match=r'pip install "headcoop\[ray\]"'):
        RayExecutor()
