"""The suite's tiers by what they cost (issues 64, 77): in the fast tier, a test outside the slow tier that runs past
the budget is listed with its time at the end and passes (no test fails on time); a slow-marked one is not in that
tier; the full run lists nothing."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

BODY = """
import time

import pytest


def spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_long_in_the_fast_tier():
    spin(0.5)


@pytest.mark.slow
def test_long_in_the_slow_tier():
    spin(0.5)


def test_short_in_the_fast_tier():
    pass
"""


def test_a_fast_tier_test_over_the_budget_is_listed_not_failed(tmp_path):
    target = ROOT / "tests" / f"test_tier_probe_{os.getpid()}.py"  # inside tests/, so that conftest.py applies
    target.write_text(BODY)
    env = dict(os.environ, HEADCOOP_FAST_LIMIT_S="0.25")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", "-o", "addopts="]
    try:
        fast = subprocess.run(command + ["-m", "not slow", str(target)], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=300)  # fmt: skip
        full = subprocess.run(command + [str(target)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    finally:
        target.unlink()
    out = fast.stdout + fast.stderr
    assert fast.returncode == 0 and "2 passed, 1 deselected" in out, out
    assert "tests over the budget (not failures)" in out, out
    assert "test_long_in_the_fast_tier took" in out and "over the fast tier's 0.25 s" in out, out
    assert "test_short_in_the_fast_tier took" not in out, out
    assert full.returncode == 0 and "3 passed" in full.stdout, full.stdout + full.stderr
    assert "over the budget" not in full.stdout, full.stdout
