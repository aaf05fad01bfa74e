"""The report's sections other than cooperation and the circuits: overview, accuracy, per-head metrics,
attention views, head patching, DLA; each takes the `Context` and returns page blocks (`display.pages`)."""

from __future__ import annotations

import sys

import pandas as pd
import torch
from markupsafe import Markup
from torch import Tensor

import headcoop as hc
from headcoop.analysis.nodes.attention import attention_data
from headcoop.display.pages import Code, Figure, Html, Table, Text
from headcoop.display.views import attention_heads_html
from headcoop.reporting.budget import EACH_PATCH, ESTIMATED_PATCH, EXACT_PATCH
from headcoop.reporting.context import Context
from headcoop.studies import study_for

RATIO_COLUMNS = ("w01", "w02")  # ratios spanning decades: significant digits, not decimals


def page_table(df: pd.DataFrame, index: bool = True, digits: int = 3) -> Table:
    def cell(value) -> str:
        if isinstance(value, float) and value != value:
            return ""
        return f"{value:.{digits}f}" if isinstance(value, float) else str(value)

    frame = df.copy()
    for column in RATIO_COLUMNS:
        if column in frame:
            frame[column] = [f"{v:.3g}" for v in frame[column]]
    return Table(frame, index=index, cell=cell)


def page_note(text: str) -> Text:
    return Text(text)


# --- sections: each returns its blocks (headcoop.display.pages), never markup ----------------------------------
def section_overview(ctx: Context) -> tuple:
    model, task, cfg = ctx.model, ctx.task, ctx.model.cfg
    fields = [
        "model_name", "n_layers", "n_heads", "d_model", "d_head", "d_vocab", "n_ctx", "attn_only",
        "normalization_type", "positional_embedding_type", "attention_dir",
    ]  # fmt: skip
    config = pd.DataFrame({"value": [str(getattr(cfg, f)) for f in fields]}, index=fields)
    n_params = sum(p.numel() for p in model.parameters())
    n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    config.loc["parameters (trainable)"] = f"{n_params} ({n_trainable})"
    blocks: list = [Text(Markup("<p><b>Model:</b> <code>{}</code> &nbsp; <b>Task:</b> <code>{}</code></p>").format(ctx.source, repr(task)), note=False)]  # fmt: skip
    if not task.fixed_inputs:  # a task of its own (the toy tasks): its module says what it is
        blocks.append(Code((sys.modules[type(task).__module__].__doc__ or "").strip()))
    if task.d_vocab <= 64:
        shown = ", ".join(f"{i}: {t}" for i, t in enumerate(task.vocab))
        blocks.append(Text(Markup("<p><b>Vocabulary</b> (id: token): {}</p>").format(shown), note=False))
    else:
        differs = (
            ""
            if task.d_vocab == cfg.d_vocab
            else f" (the model's unembedding has {cfg.d_vocab}: the task's tokenizer or vocabulary counts {task.d_vocab - cfg.d_vocab:+d})"
        )
        blocks.append(Text(Markup("<p><b>Vocabulary</b>: {} tokens{}.</p>").format(task.d_vocab, differs), note=False))
    where = "fixed prompts (the same every run)" if task.fixed_inputs else "inputs drawn from the task (seed 0)"
    blocks += [
        Text(
            Markup(
                "<p><b>Inputs</b>: every analysis below reads the same {} {}, {}; the corrupt "
                "prompt of each differs from its clean prompt where the task says, and the metric compares "
                "the answer's logit with the alternative's at the answer position.</p>"
            ).format(len(ctx.clean), where, _lengths(ctx.clean)),
            note=False,
        ),  # fmt: skip
        page_table(_examples(ctx, 4), index=False),
        Text("<h3>Configuration</h3>", note=False),
        page_table(config),
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


def _examples(ctx: Context, n: int) -> pd.DataFrame:
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


def section_accuracy(ctx: Context) -> tuple:
    metrics = ctx.task.evaluate(ctx.model)
    frame = pd.DataFrame({"value": list(metrics.values())}, index=list(metrics))
    said = "on its {} fixed prompts" if ctx.task.fixed_inputs else "on fresh samples of {}"
    what = len(ctx.clean) if ctx.task.fixed_inputs else repr(ctx.task)
    return (
        Text(Markup("<code>task.evaluate(model)</code> " + said + ".").format(what)),
        page_table(frame, digits=4),
    )


def section_heads(ctx: Context) -> tuple:
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
            + (
                f" <b>Estimated</b>: exact patching of every head did not fit the budget, so these are AtP* estimates "
                f"(<code>hc.attribute</code>, positions='all'); {int(patched.verified.sum())} heads were patched "
                "exactly (the patching section compares them)."
                if estimated
                else ""
            )
        )
    notes.append(
        "<b>DLA logit diff</b>: the head's direct contribution to logit(answer) &minus; logit(alternative) at "
        "the answer position, mean and std over the same inputs (<code>hc.dla</code>)."
    )
    blocks: list = [ctx.budget.note(w) for w in (EXACT_PATCH, ESTIMATED_PATCH) if ctx.budget.was_left_out(w)]
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
    return (*blocks, *map(page_note, notes), page_table(table))


def _share(result) -> Tensor:
    """PatchResult.normalized(), or NaN everywhere when clean and corrupt runs score the same (no gap)."""
    if result.clean_value == result.corrupt_value:
        return torch.full_like(result.values, float("nan"))
    return result.normalized()


def section_attention(ctx: Context) -> tuple:
    """One circuitsvis view per (layer, example) for the layers of the covered heads; their render calls run
    after the bundle, at the page's end."""
    n = min(ctx.examples, len(ctx.clean))
    layers = sorted({lay for lay, _ in ctx.heads})
    views = [view for layer in layers
             for view in attention_data(ctx.model, ctx.clean, layer=layer, example=0, max_examples=n, task=ctx.task)]  # fmt: skip
    markup, script = attention_heads_html(views, bundle=False)
    return (
        page_note(
            f"Attention patterns of every head of {'every layer' if len(layers) == ctx.model.cfg.n_layers else 'layers ' + ', '.join(map(str, layers))} "
            f"on {n} inputs of the patching batch (query rows, key columns; hover a head to enlarge it, click to "
            "lock). Rendered by circuitsvis, offline."
        ),
        Html(markup, script),
    )


def section_patching(ctx: Context) -> tuple:
    model = ctx.model
    heads = ctx.patch()
    each, predicted = ctx.patch_each(ctx.exact_limit_s)
    n_layers = model.cfg.n_layers
    height = max(360, 140 + 28 * model.cfg.n_heads) * n_layers
    blocks: list = [ctx.budget.note(w) for w in (EXACT_PATCH, ESTIMATED_PATCH) if ctx.budget.was_left_out(w)]
    if isinstance(heads, hc.AttributionResult):
        blocks += [
            page_note(
                "AtP* estimates of patching each head's clean output <code>z</code> into the corrupt run at all "
                f"positions at once (<code>hc.attribute</code>): {int(heads.top.sum())} top heads and "
                f"{int(heads.sampled.sum())} sampled ones patched exactly; the scatter compares them."
            ),
            Figure(heads.plot(kind="map"), height=300 + 40 * n_layers),
            Figure(heads.plot(kind="scatter"), height=420),
        ]
    elif heads is not None:
        gap = heads.clean_value != heads.corrupt_value  # else show the raw metric: there is no gap to share
        blocks += [
            page_note(
                f"Denoising: run the corrupt inputs and patch in one head's clean output <code>z</code>. Values are "
                f"the share of the clean &minus; corrupt gap restored (clean mean logit diff {heads.clean_value:.3f}, "
                f"corrupt {heads.corrupt_value:.3f})" + ("." if ctx.all_heads else "; heads not covered are blank.")
            ),
            Figure(
                heads.plot(normalized=gap, title="head patching: all positions (exact)"), height=300 + 40 * n_layers
            ),
        ]
    if each is None:
        blocks.append(ctx.budget.note(EACH_PATCH))
    elif isinstance(each, hc.AttributionResult):
        m = each.missed
        why = (f"more than {ctx.exact_limit_s:.0f} s" if predicted > ctx.exact_limit_s
               else "more than the report's budget had left")  # fmt: skip
        blocks += [
            page_note(
                f"Patching one position at a time would take about {predicted:.0f} s exactly ({why}, predicted "
                f"from one timed forward pass), so the map below shows AtP* "
                f"<b>estimates</b> (<code>hc.attribute</code>): {int(each.top.sum())} top cells and "
                f"{int(each.sampled.sum())} sampled ones were patched exactly; an estimated {m.get('estimate', 0):.3g} "
                f"(95% interval {m.get('low', 0):.3g}..{m.get('high', 0):.3g}) cells outside the top exceed the top's "
                "smallest exact effect. The scatter compares the verified estimates with their exact values."
            ),
            Figure(each.plot(kind="map"), height=height),
            Figure(each.plot(kind="scatter"), height=420),
        ]
    else:
        gap = each.clean_value != each.corrupt_value
        blocks.append(
            Figure(each.plot(normalized=gap, title="head patching: one position at a time (exact)"), height=height)
        )
    return tuple(blocks)


def section_dla(ctx: Context) -> tuple:
    attr = ctx.dla()
    return (
        page_note(
            "Direct logit attribution at the answer position: each component's contribution to logit(answer) "
            f"&minus; logit(alternative), mean over {len(ctx.clean)} inputs, error bars one std. The components "
            "sum to the model's logit difference exactly."
        ),
        Figure(attr.plot()),
    )
