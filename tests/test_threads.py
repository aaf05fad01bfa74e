"""Thread settings for a shared machine (headcoop.threads): the user's setting wins, a bad HEADCOOP_THREADS is
named, the CLI configures OpenMP before torch starts, and long analyses restore the count they change."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from headcoop import threads

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", threads.ENV_THREADS):
        monkeypatch.delenv(name, raising=False)
    chosen = list(threads._chosen)
    yield monkeypatch
    threads._chosen[:] = chosen


def test_idle_cores_is_within_the_cores():
    assert 0.0 <= threads.idle_cores() <= threads.cores() + 1e-9
    assert 1 <= threads.choose_threads() <= threads.cores()


def test_headcoop_threads_wins_and_a_bad_value_is_named(clean_env):
    clean_env.setenv(threads.ENV_THREADS, "3")
    assert threads.choose_threads() == 3
    for bad in ("0", "two", "-1"):
        clean_env.setenv(threads.ENV_THREADS, bad)
        with pytest.raises(ValueError, match=f"HEADCOOP_THREADS must be a positive integer, got '{bad}'"):
            threads.choose_threads()


def test_configure_sets_threads_and_a_wait_unless_the_user_did(clean_env):
    set_here = threads.configure_process()
    assert int(os.environ["OMP_NUM_THREADS"]) == int(set_here["OMP_NUM_THREADS"]) >= 1
    busy = int(set_here["OMP_NUM_THREADS"]) < threads.cores()
    assert set_here.get("OMP_WAIT_POLICY" if busy else "GOMP_SPINCOUNT") == (
        "PASSIVE" if busy else threads.QUIET_SPINCOUNT
    )
    for name in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        clean_env.delenv(name, raising=False)
    clean_env.setenv("OMP_NUM_THREADS", "1")
    clean_env.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert threads.configure_process() == {}  # the user's settings stay
    assert os.environ["OMP_NUM_THREADS"] == "1" and os.environ["OMP_WAIT_POLICY"] == "ACTIVE"


def test_a_users_torch_thread_count_is_left_alone_and_ours_is_restored(clean_env):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(max(1, threads.cores() - 1) if threads.cores() > 1 else 1)
        users = torch.get_num_threads()
        if users != threads.cores():
            with threads.fitted_threads() as used:
                assert used == users == torch.get_num_threads()
        torch.set_num_threads(threads.cores())
        with threads.fitted_threads() as used:
            assert torch.get_num_threads() == used >= 1
        assert torch.get_num_threads() == threads.cores()
    finally:
        torch.set_num_threads(before)


def test_the_cli_configures_before_torch_and_names_a_bad_setting():
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    code = ("import os, sys\nfrom headcoop.cli import main\nrc = main(['eval', 'count01'])\nimport torch\n"
            "print('SET', os.environ.get('OMP_NUM_THREADS'), torch.get_num_threads(), rc)")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**env, threads.ENV_THREADS: "1"})  # fmt: skip
    assert done.stdout.strip().splitlines()[-1] == "SET 1 1 0", done.stdout + done.stderr
    bad = subprocess.run([sys.executable, "-m", "headcoop.cli", "eval", "count01"], capture_output=True, text=True,
                         cwd=ROOT, timeout=300, env={**env, threads.ENV_THREADS: "none"})  # fmt: skip
    assert bad.returncode == 2 and "HEADCOOP_THREADS must be a positive integer, got 'none'" in bad.stderr
