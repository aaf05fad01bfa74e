"""experiments/robustness: the smoke mode writes both grid tables and the page; the page is rendered from
the committed tables; cells of the committed tables are recomputed independently; the notebook runs."""

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[1]
FOLDER = REPO / "experiments" / "robustness"
RESULTS = REPO / "docs" / "results"
COMMITTED = pytest.mark.skipif(not (RESULTS / "robustness" / "count01_grid.csv").exists(),
                               reason="run python -m experiments.robustness.run_all first")  # fmt: skip


def test_quick_run_writes_both_grids_and_the_page(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "experiments.robustness.run_all", "--quick", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    for name in ("count01_grid", "skip_pair_grid"):
        assert (tmp_path / "robustness" / f"{name}.csv").exists(), name
    page = (tmp_path / "robustness.md").read_text(encoding="utf-8")
    assert "## Setup at a glance" in page and "holds in" in page and "heads-only readout" in page
    again = subprocess.run(
        [sys.executable, "-m", "experiments.robustness.check_cells", "--quick", "--out", str(tmp_path), "--sample", "2"],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "DIFFERS" not in again.stdout and again.stdout.count("recomputed") >= 4


@COMMITTED
def test_page_is_rendered_from_the_tables(tmp_path):
    import shutil

    from experiments.robustness import page

    shutil.copytree(RESULTS / "robustness", tmp_path / "robustness")
    written = page.build(tmp_path)
    assert written.read_text(encoding="utf-8") == (RESULTS / "robustness.md").read_text(encoding="utf-8")


@COMMITTED
def test_committed_cells_recompute_independently():
    """Two SkipPair rows of the committed grid (small models), recomputed from scratch."""
    from experiments.robustness import check_cells

    assert check_cells.main(["--only", "skip_pair", "--sample", "2"]) == 0


@COMMITTED
def test_notebook_executes():
    nb = nbformat.read(FOLDER / "robustness.ipynb", as_version=4)
    NotebookClient(nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(FOLDER)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
