"""headcoop in a real Jupyter kernel: importing it and training with a progress bar print no warnings, and
a Batch's repr is short."""

import json
import re

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
        table, figure = _shown(cell)
        assert "<table" in table["data"]["text/html"] and table["data"]["text/plain"].startswith(start)
        assert _is_plotly(figure), figure["data"].keys()


def _shown(cell) -> list:
    """A cell's displayed outputs, less the one that loads plotly.js into the page (plotly's notebook renderer
    sends it with the first figure of a kernel, offline)."""
    return [out for out in cell.outputs if out.output_type == "display_data"
            and not (set(out["data"]) == {"text/html"} and re.search(r"plotly\.js v\d", out["data"]["text/html"]))]  # fmt: skip


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
        table, figure = _shown(cell)
        assert "<table" in table["data"]["text/html"] and _is_plotly(figure)
    saved = tmp_path / "four-results.ipynb"
    nbformat.write(nb, saved)
    text = saved.read_text()
    assert not re.search(r"src=\\?[\"']https?://cdn\.plot\.ly", text)  # nothing fetched from a CDN
    assert len(re.findall(r"plotly\.js v\d", text)) == 1  # plotly.js inlined once, offline
    from plotly.offline import get_plotlyjs

    library = len(json.dumps(get_plotlyjs()))  # as the notebook's JSON holds it
    assert saved.stat().st_size < 500_000 + library, saved.stat().st_size  # 57 KB measured besides the library


def test_an_exported_notebook_shows_every_figure_and_view_with_each_library_once(tmp_path):
    """Issue 77: a notebook executed in a kernel and exported by `jupyter nbconvert --to html` (nbconvert's
    HTMLExporter), opened in headless Chromium without network, draws every plotly figure (results' and bare
    ones) and every circuitsvis view; plotly.js and the circuitsvis bundle are each inlined once."""
    import shutil
    import subprocess

    from nbconvert import HTMLExporter

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("headless Chromium is not installed (Debian: apt-get install chromium; .ci/run does this)")
    cells = ["import headcoop as hc\nmodel = hc.load('count01')", "hc.qk(model, head=0)", "hc.patch(model)",
             "hc.dla(model).plot()", "hc.attention(model, model.task.sample(1, seed=0))",
             "hc.attention(model, model.task.sample(1, seed=1))"]  # fmt: skip
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    saved = tmp_path / "tour.ipynb"
    nbformat.write(nb, saved)
    text = saved.read_text()
    assert text.count("var CircuitsVis=") == 1  # the bundle once, with the first view
    assert len(re.findall(r"plotly\.js v\d", text)) == 1  # plotly.js once, with the first figure
    page = tmp_path / "tour.html"
    page.write_text(HTMLExporter().from_notebook_node(nb)[0], encoding="utf-8")
    command = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
               "--disable-background-networking", "--host-resolver-rules=MAP * ~NOTFOUND",
               f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=15000", "--dump-dom",
               page.resolve().as_uri()]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    # three figures: qk's, patch's and the bare DLA figure, each drawn (an svg with a trace)
    assert dom.count('class="main-svg"') >= 2 * 3 and len(re.findall(r'class="(hm|trace bars)', dom)) >= 3
    views = re.findall(r'id="(circuits-vis-\w+)"', dom)
    assert len(views) == 2
    for view in views:  # circuitsvis rendered into the div
        after = dom.split(f'id="{view}"', 1)[1][:20000]
        assert "Head Selector" in after, view
