"""docs/: the API guide runs as written (every python block, in order, one namespace, in an empty folder),
it shows every public name of the API, and the index links pages that exist."""

import re
import warnings
from pathlib import Path

import headcoop as hc

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
GUIDE = (DOCS / "guide.md").read_text(encoding="utf-8")
INDEX = (DOCS / "index.md").read_text(encoding="utf-8")


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_guide_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    blocks = _python_blocks(GUIDE)
    assert len(blocks) >= 20
    namespace: dict = {}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="HookedTransformer is deprecated", category=DeprecationWarning)
        for i, block in enumerate(blocks):
            exec(compile(block, f"docs/guide.md python block {i + 1}", "exec"), namespace)
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
