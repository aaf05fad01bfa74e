"""The suite's tiers by what they cost (issue 64): a test outside the slow tier that runs past the fast tier's
limit fails with its time named; a slow-marked one of the same length passes."""

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


def test_a_fast_tier_test_over_the_limit_fails_and_a_slow_one_does_not(tmp_path):
    target = ROOT / "tests" / f"test_tier_probe_{os.getpid()}.py"  # inside tests/, so that conftest.py applies
    target.write_text(BODY)
    try:
        env = dict(os.environ, HEADCOOP_FAST_LIMIT_S="0.25")
        run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
                              "-o", "addopts=", str(target)], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=300)  # fmt: skip
    finally:
        target.unlink()
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert "1 failed, 2 passed" in out, out
    assert "test_long_in_the_fast_tier took" in out and "over the fast tier's 0.25 s" in out, out
