"""The report's QK and OV section: every covered head's tables as heatmaps where they are small enough to read,
their top entries where not."""

from __future__ import annotations

import html
import time

import pandas as pd
import plotly.graph_objects as go
from torch import Tensor

import headcoop as hc
from headcoop.display.pages import Details, Figure
from headcoop.reporting.context import Context
from headcoop.reporting.sections import page_note, page_table


def section_circuits(ctx: Context) -> tuple:
    model = ctx.model
    blocks: list = [
        page_note(
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


def _circuit_heatmaps(ctx: Context) -> list:
    """Every covered head's QK and OV tables as heatmaps (small vocabularies)."""
    model = ctx.model
    blocks: list = []
    for layer, head in ctx.heads:
        name = f"L{layer}H{head}"
        try:
            qk = hc.qk(model, head=head, layer=layer)
            ov = hc.ov(model, head=head, layer=layer)
        except ValueError as err:  # a model the tables do not model: say so once, draw nothing
            blocks.append(page_note(html.escape(str(err))))
            break
        # a positional table (rotary, learned positions) has (token x position)^2 cells: draw the token x
        # token slice with query and key at the last position, say so once
        last = qk.scores.shape[1] - 1 if qk.positional else None
        if len(ov.to_dataframe()) > MAX_DRAWN_ROWS:
            raise _TooLarge
        figures = (qk.plot(q_pos=last, k_pos=last), ov.plot())
        if not blocks and last is not None:
            blocks.append(page_note(
                "These QK scores depend on positions too: each drawing is the token &times; token slice with the "
                f"query and the key at position {last}; <code>hc.qk(model, head, layer).to_dataframe()</code> "
                "holds every (token, position) pair."
            ))  # fmt: skip
        # inside a closed <details> a figure has no width to fill: give it one
        squares = tuple(Figure(f, height=_square(f), width=_square(f) + 120) for f in figures)
        blocks.append(Details(name, squares, open=not blocks))
    return blocks


def _circuit_tops(ctx: Context) -> list:
    """Each covered head's largest QK and OV entries over the tokens of the report's prompts, as tables,
    within the budget (the tables of the heads it leaves out are one call away)."""
    model = ctx.model
    ids = sorted(set(ctx.clean.tokens.flatten().tolist()) | set(ctx.corrupt.tokens.flatten().tolist()))
    positional = model.cfg.positional_embedding_type not in ("", None) and model.cfg.positional_embedding_type != "none"
    blocks: list = [
        page_note(
            f"This model's tables are too large to draw ({model.cfg.d_vocab} tokens"
            + (", and positions" if positional else "")
            + f", {len(ctx.heads)} heads): each head lists its "
            f"{TOP_ENTRIES} largest QK scores and OV effects (by size) over the {len(ids)} tokens of the report's "
            "prompts" + (", positions left out (token-only tables)" if positional else "") + ". The full table of "
            'a head: <code>hc.ov(model, "L0H0", positional=False, tokens=ids).to_dataframe()</code> (and '
            "<code>hc.qk</code>), with <code>ids</code> the token ids you want as rows; every row of the "
            "vocabulary when it fits in memory (<code>tokens=None</code>)."
        )
    ]
    order, by = ctx.ranked_heads()  # the heads the page names first: those patching ranks highest
    if by:
        blocks.append(page_note(f"Heads in order of their effect by {by} (the patching section's), largest first."))
    shown, per_head = 0, 1.0  # seconds a head takes: measured from the first one (a guess before it)
    for layer, head in order:
        start = time.perf_counter()
        if ctx.budget.remaining() < 2 * per_head:
            break
        try:
            qk = hc.qk(model, head=head, layer=layer, positional=False, tokens=ids)
            ov = hc.ov(model, head=head, layer=layer, positional=False, tokens=ids)
        except ValueError as err:
            blocks.append(page_note(html.escape(str(err))))
            break
        tables = (_top_entries(qk.scores, qk.vocab, qk.vocab, ("query", "key", "score")),
                  _top_entries(ov.effects, ov.vocab, ov.out_vocab, ("source", "output", "logit effect")))  # fmt: skip
        held = "; ".join(dict.fromkeys((*qk.assumptions, *ov.assumptions)))
        blocks.append(Details(f"L{layer}H{head}", (
            *(( page_note(html.escape(held)),) if held else ()),
            page_note("QK, largest |score|:"), page_table(tables[0], index=False),
            page_note("OV, largest |effect|:"), page_table(tables[1], index=False),
        ), open=shown == 0))  # fmt: skip
        shown += 1
        per_head = time.perf_counter() - start
    if shown < len(ctx.heads):
        blocks.append(page_note(f"Tables of {shown} of {len(ctx.heads)} heads fit the report's budget; the others are "
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
