"""`hc.report(model)` / `headcoop report NAME_OR_PATH`: one self-contained HTML page on what every head does.

The page holds the task and configuration, accuracy, a per-head metrics table, circuitsvis attention views
on a few inputs, the head-patching heatmaps, DLA bars, every head's QK and OV tables as heatmaps, and the
task's own head picture: the (w01, w02) head map for Count01, the preference orderings for SkipPair.

It works offline: plotly.js and the circuitsvis bundle are each inlined once (no CDN, no `<script src>`),
so the file opens in a browser with the network cut. Each plotly figure is a `<div id="hc-fig-N">`; each
attention view a circuitsvis `<div id="circuits-vis-...">` (tests check both draw in headless Chromium).
"""

from __future__ import annotations

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
from markupsafe import Markup
from torch import Tensor
from headcoop.progress import tqdm
from headcoop.tl import HookedTransformer

import headcoop as hc
from headcoop.checks import check_out_file
from headcoop.analysis.attention import attention_data
from headcoop.pages import Code, Details, Figure, Html, Section, Table, Text, render, stylesheet
from headcoop.views import attention_heads_html, circuitsvis_bundle
from headcoop.analysis.common import head_names, require_model, require_task
from headcoop.analysis.copies import task_score
from headcoop.bridge import is_bridge, is_hf_folder, kind_label, load_folder
from headcoop.studies import study_for
from headcoop.tasks.base import Batch, Task

# --- what the sections share --------------------------------------------------------------------------
@dataclasses.dataclass
class _Context:
    """The model and inputs every section reads, and results the sections share."""

    model: HookedTransformer
    task: Task
    source: str
    examples: int
    clean: Batch
    corrupt: Batch
    head_table: pd.DataFrame | None = None
    exact_limit_s: float = 60.0  # by-position patching longer than this (predicted) is shown as AtP* estimates
    _memo: dict = dataclasses.field(default_factory=dict)

    @property
    def metric(self):
        """The task's metric on the clean batch, passed to every analysis (the model's own `task` is not read)."""
        return task_score(self.task, self.clean)

    def once(self, key: str, compute: Callable):
        """`compute()` the first time `key` is asked for, the stored value after (sections share results)."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def patch(self, positions: str = "all"):
        """hc.patch of every head's z on the clean / corrupt batches (denoising)."""
        return self.once(
            f"patch-{positions}",
            lambda: hc.patch(self.model, clean=self.clean, corrupt=self.corrupt, metric=self.metric, positions=positions),
        )

    def patch_each(self, threshold_s: float):
        """Every head's z patched at each position: the exact sweep, or, where it would take longer than
        `threshold_s` (extrapolated from the verified cells of an AtP* run), that run's estimates, verified on
        their top 20 cells and 20 sampled ones. Returns (PatchResult or AttributionResult, predicted exact s)."""
        def compute():
            estimate = hc.attribute(self.model, clean=self.clean, corrupt=self.corrupt, metric=self.metric, estimator="atp*",
                                    verify=20, sample=20)  # fmt: skip
            verified = max(1, int(estimate.verified.sum()))
            predicted = estimate.cost["verification_s"] / verified * estimate.values.numel()
            return (estimate if predicted > threshold_s else self.patch("each")), predicted
        return self.once(f"patch-each-{threshold_s}", compute)

    def dla(self):
        """hc.dla on the clean batch."""
        return self.once("dla", lambda: hc.dla(self.model, self.clean))


RATIO_COLUMNS = ("w01", "w02")  # ratios spanning decades: significant digits, not decimals


def _table(df: pd.DataFrame, index: bool = True, digits: int = 3) -> Table:
    def cell(value) -> str:
        if isinstance(value, float) and value != value:
            return ""
        return f"{value:.{digits}f}" if isinstance(value, float) else str(value)

    frame = df.copy()
    for column in RATIO_COLUMNS:
        if column in frame:
            frame[column] = [f"{v:.3g}" for v in frame[column]]
    return Table(frame, index=index, cell=cell)


def _note(text: str) -> Text:
    return Text(text)


# --- sections: each returns its blocks (headcoop.pages), never markup ----------------------------------
def _section_overview(ctx: _Context) -> tuple:
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
    shown = task.vocab[:64]
    vocab = ", ".join(f"{i}: {t}" for i, t in enumerate(shown)) + (f", ... ({task.d_vocab} in all)" if task.d_vocab > 64 else "")
    return (
        Text(Markup("<p><b>Model:</b> <code>{}</code> &nbsp; <b>Task:</b> <code>{}</code></p>").format(ctx.source, repr(task)), note=False),  # fmt: skip
        Code(doc),
        Text(Markup("<p><b>Vocabulary</b> (id: token): {}</p>").format(vocab), note=False),
        Text(
            Markup("<p><b>An example</b>: <code>{}</code>, answer <code>{}</code> at position {}</p>").format(
                task.decode(example.tokens[0, :end]), task.token_strings([int(example.answer[0])])[0], int(example.answer_pos[0])
            ),
            note=False,
        ),
        Text("<h3>Configuration</h3>", note=False),
        _table(config),
    )


def _section_accuracy(ctx: _Context) -> tuple:
    metrics = ctx.task.evaluate(ctx.model)
    frame = pd.DataFrame({"value": list(metrics.values())}, index=list(metrics))
    return (
        Text(Markup("<code>task.evaluate(model)</code> on fresh samples of {}.").format(repr(ctx.task))),
        _table(frame, digits=4),
    )


def _section_heads(ctx: _Context) -> tuple:
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
    probe_batch = task.patching_inputs(n=1024, seed=1)[0]
    if study.generic_probes and len(probe_batch.labels.unique()) > 1 and len(probe_batch) < 8:
        notes.append(f"<b>probes</b>: left out: {len(probe_batch)} inputs are too few to train a probe and hold "
                     "some out (at least 8 are needed).")  # fmt: skip
    elif study.generic_probes and len(probe_batch.labels.unique()) > 1:
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
    return (*map(_note, notes), _table(table))


def _share(result) -> Tensor:
    """PatchResult.normalized(), or NaN everywhere when clean and corrupt runs score the same (no gap)."""
    if result.clean_value == result.corrupt_value:
        return torch.full_like(result.values, float("nan"))
    return result.normalized()


def _section_attention(ctx: _Context) -> tuple:
    """One circuitsvis view per (layer, example); their render calls run after the bundle, at the page's end."""
    n = min(ctx.examples, len(ctx.clean))
    views = [view for layer in range(ctx.model.cfg.n_layers)
             for view in attention_data(ctx.model, ctx.clean, layer=layer, example=0, max_examples=n)]  # fmt: skip
    markup, script = attention_heads_html(views, bundle=False)
    return (
        _note(
            f"Attention patterns of every head on {n} inputs of the task's patching batch (query rows, key "
            "columns; hover a head to enlarge it, click to lock). Rendered by circuitsvis, offline."
        ),
        Html(markup, script),
    )


def _section_patching(ctx: _Context) -> tuple:
    model = ctx.model
    heads = ctx.patch()
    each, predicted = ctx.patch_each(ctx.exact_limit_s)
    n_layers = model.cfg.n_layers
    height = max(360, 140 + 28 * model.cfg.n_heads) * n_layers
    gap = heads.clean_value != heads.corrupt_value  # else show the raw metric: there is no gap to share
    blocks = [
        _note(
            f"Denoising: run the corrupt inputs (<code>task.corrupt</code>) and patch in one head's clean "
            f"output <code>z</code>. Values are the share of the clean&minus;corrupt gap restored (clean "
            f"mean logit diff {heads.clean_value:.3f}, corrupt {heads.corrupt_value:.3f})."
        ),
        Figure(heads.plot(normalized=gap, title="head patching: all positions (exact)"), height=300 + 40 * n_layers),
    ]
    if isinstance(each, hc.AttributionResult):
        m = each.missed
        blocks += [
            _note(f"Patching one position at a time would take about {predicted:.0f} s exactly (more than "
                  f"{ctx.exact_limit_s:.0f} s, extrapolated from the verified cells), so the map below shows AtP* "
                  f"<b>estimates</b> (<code>hc.attribute</code>): {int(each.top.sum())} top cells and "
                  f"{int(each.sampled.sum())} sampled ones were patched exactly; an estimated {m.get('estimate', 0):.3g} "
                  f"(95% interval {m.get('low', 0):.3g}..{m.get('high', 0):.3g}) cells outside the top exceed the top's "
                  "smallest exact effect. The scatter compares the verified estimates with their exact values."),
            Figure(each.plot(kind="map"), height=height),
            Figure(each.plot(kind="scatter"), height=420),
        ]
    else:
        blocks.append(Figure(each.plot(normalized=gap, title="head patching: one position at a time (exact)"), height=height))
    return tuple(blocks)


def _section_dla(ctx: _Context) -> tuple:
    attr = ctx.dla()
    return (
        _note(
            "Direct logit attribution at the answer position: each component's contribution to logit(answer) "
            f"&minus; logit(alternative), mean over {len(ctx.clean)} inputs, error bars one std. The components "
            "sum to the model's logit difference exactly."
        ),
        Figure(attr.plot()),
    )


MAX_REPORT_PLAYERS = 10  # beyond this many heads, only models whose coalitions need no forward pass


MAX_REPORT_PAIRS_HEADS = 32  # hc.cooperation's coalitions grow as the square of the heads: up to 32 heads here


def _section_cooperation(ctx: _Context) -> tuple:
    """The mechanism of every pair of heads and each head's role (hc.cooperation), then Shapley values and
    pairwise interactions on accuracy (hc.interactions) where the coalitions are few enough."""
    from headcoop.analysis.cooperation import MECHANISMS, cooperation
    from headcoop.analysis.interactions import interactions

    model = ctx.model
    n = model.cfg.n_layers * model.cfg.n_heads
    linear = model.cfg.n_layers == 1 and model.cfg.attn_only and model.cfg.normalization_type is None
    exact_limit = 16 if linear else MAX_REPORT_PLAYERS
    blocks: list = []
    if n > MAX_REPORT_PAIRS_HEADS:
        blocks.append(_note(f"This model has {n} heads: too many pairs for this page. "
                            "<code>hc.cooperation(model, heads=[...])</code> names the mechanism of the heads you choose."))  # fmt: skip
    else:
        # one reference draw per ablation above 16 heads: the family's cost grows with the draws on the
        # layer-by-layer path (a 32-head two-layer model takes minutes per draw)
        coop = cooperation(model, inputs=ctx.clean, metric="accuracy", reference=ctx.clean,
                           max_exact=max(2, exact_limit), draws=4 if n <= 16 else 1)  # fmt: skip
        shown = coop.to_dataframe()
        order = {m: k for k, m in enumerate(MECHANISMS)}
        shown = shown.iloc[shown.mechanism.map(order).argsort(kind="stable")].head(12)
        roles = coop.head_table.reset_index()[["head", "role", "role_agreement", "total_effect", "total_low",
                                               "total_high", "direct_effect", "via", "backs_up"]]  # fmt: skip
        counts = ", ".join(f"{int(c * len(coop.pairs) + 0.5)} {m}" for m, c in coop.shares.items() if c > 0)
        flips = f" What flips it: {html.escape(coop.flips)}." if coop.flips else ""
        blocks += [
            _note(
                "Which <b>mechanism</b> joins each pair of heads (<code>hc.cooperation</code>), read from separate "
                "axes: what each head writes (<b>superposition</b>: both write to several completions consistent "
                "with the token they attend to, only the answer from both, sources distributed: the SkipPair "
                "post's mechanism), which heads the accuracy needs on each input (<b>redundant</b>: either alone "
                "answers; <b>division</b>: each answers its own inputs; <b>independent</b> where both are needed "
                "and their effects add, <b>not testable</b> where they add by construction), the sign of each "
                "head's total effect (<b>competition</b>) and whether one head's effect runs through a later one "
                "(<b>composition</b>). Each word is computed under a family of readings (zero, mean, resample "
                "and answer-aligned mean ablation, reference draws, every threshold at half and twice its "
                f"default: {len(coop.readings)} readings) and stands where {coop.agree:.0%} of them agree, else "
                f"<b>undetermined</b>. Overall: <b>{html.escape(coop.mechanism)}</b> in {coop.agreement:.0%} of "
                f"the readings.{flips} Pairs: {html.escape(counts)}. Rules and thresholds: the docstring of "
                f"<code>hc.cooperation</code>. {html.escape(coop.method)}."
            ),
            Figure(coop.plot(), height=520),
            _note("Each head's <b>role</b> (supports / competes / inactive: the sign of its total effect on the "
                  "accuracy, else of its isolated effect, else of the margin's, with a 95% interval that excludes "
                  "0), the share of readings that agree, whether its support is direct or through later heads, "
                  "and the heads whose answers it restores when they are ablated (<code>backs_up</code>):"),
            _table(roles, index=False, digits=4),
            _note(f"Pairs, {len(shown)} of {len(coop.pairs)}, with the share of readings that agree and what flips "
                  "the word:"),
            _table(shown[["head_a", "head_b", "mechanism", "agreement", "flips_under", "reason", "matters", "or", "and",
                          "a_only", "b_only", "multi", "only_answer", "interaction"]], index=False, digits=3),  # fmt: skip
        ]
    if n > 16 or (n > MAX_REPORT_PLAYERS and not linear):
        blocks.append(_note(f"This model has {n} heads: too many coalitions for Shapley values on this page. "
                            "<code>hc.interactions(model, method=\"sampled\")</code> estimates them."))  # fmt: skip
        return (*blocks, *_head_to_head(ctx))
    result = interactions(model, ctx.clean, metric="accuracy", how="mean", reference=ctx.clean.tokens)
    pairs = result.to_dataframe()
    pairs = pairs.reindex(pairs.interaction.abs().sort_values(ascending=False).index).head(12)
    return (
        *blocks,
        _note(
            "Each head's <b>Shapley value</b>: its average contribution to the accuracy over every coalition of "
            "the other heads (heads outside a coalition mean-ablated over these inputs); they sum to "
            f"v(all) &minus; v(none) = {result.v_full:.3f} &minus; {result.v_empty:.3f}. The <b>interaction "
            "index</b> of a pair: negative when the two substitute for each other on average, positive when the "
            "pair is worth more than its parts on average (<b>synergistic</b>: a division of labour and "
            "superposition both can give it), within 5% of |v(all) &minus; v(none)|: independent. "
            f"Overall: <b>{html.escape(result.model_verdict)}</b> ({html.escape(result.method)})."
        ),
        Figure(result.plot(title="Shapley values and pairwise interactions (accuracy)"), height=460),
        _note(f"The {len(pairs)} strongest pairs of {len(result.to_dataframe())}:"),
        _table(pairs, index=False, digits=4),
        *_head_to_head(ctx),
    )


def _head_to_head(ctx: _Context) -> tuple:
    """For models with two or more layers: path patching (causal) beside composition scores (weights)."""
    from headcoop.analysis.composition import composition
    from headcoop.analysis.path_patching import path_patch

    model = ctx.model
    if model.cfg.n_layers < 2:
        return ()
    blocks = [_note(
        "Head to head: <b>path patching</b> (<code>hc.path_patch</code>) patches only a sender head's clean output "
        "into a later receiver head's query, key or value input (the receiver's LayerNorm scale frozen), every "
        "other path as in the corrupt run: the share of the clean&minus;corrupt gap restored. <b>Composition "
        "scores</b> (<code>hc.composition</code>) are the weights-only evidence for the same pairs."
    )]  # fmt: skip
    try:
        paths = path_patch(model, clean=ctx.clean, corrupt=ctx.corrupt, metric=ctx.metric)
        blocks.append(Figure(paths.plot(), height=460))
    except ValueError as err:  # a block layout path patching does not model: say so
        blocks.append(_note(html.escape(str(err))))
    blocks.append(Figure(composition(model).plot(), height=420))
    return tuple(blocks)


def _section_circuits(ctx: _Context) -> tuple:
    model = ctx.model
    blocks = [
        _note(
            "QK: pre-softmax attention score of a query token on a key token (<code>hc.qk</code>). OV: change "
            "in each output logit when the head attends fully to a source token (<code>hc.ov</code>). Layers "
            "after the first: direct path (the head reading the embeddings)."
        )
    ]
    if model.cfg.d_vocab > MAX_DRAWN_VOCAB:
        blocks.append(_note(
            f"This model has {model.cfg.d_vocab} tokens: its QK and OV tables are too large to draw here. "
            "<code>hc.qk(model, head, layer)</code> and <code>hc.ov(...)</code> compute them."
        ))  # fmt: skip
        return tuple(blocks)
    for i, name in enumerate(head_names(model)):
        layer, head = divmod(i, model.cfg.n_heads)
        try:
            qk = hc.qk(model, head=head, layer=layer)
            # a positional table (rotary, learned positions) has (token x position)^2 cells: draw the token x
            # token slice with query and key at the last position, say so once
            last = qk.scores.shape[1] - 1 if qk.positional else None
            figures = (qk.plot(q_pos=last, k_pos=last), hc.ov(model, head=head, layer=layer).plot())
        except ValueError as err:  # a model the tables do not model: say so once, draw nothing
            blocks.append(_note(html.escape(str(err))))
            break
        if i == 0 and last is not None:
            blocks.append(_note(
                "These QK scores depend on positions too: each drawing is the token &times; token slice with the "
                f"query and the key at position {last}; <code>hc.qk(model, head, layer).to_dataframe()</code> "
                "holds every (token, position) pair."
            ))  # fmt: skip
        # inside a closed <details> a figure has no width to fill: give it one
        squares = tuple(Figure(f, height=_square(f), width=_square(f) + 120) for f in figures)
        blocks.append(Details(name, squares, open=i == 0))
    return tuple(blocks)


MAX_DRAWN_VOCAB = 64  # QK / OV heatmaps of larger vocabularies are not drawn


def _square(fig: go.Figure) -> int:
    """A heatmap's height in pixels: about 14 px a row (positional tables have many), within 380..1200."""
    return min(1200, max(380, 200 + 14 * len(fig.data[0].y)))


def _study_section(anchor: str) -> Callable[[_Context], tuple]:
    """The builder of a study's section: the study supplies data, rendered like every other section."""

    def build(ctx: _Context) -> tuple:
        table = ctx.head_table if ctx.head_table is not None else pd.DataFrame()
        part = study_for(ctx.task).section(anchor, ctx.model, ctx.task, table)
        blocks = [_note(n) for n in part.notes]
        if part.table is not None:
            blocks.append(_table(part.table))
        if part.figure is not None:
            blocks.append(Figure(part.figure, height=part.figure_height))
        return tuple(blocks)

    return build


def _sections(task: Task) -> list[tuple[str, str, Callable[[_Context], tuple]]]:
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
        ("cooperation", "Cooperation: mechanisms, roles, Shapley values and interactions", _section_cooperation),
        ("circuits", "QK and OV circuits of every head", _section_circuits),
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
        from headcoop.checkpoints import SHIPPED
        from headcoop.foreign import CONFIG

        if not (isinstance(model_or_name, str) and model_or_name in SHIPPED) and (Path(model_or_name) / CONFIG).is_file():
            from headcoop.foreign import load_model

            return load_model(model_or_name), str(model_or_name)  # a plain TransformerLens export
        return hc.load(model_or_name), str(model_or_name)
    raise TypeError(
        f"report needs a HookedTransformer, a TransformerBridge, a shipped name, a checkpoint path or a Hugging Face "
        f"model folder, got {type(model_or_name).__name__}"
    )


def report_sections(
    model: HookedTransformer, source: str = "", examples: int = 3, progress: bool = True, task: Task | None = None,
    exact_limit_s: float = 60.0,
) -> list[Section]:
    """Every section of the report as data (headcoop.pages.Section): what `report` renders. `task`
    (default: the model's own) supplies the inputs and the metric; by-position head patching predicted to
    take longer than `exact_limit_s` is shown as verified AtP* estimates."""
    task = task if task is not None else require_task(model, "the report's inputs and metrics (pass task=)")
    clean, corrupt = task.patching_inputs()
    ctx = _Context(model=model, task=task, source=source or model.cfg.model_name, examples=examples, clean=clean,
                   corrupt=corrupt, exact_limit_s=exact_limit_s)  # fmt: skip
    sections = []
    bar = tqdm(_sections(task), desc="report", unit="section", disable=not progress)
    for anchor, title, build in bar:
        bar.set_postfix_str(anchor)
        sections.append(Section(title, build(ctx), anchor=anchor))
    bar.close()
    return sections


def report(
    model_or_name, out: str | os.PathLike = "report.html", examples: int = 3, progress: bool = True,
    task: Task | None = None, exact_limit_s: float = 60.0,
) -> Path:
    """Write one self-contained HTML page on what every head of a headcoop model does; returns its path.

    model_or_name: a HookedTransformer carrying a task (`model.task`), a shipped name ("count01",
                   "skip-pair", "skip-pair-dhead1") or a checkpoint folder.
    out:           the HTML file to write (parent folders are created).
    examples:      how many inputs get a circuitsvis attention view (per layer).
    progress:      show a tqdm bar over the sections.
    task:          the task whose inputs and metric the report uses (default: the model's own); for a
                   model headcoop never trained, a contrast of your prompts (`hc.contrast`).
    exact_limit_s: by-position head patching predicted (from an AtP* run's verified cells) to take longer
                   than this is shown as AtP* estimates (`hc.attribute`, verified on 40 cells) beside the
                   exact all-positions map.
    Sections: task and configuration, accuracy, per-head metrics (patch effect, DLA, probes; Count01:
    hc.head_metrics; SkipPair: preference orderings), Count01 (w01, w02) head map or SkipPair orderings,
    attention views, head-patching heatmaps ([layer, head] and [layer, pos, head]), DLA bars, QK / OV
    heatmaps per head. plotly.js and the circuitsvis bundle are inlined once each: no network needed.
    The page is rendered from headcoop/templates/report.html.j2 (Jinja2, autoescaped).
    """
    if not isinstance(examples, int) or isinstance(examples, bool) or examples < 1:
        raise ValueError(f"examples must be a positive int, got {examples!r}")
    out = check_out_file(out, "report")
    model, source = _resolve(model_or_name)
    if task is not None:
        if not isinstance(task, Task):
            raise TypeError(f"task must be a headcoop Task such as hc.contrast(...), got {type(task).__name__}")
        task.check_ready(model, "report")
    start = time.perf_counter()
    # the task reaches every analysis as arguments (inputs, `task_score` as the metric): model.task is not set
    sections = report_sections(model, source, examples=examples, progress=progress, task=task,
                               exact_limit_s=exact_limit_s)  # fmt: skip
    elapsed = time.perf_counter() - start
    calls = [b.script for s in sections for b in s.blocks if isinstance(b, Html) and b.script]
    page = render(
        "report.html.j2",
        title=f"headcoop report: {source} ({model.cfg.model_name})",
        note=f"headcoop {hc.__version__}; built in {elapsed:.1f} s. Works offline: every script is inlined.",
        sections=sections,
        css=Markup(stylesheet()),
        plotlyjs=Markup(plotly.offline.get_plotlyjs()),
        scripts=[Markup("\n".join([circuitsvis_bundle(), *calls]))] if calls else [],
        plotly_div=_PlotlyDivs(),
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.{os.getpid()}.partial")
    try:
        partial.write_text(page, encoding="utf-8")
        out = check_out_file(out, "report")  # still a regular file (or absent) now that the page is ready
        os.replace(partial, out)  # a killed report never leaves half a page
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return out
