"""Both experiment folders have the same shape and run as modules, with no sys.path edits."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TASKS = ("count01", "skip_pair", "cooperation", "robustness")


@pytest.mark.parametrize("task", TASKS)
def test_same_shape(task):
    folder = ROOT / "experiments" / task
    for name in ("__init__.py", "run_all.py", "common.py", "page.py", "page.md.j2", f"{task}.ipynb"):
        assert (folder / name).exists(), (task, name)
    assert list(folder.glob("exp_*.py")), task
    page_template = (folder / "page.md.j2").read_text()
    assert '{% extends "results.md.j2" %}' in page_template


def test_no_sys_path_edits():
    for path in (ROOT / "experiments").rglob("*"):
        if path.suffix in (".py", ".ipynb"):
            assert "sys.path" not in path.read_text(encoding="utf-8"), path


@pytest.mark.slow
@pytest.mark.parametrize("task", TASKS)
def test_runs_as_a_module_with_the_same_flags(task):
    done = subprocess.run(
        [sys.executable, "-m", f"experiments.{task}.run_all", "--help"], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    for flag in ("--quick", "--out", "--no-png"):
        assert flag in done.stdout, (task, flag)


@pytest.mark.parametrize("name", ["count01", "skip_pair", "robustness", "cooperation"])
def test_help_answers_before_torch_is_imported(name):
    """`python -m experiments.X.run_all --help` parses its arguments first: no torch, no headcoop imported."""
    code = ("import runpy, sys\nsys.argv = ['run_all', '--help']\ntry:\n"
            f"    runpy.run_module('experiments.{name}.run_all', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print('IMPORTED', 'torch' in sys.modules, 'headcoop' in sys.modules)")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert "usage:" in done.stdout and done.stdout.strip().endswith("IMPORTED False False"), done.stdout + done.stderr
