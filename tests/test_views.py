"""headcoop.display.plot: shared plotly helpers and the offline circuitsvis attention view."""

import html
import json
import re
import urllib.request

import numpy as np
import plotly.graph_objects as go
import pytest
import torch
from circuitsvis.utils.render import RenderedHTML

import headcoop as hc
from headcoop.display.plot import bar, heatmap
from headcoop.display.views import AttentionView

PROPS = re.compile(r"CircuitsVis\.render\(\"[^\"]+\", CircuitsVis\.AttentionHeads, (\{.*?\})\);\n")


def props_of(view) -> list[dict]:
    return [json.loads(m.replace("<\\/", "</")) for m in PROPS.findall(str(view))]


@pytest.fixture(scope="module")
def model():
    return hc.Count01().model(seed=0, n_heads=4, d_model=8, d_head=2)


def test_heatmap():
    fig = heatmap(torch.arange(6.0).reshape(2, 3), ["a", "b", "a"], ["r0", "r1"], "t", xlabel="x", ylabel="y")
    assert isinstance(fig, go.Figure)
    trace = fig.data[0]
    assert np.asarray(trace.z).shape == (2, 3) and trace.zmid == 0.0
    assert list(trace.x) == ["a", "b", "a (1)"]  # duplicate labels stay separate columns
    assert list(trace.y) == ["r0", "r1"]
    assert fig.layout.title.text == "t" and fig.layout.xaxis.title.text == "x"
    assert heatmap([[1, 2]], zmid=None, colorscale="Viridis").data[0].zmid is None
    with pytest.raises(ValueError, match="2-D"):
        heatmap([1, 2, 3])
    with pytest.raises(ValueError, match="do not match"):
        heatmap([[1, 2]], x=["a"])


def test_bar():
    fig = bar(torch.tensor([1.0, -2.0]), ["a", "b"], title="t", error=[0.1, 0.2])
    assert list(fig.data[0].y) == [1.0, -2.0] and list(fig.data[0].error_y.array) == [0.1, 0.2]
    with pytest.raises(ValueError, match="matching 3 labels"):
        bar([1.0, 2.0], ["a", "b", "c"])


def test_attention_view_is_offline(model, monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("the view must not touch the network")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    view = hc.attention(model)
    assert isinstance(view, RenderedHTML) and isinstance(view, AttentionView)
    html = str(view)
    assert view._repr_html_() == html == view.__html__()
    assert "var CircuitsVis=" in html and len(html) > 1_000_000  # the bundle, inlined
    assert not re.search(r"<script[^>]*\bsrc\s*=", html)  # no external script
    assert "unpkg.com" not in html and not re.search(r"""from\s+["']https?:""", html)  # no CDN import


def test_attention_view_content(model):
    batch = hc.Count01().sample(5, seed=2)
    view = hc.attention(model, batch, example=1, max_examples=3)
    html = str(view)
    assert html.count("var CircuitsVis=") == 1  # one bundle for every example
    props = props_of(view)
    assert len(props) == 3
    _, cache = model.run_with_cache(batch.tokens)
    for i, p in zip(range(1, 4), props):
        end = int(batch.loss_pos[i].max()) + 1  # trimmed after the last loss position
        assert p["tokens"] == hc.Count01().token_strings(batch.tokens[i, :end])
        assert p["tokens"][-2] == "="
        assert p["attentionHeadNames"] == ["L0H0", "L0H1", "L0H2", "L0H3"]
        assert p["maskUpperTri"] is True
        torch.testing.assert_close(torch.tensor(p["attention"]), cache["blocks.0.attn.hook_pattern"][i, :, :end, :end])


def test_attention_untrimmed_and_without_task(model, tmp_path):
    batch = hc.Count01().sample(2, seed=3)
    assert len(props_of(hc.attention(model, batch, trim=False))[0]["tokens"]) == 24
    bare = hc.Count01().model(seed=0, n_heads=2, d_model=8, d_head=2, n_layers=2)
    del bare.task
    view = hc.attention(bare, torch.tensor([[7, 0, 1, 3]]), layer=1)
    (p,) = props_of(view)
    assert p["tokens"] == ["7", "0", "1", "3"] and p["attentionHeadNames"] == ["L1H0", "L1H1"]
    path = view.save(tmp_path / "view.html")
    assert path.read_text().startswith("<!DOCTYPE html>")
    with pytest.raises(ValueError, match="no headcoop task"):
        hc.attention(bare)


def test_labels_cannot_close_the_script():
    from headcoop.display.views import attention_view

    html = str(attention_view([("<b>head</b>", dict(attention=[[[1.0]]], tokens=["</script><i>"]))]))
    assert html.count("</script>") == 1 and "&lt;b&gt;head" in html
    (p,) = props_of(html)
    assert p["tokens"] == ["</script><i>"]


def test_attention_bad_input(model):
    with pytest.raises(IndexError, match=r"layers 0\.\.0"):
        hc.attention(model, "01=", layer=1)
    with pytest.raises(IndexError, match=r"examples 0\.\.1"):
        hc.attention(model, hc.Count01().sample(2), example=2)
    with pytest.raises(ValueError, match="max_examples must be a positive int"):
        hc.attention(model, "01=", max_examples=0)
    with pytest.raises(ValueError, match="unknown symbol"):
        hc.attention(model, "01x=")


def test_save_figure_writes_html_with_a_fixed_id(tmp_path):
    from headcoop.display.plot import bar, save_figure

    fig = bar([1.0, -2.0], ["a", "b"], title="t")
    assert save_figure(fig, tmp_path / "figs", "my_fig", png=False) == ["my_fig.html"]
    page = (tmp_path / "figs" / "my_fig.html").read_text()
    assert 'id="my_fig"' in page and not (tmp_path / "figs" / "my_fig.png").exists()


def test_plot_is_a_rendering_leaf():
    """plot.py, views.py and pages.py import no model, task or analysis code: data flows one way into them."""
    import ast
    from pathlib import Path

    import headcoop

    for leaf, allowed in (
        ("plot.py", {"numpy", "plotly"}),
        ("views.py", {"circuitsvis"}),
        ("pages.py", {"jinja2", "markupsafe", "numpy", "pandas"}),
    ):
        tree = ast.parse((Path(headcoop.__file__).parent / "display" / leaf).read_text())
        imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                    for alias in node.names}  # fmt: skip
        imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                     if isinstance(node, ast.ImportFrom) and node.module}  # fmt: skip
        third_party = imported - {"__future__", "os", "collections", "pathlib", "html", "json", "uuid", "tempfile",
                                  "webbrowser", "IPython", "dataclasses", "math", "re", "typing", "textwrap"}  # fmt: skip
        assert third_party <= allowed, (leaf, third_party)


def test_reference_lines_are_visible():
    """The headcoop template gives add_vline/add_hline shapes a width (simple_white leaves it at 0)."""
    import plotly.graph_objects as go

    from headcoop.display.plot import TEMPLATE

    fig = go.Figure(go.Scatter(x=[0.1, 10], y=[1, 20]))
    fig.update_layout(template=TEMPLATE)
    fig.add_vline(x=1, line_dash="dot")
    assert fig.layout.template.layout.shapedefaults.line.width == 1.5
    assert fig.layout.shapes[0].line.width is None  # so the line inherits the template's width


def test_attention_view_show_writes_a_page_when_no_notebook(monkeypatch, tmp_path):
    import webbrowser

    from headcoop.display.views import attention_view

    opened = []
    monkeypatch.setattr(webbrowser, "open", opened.append)
    attention_view([("h", dict(attention=[[[1.0]]], tokens=["a"]))]).show()
    assert len(opened) == 1 and opened[0].startswith("file://")


def test_every_result_is_frozen_and_shows_itself_in_a_notebook():
    import dataclasses

    import headcoop as hc

    model = hc.Count01(max_len=6).model(seed=0, n_heads=2, d_model=4)
    batch = model.task.sample(32, seed=0)
    from headcoop.studies import skip_pair

    pair_model = hc.SkipPair(seq_len=4).model(seed=0, n_heads=2, d_head=2)
    results = [hc.patch(model, clean=batch), hc.dla(model, batch), hc.qk(model, head=0), hc.ov(model, head=0),
               hc.probe(model, batch, batch.labels), hc.head_metrics(model, n=64),
               skip_pair.exact_evaluate(pair_model), skip_pair.preferences(pair_model)]  # fmt: skip
    for result in results:
        name = type(result).__name__
        field = dataclasses.fields(result)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(result, field, None)
        page = result._repr_html_()  # the table; the figure goes through plotly's renderer (_ipython_display_)
        assert "<table" in page and "plotly" not in page.lower(), name
        assert page.startswith("<div><pre>" + html.escape(repr(result))[:20]), name
        assert callable(result._ipython_display_) and result.plot().data, name
        assert len(repr(result)) < 400, name


def test_a_crowded_axis_slants_its_labels_and_a_paneled_map_makes_room_for_its_subtitle():
    """Issue 51: head-map labels overlapped at GPT-2 size, and a panel's title sat over the AtP* subtitle."""
    import torch

    import headcoop as hc
    from headcoop.display.plot import crowded_ticks, heatmap

    assert crowded_ticks(["H0", "H1"]) == {}
    many = [f"pos {i}: token{i}" for i in range(40)]
    assert crowded_ticks(many)["tickangle"] == -45
    fig = heatmap(torch.zeros(2, 40), x=many, y=["a", "b"])
    assert fig.layout.xaxis.tickangle == -45
    model = hc.load("skip-pair")
    est = hc.attribute(model, estimator="atp*", component="z", positions="each", verify=2, sample=2, progress=False)
    fig = est.plot(kind="map")
    lines = fig.layout.title.text.count("<br>")
    assert lines >= 1 and fig.layout.margin.t >= 80 + 18 * lines + 30  # the subtitle's lines and the panel title fit
