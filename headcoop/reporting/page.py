"""`hc.report(model)` / `headcoop report NAME_OR_PATH`: one self-contained HTML page on what every head does.

The page holds the task and configuration, accuracy, a per-head metrics table, circuitsvis attention views
on a few inputs, the head-patching heatmaps, DLA bars, every head's QK and OV tables as heatmaps, and the
task's own head picture: the (w01, w02) head map for Count01, the preference orderings for SkipPair.

It works offline: plotly.js and the circuitsvis bundle are each inlined once (no CDN, no `<script src>`),
so the file opens in a browser with the network cut. Each plotly figure is a `<div id="hc-fig-N">`; each
attention view a circuitsvis `<div id="circuits-vis-...">` (tests check both draw in headless Chromium).
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import plotly.offline
import torch
from markupsafe import Markup

import headcoop as hc
from headcoop.analysis.engine.inputs import model_device, parse_heads, require_model, require_task
from headcoop.checks import check_out_file, check_time_budget
from headcoop.display.pages import Figure, Html, Section, Text, render, stylesheet
from headcoop.display.progress import tqdm
from headcoop.display.views import circuitsvis_bundle
from headcoop.models.bridge import is_bridge, is_hf_folder, kind_label, load_folder
from headcoop.models.tl import HookedTransformer
from headcoop.reporting.budget import Budget, forward_seconds
from headcoop.reporting.circuits import section_circuits
from headcoop.reporting.context import Context
from headcoop.reporting.cooperation import section_cooperation
from headcoop.reporting.sections import (
    page_note,
    page_table,
    section_accuracy,
    section_attention,
    section_dla,
    section_heads,
    section_overview,
    section_patching,
)
from headcoop.storage.folders import replace_file
from headcoop.studies import study_for
from headcoop.tasks.base import Task


def _study_section(anchor: str) -> Callable[[Context], tuple]:
    """The builder of a study's section: the study supplies data, rendered like every other section."""

    def build(ctx: Context) -> tuple:
        table = ctx.head_table if ctx.head_table is not None else pd.DataFrame()
        part = study_for(ctx.task).section(anchor, ctx.model, ctx.task, table)
        blocks: list = [page_note(n) for n in part.notes]
        if part.table is not None:
            blocks.append(page_table(part.table))
        if part.figure is not None:
            blocks.append(Figure(part.figure, height=part.figure_height))
        return tuple(blocks)

    return build


def _sections(task: Task) -> list[tuple[str, str, Callable[[Context], tuple]]]:
    """(anchor, title, builder) in page order."""
    sections: list[tuple[str, str, Callable[[Context], tuple]]] = [
        ("overview", "Task and configuration", section_overview),
        ("accuracy", "Accuracy", section_accuracy),
        ("heads", "Per-head metrics", section_heads),
    ]
    sections += [(anchor, title, _study_section(anchor)) for anchor, title in study_for(task).sections]
    sections += [
        ("attention", "Attention patterns", section_attention),
        ("patching", "Head patching", section_patching),
        ("dla", "Direct logit attribution", section_dla),
        ("cooperation", "Cooperation: mechanisms, roles, Shapley values and interactions", section_cooperation),
        ("circuits", "QK and OV circuits of every head", section_circuits),
    ]
    return sections


# --- the page -----------------------------------------------------------------------------------------
class _PlotlyDivs:
    """Renders pages.Figure blocks as `<div id="hc-fig-N">` plus the script that draws it (plotly.js is
    inlined once in <head>), numbering the figures in page order."""

    def __init__(self):
        self.count = 0

    def __call__(self, block: Figure) -> Markup:
        div_id = f"hc-fig-{self.count}"
        self.count += 1
        fig, height, width = block.figure, block.height, block.width
        top = max(60, (fig.layout.margin.t or 0) if fig.layout.margin else 0)  # room for wrapped subtitles
        fig.update_layout(height=height, width=width, margin=dict(t=top, b=50, l=60, r=30))
        return Markup(fig.to_html(
            full_html=False, include_plotlyjs=False, div_id=div_id, default_height=f"{height}px",
            default_width="100%" if width is None else f"{width}px",
            config={"displaylogo": False, "responsive": width is None},
        ))  # fmt: skip


def _resolve(model_or_name) -> tuple[HookedTransformer, str]:
    if isinstance(model_or_name, HookedTransformer):
        return model_or_name, model_or_name.cfg.model_name
    if is_bridge(model_or_name):
        require_model(model_or_name, "report")
        return model_or_name, kind_label(model_or_name)
    if isinstance(model_or_name, (str, os.PathLike)) and is_hf_folder(model_or_name):
        return load_folder(model_or_name), f"{model_or_name} (Hugging Face folder, as a TransformerBridge)"
    if isinstance(model_or_name, (str, os.PathLike)):
        from headcoop.storage.checkpoints import SHIPPED
        from headcoop.storage.foreign import CONFIG

        if (
            not (isinstance(model_or_name, str) and model_or_name in SHIPPED)
            and (Path(model_or_name) / CONFIG).is_file()
        ):
            from headcoop.storage.foreign import load_model

            return load_model(model_or_name), str(model_or_name)  # a plain TransformerLens export
        return hc.load(model_or_name), str(model_or_name)
    raise TypeError(
        f"report needs a HookedTransformer, a TransformerBridge, a shipped name, a checkpoint path or a Hugging Face "
        f"model folder, got {type(model_or_name).__name__}"
    )


SECTION_NAMES = ("overview", "accuracy", "heads", "attention", "patching", "dla", "cooperation", "circuits")
BUDGET_S = 60.0  # the report's default time budget in seconds


def report_sections(
    model: HookedTransformer,
    source: str = "",
    examples: int = 3,
    progress: bool = True,
    task: Task | None = None,
    exact_limit_s: float = 60.0,
    heads=None,
    sections=None,
    budget_s: float | None = None,
    started: float | None = None,
) -> list[Section]:
    """Every section of the report as data (headcoop.display.pages.Section): what `report` renders. `task`
    (default: the model's own) supplies the inputs and the metric; by-position head patching predicted to
    take longer than `exact_limit_s` is shown as verified AtP* estimates; `heads`, `sections`, `budget_s`:
    as `report`."""
    own_task = task is None
    task = task if task is not None else require_task(model, "the report's inputs and metrics (pass task=)")
    clean, corrupt = task.patching_inputs()
    device = model_device(model)
    clean, corrupt = clean.to(device), corrupt.to(device)
    every = [(lay, h) for lay in range(model.cfg.n_layers) for h in range(model.cfg.n_heads)]
    covered = every if heads is None else sorted(set(parse_heads(model, heads)))
    if not covered:
        raise ValueError("heads is empty; give the heads the report covers, e.g. ['L0H1', 'L3H2'], or None for all")
    budget = Budget(budget_s, forward_seconds(model, clean.tokens), start=started or time.perf_counter(),
                     setup=_setup_code(source or model.cfg.model_name, own_task, task))  # fmt: skip
    ctx = Context(model=model, task=task, source=source or model.cfg.model_name, examples=examples, clean=clean,
                   corrupt=corrupt, exact_limit_s=exact_limit_s, heads=covered, budget=budget)  # fmt: skip
    chosen = _sections(task)
    if sections is not None:
        wanted = _check_sections(sections, [anchor for anchor, _, _ in chosen])
        chosen = [row for row in chosen if row[0] in wanted]
    out = []
    bar = tqdm(chosen, desc="report", unit="section", disable=not progress)
    for anchor, title, build in bar:
        bar.set_postfix_str(anchor)
        with warnings.catch_warnings(record=True) as caught:  # headcoop's warnings go on the page, by the numbers
            warnings.simplefilter("always", UserWarning)
            blocks = tuple(build(ctx))
        ours = [w for w in caught if issubclass(w.category, UserWarning) and "headcoop" in str(w.filename)]
        for w in caught:  # every other warning as it would have been shown
            if w not in ours:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        said = dict.fromkeys(str(w.message) for w in ours)
        blocks += tuple(Text(Markup("<b>Warning</b>: {}").format(message)) for message in said)
        out.append(Section(title, blocks, anchor=anchor))
    bar.close()
    return out


def _setup_code(source: str, own_task: bool, task=None) -> str:
    """The Python that loads the report's model and inputs, for the calls the page offers, runnable as printed:
    the model by the shipped name or folder the report was given (a model passed in memory stays `model`), the
    inputs from its own task, from the prompts file the task was read from (--prompts, with its tokenizer
    file), or from the `task` passed in memory."""
    from headcoop.storage.checkpoints import SHIPPED
    from headcoop.storage.foreign import CONFIG

    name = source.split(" (")[0]  # "my-gpt2 (Hugging Face folder, ...)" -> "my-gpt2"
    if name in SHIPPED or (Path(name).is_dir() and not (Path(name) / CONFIG).is_file()):
        load = f"model = hc.load({name!r}); "
    elif Path(name).is_dir() and is_hf_folder(name):
        load = f"from headcoop.models.bridge import load_folder; model = load_folder({name!r}); "
    elif Path(name).is_dir():
        load = f"from headcoop.storage.foreign import load_model; model = load_model({name!r}); "
    else:
        load = ""  # a model passed to hc.report in memory
    prompts = getattr(task, "prompts_file", None)
    if own_task:
        inputs = "model.task.patching_inputs()"
    elif prompts is not None:
        tokenizer = getattr(task, "tokenizer_file", None)
        load += "from headcoop.storage.foreign import load_tokenizer, read_prompts; "
        inputs = (
            f"read_prompts({prompts!r}, {f'load_tokenizer({tokenizer!r})' if tokenizer else 'None'}).patching_inputs()"
        )
    else:
        inputs = "task.patching_inputs()"  # the task passed to hc.report in memory
    return f"import headcoop as hc; {load}clean, corrupt = {inputs}"


def _check_sections(sections, known: list[str]) -> set[str]:
    if isinstance(sections, str):
        sections = [part.strip() for part in sections.split(",") if part.strip()]
    if not isinstance(sections, (list, tuple, set)) or not all(isinstance(name, str) for name in sections):
        raise TypeError(f"sections must be section names (a list, or one comma-separated string) from {known}, "
                        f"got {sections!r}")  # fmt: skip
    sections = list(sections)
    unknown = [name for name in sections if name not in known]
    if unknown or not sections:
        raise ValueError(f"unknown report sections {unknown}; this task's sections are {known}" if unknown else
                         f"sections is empty; give one or more of {known}")  # fmt: skip
    return set(sections)


def report(
    model_or_name,
    out: str | os.PathLike = "report.html",
    examples: int = 3,
    progress: bool = True,
    task: Task | None = None,
    exact_limit_s: float = 60.0,
    heads=None,
    sections=None,
    budget_s: float | None = BUDGET_S,
    device: str | None = None,
    started: float | None = None,
) -> Path:
    """Write one self-contained HTML page on what every head of a model does; returns its path.

    model_or_name: a HookedTransformer or TransformerBridge (carrying a task, or with `task=`), a shipped name
                   ("count01", "skip-pair", "skip-pair-dhead1"), a checkpoint folder, a TransformerLens export
                   or a Hugging Face model folder.
    out:           the HTML file to write (parent folders are created).
    examples:      how many inputs get a circuitsvis attention view (per layer).
    progress:      show a tqdm bar over the sections.
    task:          the task whose inputs and metric the report uses (default: the model's own); for a
                   model headcoop never trained, a contrast of your prompts (`hc.contrast`).
    exact_limit_s: by-position head patching predicted to take longer than this is shown as AtP* estimates
                   (`hc.attribute`, verified on 40 cells) beside the exact all-positions map.
    heads:         the heads the per-head sections cover (any form `hc.ablate` takes, e.g. ["L0H1", "L5H3"];
                   default every head).
    sections:      which sections to build (names in SECTION_NAMES and the task's own, or a comma-separated
                   string); default all.
    budget_s:      the report's time budget in seconds (default 60; 0 or None: no limit). One forward pass is timed
                   first; an analysis predicted to overrun what is left is left out, and the page says what
                   it would cost and the call that runs it.
    device:        move the model there first ("cpu", "cuda", "cuda:1"; default: where it is).
    started:       the `time.perf_counter()` the budget counts from (default: this call); the CLI passes its own
                   start, so its imports count, and the page says how much of the budget went before.
    Sections: task and configuration (the prompts, with examples), accuracy, per-head metrics (patch effect,
    DLA, probes; the task's own columns), the task's own head picture, attention views, head-patching
    heatmaps, DLA bars, cooperation (mechanisms, roles, Shapley values, path patching, composition), QK / OV
    tables per head (heatmaps for small vocabularies, else their largest entries). plotly.js and the
    circuitsvis bundle are inlined once each: no network needed. The page is rendered from
    headcoop/templates/report.html.j2 (Jinja2, autoescaped).
    """
    called = time.perf_counter() if started is None else started  # the budget counts the model's loading too
    before_s = time.perf_counter() - called
    if not isinstance(examples, int) or isinstance(examples, bool) or examples < 1:
        raise ValueError(f"examples must be a positive int, got {examples!r}")
    budget_s = check_time_budget("budget_s", budget_s)  # one meaning with the CLI's --budget: 0 is no limit
    out = check_out_file(out, "report")
    model, source = _resolve(model_or_name)
    if device is not None:
        model = _to_device(model, device)
    if task is not None:
        if not isinstance(task, Task):
            raise TypeError(f"task must be a headcoop Task such as hc.contrast(...), got {type(task).__name__}")
        task.check_ready(model, "report")
    start = time.perf_counter()
    # the task reaches every analysis as arguments (inputs, `task_score` as the metric): model.task is not set
    sections = report_sections(model, source, examples=examples, progress=progress, task=task,
                               exact_limit_s=exact_limit_s, heads=heads, sections=sections, budget_s=budget_s,
                               started=called)  # fmt: skip
    elapsed = time.perf_counter() - start
    calls = [b.script for s in sections for b in s.blocks if isinstance(b, Html) and b.script]
    budget = (
        "no time budget"
        if budget_s is None
        else f"time budget {budget_s:.0f} s"
        + (f", {before_s:.0f} s of it spent before the report began (imports, loading)" if before_s >= 0.5 else "")
    )
    page = render(
        "report.html.j2",
        title=f"headcoop report: {source}" + ("" if model.cfg.model_name in source else f" ({model.cfg.model_name})"),
        note=f"headcoop {hc.__version__}; built in {elapsed:.1f} s on {model_device(model)} ({budget}). Works offline: "
        "every script is inlined.",
        sections=sections,
        css=Markup(stylesheet()),
        plotlyjs=Markup(plotly.offline.get_plotlyjs()),
        scripts=[Markup("\n".join([circuitsvis_bundle(), *calls]))] if calls else [],
        plotly_div=_PlotlyDivs(),
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out = check_out_file(out, "report")  # still a regular file (or absent) now that the page is ready
    return replace_file(out, page, "report")  # its mode and owner kept; a killed report never leaves half a page


def _to_device(model, device: str):
    """`model` moved to `device` (ValueError naming a device torch does not know); its task stays its own."""
    try:
        target = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device {device!r} is not a torch device; use 'cpu', 'cuda' or 'cuda:1'") from None
    if target.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: this machine has no CUDA device (torch.cuda.is_available() is False)")
    if target.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"device {device!r}: the report computes on 'cpu', 'cuda' or 'mps' ({target.type!r} holds no "
                         "values to measure)")  # fmt: skip
    return model.to(target)  # nn.Module.to moves in place and returns the module: the task it carries stays
