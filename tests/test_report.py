"""hc.report / `headcoop report`: the page's sections, its offline promise, its numbers, and that it draws.

The browser test opens the page in headless Chromium (Debian's `chromium` package, which .ci/run installs)
with every host name unresolvable, dumps the DOM after the scripts ran, and checks that each plotly figure
div holds plotly's rendered SVG and each circuitsvis container the drawn head canvases.
"""

import importlib
import re
import shutil
import subprocess
import sys

import pytest
import torch
from transformer_lens.utilities import get_act_name

import headcoop as hc
from headcoop.analysis.engine.inputs import head_names
from headcoop.display.views import circuitsvis_bundle
from headcoop.studies import skip_pair as skip_pair_study
from headcoop.studies.skip_pair import compare_orderings

report_module = importlib.import_module("headcoop.reporting.page")
report_context = importlib.import_module("headcoop.reporting.context")
report_sections = importlib.import_module("headcoop.reporting.sections")
sys.modules["headcoop"].report = report_module.report  # the import above set hc.report to the module

EXAMPLES = 2
SCRIPT_SRC = re.compile(r"<script[^>]*\bsrc\s*=", re.I)
FIGURE_ID = re.compile(r'id="(hc-fig-\d+)"')
VIEW_ID = re.compile(r"id='(circuits-vis-\w+)'")


def _count01():
    task = hc.Count01()
    model = task.model(seed=0, n_heads=2, d_model=4, d_head=2)
    return hc.train(task, model, steps=30, batch_size=64, seed=0, progress=False)


def _skip_pair():
    task = hc.SkipPair()
    model = task.model(seed=0, n_heads=2, d_head=3)
    return hc.train(task, model, steps=30, batch_size=64, seed=0, progress=False)


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """{name: (model, path, html)} for a tiny Count01, a tiny SkipPair, a two-layer Count01 model, and a
    foreign model (attn-only-2l's shape, a tokenizer, no headcoop task) reported through a contrast."""
    from helpers import attn_only_2l_like, name_prompts, tiny_tokenizer

    root = tmp_path_factory.mktemp("report")
    two_layer = hc.Count01().model(seed=1, n_heads=2, d_model=4, d_head=2, n_layers=2)
    foreign = attn_only_2l_like()
    contrast = hc.contrast(*name_prompts()[:4], labels=name_prompts()[4], vocab=tiny_tokenizer())
    out = {}
    for name, model, task in [("count01", _count01(), None), ("skip_pair", _skip_pair(), None),
                              ("two_layer", two_layer, None), ("foreign", foreign, contrast)]:  # fmt: skip
        path = hc.report(model, out=root / name / "report.html", examples=EXAMPLES, progress=False, task=task)
        out[name] = (model, path, path.read_text(encoding="utf-8"))
    assert getattr(foreign, "task", None) is None  # the report attached the contrast only while it ran
    return out


COMMON = ["overview", "accuracy", "heads", "attention", "patching", "dla", "cooperation", "circuits"]


@pytest.mark.parametrize(
    "name, extra, absent",
    [
        ("count01", ["count01-map"], ["preferences"]),
        ("skip_pair", ["preferences"], ["count01-map"]),
        ("two_layer", ["count01-map"], ["preferences"]),
        ("foreign", [], ["count01-map", "preferences"]),
    ],
)
def test_sections(pages, name, extra, absent):
    model, path, html = pages[name]
    assert path.name == "report.html" and path.exists()
    for anchor in COMMON + extra:
        assert f"id='hc-sec-{anchor}'" in html and f"href='#hc-sec-{anchor}'" in html
    for anchor in absent:
        assert f"hc-sec-{anchor}" not in html
    for head in head_names(model):
        assert f"<th>{head}</th>" in html  # a row of the per-head table
        assert f"<summary>{head}</summary>" in html  # its QK / OV tables
    assert model.cfg.model_name in html and repr(getattr(model, "task", None)).split("(")[0] in html
    # the cooperation section: the mechanism heatmap, each head's role, the pair table
    assert "Mechanism of each pair of heads" in html and "backs_up" in html
    assert re.search(r"<td>(supports|competes|inactive|undetermined)</td>", html)


def test_offline_and_scripts_inlined_once(pages):
    import plotly.offline

    plotly_js = plotly.offline.get_plotlyjs()
    bundle = circuitsvis_bundle()
    for _, _, html in pages.values():
        assert not SCRIPT_SRC.search(html), "no external script may be loaded"
        assert html.count(plotly_js) == 1 and html.count(bundle) == 1
        ours = html.replace(plotly_js, "").replace(bundle, "")  # the page without the two libraries
        assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", ours), "no remote resource"
        assert "cdn.plot.ly" not in ours and "unpkg.com" not in ours
        assert html.count("var CircuitsVis=") == 1


def test_figures_and_views(pages):
    for name, (model, _, html) in pages.items():
        figures = FIGURE_ID.findall(html)
        # patching (2), DLA (1), cooperation (mechanisms 1, Shapley 1, and path patching + composition with 2+ layers), QK + OV per
        # head, and the task's own figure (1; a contrast has none)
        own = 0 if name == "foreign" else 1
        head_to_head = 2 if model.cfg.n_layers > 1 else 0
        expected = 5 + head_to_head + 2 * model.cfg.n_layers * model.cfg.n_heads + own
        if "<b>The pair map</b>" in html:  # where the words cannot see: the map, and its named pairs' graph
            assert model.cfg.n_layers * model.cfg.n_heads >= 3 and len(figures) in (expected + 1, expected + 2)
        else:
            assert len(figures) == expected
        assert len(set(figures)) == len(figures)
        views = VIEW_ID.findall(html)
        assert len(views) == EXAMPLES * model.cfg.n_layers
        assert html.count("CircuitsVis.render(") == len(views)


@torch.no_grad()
def _slow_patch_effect(model, clean, corrupt, layer, head) -> float:
    """Normalised denoising effect of one head's z, one hooked forward pass (reference for the table)."""
    name = get_act_name("z", layer)
    _, cache = model.run_with_cache(clean.tokens, names_filter=name)

    def hook(z, hook):
        z[:, :, head] = cache[name][:, :, head]
        return z

    metric = lambda logits: model.task.logit_diff(logits, clean).mean().item()  # noqa: E731
    clean_v, corrupt_v = metric(model(clean.tokens)), metric(model(corrupt.tokens))
    patched = metric(model.run_with_hooks(corrupt.tokens, fwd_hooks=[(name, hook)]))
    return (patched - corrupt_v) / (clean_v - corrupt_v)


@torch.no_grad()
def _slow_dla(model, batch, layer, head) -> float:
    """Mean over examples of the head's direct push on logit(answer) - logit(wrong), from hook_z."""
    name = get_act_name("z", layer)
    _, cache = model.run_with_cache(batch.tokens, names_filter=name)
    rows = torch.arange(len(batch))
    z = cache[name][rows, batch.answer_pos, head]  # [batch, d_head]
    logits = z @ model.blocks[layer].attn.W_O[head] @ model.W_U
    return (logits[rows, batch.answer] - logits[rows, batch.wrong]).mean().item()


@pytest.mark.parametrize("name", ["two_layer", "skip_pair"])
def test_head_table_against_slow_references(pages, name):
    model = pages[name][0]
    clean, corrupt = model.task.patching_inputs()
    ctx = report_context.Context(model=model, task=model.task, source="m", examples=1, clean=clean, corrupt=corrupt)
    report_sections.section_heads(ctx)
    table = ctx.head_table
    assert list(table.index) == head_names(model)
    for i, head_name in enumerate(head_names(model)):
        layer, head = divmod(i, model.cfg.n_heads)
        effect = _slow_patch_effect(model, clean, corrupt, layer, head)
        assert table.loc[head_name, "patch effect"] == pytest.approx(effect, abs=1e-4)
        assert table.loc[head_name, "DLA logit diff"] == pytest.approx(_slow_dla(model, clean, layer, head), abs=1e-4)
    if name == "skip_pair":
        assert {"probe acc", "probe ROC AUC", "preference (QK from 0)"} <= set(table.columns)
    else:
        assert {"s_acc", "w01", "w02"} <= set(table.columns)


@torch.no_grad()
def test_skip_pair_preferences_from_the_scores(pages):
    """Orderings against the model's own hook_attn_scores on a sequence holding 1, 2, 3, 4 before 0."""
    model = pages["skip_pair"][0]
    prefs = skip_pair_study.preferences(model).to_dataframe()
    tokens = torch.tensor([[5, 1, 2, 3, 4, 6, 7, 8, 9, 0]])
    _, cache = model.run_with_cache(tokens)
    scores = cache[get_act_name("attn_scores", 0)][0, :, -1, 1:5]  # [head, signal token 1..4]
    for head in range(model.cfg.n_heads):
        order = (scores[head].argsort(descending=True) + 1).tolist()
        assert prefs.loc[f"L0H{head}", "ordering"] == " > ".join(map(str, order))
        expected = {f"score {t}": scores[head, t - 1].item() for t in (1, 2, 3, 4)}
        assert prefs.loc[f"L0H{head}", list(expected)].tolist() == pytest.approx(list(expected.values()), abs=1e-5)


def test_shipped_name_and_cli(tmp_path, capsys):
    from headcoop.cli import main

    out = tmp_path / "sub" / "sp.html"
    assert main(["report", "skip-pair-dhead1", "--out", str(out), "--examples", "1", "--no-progress"]) == 0
    assert out.exists() and f"wrote {out}" in capsys.readouterr().out
    assert "skip-pair-dhead1" in out.read_text(encoding="utf-8")
    assert callable(hc.report) and hc.report is report_module.report  # the CLI's import left hc.report alone
    assert main(["report", str(tmp_path / "nothing"), "--no-progress"]) == 2
    assert "no headcoop checkpoint" in capsys.readouterr().err


def test_bad_input(tmp_path):
    bare = hc.Count01().model(seed=0, n_heads=2, d_model=4, d_head=2)
    del bare.task
    with pytest.raises(ValueError, match="carries no headcoop task"):
        hc.report(bare, out=tmp_path / "r.html", progress=False)
    with pytest.raises(ValueError, match="examples must be a positive int"):
        hc.report("count01", out=tmp_path / "r.html", examples=0)
    with pytest.raises(TypeError, match="a shipped name, a checkpoint path or a Hugging Face model folder"):
        hc.report(3, out=tmp_path / "r.html")
    with pytest.raises(FileNotFoundError, match="shipped names are"):
        hc.report(tmp_path / "missing", out=tmp_path / "r.html")
    assert not (tmp_path / "r.html").exists()


# --- in a browser ---------------------------------------------------------------------------------------
def _dump_dom(chromium: str, path, profile) -> str:
    command = [
        chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run",
        "--host-resolver-rules=MAP * ~NOTFOUND",  # no network: any remote load would fail
        f"--user-data-dir={profile}", "--virtual-time-budget=15000", "--dump-dom", path.resolve().as_uri(),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, f"chromium failed ({done.returncode}): {done.stderr[-2000:]}"
    return done.stdout


def _segments(dom: str) -> dict[str, str]:
    """The DOM from each figure / view / section marker to the next one, by marker id."""
    marks = [(m.start(), m.group(1)) for m in re.finditer(r'id="(hc-[\w-]+|circuits-vis-\w+)"', dom)]
    ends = [start for start, _ in marks[1:]] + [len(dom)]
    return {name: dom[start:end] for (start, name), end in zip(marks, ends)}


@pytest.mark.slow
def test_page_draws_in_headless_chromium(pages, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("headless Chromium is not installed (Debian: apt-get install chromium; .ci/run does this)")
    for name in ("count01", "skip_pair", "two_layer", "foreign"):
        model, path, html = pages[name]
        dom = _dump_dom(chromium, path, tmp_path / f"profile-{name}")
        segments = _segments(dom)
        figures = FIGURE_ID.findall(html)
        assert figures and all(f in segments for f in figures)
        blank = [f for f in figures if 'class="main-svg"' not in segments[f]]
        assert not blank, f"plotly did not draw {blank}"
        for f in figures:  # a drawn heatmap / bar / scatter trace, not only the axes
            assert re.search(r'class="(hm|trace bars|trace scatter)', segments[f]), f
        views = VIEW_ID.findall(html)
        assert views and all(v in segments for v in views)
        for view in views:
            drawn = segments[view]
            assert "Head Selector" in drawn, f"circuitsvis did not render {view}"
            # one thumbnail canvas per head plus the zoomed pattern
            assert drawn.count("<canvas") == model.cfg.n_heads + 1, view
            for head in range(model.cfg.n_heads):
                assert re.search(rf">L\d+H{head}</h4>", drawn), (view, head)


def test_ordering_relations():
    """The page names relations with headcoop.studies.skip_pair.compare_orderings."""
    assert compare_orderings((3, 1, 4, 2), (2, 4, 1, 3)) == "reversed"
    assert compare_orderings((3, 1, 4, 2), (3, 1, 4, 2)) == "equal"
    assert compare_orderings((1, 2, 3, 4), (2, 1, 3, 4)) == "partly equal"
    assert compare_orderings((1, 2, 3, 4), (4, 3, 1, 2)) == "partly reversed"


def test_model_whose_heads_write_nothing(tmp_path):
    """Clean and corrupt runs score the same (W_O = 0): the page still renders, patch effects are blank."""
    model = hc.Count01().model(seed=0, n_heads=2, d_model=4, d_head=2)
    with torch.no_grad():
        model.blocks[0].attn.W_O.zero_()
    path = hc.report(model, out=tmp_path / "flat.html", examples=1, progress=False)
    assert "hc-sec-patching" in path.read_text(encoding="utf-8")
    clean, corrupt = model.task.patching_inputs()
    ctx = report_context.Context(model=model, task=model.task, source="m", examples=1, clean=clean, corrupt=corrupt)
    report_sections.section_heads(ctx)
    assert ctx.head_table["patch effect"].isna().all()


def test_a_third_task_plugs_in_without_touching_the_report(tmp_path):
    """The report has no task-name switches: a study registered for a new task adds its column and section."""
    import ast
    from pathlib import Path

    import pandas as pd

    from headcoop.studies import STUDIES, Study, StudySection, register_study

    reporting = Path(report_module.__file__).parent
    names = {node.value for path in reporting.glob("*.py") for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Constant)}  # fmt: skip
    assert not {"count01", "skip-pair"} & names, "no task names in headcoop/reporting/"

    class Parity(hc.Count01):
        name = "parity-demo"

    class ParityStudy(Study):
        sections = (("parity", "Parity demo section"),)

        def head_columns(self, model, task):
            return pd.DataFrame({"demo": [1.0] * model.cfg.n_heads}, index=hc.head_names(model)), ["demo column"]

        def section(self, anchor, model, task, head_table):
            return StudySection(notes=("a note from the study",), table=head_table[["demo"]])

    register_study("parity-demo", ParityStudy())
    try:
        task = Parity(max_len=4)
        model = task.model(seed=0, n_heads=2, d_model=4)
        page = hc.report(model, out=tmp_path / "p.html", examples=1, progress=False).read_text()
    finally:
        del STUDIES["parity-demo"]
    assert "Parity demo section" in page and "a note from the study" in page and "demo column" in page


def test_count01_head_map_shows_its_reference_lines_and_separates_crowded_labels():
    """The figure JSON: the dotted lines at w01 = 1 and w02 = 10 have a visible width (from the template), and
    heads at the same spot get different label positions."""
    import pandas as pd

    from headcoop.display.plot import TEMPLATE
    from headcoop.studies.count01 import head_map_figure

    table = pd.DataFrame({"w01": [1.0, 1.01, 0.99, 5.0], "w02": [2.0, 2.02, 1.98, 50.0], "s_acc": [0.9] * 4},
                         index=["L0H0", "L0H1", "L0H2", "L0H3"])  # fmt: skip
    fig = head_map_figure(table)
    assert fig.layout.template.layout.shapedefaults.line.width > 0
    assert sorted((s.type, s.x0 if s.x0 == s.x1 else s.y0) for s in fig.layout.shapes) == [
        ("line", 1.0),
        ("line", 10.0),
    ]
    assert all(s.line.width is None or s.line.width > 0 for s in fig.layout.shapes)
    positions = list(fig.data[0].textposition)
    assert len(set(positions[:3])) == 3 and positions[3] == "top center"
    assert fig.layout.template == pio_template(TEMPLATE)


def pio_template(name):
    import plotly.io as pio

    return pio.templates[name]


def test_pages_escape_what_is_not_headcoop_text():
    """The HTML template autoescapes: a task repr or table cell holding markup is shown, not run; a
    section's own Text (headcoop's trusted fragments) and a Table keep their markup."""
    import pandas as pd
    from markupsafe import Markup

    from headcoop.display.pages import Code, Section, Table, Text, render, stylesheet

    evil = "<script>alert(1)</script>"
    section = Section("a <b> title", (Text("<b>bold</b>"), Code(evil), Table(pd.DataFrame({"x": [evil]}))), anchor="a")
    page = render(
        "report.html.j2", title=evil, note="n", sections=[section], css=Markup(stylesheet()), plotlyjs=Markup(""),
        scripts=[], plotly_div=lambda block: "",
    )  # fmt: skip
    assert "<script>alert(1)</script>" not in page
    assert page.count("&lt;script&gt;alert(1)&lt;/script&gt;") == 4  # <title>, <h1>, the code block, the cell
    assert '<p class="note"><b>bold</b></p>' in page and "a &lt;b&gt; title" in page
    assert "<table" in page and "table.hc" in page  # the table and the shipped CSS


def test_markdown_tables_come_from_pandas():
    import pandas as pd

    from headcoop.display.pages import Table

    text = Table(pd.DataFrame({"name": ["a", "b"], "value": [1.23456, float("nan")]}), digits=2).markdown()
    assert text.splitlines() == [
        "| name   |   value |",
        "|:-------|--------:|",
        "| a      |    1.23 |",
        "| b      |     n/a |",
    ]


def test_slow_by_position_patching_is_shown_as_verified_estimates():
    """With a limit the exact sweep exceeds, the patching section shows AtP* estimates (map and verification
    scatter) beside the exact all-positions map; under it, the exact by-position map."""
    model = hc.Count01().model(seed=0, n_heads=2, d_model=8, d_head=2)
    clean, corrupt = model.task.patching_inputs()

    def section(limit):
        ctx = report_context.Context(model=model, task=model.task, source="m", examples=1, clean=clean,
                                     corrupt=corrupt, exact_limit_s=limit)  # fmt: skip
        return report_sections.section_patching(ctx)

    estimated = section(0.0)
    titles = [b.figure.layout.title.text for b in estimated if hasattr(b, "figure")]
    assert any("ESTIMATE" in t for t in titles) and any("(exact)" in t for t in titles) and len(titles) == 3
    assert "sampled ones were patched exactly" in estimated[2].text
    exact = section(1e9)
    assert [b.figure.layout.title.text for b in exact if hasattr(b, "figure")][-1].endswith("(exact)")


def test_the_report_does_not_set_the_models_task(tmp_path):
    """A task given to the report reaches every analysis as arguments (inputs and `task_score` as the metric):
    a model built without a task has none afterwards (the report once set model.task and restored it)."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(n_layers=2, d_model=16, n_ctx=8, d_head=4, n_heads=2, d_vocab=12, attn_only=True,
                                  act_fn="relu", seed=0)  # fmt: skip
    model = HookedTransformer(cfg)
    assert not hasattr(model, "task")
    task = hc.contrast([[1, 2, 3, 4], [1, 5, 3, 4]], [[1, 6, 3, 4], [1, 7, 3, 4]], [8, 9], [9, 8])
    seen = []
    original = type(model).__setattr__

    def watch(self, name, value):
        if name == "task":
            seen.append(value)
        original(self, name, value)

    type(model).__setattr__ = watch
    try:
        hc.report(model, out=tmp_path / "r.html", task=task, progress=False)
    finally:
        type(model).__setattr__ = original
    assert seen == [] and not hasattr(model, "task")
    assert (tmp_path / "r.html").stat().st_size > 0


def test_warnings_go_on_the_page_by_their_numbers(pages):
    """Issue 51: where headcoop warns about a number (here the test model's clean - corrupt gap of 0.0015,
    which makes normalized patching effects read the gap), the page says so in the section that shows it."""
    text = pages["count01"][2]
    patching = text[text.index("id='hc-sec-patching'") : text.index("id='hc-sec-dla'")]
    assert "<b>Warning</b>: the clean - corrupt gap is 0.00148" in patching
