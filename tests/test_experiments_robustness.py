"""experiments/robustness: the smoke mode writes both grid tables and the page; the page is rendered from
the committed tables; cells of the committed tables are recomputed independently; the notebook runs."""

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.slow  # the slow tier: `pytest -m "not slow"` leaves it out while working

REPO = Path(__file__).resolve().parents[1]
FOLDER = REPO / "experiments" / "robustness"
RESULTS = REPO / "docs" / "results"
COMMITTED = pytest.mark.skipif(not (RESULTS / "robustness" / "count01_grid.csv").exists(),
                               reason="run python -m experiments.robustness.run_all first")  # fmt: skip


def test_quick_run_writes_both_grids_and_the_page(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "experiments.robustness.run_all", "--quick", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=1200, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    for name in ("count01_grid", "count01_band", "count01_ensemble", "count01_table1", "skip_pair_grid"):
        assert (tmp_path / "robustness" / f"{name}.csv").exists(), name
    page = (tmp_path / "robustness.md").read_text(encoding="utf-8")
    assert "## Setup at a glance" in page and "holds in" in page and "heads-only readout" in page
    again = subprocess.run(
        [sys.executable, "-m", "experiments.robustness.check_cells", "--quick", "--out", str(tmp_path), "--sample", "6"],
        capture_output=True, text=True, timeout=1200, cwd=REPO,
    )  # fmt: skip
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "DIFFERS" not in again.stdout and again.stdout.count("recomputed") >= 4
    assert "only_correct table" in again.stdout and "band_mean_s_acc_at_1 table" in again.stdout
    # a partial rerun rewrites only its own tables and records itself beside the full run's timing
    before = {p.name: p.read_bytes() for p in (tmp_path / "robustness").glob("count01_*.csv")}
    only = subprocess.run(
        [sys.executable, "-m", "experiments.robustness.run_all", "--quick", "--out", str(tmp_path), "--only", "skip_pair_grid"],
        capture_output=True, text=True, timeout=1200, cwd=REPO,
    )  # fmt: skip
    assert only.returncode == 0, only.stderr[-3000:]
    assert before == {p.name: p.read_bytes() for p in (tmp_path / "robustness").glob("count01_*.csv")}
    import json

    timing = json.loads((tmp_path / "robustness" / "timing.json").read_text())
    assert timing["jobs"] > 6 and timing["reruns"][-1]["only"] == ["skip_pair_grid"]
    assert "pairs_covered" in (tmp_path / "robustness" / "skip_pair_grid.csv").read_text().splitlines()[0]


@COMMITTED
def test_page_is_rendered_from_the_tables(tmp_path):
    import shutil

    from experiments.robustness import page

    shutil.copytree(RESULTS, tmp_path, dirs_exist_ok=True)  # the grid, and the page tables some readings read
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
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(FOLDER)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors


def test_registry_readings_judge_what_their_words_say():
    """The registry's readings on grid tables built by hand (experiments/claims.py), judged cell by cell as
    robustness.md judges them: they hold and fail where they should."""
    import numpy as np
    import pandas as pd

    from experiments.claims import REGISTRY
    from experiments.robustness.page import judge_cells, verdict

    entry = {e.key: e for e in REGISTRY}
    w01s = np.logspace(-3, 3, 13)
    high = pd.DataFrame([dict(variant="default", steps=300, seed=0, head=h, w01=w, others=others,
                              s_acc=1.0 if 0.1 - 1e-9 <= w <= 10 + 1e-9 or others == "0.0" else 0.6)
                         for w in w01s for h in range(2) for others in ("model", "0.0")])  # fmt: skip
    narrow = high.assign(s_acc=np.where((high.w01 > 5) & (high.others == "model"), 0.9, high.s_acc))
    band = pd.concat([high, narrow.assign(variant="narrow")])
    kept, zeroed = entry["band"].readings
    cells = judge_cells({"band": band}, entry["band"], kept, ["default", "narrow"])
    assert cells[("default", 300)][0] == "holds" and cells[("narrow", 300)][0] == "fails"
    assert verdict(cells, [300]) == "holds under default; fails under narrow"
    assert judge_cells({"band": band}, entry["band"], zeroed, ["narrow"])[("narrow", 300)][0] == "holds"

    rng = np.random.default_rng(0)
    x = rng.normal(size=400)
    y = 0.72 * x + np.sqrt(1 - 0.72**2) * rng.normal(size=400)  # r close to 0.72
    ens = pd.concat([pd.DataFrame(dict(variant="default", steps=300, kind="primary", weighted_s_acc=x, answer_acc=y,
                                       answer_45_acc=x)),
                     pd.DataFrame(dict(variant="none", steps=300, kind="primary", weighted_s_acc=x,
                                       answer_acc=rng.normal(size=400), answer_45_acc=x))])  # fmt: skip
    by_name = {r.name: r for r in entry["r"].readings}
    strong, own = by_name["strong, y = answer accuracy"], by_name["strong, y = the model's own separation"]
    value = by_name["the value 0.72, y = answer accuracy"]
    cells = judge_cells({"ensemble": ens}, entry["r"], value, ["default", "none"])
    assert cells[("default", "every training length")][0] == "holds"
    assert cells[("none", "every training length")][0] == "fails"
    assert (
        judge_cells({"ensemble": ens}, entry["r"], strong, ["default"])[("default", "every training length")][0]
        == "holds"
    )
    # r = 1 is not 0.72, but it is a strong correlation
    assert (
        judge_cells({"ensemble": ens}, entry["r"], own, ["default"])[("default", "every training length")][0] == "holds"
    )

    t1 = pd.DataFrame(dict(variant="default", steps=1000, seed=0, head=range(4), joint_s_acc=0.9, isolated_s_acc=0.95,
                           joint_l_acc_head=0.8, isolated_l_acc_head=[0.7, 0.9, 0.9, 0.9], joint_l_acc=0.8,
                           isolated_l_acc=0.8))  # fmt: skip
    by = {r.name: r for r in entry["joint"].readings}
    assert judge_cells({"table1": t1}, entry["joint"], by["by s_acc"], ["default"])[("default", 1000)][0] == "holds"
    assert judge_cells({"table1": t1}, entry["joint"], by["by l_acc"], ["default"])[("default", 1000)][0] == "fails"

    grid = pd.DataFrame({"variant": "default", "steps": 3000, "shape": "2 heads, d_head 5", "seed": range(3),
                         "signal_acc": 1.0, "qualifying": [4, 3, 0], "only_correct": [4, 2, 0],
                         "specific_rows": [8, 8, 2], "specific_total": 8, "correct_up_both": [9, 3, 7]})  # fmt: skip
    universal, typical = entry["only_correct"].readings[:2]
    assert judge_cells({"grid": grid}, entry["only_correct"], universal, ["default"])[("default", 3000)] == (
        "fails",
        "6/7 pair types",
    )
    assert judge_cells({"grid": grid}, entry["only_correct"], typical, ["default"])[("default", 3000)][0] == "holds"
    assert (
        judge_cells({"grid": grid}, entry["conditional"], entry["conditional"].readings[0], ["default"])[
            ("default", 3000)
        ][0]
        == "holds"
    )
    captions = {r.name: r for r in entry["caption"].readings}
    on_grid = captions["every pair type"]
    caption = judge_cells({"grid": grid}, entry["caption"], on_grid, ["default"])[("default", 3000)]
    assert caption == ("fails", "19/30 (model, pair type)")  # universal: 11 counterexamples
    unsolved = grid.assign(signal_acc=0.5)
    assert (
        judge_cells({"grid": unsolved}, entry["caption"], on_grid, ["default"])[("default", 3000)][0]
        == "not testable here"
    )
    # the favoured reading: every seed skip_pair.md trained (its runs table), one counterexample fails it
    from experiments.robustness.page import PAGE

    every_seed = captions["every pair type, every seed"]
    assert every_seed.favoured and every_seed.table == "skip_pair/runs"
    runs = pd.DataFrame(dict(n_heads=2, d_head=[5, 5, 5, 1], signal_acc=[1.0, 1.0, 0.5, 1.0],
                             correct_up_both=[10, 9, 0, 0]))  # fmt: skip
    assert judge_cells({every_seed.table: runs}, entry["caption"], every_seed, ["default"]) == {
        ("default", PAGE): ("fails", "19/20 (model, pair type)")
    }  # the unsolved and the d_head 1 runs left out
    assert judge_cells({every_seed.table: runs.assign(correct_up_both=[10, 10, 0, 0])}, entry["caption"], every_seed,
                       ["default"])[("default", PAGE)][0] == "holds"  # fmt: skip


def test_a_grid_job_on_a_dask_worker_gives_the_tables_of_an_in_process_run(tmp_path):
    """run_all --scheduler sends jobs to Dask workers: one job there equals the same job run here."""
    import functools

    pytest.importorskip("dask.distributed")
    import headcoop as hc
    from experiments.robustness import exp_grid, run_all
    from experiments.robustness.common import Settings
    from headcoop.training.executors import as_executor, each_result

    s = Settings.quick_settings(tmp_path)
    job = ("skip_pair_grid", "context 20")
    with hc.dask_client(workers=1) as client:
        ((_, result, error),) = list(each_result(as_executor(client), functools.partial(run_all._run, s=s), [job]))
    assert error is None
    remote, here = result[0]["skip_pair_grid"], exp_grid.run_job(job, s)["skip_pair_grid"]
    assert len(remote) == 6 and remote.equals(here)  # 3 shapes x 2 lengths x 1 seed
