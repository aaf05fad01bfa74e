"""experiments/cooperation: the smoke mode writes every table and the page; the page is rendered from the
committed tables; the notebook runs in a real kernel."""

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.slow  # the slow tier: `pytest -m "not slow"` leaves it out while working

REPO = Path(__file__).resolve().parents[1]
FOLDER = REPO / "experiments" / "cooperation"
RESULTS = REPO / "docs" / "results"


def test_quick_run_writes_every_table_and_the_page(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "experiments.cooperation.run_all", "--quick", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=1200, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    for name in (
        "count01_mechanisms",
        "count01_pairs",
        "count01_heads",
        "skip_pair_mechanisms",
        "skip_pair_contexts",
        "two_layer_mechanisms",
        "two_layer_heads",
        "two_layer_paths",
        "two_layer_composition",
    ):
        assert (tmp_path / "cooperation" / f"{name}.csv").exists(), name
    page = (tmp_path / "cooperation.md").read_text(encoding="utf-8")
    assert "## 1. Count01" in page and "## 3. Compete" in page and "## 4. Two layers" in page
    assert "pseudo-ensemble" in page and "superposition" in page


def test_page_is_rendered_from_the_tables(tmp_path):
    import shutil

    from experiments.cooperation import page

    shutil.copytree(RESULTS, tmp_path, dirs_exist_ok=True)  # Table 1 (section 3) and the registry's grid tables
    written = page.build(tmp_path)
    assert written.read_text(encoding="utf-8") == (RESULTS / "cooperation.md").read_text(encoding="utf-8")


def test_notebook_executes():
    nb = nbformat.read(FOLDER / "cooperation.ipynb", as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(FOLDER)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors


def test_figures_are_drawn_and_agree_with_the_instrument(tmp_path):
    """The same-computation figure's correlations are hc.cooperation's (its r_min over active heads), and
    both figures are written as HTML (PNG where kaleido can export)."""
    import headcoop as hc
    from experiments.cooperation import figures

    drawn = figures.count01_same(tmp_path, n=256)
    model, task = hc.load("count01"), hc.Count01()
    same = hc.cooperation(model, inputs=task.sample(256, seed=3), how="zero", max_exact=2).same
    assert drawn["active"] == int(same.active.sum())
    assert abs(drawn["r_min"] - float(same.r_min_active.min())) < 1e-6
    counted = figures.skip_pair_words(tmp_path, draws=1)  # readings drawn per checkpoint
    assert counted["skip-pair"] == len(hc.cooperation(hc.load("skip-pair"), draws=1).words.columns) > 0
    assert sum(figures.count01_pairs(tmp_path, n=256).values()) == 16 * 15 // 2  # every pair drawn once
    assert all((tmp_path / f"{name}.html").exists() for name in ("count01_same", "count01_pairs", "skip_pair_words"))
