"""docs/: the API guide runs as written (every python block, in order, one namespace, in an empty folder),
it shows every public name of the API, and the index links pages that exist."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

import headcoop as hc

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
GUIDE = (DOCS / "guide.md").read_text(encoding="utf-8")
INDEX = (DOCS / "index.md").read_text(encoding="utf-8")


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


RUNNER = """
import re, sys, warnings
import torch
torch.set_num_threads(1)  # as tests/conftest.py: tiny models, shared cores
warnings.filterwarnings("ignore", message="HookedTransformer is deprecated", category=DeprecationWarning)
text = open(sys.argv[1], encoding="utf-8").read()
namespace = {}
for i, block in enumerate(re.findall(r"```python\\n(.*?)```", text, flags=re.S)):
    exec(compile(block, f"docs/guide.md python block {i + 1}", "exec"), namespace)
print("ran", i + 1, "blocks")
"""


@pytest.mark.slow
def test_guide_runs_as_written(tmp_path):
    """In a fresh interpreter, as a reader would run it (other tests' imports cannot leak in)."""
    blocks = _python_blocks(GUIDE)
    assert len(blocks) >= 20
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, str(DOCS / "guide.md")], cwd=tmp_path, capture_output=True, text=True,
        timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert f"ran {len(blocks)} blocks" in done.stdout
    assert (tmp_path / "runs" / "tiny" / "weights.safetensors").exists()
    assert (tmp_path / "attention.html").exists() and (tmp_path / "tiny-report.html").exists()


def test_guide_shows_every_public_name():
    code = "\n".join(_python_blocks(GUIDE))
    missing = [name for name in hc.__all__ if not re.search(rf"\bhc\.{name}\b", code)]
    assert not missing, f"docs/guide.md has no example of {missing}"


def test_index_links():
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", INDEX)
    assert "guide.md" in links
    assert "results/count01.md" in links and "results/skip_pair.md" in links
    local = [link for link in links if "://" not in link]
    assert (DOCS / "guide.md").exists()
    for link in local:
        # the results pages are written by the experiments; every other link must resolve now
        assert link.startswith("results/") or (DOCS / link).exists(), link


def test_architecture_extensions_run_as_written(tmp_path):
    """docs/architecture.md's two worked extensions use the public API alone and run as written."""
    text = (DOCS / "architecture.md").read_text(encoding="utf-8")
    blocks = _python_blocks(text)
    assert len(blocks) == 2 and all("headcoop.analysis" not in block for block in blocks)
    done = subprocess.run([sys.executable, "-c", RUNNER.replace("docs/guide.md", "docs/architecture.md"),
                           str(DOCS / "architecture.md")], cwd=tmp_path, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert "EdgeAblationResult" in done.stdout and "ran 2 blocks" in done.stdout
