"""headcoop in a real Jupyter kernel: importing it and training with a progress bar print no warnings, and
a Batch's repr is short."""

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.slow  # the slow tier: `pytest -m "not slow"` leaves it out while working


def test_import_and_train_in_a_kernel_print_no_warning(tmp_path):
    cells = [
        "import headcoop as hc\ntask = hc.Count01(max_len=6)\n"
        "model = hc.train(task, task.model(seed=0, n_heads=2, d_model=4), steps=3, batch_size=8, warmup=1)",
        "task.sample(512)",
        "hc.patch(model)",
        "hc.head_metrics(model, n=64)",
        "from headcoop.studies import skip_pair\n"
        "skip_pair.exact_evaluate(hc.SkipPair(seq_len=4).model(seed=0, n_heads=2, d_head=2))",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    streams = [out.get("text", "") for cell in nb.cells for out in cell.outputs if out.output_type == "stream"]
    assert not any("IProgress" in text or "Warning" in text for text in streams), streams
    (result,) = [out for out in nb.cells[1].outputs if out.output_type == "execute_result"]
    text = result["data"]["text/plain"]
    assert text.startswith("Batch(512 examples: tokens [512, 10]") and len(text) < 400
    for cell, start in ((nb.cells[2], "PatchResult(denoise 'z'"), (nb.cells[3], "HeadMetrics(2 heads"),
                        (nb.cells[4], "ExactEvaluation(signal accuracy")):  # fmt: skip
        table, figure = [out for out in cell.outputs if out.output_type == "display_data"]
        assert "<table" in table["data"]["text/html"] and table["data"]["text/plain"].startswith(start)
        assert _is_plotly(figure), figure["data"].keys()


def _is_plotly(output) -> bool:
    """A figure drawn by plotly's own renderer: its mimetype (JupyterLab, VS Code) or its notebook HTML."""
    data = output["data"]
    return "application/vnd.plotly.v1+json" in data or "plotly" in data.get("text/html", "")


def test_results_display_through_plotlys_renderer_and_keep_the_notebook_small(tmp_path):
    """Each displayed result is its table and a figure through plotly's renderer; plotly.js is never inlined
    by headcoop (it was 4.8 MB in the first display of every process) nor fetched from a CDN."""
    cells = ["import headcoop as hc\nmodel = hc.load('count01')", "hc.qk(model, head=0)", "hc.ov(model, head=1)",
             "hc.patch(model)", "hc.interactions(model, heads=[0, 1, 2])"]  # fmt: skip
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    for cell in nb.cells[1:]:
        table, figure = [out for out in cell.outputs if out.output_type == "display_data"]
        assert "<table" in table["data"]["text/html"] and _is_plotly(figure)
    saved = tmp_path / "four-results.ipynb"
    nbformat.write(nb, saved)
    text = saved.read_text()
    assert "cdn.plot.ly" not in text and text.count("plotly.js v") <= 1
    assert saved.stat().st_size < 500_000, saved.stat().st_size  # 57 KB measured; 6.5 MB for 10 cells before
