"""The README's promises: CI runs its test command, and its API tour runs as written."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _blocks(lang):
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def test_quick_start_is_two_commands_and_ci_runs_the_test_command():
    commands = [b.strip() for b in _blocks("bash")]
    assert len(commands) == 2
    assert all(c.startswith("pip install torch==2.13.0 && ") for c in commands)
    assert "pytest" in commands[1]
    ci = (ROOT / ".ci" / "run").read_text()
    assert commands[1] in ci.splitlines()
    # the contributor's checks (one sh block, a command a line), each run by CI before the tests
    checks = [line.split("#")[0].strip() for block in _blocks("sh") for line in block.splitlines() if line.strip()]
    assert checks == ["ruff check . && ruff format --check .", "mypy"]
    before = ci.splitlines()[: ci.splitlines().index(commands[1])]
    assert all(any(line.endswith(check) for line in before) for check in checks)


@pytest.mark.slow
def test_api_tour_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tour,) = _blocks("python")
    namespace: dict = {}
    exec(compile(tour, "README.md tour", "exec"), namespace)
    assert (tmp_path / "runs" / "tiny" / "weights.safetensors").exists()
    assert len(namespace["models"]) == 4
