"""The Count01 experiments: the notebook executes cleanly, the hand-written minimal model solves the task,
and a smoke run of run_all.py (tiny sizes, into a temporary folder) writes every table and the doc."""

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import torch
from nbclient import NotebookClient

import headcoop as hc

pytestmark = pytest.mark.slow  # the slow tier: `pytest -m "not slow"` leaves it out while working

REPO = Path(__file__).resolve().parents[1]
FOLDER = REPO / "experiments" / "count01"
RESULTS = REPO / "docs" / "results" / "count01"


@pytest.mark.skipif(
    not (RESULTS / "shipped_heads.csv").exists(), reason="run python -m experiments.count01.run_all first"
)
def test_notebook_executes_without_errors():
    nb = nbformat.read(FOLDER / "count01.ipynb", as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(FOLDER)}})
    client.execute()  # raises CellExecutionError on any error
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    errors = [o for o in outputs if o.output_type == "error"]
    assert not errors
    assert sum(1 for cell in nb.cells if cell.cell_type == "code") >= 6


def test_hand_written_minimal_model_solves_the_task():
    from experiments.count01.exp_models import minimal_model

    model = minimal_model()
    assert (model.cfg.d_model, model.cfg.n_heads, model.cfg.d_head) == (1, 1, 1)
    result = hc.evaluate(model, n=2000, seed=7)
    assert result["answer_acc"] == 1.0 and result["eos_acc"] == 1.0
    # the extremes: all-0 / all-1 strings of the longest length, and a single 1 among 19 twos
    task = hc.Count01()
    syms = torch.tensor([[0] * 20, [1] * 20, [2] * 19 + [1], [0, 1] * 9 + [1, 2]])
    batch = task.batch_from_strings(syms, torch.full((4,), 20))
    assert task.correct(model(batch.tokens), batch).all()


def test_quick_run_writes_every_table_and_the_doc(tmp_path):
    out = tmp_path / "count01"
    done = subprocess.run(
        [sys.executable, "-m", "experiments.count01.run_all", "--quick", "--no-png", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=1200, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    for name in ("sweep_accuracy", "primary_summary", "ensemble_correlation", "shipped_heads", "intervention_summary",
                 "logit_means", "ablation_aggregation", "table1", "minimal_handwritten", "minimal_trained",
                 "two_layer_summary", "timing"):  # fmt: skip
        assert (out / f"{name}.csv").exists() and (out / f"{name}.md").exists(), name
    assert (out / "intervention_model.html").exists()
    doc = (tmp_path / "count01.md").read_text()
    assert "missing:" not in doc and "## 8. The minimal solution" in doc


def test_quick_needs_an_out_folder():
    done = subprocess.run(
        [sys.executable, "-m", "experiments.count01.run_all", "--quick"], capture_output=True, text=True, cwd=REPO
    )
    assert done.returncode != 0 and "--quick needs --out" in done.stderr


@pytest.mark.skipif(not (RESULTS / "timing.csv").exists(), reason="run python -m experiments.count01.run_all first")
def test_doc_is_rendered_from_the_tables(tmp_path):
    """Rendering the page from the committed tables reproduces the committed page: no number is typed by hand,
    and the template and section data are all it takes."""
    from experiments.count01 import page

    written = page.build(tmp_path, tables=RESULTS)
    assert written.read_text(encoding="utf-8") == (REPO / "docs" / "results" / "count01.md").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "options", [{}, {"positional": True}, {"readout": "heads"}, {"readout": "heads", "positional": True}]
)
def test_isolated_copy_starts_as_the_joint_models_head(options):
    """Table 1's one-head model computes, at initialisation, what head h contributes in the joint model plus the
    paths every forward pass has (embeddings, biases): so 'the same head' trained alone starts where it did."""
    from experiments.count01.exp_models import isolated_copy

    task = hc.Count01(**options)
    joint = task.model(seed=3, n_heads=4, d_model=8, d_head=2)
    batch = task.sample(64, seed=0)
    parts = hc.dla(joint, batch, pos=batch.answer_pos)
    for h in (0, 3):
        single = isolated_copy(task, joint, h, seed=3)
        want = parts.heads()[:, 0, h] + parts.total() - parts.heads()[:, 0].sum(1)  # the other heads removed
        got = single(batch.tokens)[torch.arange(len(batch)), batch.answer_pos]
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        if options.get("readout") == "heads":
            assert single.cfg.d_model == 8 + 2
