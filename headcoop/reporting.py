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
import warnings
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
from headcoop.checks import check_out_file, check_time_budget
from headcoop.folders import replace_file
from headcoop.analysis.nodes.attention import attention_data
from headcoop.analysis.mechanisms.cooperation import ALL_PAIRS_UP_TO
from headcoop.pages import Code, Details, Figure, Html, Section, Table, Text, render, stylesheet
from headcoop.views import attention_heads_html, circuitsvis_bundle
from headcoop.analysis.engine.inputs import model_device, parse_heads, require_model, require_task
from headcoop.analysis.engine.copies import task_score
from headcoop.analysis.vocabulary import head_name
from headcoop.bridge import is_bridge, is_hf_folder, kind_label, load_folder
from headcoop.studies import study_for
from headcoop.tasks.base import Batch, Task

# --- what the sections share --------------------------------------------------------------------------
EXACT_PATCH = "exact head patching (all positions)"
ESTIMATED_PATCH = "AtP* estimates of head patching (all positions), 24 heads verified"
EACH_PATCH = "head patching one position at a time (AtP* estimates, 40 cells verified)"
RESERVE_S = 7.0  # of the budget, kept for drawing and writing the page (about 5 s for a 7 MB page on 2 cores)


@dataclasses.dataclass
class _Budget:
    """The report's time: `limit_s` seconds of wall time from `start` (None: no limit). An analysis is run
    when its predicted cost (forward passes of the patching batch, each `forward_s` as measured once on this
    machine) fits in what is left; otherwise it is left out, and the page says what it would have cost and
    the call that runs it."""

    limit_s: float | None
    forward_s: float
    start: float = dataclasses.field(default_factory=time.perf_counter)
    left_out: list = dataclasses.field(default_factory=list)  # (what, predicted s, how to run it, s left then)
    setup: str = ""  # the Python that gives a left-out call its `model`, `clean` and `corrupt`

    def remaining(self) -> float:
        if self.limit_s is None:
            return float("inf")
        return self.limit_s - (time.perf_counter() - self.start) - RESERVE_S

    def afford(self, what: str, forwards: float, how: str) -> bool:
        """Whether `what`, predicted at `forwards` forward passes, fits; if not it is listed as left out."""
        predicted, left = forwards * self.forward_s, self.remaining()
        if predicted <= left:
            return True
        self.left_out.append((what, predicted, how, left))
        return False

    def was_left_out(self, what: str) -> bool:
        return any(row[0] == what for row in self.left_out)

    def note(self, what: str) -> Text:
        """The page's words for an analysis left out."""
        _, predicted, how, left = next(row for row in self.left_out if row[0] == what)
        return Text(Markup(
            "<p class=\"note\"><b>Left out to stay within the report's budget:</b> {} (predicted {:.0f} s on this "
            "machine; {:.0f} s of the {:.0f} s budget were left). Run it with <code>{}</code> (after <code>{}</code>), "
            "or give the report a larger budget (<code>--budget</code>, <code>hc.report(budget_s=...)</code>) or "
            "fewer heads (<code>--heads</code>).</p>"
        ).format(what, predicted, max(0.0, left), self.limit_s or 0, how, self.setup), note=False)


def _forward_seconds(model: HookedTransformer, tokens: Tensor) -> float:
    """Wall time of one forward pass of `tokens`: the quickest of three after one that warms up (one timed
    pass read 3x slow under a passing load, and every prediction of the report scales with it)."""
    times = []
    with torch.no_grad():
        model(tokens)
        for _ in range(3):
            start = time.perf_counter()
            model(tokens)
            times.append(time.perf_counter() - start)
            if sum(times) > 5.0:  # a slow model: the first passes are enough
                break
    return max(min(times), 1e-5)


def _depth(model: HookedTransformer, layer: int) -> float:
    """The share of a forward pass a copy starting at `layer` runs (a Bridge's copies run from the tokens)."""
    return 1.0 if is_bridge(model) else (model.cfg.n_layers - layer) / model.cfg.n_layers


def _gradient_cost(model: HookedTransformer) -> float:
    """Forward passes AtP*'s estimate takes: the clean and corrupt runs, the backward pass, and GradDrop's
    pass per layer (measured on a GPT-2-small-shaped Bridge: 14.7 passes' time for 12 layers)."""
    return 2 + model.cfg.n_layers


@dataclasses.dataclass
class _Context:
    """The model and inputs every section reads, the heads the report covers, its budget, and results the
    sections share."""

    model: HookedTransformer
    task: Task
    source: str
    examples: int
    clean: Batch
    corrupt: Batch
    heads: list[tuple[int, int]] | None = None  # None: every head
    budget: _Budget | None = None
    head_table: pd.DataFrame | None = None
    exact_limit_s: float = 60.0  # by-position patching longer than this (predicted) is shown as AtP* estimates
    _memo: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.heads is None:
            self.heads = [(lay, h) for lay in range(self.model.cfg.n_layers) for h in range(self.model.cfg.n_heads)]
        if self.budget is None:
            self.budget = _Budget(None, _forward_seconds(self.model, self.clean.tokens))

    @property
    def all_heads(self) -> bool:
        return len(self.heads) == self.model.cfg.n_layers * self.model.cfg.n_heads

    @property
    def names(self) -> list[str]:
        """The covered heads' names ("L0H3"), in model order."""
        return [f"L{lay}H{h}" for lay, h in self.heads]

    @property
    def heads_arg(self) -> str:
        """The covered heads as the argument of a call shown on the page."""
        return "" if self.all_heads else f", heads={self.names!r}"

    @property
    def metric(self):
        """The task's metric on the clean batch, passed to every analysis (the model's own `task` is not read)."""
        return task_score(self.task, self.clean)

    def once(self, key: str, compute: Callable):
        """`compute()` the first time `key` is asked for, the stored value after (sections share results)."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def patch_cost(self, positions: int = 1) -> float:
        """Predicted forward passes of patching the covered heads: on a one-layer model (where each copy
        recomputes one head, far less than a pass) timed on one and on four heads and extrapolated; else the
        clean and corrupt runs, then one copy per head and position from the head's layer."""
        if self.model.cfg.n_layers == 1:
            return self.once(f"patch-cost-{positions}", lambda: self._probed_patch(positions)) / self.budget.forward_s
        return 2 + positions * sum(_depth(self.model, lay) for lay, _ in self.heads)

    def _probed_patch(self, positions: int) -> float:
        """Seconds of hc.patch on every covered head, from its time on the first head and on the first four."""
        where = "all" if positions == 1 else "each"
        times = []
        for heads in dict.fromkeys((tuple(self.heads[:1]), tuple(self.heads[:4]))):
            start = time.perf_counter()
            hc.patch(self.model, clean=self.clean, corrupt=self.corrupt, metric=self.metric, positions=where,
                     heads=list(heads), progress=False)  # fmt: skip
            times.append(time.perf_counter() - start)
        if len(times) == 1:  # one head covered: the probe was the call
            return times[0]
        extra = min(4, len(self.heads)) - 1
        per = max(0.0, times[1] - times[0]) / extra
        return max(0.0, times[0] - per) + per * len(self.heads)

    def patch(self, positions: str = "all"):
        """hc.patch of the covered heads' z on the clean / corrupt batches (denoising); where that does not
        fit the budget and positions="all", AtP* estimates of it verified on 12 top and 12 sampled heads
        (an AttributionResult); None when neither fits (the exact map of every position: see patch_each)."""
        def compute():
            call = f"hc.patch(model, clean, corrupt{self.heads_arg})"
            if self.budget.afford(EXACT_PATCH, self.patch_cost(), call):
                return hc.patch(self.model, clean=self.clean, corrupt=self.corrupt, metric=self.metric,
                                positions=positions, heads=None if self.all_heads else self.heads, progress=False)  # fmt: skip
            atp = _gradient_cost(self.model) + 1.1 * 24 * max(_depth(self.model, lay) for lay, _ in self.heads)  # 24 heads
            if positions != "all" or not self.budget.afford(
                    ESTIMATED_PATCH, atp, "hc.attribute(model, clean, corrupt, positions='all', estimator='atp*')"):
                return None
            return hc.attribute(self.model, clean=self.clean, corrupt=self.corrupt, metric=self.metric, positions="all",
                                estimator="atp*", verify=12, sample=12, progress=False)  # fmt: skip
        return self.once(f"patch-{positions}", compute)

    def patch_each(self, threshold_s: float):
        """Every covered head's z patched at each position: the exact sweep, or, where it would take longer than
        `threshold_s` or the budget's remainder, AtP* estimates verified on their top 20 cells and 20 sampled
        ones; None when even those do not fit. Returns (PatchResult or AttributionResult or None, predicted
        exact s)."""
        def compute():
            n_pos = self.clean.tokens.shape[1]
            predicted = self.patch_cost(n_pos) * self.budget.forward_s
            if predicted <= min(threshold_s, self.budget.remaining()):
                return self.patch("each"), predicted
            atp = _gradient_cost(self.model) + 1.1 * 40 * max(_depth(self.model, lay) for lay, _ in self.heads)  # 40 cells
            if not self.budget.afford(EACH_PATCH, atp, "hc.attribute(model, clean, corrupt, estimator='atp*')"):
                return None, predicted
            estimate = hc.attribute(self.model, clean=self.clean, corrupt=self.corrupt, metric=self.metric,
                                    estimator="atp*", verify=20, sample=20, progress=False)  # fmt: skip
            return estimate, predicted
        return self.once(f"patch-each-{threshold_s}", compute)

    def ranked_heads(self) -> tuple[list[tuple[int, int]], str]:
        """The covered heads, the largest patching effect first (the patching section's `patch()`: exact, else
        AtP*'s ranking), and what ranked them; in model order, with "", where patching did not fit."""
        result = self.patch()
        if result is None:
            return list(self.heads), ""
        frame = result.to_dataframe()
        estimated = isinstance(result, hc.AttributionResult)
        size = frame["score"] if estimated else (frame["value"] - result.corrupt_value).abs()
        order = [(int(lay), int(h)) for lay, h in frame.assign(size=size).sort_values("size", ascending=False,
                                                                                      kind="stable")[["layer", "head"]].to_numpy()]  # fmt: skip
        covered = set(self.heads)
        return [h for h in order if h in covered], "AtP* estimates of patching" if estimated else "exact patching"

    def narrowed(self, heads: list[tuple[int, int]]) -> "_Context":
        """The same model, inputs and budget covering `heads` only, with results of its own."""
        return dataclasses.replace(self, heads=list(heads), head_table=None, _memo={})

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
    fields = [
        "model_name", "n_layers", "n_heads", "d_model", "d_head", "d_vocab", "n_ctx", "attn_only",
        "normalization_type", "positional_embedding_type", "attention_dir",
    ]  # fmt: skip
    config = pd.DataFrame({"value": [str(getattr(cfg, f)) for f in fields]}, index=fields)
    n_params = sum(p.numel() for p in model.parameters())
    n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    config.loc["parameters (trainable)"] = f"{n_params} ({n_trainable})"
    blocks = [Text(Markup("<p><b>Model:</b> <code>{}</code> &nbsp; <b>Task:</b> <code>{}</code></p>").format(ctx.source, repr(task)), note=False)]  # fmt: skip
    if not task.fixed_inputs:  # a task of its own (the toy tasks): its module says what it is
        blocks.append(Code((sys.modules[type(task).__module__].__doc__ or "").strip()))
    if task.d_vocab <= 64:
        shown = ", ".join(f"{i}: {t}" for i, t in enumerate(task.vocab))
        blocks.append(Text(Markup("<p><b>Vocabulary</b> (id: token): {}</p>").format(shown), note=False))
    else:
        differs = "" if task.d_vocab == cfg.d_vocab else f" (the model's unembedding has {cfg.d_vocab}: the task's tokenizer or vocabulary counts {task.d_vocab - cfg.d_vocab:+d})"
        blocks.append(Text(Markup("<p><b>Vocabulary</b>: {} tokens{}.</p>").format(task.d_vocab, differs), note=False))
    where = "fixed prompts (the same every run)" if task.fixed_inputs else "inputs drawn from the task (seed 0)"
    blocks += [
        Text(Markup("<p><b>Inputs</b>: every analysis below reads the same {} {}, {}; the corrupt "
                    "prompt of each differs from its clean prompt where the task says, and the metric compares "
                    "the answer's logit with the alternative's at the answer position.</p>"
                    ).format(len(ctx.clean), where, _lengths(ctx.clean)), note=False),  # fmt: skip
        _table(_examples(ctx, 4), index=False),
        Text("<h3>Configuration</h3>", note=False),
        _table(config),
    ]
    if not ctx.all_heads:
        blocks.insert(1, Text(Markup("<p><b>Heads covered</b> (<code>--heads</code>): {} of {}.</p>").format(
            ", ".join(ctx.names), cfg.n_layers * cfg.n_heads), note=False))  # fmt: skip
    return tuple(blocks)


def _lengths(batch) -> str:
    """How long the prompts are, read up to each one's answer position: "16 tokens long", or "5 to 16 tokens
    long (padded to 16)" for prompts of mixed length."""
    lengths = batch.answer_pos.cpu() + 1
    width = batch.tokens.shape[1]
    low, high = int(lengths.min()), int(lengths.max())
    if low == high == width:
        return f"{width} tokens long"
    return (f"{low} to {high} tokens long" if low != high else f"{high} tokens long") + f" (padded to {width})"


def _examples(ctx: _Context, n: int) -> pd.DataFrame:
    """The first `n` clean / corrupt prompts with their answers, as the task's tokens."""
    task, rows = ctx.task, []
    for i in range(min(n, len(ctx.clean))):
        end = int(ctx.clean.loss_pos[i].max()) + 1
        wrong = ctx.clean.wrong[i]
        rows.append({
            "clean prompt": task.decode(ctx.clean.tokens[i, :end]),
            "corrupt prompt": task.decode(ctx.corrupt.tokens[i, :end]),
            "answer": task.token_strings([int(ctx.clean.answer[i])])[0],
            "alternative": task.token_strings([int(wrong)])[0],
            "at position": int(ctx.clean.answer_pos[i]),
        })  # fmt: skip
    return pd.DataFrame(rows)


def _section_accuracy(ctx: _Context) -> tuple:
    metrics = ctx.task.evaluate(ctx.model)
    frame = pd.DataFrame({"value": list(metrics.values())}, index=list(metrics))
    said = "on its {} fixed prompts" if ctx.task.fixed_inputs else "on fresh samples of {}"
    what = len(ctx.clean) if ctx.task.fixed_inputs else repr(ctx.task)
    return (
        Text(Markup("<code>task.evaluate(model)</code> " + said + ".").format(what)),
        _table(frame, digits=4),
    )


def _section_heads(ctx: _Context) -> tuple:
    model, task = ctx.model, ctx.task
    names = ctx.names
    patched, attr = ctx.patch(), ctx.dla()
    diff = attr.logit_diff()[:, [attr.components.index(n) for n in names]]  # [batch, head]
    table = pd.DataFrame(
        {
            "DLA logit diff": diff.mean(0).cpu().numpy(),
            "DLA std": diff.std(0, unbiased=False).cpu().numpy(),
        },
        index=pd.Index(names, name="head"),
    )
    notes = []
    if patched is not None:
        share = _share(patched).reshape(-1)
        flat = [lay * model.cfg.n_heads + h for lay, h in ctx.heads]
        estimated = isinstance(patched, hc.AttributionResult)
        table.insert(0, "patch effect (AtP* estimate)" if estimated else "patch effect", share[flat].numpy())
        notes.append(
            "<b>patch effect</b>: share of the clean &minus; corrupt gap in mean logit difference (right answer "
            "minus the alternative) restored by patching the head's output <code>z</code> from the clean run into "
            f"the corrupt run (<code>hc.patch</code> on {len(ctx.clean)} inputs; 1: the head alone restores it)."
            + (f" <b>Estimated</b>: exact patching of every head did not fit the budget, so these are AtP* estimates "
               f"(<code>hc.attribute</code>, positions='all'); {int(patched.verified.sum())} heads were patched "
               "exactly (the patching section compares them)." if estimated else "")
        )
    notes.append(
        "<b>DLA logit diff</b>: the head's direct contribution to logit(answer) &minus; logit(alternative) at "
        "the answer position, mean and std over the same inputs (<code>hc.dla</code>)."
    )
    blocks = [ctx.budget.note(w) for w in (EXACT_PATCH, ESTIMATED_PATCH) if ctx.budget.was_left_out(w)]
    study = study_for(task)
    probe_batch = task.patching_inputs(n=1024, seed=1)[0]
    if study.generic_probes and len(probe_batch.labels.unique()) > 1 and len(probe_batch) < 8:
        notes.append(f"<b>probes</b>: left out: {len(probe_batch)} inputs are too few to train a probe and hold "
                     "some out (at least 8 are needed).")  # fmt: skip
    elif study.generic_probes and len(probe_batch.labels.unique()) > 1:
        probes = hc.probe(model, probe_batch, probe_batch.labels, site="z", layer=None)
        keep = [probes.names.index(n) for n in names]
        table["probe acc"] = probes.acc[keep].numpy()
        table["probe ROC AUC"] = probes.roc_auc[keep].numpy()
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
    return (*blocks, *map(_note, notes), _table(table))


def _share(result) -> Tensor:
    """PatchResult.normalized(), or NaN everywhere when clean and corrupt runs score the same (no gap)."""
    if result.clean_value == result.corrupt_value:
        return torch.full_like(result.values, float("nan"))
    return result.normalized()


def _section_attention(ctx: _Context) -> tuple:
    """One circuitsvis view per (layer, example) for the layers of the covered heads; their render calls run
    after the bundle, at the page's end."""
    n = min(ctx.examples, len(ctx.clean))
    layers = sorted({lay for lay, _ in ctx.heads})
    views = [view for layer in layers
             for view in attention_data(ctx.model, ctx.clean, layer=layer, example=0, max_examples=n, task=ctx.task)]  # fmt: skip
    markup, script = attention_heads_html(views, bundle=False)
    return (
        _note(
            f"Attention patterns of every head of {'every layer' if len(layers) == ctx.model.cfg.n_layers else 'layers ' + ', '.join(map(str, layers))} "
            f"on {n} inputs of the patching batch (query rows, key columns; hover a head to enlarge it, click to "
            "lock). Rendered by circuitsvis, offline."
        ),
        Html(markup, script),
    )


def _section_patching(ctx: _Context) -> tuple:
    model = ctx.model
    heads = ctx.patch()
    each, predicted = ctx.patch_each(ctx.exact_limit_s)
    n_layers = model.cfg.n_layers
    height = max(360, 140 + 28 * model.cfg.n_heads) * n_layers
    blocks = [ctx.budget.note(w) for w in (EXACT_PATCH, ESTIMATED_PATCH) if ctx.budget.was_left_out(w)]
    if isinstance(heads, hc.AttributionResult):
        blocks += [
            _note("AtP* estimates of patching each head's clean output <code>z</code> into the corrupt run at all "
                  f"positions at once (<code>hc.attribute</code>): {int(heads.top.sum())} top heads and "
                  f"{int(heads.sampled.sum())} sampled ones patched exactly; the scatter compares them."),
            Figure(heads.plot(kind="map"), height=300 + 40 * n_layers),
            Figure(heads.plot(kind="scatter"), height=420),
        ]
    elif heads is not None:
        gap = heads.clean_value != heads.corrupt_value  # else show the raw metric: there is no gap to share
        blocks += [
            _note(
                f"Denoising: run the corrupt inputs and patch in one head's clean output <code>z</code>. Values are "
                f"the share of the clean &minus; corrupt gap restored (clean mean logit diff {heads.clean_value:.3f}, "
                f"corrupt {heads.corrupt_value:.3f})" + ("." if ctx.all_heads else "; heads not covered are blank.")
            ),
            Figure(heads.plot(normalized=gap, title="head patching: all positions (exact)"), height=300 + 40 * n_layers),
        ]
    if each is None:
        blocks.append(ctx.budget.note(EACH_PATCH))
    elif isinstance(each, hc.AttributionResult):
        m = each.missed
        why = (f"more than {ctx.exact_limit_s:.0f} s" if predicted > ctx.exact_limit_s
               else "more than the report's budget had left")  # fmt: skip
        blocks += [
            _note(f"Patching one position at a time would take about {predicted:.0f} s exactly ({why}, predicted "
                  f"from one timed forward pass), so the map below shows AtP* "
                  f"<b>estimates</b> (<code>hc.attribute</code>): {int(each.top.sum())} top cells and "
                  f"{int(each.sampled.sum())} sampled ones were patched exactly; an estimated {m.get('estimate', 0):.3g} "
                  f"(95% interval {m.get('low', 0):.3g}..{m.get('high', 0):.3g}) cells outside the top exceed the top's "
                  "smallest exact effect. The scatter compares the verified estimates with their exact values."),
            Figure(each.plot(kind="map"), height=height),
            Figure(each.plot(kind="scatter"), height=420),
        ]
    else:
        gap = each.clean_value != each.corrupt_value
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


# hc.cooperation reads every pair up to ALL_PAIRS_UP_TO heads, above it the top pairs only: the report covers
# cooperation up to that many heads (one source for the limit: cooperation's)
MAX_REPORT_PAIRS_HEADS = ALL_PAIRS_UP_TO
STAND_IN_HEADS = 4  # above that, cooperation of this many heads, those with the largest patching effect


def _section_cooperation(ctx: _Context) -> tuple:
    """The mechanism of every pair of covered heads and each head's role (hc.cooperation), then Shapley values
    and pairwise interactions on accuracy (hc.interactions) where they are exact and fit the budget, then
    head-to-head path patching and composition scores. One overall verdict: hc.cooperation's."""
    from headcoop.analysis.mechanisms.cooperation import MECHANISMS, cooperation
    from headcoop.analysis.games.interactions import MAX_EXACT, interactions

    model, k = ctx.model, len(ctx.heads)
    heads = None if ctx.all_heads else ctx.heads
    blocks: list = []
    cost = (lambda draws: _cooperation_forwards(ctx, draws)) if k >= 2 else (lambda draws: 0.0)  # noqa: E731
    draws = 4 if k <= 16 and cost(4) * ctx.budget.forward_s <= ctx.budget.remaining() else 1
    what = "hc.cooperation (the mechanism of every pair of heads)"
    if k < 2:
        blocks.append(_note(f"This report covers {k} head: cooperation is a word about pairs of heads, so this section "
                            "is left out. <code>--heads</code> with two or more heads (or <code>hc.cooperation(model, "
                            "heads=['L0H1', 'L0H2'])</code>) runs it."))  # fmt: skip
        return tuple(blocks)
    if k > MAX_REPORT_PAIRS_HEADS:
        mapped = _pair_map_blocks(ctx)
        if mapped is not None:
            return mapped
        ranked, by = ctx.ranked_heads()
        note = (f"This report covers {k} heads: too many pairs for hc.cooperation's words on this page (at most "
                f"{MAX_REPORT_PAIRS_HEADS}), and the pair map of all {k} heads (<code>hc.pair_map</code>) did not fit "
                f"the budget ({_map_left_out(ctx)}). <code>hc.cooperation(model, heads=[...])</code> names the "
                "mechanism of the heads you choose; <code>--heads</code> picks them for the report.")  # fmt: skip
        if not by:
            return (_note(note + " No ranking of the heads fit the budget, so nothing stands in here."),)
        top = ranked[:STAND_IN_HEADS]
        names = [head_name(*h) for h in top]
        return (_note(note + f" <b>Standing in</b>: the {len(top)} heads with the largest effect by {by} (the "
                      f"patching section's), {', '.join(names)}: <code>hc.cooperation(model, inputs=clean, "
                      f"heads={names!r})</code>."), *_section_cooperation(ctx.narrowed(top)))  # fmt: skip
    elif not ctx.budget.afford(what, cost(draws), f"hc.cooperation(model, inputs=clean, metric='accuracy', draws=1{ctx.heads_arg})"):
        blocks.append(ctx.budget.note(what))
    else:
        coop = cooperation(model, inputs=ctx.clean, heads=heads, metric="accuracy", reference=ctx.clean,
                           max_exact=max(2, MAX_EXACT), draws=draws, progress=False)  # fmt: skip
        shown = coop.to_dataframe()
        order = {m: i for i, m in enumerate(MECHANISMS)}
        shown = shown.iloc[shown.mechanism.map(order).argsort(kind="stable")].head(12)
        roles = coop.head_table.reset_index()[["head", "role", "role_agreement", "total_effect", "total_low",
                                               "total_high", "direct_effect", "via", "backs_up"]]  # fmt: skip
        counts = ", ".join(f"{int(c * len(coop.pairs) + 0.5)} {m}" for m, c in coop.shares.items() if c > 0)
        flips = f" What flips it: {html.escape(coop.flips)}." if coop.flips else ""
        blocks += [
            _note(f"<b>{html.escape(coop.summary)}</b>"),
            _note(
                "Which <b>mechanism</b> joins each pair of heads (<code>hc.cooperation</code>), each word its source's "
                "defining property: <b>superposition</b> (the SkipPair post: what a head copies from the token it "
                "attends to depends on the tokens it does not attend to; both write several completions and meet "
                "only on the answer; sources distributed), <b>redundant</b> (either alone answers), <b>division</b> "
                "(one head alone on each input), <b>conjunction</b> (both needed: the Count01 paper's \"only solve "
                "the original task in conjunction\"), <b>not testable</b> (a continuous metric additive over the "
                "two heads by construction), <b>competition</b> (one head's total effect opposes the answer) and "
                "<b>composition</b> (one head's effect runs through a later one); the model-level <b>same "
                "computation</b> axis reads the heads' per-input pushes without ablation. Each word is computed "
                f"under zero, mean and resample ablation (aligned by the answer position), {draws} reference "
                f"draw{'s' if draws > 1 else ''} each, every threshold at half and twice its default ("
                f"{len(coop.readings)} readings), each ablation kind one vote; an ablation that cannot see a pair "
                f"abstains. A word stands at {coop.agree:.0%} of the votes, else <b>undetermined</b>. <b>The "
                f"section's verdict: {html.escape(coop.mechanism)}</b> in {coop.agreement:.0%} of the votes.{flips} "
                f"Pairs: {html.escape(counts)}. Rules and thresholds: <code>headcoop/analysis/mechanisms/words.py</code>. "
                f"{html.escape(coop.method)}."
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
    return (*blocks, *_shapley(ctx, heads, MAX_EXACT, interactions), *_head_to_head(ctx))


PAIR_MAP_NAMED = 3  # pairs of the map the report names by hc.cooperation, as many as fit in the budget


def _pair_map_blocks(ctx: _Context) -> tuple | None:
    """Every pair's interaction (hc.pair_map: exact where its predicted cost fits the budget, else its screen),
    the strongest pairs named by hc.cooperation as far as the budget allows; None when neither fits (the
    budget lists the map as left out)."""
    from headcoop.analysis.pairs.compute import exact_passes, pair_map, screen_passes

    k, game, left = len(ctx.heads), _game(ctx), ctx.budget.remaining()
    exact, screen = exact_passes(game), screen_passes(game)
    call = f"hc.pair_map(model, clean, how='mean', reference=clean{ctx.heads_arg})"
    if exact * ctx.budget.forward_s <= left:
        method = "exact"
    elif ctx.budget.afford(f"the pair map of all {k} heads", screen, call):
        method = "screen"
    else:
        return None
    result = pair_map(ctx.model, ctx.clean, metric="logit_diff", how="mean", reference=ctx.clean,
                      heads=None if ctx.all_heads else ctx.heads, method=method, named=0, progress=False)  # fmt: skip
    strongest = result.interacting().head(PAIR_MAP_NAMED)
    fits = 0
    for row in strongest.itertuples():  # each pair's words cost about one 2-head hc.cooperation
        pair = parse_heads(ctx.model, [row.head_a, row.head_b])
        if not ctx.budget.afford("hc.cooperation's words for the map's strongest pairs",
                                 _cooperation_forwards(ctx.narrowed(pair), 1), f"result.with_words(model, clean, clean, {PAIR_MAP_NAMED})"):  # fmt: skip
            break
        fits += 1
    if fits:
        result = result.with_words(ctx.model, ctx.clean, ctx.clean, fits)
    predicted = (exact if method == "exact" else screen) * ctx.budget.forward_s
    lines = "<br>".join(html.escape(line) for line in result.lines())
    computed = result.to_dataframe()
    frame = computed.head(12)
    shown = [c for c in ("head_a", "head_b", "interaction", "relative", "effect_a", "effect_b", "pair_effect", "word",
                         "agreement", "flips_under", "role_a", "role_b") if c in frame.columns]  # fmt: skip
    blocks = [
        _note(f"<b>The pair map</b> (<code>hc.pair_map</code>): this report covers {k} heads, too many for "
              f"hc.cooperation's words on every pair (at most {MAX_REPORT_PAIRS_HEADS}), so every one of the "
              f"{k * (k - 1) // 2:,} pairs gets its interaction instead: I = v(both removed) - v(first removed) - "
              "v(second removed) + v(none removed), on the logit difference, mean ablation over the clean inputs "
              f"({'exact, every pair' if result.exact else 'screened by second-order attribution, its top and a sample computed exactly'}; "
              f"predicted {predicted:.0f} s, took {result.cost['seconds']:.0f} s). I &lt; 0: removing both costs more "
              "than the two removals apart (backups); I &gt; 0: less (each needs the other). The strongest "
              f"interacting pairs are named by hc.cooperation's reading family ({fits} of them fit the budget).<br>{lines}"),
        Figure(result.plot(), height=720),
    ]  # fmt: skip
    if fits:
        blocks.append(Figure(result.graph(), height=460))
    blocks += [_note(f"Pairs, the strongest {len(frame)} of {len(computed):,} computed exactly:"),
               _table(frame[shown], index=False, digits=4)]  # fmt: skip
    return tuple(blocks)


def _map_left_out(ctx: _Context) -> str:
    """Why the pair map is not on the page: its predicted time against the budget left."""
    row = next((r for r in ctx.budget.left_out if r[0].startswith("the pair map")), None)
    if row is None:
        return "not attempted"
    return f"its screen predicted {row[1]:.0f} s, {max(0.0, row[3]):.0f} s were left"


def _game(ctx: _Context):
    """The coalition game the report's cooperation and Shapley calls play (mean ablation over the clean
    inputs, accuracy), for predicting their cost."""
    from headcoop.analysis.games.coalitions import CoalitionGame

    # built once per report (its mean ablation runs the reference batch once)
    return ctx.once("cost-game", lambda: CoalitionGame(ctx.model, ctx.heads, tokens=ctx.clean, metric="accuracy",
                                                       how="mean", reference=ctx.clean.tokens))  # fmt: skip


def _shapley_forwards(ctx: _Context) -> float:
    """Forward passes (of the clean batch) exact Shapley values take: every coalition on the game's own path
    (timed on a sample where the path is linear), and the pairs' ablation interactions."""
    from headcoop.analysis.games.coalitions import all_masks, game_seconds

    def compute() -> float:
        k = len(ctx.heads)
        masks = all_masks(k)  # and the ablation interaction's 1 + k + k (k - 1) / 2 coalitions, on the same path
        extra = masks[torch.randint(0, len(masks), (1 + k + k * (k - 1) // 2,), generator=torch.Generator().manual_seed(0))]
        return game_seconds(_game(ctx), torch.cat([masks, extra]), ctx.budget.forward_s) / ctx.budget.forward_s + 3

    return ctx.once("shapley-forwards", compute)  # the cooperation and Shapley sections both ask


def _cooperation_forwards(ctx: _Context, draws: int) -> float:
    """Forward passes (of the clean batch) `hc.cooperation` takes as the report calls it: per ablation kind its
    coalitions (the draws stacked on the batch, so their rows count draws times), on the game's own path, and
    for mean and resample each pair's coalitions with one head zeroed; the
    exact interaction index; the reference runs; composition and backup (about two passes per cross-layer pair
    and kind); and the clean runs."""
    import itertools

    from headcoop.analysis.games.coalitions import game_seconds, linear_applies
    from headcoop.analysis.mechanisms.cooperation import coalition_masks
    from headcoop.analysis.mechanisms.words import THRESHOLDS, band

    k = len(ctx.heads)
    masks = coalition_masks(k, list(itertools.combinations(range(k), 2)))
    per_kind = ctx.once("cooperation-coalitions",  # asked for each number of draws: timed once
                        lambda: game_seconds(_game(ctx), masks, ctx.budget.forward_s) / ctx.budget.forward_s)  # fmt: skip
    cross = sum(1 for (a, _), (b, _) in itertools.combinations(ctx.heads, 2) if a != b)
    # the words read per pair and reading (Python, not the model): about 60 us each, and 0.2 s for the tables,
    # measured on the shipped Count01 and SkipPair models (benchmarks/report_predictions.py)
    readings = (1 + 2 * draws) * len(band(THRESHOLDS, (0.5, 2.0)))
    python_s = 0.2 + 6e-5 * readings * k * (k - 1) / 2
    # mean's and resample's coalitions with one head zeroed (`zeroed_runs`): none where the game is linear
    pairs = k * (k - 1) // 2
    zeroed = 0.0 if linear_applies(ctx.model, "logit_diff") else per_kind * (k + 4 * pairs) / len(masks) * 2 * draws
    return (per_kind * (1 + 2 * draws) + zeroed + (_shapley_forwards(ctx) if k <= 16 else 0) + 2 * draws + 6 * cross
            + 4 + python_s / ctx.budget.forward_s + _edit_forwards(ctx))  # fmt: skip


def _edit_forwards(ctx: _Context) -> float:
    """Forward passes (of the clean batch) of `hc.cooperation`'s counterfactual edits (`edits.py`): the edited
    inputs and their originals once for the direct push, and once per head more (and the unablated run) where a
    later layer reads some head."""
    from headcoop.analysis.mechanisms.edits import EDIT_INPUTS, edit_inputs, read_later

    clean = ctx.clean
    edits = len(edit_inputs(clean.tokens, clean.answer_pos)["source"])
    rows = (edits + min(EDIT_INPUTS, len(clean.tokens))) / max(len(clean.tokens), 1)
    return rows * (1 + ((1 + len(ctx.heads)) if any(read_later(ctx.model, ctx.heads)) else 0))


def _shapley(ctx: _Context, heads, max_exact: int, interactions: Callable) -> tuple:
    """Shapley values and interaction indices (exact only: the report shows no sampled estimates)."""
    k = len(ctx.heads)
    what = "Shapley values and pairwise interactions (hc.interactions, exact)"
    if k > max_exact:
        return (_note(f"Shapley values: exact up to {max_exact} heads (<code>hc.interactions</code>' "
                      f"<code>max_exact</code>; 2^{max_exact} coalitions), and this report covers {k}. "
                      "<code>hc.interactions(model, estimator=\"kernelshap\")</code> estimates them with standard errors."),)  # fmt: skip
    if not ctx.budget.afford(what, _shapley_forwards(ctx), f"hc.interactions(model, tokens=clean, metric='accuracy'{ctx.heads_arg})"):
        return (ctx.budget.note(what),)
    result = interactions(ctx.model, ctx.clean, heads=heads, metric="accuracy", how="mean", reference=ctx.clean.tokens,
                          progress=False)  # fmt: skip
    pairs = result.to_dataframe()
    signs = pd.Series(result.verdicts).value_counts()
    pairs = pairs.reindex(pairs.interaction.abs().sort_values(ascending=False).index).head(12)
    return (
        _note(
            "Each head's <b>Shapley value</b>: its average contribution to the accuracy over every coalition of "
            "the other heads (heads outside a coalition mean-ablated over these inputs); they sum to "
            f"v(all) &minus; v(none) = {result.v_full:.3f} &minus; {result.v_empty:.3f}. The <b>interaction "
            "index</b> of a pair is an average over coalitions: negative when the two substitute for each other on "
            "average, positive when the pair is worth more than its parts on average (a division of labour and "
            "superposition both can give it), within 5% of |v(all) &minus; v(none)|: independent. It names no "
            "mechanism on its own; the section's verdict above reads it with the other axes. Signs of the pairs: "
            + html.escape(", ".join(f"{n} {word}" for word, n in signs.items())) + f" ({html.escape(result.method)})."
        ),
        Figure(result.plot(title="Shapley values and pairwise interactions (accuracy)"), height=460),
        _note(f"The {len(pairs)} strongest pairs of {len(result.to_dataframe())}:"),
        _table(pairs, index=False, digits=4),
    )


def _head_to_head(ctx: _Context) -> tuple:
    """For models with two or more layers: path patching (causal) beside composition scores (weights)."""
    from headcoop.analysis.weights.composition import composition
    from headcoop.analysis.edges.path_patching import path_patch

    model = ctx.model
    senders = [(lay, h) for lay, h in ctx.heads if any(r > lay for r, _ in ctx.heads)]
    if model.cfg.n_layers < 2 or not senders:
        return ()
    blocks = [_note(
        "Head to head: <b>path patching</b> (<code>hc.path_patch</code>) patches only a sender head's clean output "
        "into a later receiver head's query, key or value input (the receiver's LayerNorm scale frozen), every "
        "other path as in the corrupt run: the share of the clean &minus; corrupt gap restored. <b>Composition "
        "scores</b> (<code>hc.composition</code>) are the weights-only evidence for the same pairs."
    )]  # fmt: skip
    edges = sum(3 * _depth(model, r) for s, _ in ctx.heads for r, _ in ctx.heads if r > s)
    direct = sum(_depth(model, s) for s, _ in senders)
    what = "path patching of every sender -> receiver pair (hc.path_patch)"
    subset = "" if ctx.all_heads else f", senders={ctx.names!r}, receivers={ctx.names!r}"
    if not ctx.budget.afford(what, 2 + edges + direct, f"hc.path_patch(model, clean, corrupt{subset})"):
        blocks.append(ctx.budget.note(what))
    else:
        try:
            paths = path_patch(model, clean=ctx.clean, corrupt=ctx.corrupt, metric=ctx.metric, progress=False,
                               senders=None if ctx.all_heads else senders, receivers=None if ctx.all_heads else ctx.heads)  # fmt: skip
            blocks.append(Figure(paths.plot(), height=460))
        except ValueError as err:  # a block layout path patching does not model: say so
            blocks.append(_note(html.escape(str(err))))
    total = model.cfg.n_layers * model.cfg.n_heads  # hc.composition scores every pair of the model's heads
    if total <= MAX_REPORT_PAIRS_HEADS:
        blocks.append(Figure(composition(model).plot(), height=420))
    else:
        blocks.append(_note(f"Composition scores: this model has {total} heads, too many pairs to score and draw here "
                            f"(at most {MAX_REPORT_PAIRS_HEADS} heads; 20 s for 144 on 2 CPU cores): "
                            "<code>hc.composition(model).to_dataframe()</code> holds them all."))  # fmt: skip
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
    small = model.cfg.d_vocab <= MAX_DRAWN_VOCAB and len(ctx.heads) <= MAX_DRAWN_HEADS
    if small:
        try:
            return (*blocks, *_circuit_heatmaps(ctx))
        except _TooLarge:  # positional tables of many rows: the top entries instead
            pass
    return (*blocks, *_circuit_tops(ctx))


MAX_DRAWN_VOCAB = 64  # QK / OV heatmaps of larger vocabularies are not drawn: their top entries are listed
MAX_DRAWN_HEADS = 32  # nor the heatmaps of more heads than this
MAX_DRAWN_ROWS = 96  # nor heatmaps of more rows (a positional table has token x position rows)
TOP_ENTRIES = 8  # entries of each head's QK and OV tables listed when they are not drawn


class _TooLarge(Exception):
    pass


def _circuit_heatmaps(ctx: _Context) -> list:
    """Every covered head's QK and OV tables as heatmaps (small vocabularies)."""
    model, blocks = ctx.model, []
    for layer, head in ctx.heads:
        name = f"L{layer}H{head}"
        try:
            qk = hc.qk(model, head=head, layer=layer)
            ov = hc.ov(model, head=head, layer=layer)
        except ValueError as err:  # a model the tables do not model: say so once, draw nothing
            blocks.append(_note(html.escape(str(err))))
            break
        # a positional table (rotary, learned positions) has (token x position)^2 cells: draw the token x
        # token slice with query and key at the last position, say so once
        last = qk.scores.shape[1] - 1 if qk.positional else None
        if len(ov.to_dataframe()) > MAX_DRAWN_ROWS:
            raise _TooLarge
        figures = (qk.plot(q_pos=last, k_pos=last), ov.plot())
        if not blocks and last is not None:
            blocks.append(_note(
                "These QK scores depend on positions too: each drawing is the token &times; token slice with the "
                f"query and the key at position {last}; <code>hc.qk(model, head, layer).to_dataframe()</code> "
                "holds every (token, position) pair."
            ))  # fmt: skip
        # inside a closed <details> a figure has no width to fill: give it one
        squares = tuple(Figure(f, height=_square(f), width=_square(f) + 120) for f in figures)
        blocks.append(Details(name, squares, open=not blocks))
    return blocks


def _circuit_tops(ctx: _Context) -> list:
    """Each covered head's largest QK and OV entries over the tokens of the report's prompts, as tables,
    within the budget (the tables of the heads it leaves out are one call away)."""
    model = ctx.model
    ids = sorted(set(ctx.clean.tokens.flatten().tolist()) | set(ctx.corrupt.tokens.flatten().tolist()))
    positional = model.cfg.positional_embedding_type not in ("", None) and model.cfg.positional_embedding_type != "none"
    blocks = [_note(
        f"This model's tables are too large to draw ({model.cfg.d_vocab} tokens"
        + (", and positions" if positional else "") + f", {len(ctx.heads)} heads): each head lists its "
        f"{TOP_ENTRIES} largest QK scores and OV effects (by size) over the {len(ids)} tokens of the report's "
        "prompts" + (", positions left out (token-only tables)" if positional else "") + ". The full table of "
        "a head: <code>hc.ov(model, \"L0H0\", positional=False, tokens=ids).to_dataframe()</code> (and "
        "<code>hc.qk</code>), with <code>ids</code> the token ids you want as rows; every row of the "
        "vocabulary when it fits in memory (<code>tokens=None</code>)."
    )]
    order, by = ctx.ranked_heads()  # the heads the page names first: those patching ranks highest
    if by:
        blocks.append(_note(f"Heads in order of their effect by {by} (the patching section's), largest first."))
    shown, per_head = 0, 1.0  # seconds a head takes: measured from the first one (a guess before it)
    for layer, head in order:
        start = time.perf_counter()
        if ctx.budget.remaining() < 2 * per_head:
            break
        try:
            qk = hc.qk(model, head=head, layer=layer, positional=False, tokens=ids)
            ov = hc.ov(model, head=head, layer=layer, positional=False, tokens=ids)
        except ValueError as err:
            blocks.append(_note(html.escape(str(err))))
            break
        tables = (_top_entries(qk.scores, qk.vocab, qk.vocab, ("query", "key", "score")),
                  _top_entries(ov.effects, ov.vocab, ov.out_vocab, ("source", "output", "logit effect")))  # fmt: skip
        held = "; ".join(dict.fromkeys((*qk.assumptions, *ov.assumptions)))
        blocks.append(Details(f"L{layer}H{head}", (
            *(( _note(html.escape(held)),) if held else ()),
            _note("QK, largest |score|:"), _table(tables[0], index=False),
            _note("OV, largest |effect|:"), _table(tables[1], index=False),
        ), open=shown == 0))  # fmt: skip
        shown += 1
        per_head = time.perf_counter() - start
    if shown < len(ctx.heads):
        blocks.append(_note(f"Tables of {shown} of {len(ctx.heads)} heads fit the report's budget; the others are "
                            "one <code>hc.qk</code> / <code>hc.ov</code> call each (or a larger <code>--budget</code>)."))  # fmt: skip
    return blocks


def _top_entries(values: Tensor, rows: list[str], columns: list[str], names: tuple[str, str, str]) -> pd.DataFrame:
    """The TOP_ENTRIES entries of a 2-D table [rows, columns] largest in absolute value, largest first."""
    flat = values.detach().float().cpu().flatten()
    top = flat.abs().topk(min(TOP_ENTRIES, flat.numel())).indices
    r, c = top // values.shape[1], top % values.shape[1]
    return pd.DataFrame({names[0]: [rows[i] for i in r.tolist()], names[1]: [columns[j] for j in c.tolist()],
                         names[2]: flat[top].numpy()})  # fmt: skip


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


SECTION_NAMES = ("overview", "accuracy", "heads", "attention", "patching", "dla", "cooperation", "circuits")
BUDGET_S = 60.0  # the report's default time budget in seconds


def report_sections(
    model: HookedTransformer, source: str = "", examples: int = 3, progress: bool = True, task: Task | None = None,
    exact_limit_s: float = 60.0, heads=None, sections=None, budget_s: float | None = None,
    started: float | None = None,
) -> list[Section]:
    """Every section of the report as data (headcoop.pages.Section): what `report` renders. `task`
    (default: the model's own) supplies the inputs and the metric; by-position head patching predicted to
    take longer than `exact_limit_s` is shown as verified AtP* estimates; `heads`, `sections`, `budget_s`:
    as `report`."""
    own_task = task is None
    task = task if task is not None else require_task(model, "the report's inputs and metrics (pass task=)")
    clean, corrupt = task.patching_inputs()
    device = model_device(model)
    clean, corrupt = clean.to(device), corrupt.to(device)
    covered = None if heads is None else sorted(set(parse_heads(model, heads)))
    if covered is not None and not covered:
        raise ValueError("heads is empty; give the heads the report covers, e.g. ['L0H1', 'L3H2'], or None for all")
    budget = _Budget(budget_s, _forward_seconds(model, clean.tokens), start=started or time.perf_counter(),
                     setup=_setup_code(source or model.cfg.model_name, own_task))  # fmt: skip
    ctx = _Context(model=model, task=task, source=source or model.cfg.model_name, examples=examples, clean=clean,
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


def _setup_code(source: str, own_task: bool) -> str:
    """The Python that loads the report's model and inputs, for the calls the page offers: the model by the
    shipped name or folder the report was given (a model passed in memory stays `model`), the inputs from its
    own task or from the prompts file (--prompts)."""
    from headcoop.checkpoints import SHIPPED
    from headcoop.foreign import CONFIG

    name = source.split(" (")[0]  # "my-gpt2 (Hugging Face folder, ...)" -> "my-gpt2"
    if name in SHIPPED or (Path(name).is_dir() and not (Path(name) / CONFIG).is_file()):
        load = f"model = hc.load({name!r}); "
    elif Path(name).is_dir() and is_hf_folder(name):
        load = f"from headcoop.bridge import load_folder; model = load_folder({name!r}); "
    elif Path(name).is_dir():
        load = f"from headcoop.foreign import load_model; model = load_model({name!r}); "
    else:
        load = ""  # a model passed to hc.report in memory
    inputs = ("model.task.patching_inputs()" if own_task else
              "headcoop.foreign.read_prompts('PROMPTS.json', tokenizer).patching_inputs()")  # fmt: skip
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
    model_or_name, out: str | os.PathLike = "report.html", examples: int = 3, progress: bool = True,
    task: Task | None = None, exact_limit_s: float = 60.0, heads=None, sections=None,
    budget_s: float | None = BUDGET_S, device: str | None = None, started: float | None = None,
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
    budget = "no time budget" if budget_s is None else f"time budget {budget_s:.0f} s" + (
        f", {before_s:.0f} s of it spent before the report began (imports, loading)" if before_s >= 0.5 else "")
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
