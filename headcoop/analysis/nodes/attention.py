"""Attention patterns for circuitsvis: run the model, hand plain data to `headcoop.display.views`.

view = hc.attention(model, batch[:2])   # an offline circuitsvis view; Jupyter renders it
"""

from __future__ import annotations

import torch
from transformer_lens.utilities import get_act_name

from headcoop.analysis.engine.inputs import as_tokens, layers_of, require_task, token_labels
from headcoop.analysis.vocabulary import head_name
from headcoop.display.views import AttentionView, attention_view
from headcoop.models.tl import HookedTransformer
from headcoop.tasks.base import Batch


@torch.no_grad()
def attention_data(
    model: HookedTransformer,
    tokens=None,
    layer: int | None = None,
    example: int = 0,
    max_examples: int = 1,
    trim: bool = True,
    task=None,
) -> list[tuple[str, dict]]:
    """circuitsvis AttentionHeads view of every head of `layer` (None: one view per layer), labelled with the task's token strings
    and head names ("L0H3"), for examples `example` .. `example + max_examples - 1` of `tokens`.

    tokens: a Batch, text(s) or [batch, pos] / [pos] ids; default the task's clean patching batch.
    trim:   for a Batch, cut each example after its last loss position (drops right padding).
    task:   the task whose vocabulary or tokenizer labels the tokens (default: the model's own; else its tokenizer).
    Only the shown examples are run through the model (patterns [head, q_pos, k_pos] each).
    Returns plain data for the renderer: one (heading, AttentionHeads props) per example, the props
    holding the patterns as numpy arrays [head, q_pos, k_pos], the token labels and the head names.
    """
    layers = layers_of(model, layer)
    if tokens is None:
        tokens = require_task(model, "tokens").patching_inputs()[0]
    ids = as_tokens(model, tokens)
    n = ids.shape[0]
    if not isinstance(example, int) or not -n <= example < n:
        raise IndexError(f"example {example!r} is out of range: there are examples 0..{n - 1}")
    if not isinstance(max_examples, int) or max_examples < 1:
        raise ValueError(f"max_examples must be a positive int, got {max_examples!r}")
    rows = list(range(example % n, min(example % n + max_examples, n)))
    ends = [ids.shape[1]] * len(rows)
    if trim and isinstance(tokens, Batch):
        ends = [int(tokens.loss_pos[r].max()) + 1 for r in rows]
    wanted = {get_act_name("pattern", lay): lay for lay in layers}
    _, cache = model.run_with_cache(ids[rows], names_filter=lambda hook: hook in wanted)
    views = []
    for name, lay in wanted.items():
        patterns = cache[name]  # [example, head, q_pos, k_pos]
        names = [head_name(lay, h) for h in range(model.cfg.n_heads)]
        for i, (row, end) in enumerate(zip(rows, ends)):
            labels = token_labels(model, ids[row, :end], task)
            props = dict(
                attention=patterns[i, :, :end, :end].float().cpu().numpy(),
                tokens=labels,
                attentionHeadNames=names,
                maskUpperTri=model.cfg.attention_dir == "causal",
            )
            views.append((f"layer {lay}, example {row}: {' '.join(labels)}", props))
    return views


def attention(
    model: HookedTransformer,
    tokens=None,
    layer: int | None = None,
    example: int = 0,
    max_examples: int = 1,
    trim: bool = True,
) -> AttentionView:
    """circuitsvis AttentionHeads view of every head of `layer` (None: every layer) for examples `example` ..
    `example + max_examples - 1` of `tokens` (arguments as `attention_data`). Renders offline: the
    returned AttentionView's HTML holds the JS bundle and no CDN URL."""
    return attention_view(attention_data(model, tokens, layer, example, max_examples, trim))
