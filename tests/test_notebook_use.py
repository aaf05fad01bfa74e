"""headcoop in a real Jupyter kernel: importing it and training with a progress bar print no warnings, and
a Batch's repr is short."""

import pytest
import nbformat
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
    (shown,) = [out for out in nb.cells[2].outputs if out.output_type == "execute_result"]
    assert "<table" in shown["data"]["text/html"] and "plotly" in shown["data"]["text/html"]
    assert shown["data"]["text/plain"].startswith("PatchResult(denoise 'z'")
    for cell, start in ((nb.cells[3], "HeadMetrics(2 heads"), (nb.cells[4], "ExactEvaluation(signal accuracy")):
        (shown,) = [out for out in cell.outputs if out.output_type == "execute_result"]
        assert "<table" in shown["data"]["text/html"] and "plotly" in shown["data"]["text/html"]
        assert shown["data"]["text/plain"].startswith(start), shown["data"]["text/plain"]
