"""`hc.report(model)` / `headcoop report NAME_OR_PATH`: one self-contained HTML page on what every head does.

The page holds the task and configuration, accuracy, a per-head metrics table, circuitsvis attention views
on a few inputs, the head-patching heatmaps, DLA bars, every head's QK and OV tables as heatmaps, and the
task's own head picture: the (w01, w02) head map for Count01, the preference orderings for SkipPair.

It works offline: plotly.js and the circuitsvis bundle are each inlined once (no CDN, no `<script src>`),
so the file opens in a browser with the network cut. Each plotly figure is a `<div id="hc-fig-N">`; each
attention view a circuitsvis `<div id="circuits-vis-...">` (tests check both draw in headless Chromium).
"""

from __future__ import annotations

import argparse
import dataclasses
import html
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import plotly.offline
import torch
from torch import Tensor
from headcoop.progress import tqdm
from transformer_lens import HookedTransformer

import headcoop as hc
from headcoop.checks import check_out_file
from headcoop.analysis.attention import attention_data
from headcoop.views import attention_heads_html, module_script
from headcoop.analysis.common import head_names, require_task
from headcoop.studies import study_for
from headcoop.tasks.base import Batch, Task

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; max-width: 1200px;
       padding: 0 24px 48px; color: #222; line-height: 1.45; }
h1 { margin-bottom: 0; } h2 { margin-top: 40px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
table.hc { border-collapse: collapse; font-size: 14px; margin: 8px 0; }
table.hc th, table.hc td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
table.hc th { background: #f4f4f4; } table.hc td:first-child, table.hc th:first-child { text-align: left; }
.note { color: #555; font-size: 14px; max-width: 900px; }
.row { display: flex; flex-wrap: wrap; gap: 12px; }
details { margin: 6px 0; } summary { cursor: pointer; font-weight: 600; }
nav a { margin-right: 14px; } code { background: #f4f4f4; padding: 0 3px; }
"""


# --- what the sections share --------------------------------------------------------------------------
@dataclasses.dataclass
class _Context:
    """The model and inputs every section reads, and the figures the page collects."""

    model: HookedTransformer
    task: Task
    source: str
    examples: int
    clean: Batch
    corrupt: Batch
    n_figures: int = 0
    head_table: pd.DataFrame | None = None
    _memo: dict = dataclasses.field(default_factory=dict)

    def once(self, key: str, compute: Callable):
        """`compute()` the first time `key` is asked for, the stored value after (sections share results)."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def patch(self, positions: str = "all"):
        """hc.patch of every head's z on the clean / corrupt batches (denoising)."""
        return self.once(
            f"patch-{positions}",
            lambda: hc.patch(self.model, clean=self.clean, corrupt=self.corrupt, positions=positions),
        )

    def dla(self):
        """hc.dla on the clean batch."""
        return self.once("dla", lambda: hc.dla(self.model, self.clean))

    def figure(self, fig: go.Figure, height: int = 420, width: int | None = None) -> str:
        """The figure as a div (`hc-fig-N`) and the script that draws it; plotly.js is loaded once in <head>.

        width: fixed width in pixels (needed inside closed <details>, which have no width to fill);
        default: the page's width."""
        div_id = f"hc-fig-{self.n_figures}"
        self.n_figures += 1
        fig.update_layout(height=height, width=width, margin=dict(t=60, b=50, l=60, r=30))
        return fig.to_html(
            full_html=False, include_plotlyjs=False, div_id=div_id, default_height=f"{height}px",
            default_width="100%" if width is None else f"{width}px",
            config={"displaylogo": False, "responsive": width is None},
        )  # fmt: skip


def _esc(text) -> str:
    return html.escape(str(text))


RATIO_COLUMNS = ("w01", "w02")  # ratios spanning decades: significant digits, not decimals


def _table(df: pd.DataFrame, index: bool = True, digits: int = 3) -> str:
    formatters = {c: (lambda x: f"{x:.3g}") for c in df.columns if c in RATIO_COLUMNS}
    return df.to_html(
        classes="hc", border=0, index=index, na_rep="", escape=True, formatters=formatters,
        float_format=lambda x: f"{x:.{digits}f}",
    )  # fmt: skip


def _note(text: str) -> str:
    return f"<p class='note'>{text}</p>"


# --- task-specific head pictures ----------------------------------------------------------------------
# --- sections -----------------------------------------------------------------------------------------
def _section_overview(ctx: _Context) -> str:
    model, task, cfg = ctx.model, ctx.task, ctx.model.cfg
    doc = (sys.modules[type(task).__module__].__doc__ or "").strip()
    fields = [
        "model_name", "n_layers", "n_heads", "d_model", "d_head", "d_vocab", "n_ctx", "attn_only",
        "normalization_type", "positional_embedding_type", "attention_dir",
    ]  # fmt: skip
    config = pd.DataFrame({"value": [str(getattr(cfg, f)) for f in fields]}, index=fields)
    n_params = sum(p.numel() for p in model.parameters())
    n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    config.loc["parameters (trainable)"] = f"{n_params} ({n_trainable})"
    example = ctx.clean[:1]
    end = int(example.loss_pos.max()) + 1
    return (
        f"<p><b>Model:</b> <code>{_esc(ctx.source)}</code> &nbsp; <b>Task:</b> <code>{_esc(repr(task))}</code></p>"
        f"<pre class='note'>{_esc(doc)}</pre>"
        f"<p><b>Vocabulary</b> (id: token): {_esc(', '.join(f'{i}: {t}' for i, t in enumerate(task.vocab)))}</p>"
        f"<p><b>An example</b>: <code>{_esc(task.decode(example.tokens[0, :end]))}</code>, answer "
        f"<code>{_esc(task.vocab[int(example.answer[0])])}</code> at position {int(example.answer_pos[0])}</p>"
        f"<h3>Configuration</h3>{_table(config)}"
    )


def _section_accuracy(ctx: _Context) -> str:
    metrics = ctx.task.evaluate(ctx.model)
    frame = pd.DataFrame({"value": list(metrics.values())}, index=list(metrics))
    return _note(f"<code>task.evaluate(model)</code> on fresh samples of {_esc(repr(ctx.task))}.") + _table(
        frame, digits=4
    )


def _section_heads(ctx: _Context) -> str:
    model, task = ctx.model, ctx.task
    names = head_names(model)
    patched, attr = ctx.patch(), ctx.dla()
    diff = attr.logit_diff()[:, [attr.components.index(n) for n in names]]  # [batch, head]
    table = pd.DataFrame(
        {
            "patch effect": _share(patched).reshape(-1).numpy(),
            "DLA logit diff": diff.mean(0).cpu().numpy(),
            "DLA std": diff.std(0, unbiased=False).cpu().numpy(),
        },
        index=pd.Index(names, name="head"),
    )
    notes = [
        "<b>patch effect</b>: share of the clean&minus;corrupt gap in mean logit difference (right answer "
        "minus the alternative) restored by patching the head's output <code>z</code> from the clean run into "
        f"the corrupt run (<code>hc.patch</code> on {len(ctx.clean)} inputs; 1: the head alone restores it).",
        "<b>DLA logit diff</b>: the head's direct contribution to logit(answer) &minus; logit(alternative) at "
        "the answer position, mean and std over the same inputs (<code>hc.dla</code>).",
    ]
    study = study_for(task)
    if study.generic_probes:
        probe_batch = task.patching_inputs(n=1024, seed=1)[0]
        probes = hc.probe(model, probe_batch, probe_batch.labels, site="z", layer=None)
        table["probe acc"] = probes.acc.numpy()
        table["probe ROC AUC"] = probes.roc_auc.numpy()
        notes.append(
            "<b>probe acc / ROC AUC</b>: linear probe of the task label from the head's <code>z</code> at the "
            f"answer position, held-out ({len(probes.test_index)} of {len(probe_batch)} inputs; "
            f"{len(probes.classes)} classes; <code>hc.probe</code>)."
        )
    columns, study_notes = study.head_columns(model, task)
    if columns is not None:
        table = table.join(columns)
    notes += study_notes
    ctx.head_table = table
    return "".join(_note(n) for n in notes) + _table(table)


def _share(result) -> Tensor:
    """PatchResult.normalized(), or NaN everywhere when clean and corrupt runs score the same (no gap)."""
    if result.clean_value == result.corrupt_value:
        return torch.full_like(result.values, float("nan"))
    return result.normalized()


def _section_attention(ctx: _Context) -> str:
    """One circuitsvis view per (layer, example), every render call in one script after the bundle."""
    n = min(ctx.examples, len(ctx.clean))
    views = [view for layer in range(ctx.model.cfg.n_layers)
             for view in attention_data(ctx.model, ctx.clean, layer=layer, example=0, max_examples=n)]  # fmt: skip
    markup, script = attention_heads_html(views)
    return (
        _note(
            f"Attention patterns of every head on {n} inputs of the task's patching batch (query rows, key "
            "columns; hover a head to enlarge it, click to lock). Rendered by circuitsvis, offline."
        )
        + markup
        + "\n"
        + module_script(script)
    )


def _section_patching(ctx: _Context) -> str:
    model = ctx.model
    heads, each = ctx.patch(), ctx.patch("each")
    n_layers = model.cfg.n_layers
    height = max(360, 140 + 28 * model.cfg.n_heads) * n_layers
    gap = heads.clean_value != heads.corrupt_value  # else show the raw metric: there is no gap to share
    return (
        _note(
            f"Denoising: run the corrupt inputs (<code>task.corrupt</code>) and patch in one head's clean "
            f"output <code>z</code>. Values are the share of the clean&minus;corrupt gap restored (clean "
            f"mean logit diff {heads.clean_value:.3f}, corrupt {heads.corrupt_value:.3f})."
        )
        + ctx.figure(heads.plot(normalized=gap, title="head patching: all positions"), height=300 + 40 * n_layers)
        + ctx.figure(each.plot(normalized=gap, title="head patching: one position at a time"), height=height)
    )


def _section_dla(ctx: _Context) -> str:
    attr = ctx.dla()
    return _note(
        "Direct logit attribution at the answer position: each component's contribution to logit(answer) "
        f"&minus; logit(alternative), mean over {len(ctx.clean)} inputs, error bars one std. The components "
        "sum to the model's logit difference exactly."
    ) + ctx.figure(attr.plot())


def _section_circuits(ctx: _Context) -> str:
    model = ctx.model
    parts = [
        _note(
            "QK: pre-softmax attention score of a query token on a key token (<code>hc.qk</code>). OV: change "
            "in each output logit when the head attends fully to a source token (<code>hc.ov</code>). Layers "
            "after the first: direct path (the head reading the embeddings)."
        )
    ]
    for i, name in enumerate(head_names(model)):
        layer, head = divmod(i, model.cfg.n_heads)
        qk_fig = hc.qk(model, head=head, layer=layer).plot()
        ov_fig = hc.ov(model, head=head, layer=layer).plot()
        qk_html, ov_html = (ctx.figure(f, height=_square(f), width=_square(f) + 120) for f in (qk_fig, ov_fig))
        parts.append(
            f"<details{' open' if i == 0 else ''}><summary>{name}</summary>"
            f"<div class='row'><div>{qk_html}</div><div>{ov_html}</div></div></details>"
        )
    return "".join(parts)


def _square(fig: go.Figure) -> int:
    """A heatmap's height in pixels: about 14 px a row (positional tables have many), within 380..1200."""
    return min(1200, max(380, 200 + 14 * len(fig.data[0].y)))


def _study_section(anchor: str) -> Callable[[_Context], str]:
    """The builder of a study's section: the study supplies data, rendered here like every other section."""

    def build(ctx: _Context) -> str:
        table = ctx.head_table if ctx.head_table is not None else pd.DataFrame()
        part = study_for(ctx.task).section(anchor, ctx.model, ctx.task, table)
        html_parts = [_note(n) for n in part.notes]
        if part.table is not None:
            html_parts.append(_table(part.table))
        if part.figure is not None:
            html_parts.append(ctx.figure(part.figure, height=part.figure_height))
        return "".join(html_parts)

    return build


def _sections(task: Task) -> list[tuple[str, str, Callable[[_Context], str]]]:
    """(anchor, title, builder) in page order."""
    sections = [
        ("overview", "Task and configuration", _section_overview),
        ("accuracy", "Accuracy", _section_accuracy),
        ("heads", "Per-head metrics", _section_heads),
    ]
    sections += [(anchor, title, _study_section(anchor)) for anchor, title in study_for(task).sections]
    sections += [
        ("attention", "Attention patterns", _section_attention),
        ("patching", "Head patching", _section_patching),
        ("dla", "Direct logit attribution", _section_dla),
        ("circuits", "QK and OV circuits of every head", _section_circuits),
    ]
    return sections


# --- the page -----------------------------------------------------------------------------------------
def _resolve(model_or_name) -> tuple[HookedTransformer, str]:
    if isinstance(model_or_name, HookedTransformer):
        return model_or_name, model_or_name.cfg.model_name
    if isinstance(model_or_name, (str, os.PathLike)):
        return hc.load(model_or_name), str(model_or_name)
    raise TypeError(
        f"report needs a HookedTransformer, a shipped name or a checkpoint path, got {type(model_or_name).__name__}"
    )


def report(
    model_or_name, out: str | os.PathLike = "report.html", examples: int = 3, progress: bool = True
) -> Path:
    """Write one self-contained HTML page on what every head of a headcoop model does; returns its path.

    model_or_name: a HookedTransformer carrying a task (`model.task`), a shipped name ("count01",
                   "skip-pair", "skip-pair-dhead1") or a checkpoint folder.
    out:           the HTML file to write (parent folders are created).
    examples:      how many inputs get a circuitsvis attention view (per layer).
    progress:      show a tqdm bar over the sections.
    Sections: task and configuration, accuracy, per-head metrics (patch effect, DLA, probes; Count01:
    hc.head_metrics; SkipPair: preference orderings), Count01 (w01, w02) head map or SkipPair orderings,
    attention views, head-patching heatmaps ([layer, head] and [layer, pos, head]), DLA bars, QK / OV
    heatmaps per head. plotly.js and the circuitsvis bundle are inlined once each: no network needed.
    """
    if not isinstance(examples, int) or isinstance(examples, bool) or examples < 1:
        raise ValueError(f"examples must be a positive int, got {examples!r}")
    out = check_out_file(out, "report")
    model, source = _resolve(model_or_name)
    task = require_task(model, "the report's inputs and metrics")
    clean, corrupt = task.patching_inputs()
    ctx = _Context(model=model, task=task, source=source, examples=examples, clean=clean, corrupt=corrupt)
    sections = _sections(task)
    start = time.perf_counter()
    bodies = []
    bar = tqdm(sections, desc="report", unit="section", disable=not progress)
    for anchor, title, build in bar:
        bar.set_postfix_str(anchor)
        bodies.append(f"<section id='hc-sec-{anchor}'><h2>{_esc(title)}</h2>\n{build(ctx)}\n</section>")
    bar.close()
    elapsed = time.perf_counter() - start

    nav = " ".join(f"<a href='#hc-sec-{anchor}'>{_esc(title)}</a>" for anchor, title, _ in sections)
    title = f"headcoop report: {source} ({model.cfg.model_name})"
    page = "\n".join([
        "<!DOCTYPE html>", "<html lang='en'><head><meta charset='utf-8'>", f"<title>{_esc(title)}</title>",
        f"<style>{_CSS}</style>",
        f'<script type="text/javascript">{plotly.offline.get_plotlyjs()}</script>',
        "</head><body>",
        f"<h1>{_esc(title)}</h1>",
        _note(f"headcoop {hc.__version__}; built in {elapsed:.1f} s. Works offline: every script is inlined."),
        f"<nav>{nav}</nav>", *bodies, "</body></html>",
    ])  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.{os.getpid()}.partial")
    partial.write_text(page, encoding="utf-8")
    os.replace(partial, out)  # a killed report never leaves half a page
    return out


# --- command line ---------------------------------------------------------------------------------------
def _cmd_report(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    path = report(args.model, out=args.out, examples=args.examples, progress=not args.no_progress)
    size = path.stat().st_size / 2**20
    print(f"wrote {path} ({size:.1f} MB) in {time.perf_counter() - start:.1f} s; open it in a browser (works offline)")
    return 0
