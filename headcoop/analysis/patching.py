"""Activation patching of attention heads and the residual stream, many patches per forward pass.

Direction conventions
---------------------
Two inputs of the same shape: *clean* (the model gives the right answer) and *corrupt* (a minimal change
that asks for the alternative). A patch runs one input, the *target*, and overwrites one slice of one
activation with the same slice from a run on the other input, the *source*:

- ``direction="denoise"`` (the default, as in ``transformer_lens.patching``): run the corrupt input and
  patch in clean activations. A value near the clean baseline means the patched slice alone restores
  the behaviour (the slice is *sufficient*).
- ``direction="noise"``: run the clean input and patch in corrupt activations. A value near the corrupt
  baseline means the behaviour breaks without the slice (the slice is *necessary*). This equals
  ``transformer_lens.patching`` called with the clean and corrupt inputs swapped.

In both directions the metric is scored on the patched logits with the same metric (by default the
task's mean logit difference, right answer minus alternative, measured against the clean batch), and
``PatchResult.normalized()`` maps it to ``(value - corrupt) / (clean - corrupt)``: 0 at the corrupt
baseline, 1 at the clean baseline.

The batching trick
------------------
``transformer_lens.patching`` runs one forward pass per patch and syncs with the host (``.item()``) after
each. Here the patches of a sweep are stacked along the batch axis: a chunk of P patches of one layer is
one pass over P copies of the target batch ([P * batch, pos]), copy p carrying patch p. P comes from
``memory_budget_mb``. Two ways to run a chunk, both compared with transformer_lens in the tests:

- hooked (``head_local=False``, and always for resid_pre): ``run_with_hooks`` from the target's residual
  stream at the patched layer (``start_at_layer``; earlier layers are not rerun), with one hook on the
  patched activation that overwrites, in copy p, exactly the slice (head[p], pos[p]) from the source
  run -- one advanced-index assignment with index tensors per chunk, not one per patch.
- head-local (the default where the blocks allow it, `suffix.supported`: standard causal attention with
  standard, shortformer or rotary positions (rotary: z, v and pattern patches; its cached q and k are
  before the rotation), LayerNorm / RMSNorm and MLPs allowed, no grouped queries, sinks or soft-capping,
  no padding mask): a patch of head h's q, k, v, pattern or z changes only
  z[:, :, h] in its layer, so the rest of that layer is taken from the cached target run. Each copy
  recomputes head h alone (scores with the module's own ``calculate_attention_scores`` and causal mask,
  softmax, ``pattern @ v``), applies ``F.linear(z, W_O, b_O)``, adds the target's resid_pre and runs the
  block's MLP, as the block does; a one-position patch of z, q or pattern changes a single row of z, so
  only that row is recomputed. Later layers then run row-wise from the first row the patch can change
  (``headcoop.analysis.suffix``: with causal attention no earlier row changes; the keys and values of
  earlier rows come from the target's cache), and the last layer only at the rows the metric reads
  (checked on every call, see ``suffix.reads_only``).

The metric is evaluated per copy on the stacked logits: the task's logit difference is vectorised over
the patch axis; a user metric is called on each copy's [batch, pos, vocab] slice (no forward pass).
Results stay on the device until one transfer at the end; only the activations needed are cached.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import einops
import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer
from transformer_lens.utilities import get_act_name

from headcoop.plot import Displayed
from headcoop.analysis import suffix
from headcoop.analysis.common import as_tokens, check_choice, check_layer, head_selection, model_device, task_of, task_symbols
from headcoop.checks import check_bool, check_finite, check_float, check_metric_value, installed_hooks
from headcoop.analysis.vocabulary import (
    COMPONENTS, DIRECTIONS, PATCH_METHODS, POSITIONS, Component, Direction, PatchMethod, Positions, head_name,
    layer_name,
)  # fmt: skip
from headcoop.tasks.base import Batch


Metric = Callable[[Float[Tensor, "batch pos vocab"]], Float[Tensor, ""]]


# --- the result ---------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class PatchResult(Displayed):
    """The metric after each patch, with labelled axes.

    values:        tensor whose axes are named by `dims`:
                   z/q/k/v/pattern, positions="all":  ("layer", "head")
                   z/q/k/v,         positions="each": ("layer", "pos", "head")
                   pattern,         positions="each": ("layer", "dest_pos", "head")  (the query position
                                                      whose attention row is patched)
                   resid_pre, "all": ("layer",)   resid_pre, "each": ("layer", "pos")
    coords:        for each dim, the model index of each entry (e.g. the layers and heads patched).
    clean_value:   the metric on the unpatched clean run; corrupt_value: on the unpatched corrupt run.
    pos_labels:    one label per position ("3 =" where every clean row holds "=" there, else "3").
    method:        how the patched runs were computed: "head-local", "stacked", or "one pass per patch
                   (hooks at ...)" when hooks were installed on the model (see `patch`).
    """

    values: Tensor
    dims: tuple[str, ...]
    coords: dict[str, list[int]]
    clean_value: float
    corrupt_value: float
    component: str
    positions: str
    direction: str
    pos_labels: list[str]
    method: str = "stacked"

    def normalized(self) -> Tensor:
        """(values - corrupt_value) / (clean_value - corrupt_value): the share of the clean-corrupt gap
        at which each patched run lands (0 = corrupt baseline, 1 = clean baseline). Same shape as values."""
        gap = self.clean_value - self.corrupt_value
        if gap == 0:
            raise ValueError("clean and corrupt baselines are equal, so the gap cannot be normalised")
        return (self.values - self.corrupt_value) / gap

    def item(self) -> float:
        """The single value of a one-patch result (e.g. one head, positions="all", one layer)."""
        if self.values.numel() != 1:
            raise ValueError(f"this result holds {self.values.numel()} values (shape {tuple(self.values.shape)})")
        return float(self.values.reshape(()))

    def __float__(self) -> float:
        return self.item()

    def __repr__(self) -> str:
        return (
            f"PatchResult({self.direction} {self.component!r}, positions={self.positions!r}, dims={self.dims}, "
            f"shape={tuple(self.values.shape)}, clean={self.clean_value:.4g}, corrupt={self.corrupt_value:.4g}, "
            f"method={self.method!r})"
        )

    def to_dataframe(self) -> pd.DataFrame:
        """One row per patch: a column per dim (model indices), `value` and `normalized`."""
        grids = np.meshgrid(*[np.asarray(self.coords[d]) for d in self.dims], indexing="ij")
        frame = pd.DataFrame({d: g.reshape(-1) for d, g in zip(self.dims, grids)})
        frame["value"] = self.values.reshape(-1).numpy()
        gap = self.clean_value - self.corrupt_value
        frame["normalized"] = (frame["value"] - self.corrupt_value) / gap if gap != 0 else np.nan
        for d in ("pos", "dest_pos"):
            if d in frame:
                frame[f"{d}_label"] = [self.pos_labels[p] for p in frame[d]]
        return frame

    def plot(self, normalized: bool | None = None, title: str | None = None):
        """A plotly heatmap (never shown): layer x head, layer x position, or, for per-position head
        sweeps, one panel per layer of head x position. Hover shows the head name, position and value.

        normalized: plot `normalized()` (0 = corrupt baseline, 1 = clean) rather than the raw metric;
        by default it does whenever the two baselines differ."""
        if normalized is None:
            normalized = self.clean_value != self.corrupt_value
        return _plot(self, normalized, title)


# --- inputs -------------------------------------------------------------------------------------------
def _resolve_inputs(model: HookedTransformer, clean, corrupt, metric) -> tuple[Tensor, Tensor, Metric, Callable | None]:
    """(clean tokens, corrupt tokens, metric, the task's metric over stacked copies when it is the metric)."""
    task = task_of(model)
    if clean is None and corrupt is None:
        if task is None:
            raise ValueError(
                "this model carries no headcoop task, so patch() needs clean=, corrupt= and metric=; "
                "build the model with hc.Count01().model(...) / hc.load(...) for task defaults"
            )
        clean, corrupt = task.patching_inputs()
    elif clean is None:
        raise ValueError("corrupt= was given without clean=; pass both (or neither, to use the task's inputs)")
    elif corrupt is None:
        if not isinstance(clean, Batch) or task is None:
            raise ValueError(
                "corrupt= is missing; it can only be derived (task.corrupt) when clean= is a Batch "
                "and the model carries a task"
            )
        corrupt = task.corrupt(clean)
    clean_tokens, corrupt_tokens = as_tokens(model, clean), as_tokens(model, corrupt)
    if clean_tokens.shape != corrupt_tokens.shape:
        raise ValueError(
            f"clean and corrupt inputs must have the same shape, got clean {tuple(clean_tokens.shape)} "
            f"and corrupt {tuple(corrupt_tokens.shape)}"
        )
    task_batch = None
    if metric is None:
        if task is None:
            raise ValueError(
                "this model carries no headcoop task, so there is no default metric; pass "
                "metric=lambda logits: ... (logits [batch, pos, vocab] -> scalar tensor)"
            )
        if not isinstance(clean, Batch):
            raise ValueError(
                "the default metric (the task's logit difference) needs clean= as a Batch, which knows the "
                "answers; pass a Batch or an explicit metric="
            )
        task_batch = clean.to(clean_tokens.device)
        metric = lambda logits: task.metric(logits, task_batch)  # noqa: E731
        metric.rows = task_batch.answer_pos  # where the task's metric reads (checked by suffix.reads_only)
    elif not callable(metric):
        raise TypeError(f"metric must be callable (logits [batch, pos, vocab] -> scalar), got {type(metric).__name__}")
    # The task's metric keeps leading axes, so it also scores every stacked copy in one call.
    return clean_tokens, corrupt_tokens, metric, metric if task_batch is not None else None


def _pos_labels(model: HookedTransformer, tokens: Int[Tensor, "batch pos"]) -> list[str]:
    """'p tok' where every row holds the task symbol tok at position p, else 'p'."""
    symbols = task_symbols(model)
    same = (tokens == tokens[:1]).all(0).tolist()
    first = tokens[0].tolist()
    return [f"{p} {symbols[first[p]]}" if symbols and same[p] else str(p) for p in range(tokens.shape[1])]


# --- the patch grid -----------------------------------------------------------------------------------
@dataclasses.dataclass
class _Grid:
    """Every patch of a sweep, flattened in the order of `dims` (layer outermost)."""

    dims: tuple[str, ...]
    coords: dict[str, list[int]]
    layer: Tensor  # [n_patches] (CPU)
    head: Tensor | None  # [n_patches] on the model's device
    pos: Tensor | None  # [n_patches] on the model's device

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(len(self.coords[d]) for d in self.dims)


def _grid(component: str, positions: str, layers: list[int], heads: list[int], n_pos: int, device) -> _Grid:
    if component == "resid_pre":
        dims = ("layer",) if positions == "all" else ("layer", "pos")
    elif positions == "all":
        dims = ("layer", "head")
    else:
        dims = ("layer", "dest_pos" if component == "pattern" else "pos", "head")
    values = {"layer": layers, "head": heads, "pos": list(range(n_pos)), "dest_pos": list(range(n_pos))}
    coords = {d: values[d] for d in dims}
    mesh = torch.cartesian_prod(*[torch.tensor(coords[d]) for d in dims]).reshape(-1, len(dims))
    column = {d: mesh[:, i] for i, d in enumerate(dims)}
    pos = column.get("pos", column.get("dest_pos"))
    return _Grid(
        dims=dims,
        coords=coords,
        layer=column["layer"],
        head=column["head"].to(device) if "head" in column else None,
        pos=pos.to(device) if pos is not None else None,
    )


def _set_slices(act: Tensor, source: Tensor, component: str, head: Tensor | None, pos: Tensor | None) -> None:
    """In place: in copy i of `act` ([n, batch, ...]) put `source`'s slice (head[i], pos[i]).

    act: [n, batch, pos, head, d] for q/k/v/z, [n, batch, head, dest, src] for pattern,
    [n, batch, pos, d_model] for resid_pre; source: the same without the leading n.
    """
    copy = torch.arange(act.shape[0], device=act.device)
    if component == "resid_pre":
        if pos is None:
            act.copy_(source.expand_as(act))
        else:
            act[copy, :, pos] = source[:, pos].transpose(0, 1)
    elif component == "pattern":
        if pos is None:
            act[copy, :, head] = source[:, head].transpose(0, 1)
        else:
            act[copy, :, head, pos] = source[:, head, pos].transpose(0, 1)
    elif pos is None:
        act[copy, :, :, head] = source[:, :, head].permute(2, 0, 1, 3)
    else:
        act[copy, :, pos, head] = source[:, pos, head].transpose(0, 1)


def _continuation(model: HookedTransformer, tokens: Tensor) -> dict[str, Tensor | None]:
    """What a forward pass started mid-model (`start_at_layer`) needs besides the residual stream, as the
    model's own `input_to_embed` computes it from `tokens`: a shortformer's positional embedding, and the
    padding mask TransformerLens derives from a left-padding tokenizer (None where there is none)."""
    _, _, shortformer_pos_embed, attention_mask = model.input_to_embed(tokens)
    return {"shortformer_pos_embed": shortformer_pos_embed, "attention_mask": attention_mask}


def _repeat(extras: dict[str, Tensor | None], n: int) -> dict[str, Tensor | None]:
    """`extras` for n stacked copies of the batch."""
    return {k: None if v is None else v.repeat(n, *[1] * (v.ndim - 1)) for k, v in extras.items()}


def _kv_heads(model: HookedTransformer) -> int:
    """How many key/value heads the k and v hooks hold (fewer than n_heads in a grouped-query model)."""
    cfg = model.cfg
    if cfg.n_key_value_heads is None or getattr(cfg, "ungroup_grouped_query_attention", False):
        return cfg.n_heads
    return cfg.n_key_value_heads


def _prefix_reusable(model: HookedTransformer, component: str) -> bool:
    """Whether the head-local shortcut reproduces the model's own computation: blocks whose attention
    output is `F.linear(z, W_O, b_O)` added to resid_pre (then the MLP, per row), scores from the hooked q/k
    by `calculate_attention_scores` and the causal mask alone, and later layers the row-wise suffix
    (`headcoop.analysis.suffix`) runs exactly."""
    if component == "resid_pre" or not suffix.supported(model):
        return False
    # the cached q and k of a rotary model are before the rotation the scores use: q/k patches go stacked
    return not (model.cfg.positional_embedding_type == "rotary" and component in ("q", "k"))


def patches_per_chunk(
    model: HookedTransformer, batch: int, n_pos: int, memory_budget_mb: float, from_layer: int = 0, head_local: bool = False
) -> int:
    """How many patched copies of a [batch, n_pos] input fit in `memory_budget_mb` (at least 1).

    Estimates the live activations of one sequence: for the full forward from `from_layer`, one layer's
    q, k, v, z, scores and pattern (twice over for temporaries) for each remaining layer; for the
    head-local shortcut, the patched layer's z, one head's scores and the residual stream instead.
    """
    cfg = model.cfg
    n_kv = cfg.n_key_value_heads or cfg.n_heads
    layer = (
        n_pos * cfg.d_head * (2 * cfg.n_heads + 2 * n_kv)
        + 2 * cfg.n_heads * n_pos * n_pos
        + 4 * n_pos * cfg.d_model
        + (2 * n_pos * cfg.d_mlp if not cfg.attn_only and cfg.d_mlp else 0)
    )
    later = cfg.n_layers - from_layer - (1 if head_local else 0)
    first = 2 * n_pos * cfg.n_heads * cfg.d_head + 3 * n_pos * n_pos + 3 * n_pos * cfg.d_model if head_local else 0
    per_sequence = (first + 2 * later * layer + 2 * n_pos * cfg.d_vocab_out) * torch.finfo(cfg.dtype).bits // 8
    return max(1, int(memory_budget_mb * 2**20 // (per_sequence * batch)))


# --- patching -----------------------------------------------------------------------------------------
def _copies(logits: Tensor | suffix.RowLogits, n: int, batch: int) -> Tensor | suffix.RowLogits:
    """[n, batch, pos, vocab] from the [n * batch, pos, vocab] a stacked pass returns (RowLogits as they are)."""
    return logits if isinstance(logits, suffix.RowLogits) else logits.view(n, batch, *logits.shape[1:])


def _stacked_metric(logits: Float[Tensor, "n batch pos vocab"] | suffix.RowLogits, metric: Metric,
                    stacked: Callable | None) -> Tensor:  # fmt: skip
    """The metric of each copy, [n], without leaving the device: the task's metric takes the copy axis in
    one call; a user's metric is called on each copy's [batch, pos, vocab] logits."""
    if isinstance(logits, suffix.RowLogits):
        if stacked is not None:
            logits = logits.full()
        else:
            return torch.stack([check_metric_value(metric(copy)).detach().clone().to(copy.device)
                                for copy in logits.each()])  # fmt: skip
    if stacked is not None:
        values = stacked(logits)
        if values.shape != logits.shape[:1]:
            raise ValueError(
                f"the task's metric returned shape {tuple(values.shape)} for logits {tuple(logits.shape)}; "
                "Task.metric must keep leading axes (one value per copy)"
            )
        return values
    return torch.stack([check_metric_value(metric(copy)).to(logits.device) for copy in logits])


@torch.no_grad()
def patch(
    model: HookedTransformer,
    head: int | None = None,
    layer: int | None = None,
    clean=None,
    corrupt=None,
    metric: Metric | None = None,
    component: Component = "z",
    positions: Positions = "all",
    direction: Direction = "denoise",
    memory_budget_mb: float = 256,
    head_local: bool = True,
    method: PatchMethod = "auto",
) -> PatchResult:
    """Activation patching of one head or every head (or the residual stream), all patches batched.

    model:       any attention-only HookedTransformer; with `model.task`, nothing else is needed.
    head, layer: which heads to patch. None means all: `head=3` patches head 3 in every layer (one
                 value per layer), `head=3, layer=1` that single head, `layer=1` every head of layer 1.
                 Out of range -> IndexError. resid_pre takes no head.
    clean, corrupt: [batch, pos] tokens in any form `as_tokens` takes (Batch, texts, ids), same shape.
                 Default: the task's `patching_inputs()`; with clean a Batch, corrupt defaults to
                 `task.corrupt(clean)`.
    metric:      logits [batch, pos, vocab] -> scalar tensor. Default: the task's mean logit difference
                 (right answer minus alternative at the answer position) on the clean Batch.
    component:   "z" (head output), "q", "k", "v", "pattern", or "resid_pre" (per layer, no head axis).
                 In a grouped-query model the head axis of "k" and "v" counts key/value heads: patching
                 one changes every query head that shares it.
    positions:   "all" patches every position at once; "each" one patch per position (per destination
                 position for "pattern", like transformer_lens's pattern-by-pos).
    direction:   "denoise" runs corrupt with clean activations patched in; "noise" the reverse.
    memory_budget_mb: memory for one stacked pass; sets how many patches share a pass.
    head_local:  reuse the target run's activations of the patched layer and recompute only the
                 patched head there (where the model's blocks allow, see the module docstring);
                 False runs every copy through the whole model with hooks.
    method:      "auto" (head-local where it applies, else stacked; the reference whenever a hook is
                 installed), "head-local", "stacked", or "reference": the slow, obviously-correct path, one
                 forward pass from the tokens per patch with a hook on the component, as
                 `transformer_lens.patching` does. The tests compare the fast paths with it through this switch.

    Hooks already on the model (inside `hc.ablate`, `hc.set_attention`, or a user's own) are honoured:
    every shortcut above would bypass them or stack the batch they may depend on, so with any hook
    installed each patch is one plain forward pass from the tokens, as `transformer_lens.patching` does
    (exact, and as slow as it); `result.method` says which way ran.
    ValueError for a model with NaN/inf weights or a metric that does not return a scalar.
    Returns a PatchResult; `values` has dims ("layer", "head"), ("layer", "pos", "head"),
    ("layer", "dest_pos", "head"), ("layer",) or ("layer", "pos") (see PatchResult).
    """
    check_finite(model, "hc.patch")
    check_choice("component", component, COMPONENTS)
    check_choice("positions", positions, POSITIONS)
    check_choice("direction", direction, DIRECTIONS)
    check_float("memory_budget_mb", memory_budget_mb, 0.0, low_open=True)
    check_bool("head_local", head_local)
    check_choice("method", method, PATCH_METHODS)
    if component == "resid_pre" and head is not None:
        raise ValueError("component 'resid_pre' has no head axis; pass head=None (use layer= to pick a layer)")
    layer, picked = head_selection(model, head, layer)
    layers = list(range(model.cfg.n_layers)) if layer is None else [check_layer(model, layer)]
    n_kv = _kv_heads(model)
    if component == "resid_pre":
        heads = []
    elif component in ("k", "v") and n_kv != model.cfg.n_heads:
        heads = list(range(n_kv)) if picked is None else picked
        if max(heads) >= n_kv:
            raise IndexError(
                f"head {max(heads)} is out of range for component {component!r}: this grouped-query model has "
                f"key/value heads 0..{n_kv - 1} (each shared by {model.cfg.n_heads // n_kv} query heads)"
            )
    else:
        heads = list(range(model.cfg.n_heads)) if picked is None else picked

    clean_tokens, corrupt_tokens, metric, stacked = _resolve_inputs(model, clean, corrupt, metric)
    source_tokens, target_tokens = (
        (clean_tokens, corrupt_tokens) if direction == "denoise" else (corrupt_tokens, clean_tokens)
    )
    hooks = installed_hooks(model)
    extras = _continuation(model, target_tokens)
    # the head-local scores use the causal mask alone: not with a padding mask
    possible = _prefix_reusable(model, component) and extras["attention_mask"] is None
    if method == "head-local" and not possible:
        raise ValueError(f"method='head-local' does not apply to component {component!r} of this model (its "
                         "blocks or a padding mask need the whole layer recomputed); use 'auto' or 'stacked'")  # fmt: skip
    reference = method == "reference" or bool(hooks)
    local = not reference and possible and (method == "head-local" or (method == "auto" and head_local))
    method = "head-local" if local else "stacked"
    if reference:
        shown = ", ".join(hooks[:3]) + (f" and {len(hooks) - 3} more" if len(hooks) > 3 else "")
        method = f"one pass per patch (hooks at {shown})" if hooks else "one pass per patch (method='reference')"
    patched = {get_act_name(component, lay) for lay in layers}
    # The target run supplies each copy's starting point: the residual stream entering the patched layer,
    # and, for the head-local shortcut, that layer's activations the patch leaves alone.
    kept = ("resid_pre", "resid_post", "z", "q", "k", "v", "pattern") if local else ("resid_pre",)
    starts = {get_act_name(name, lay) for lay in layers for name in kept}
    if local:  # the suffix reads later layers' cached keys and values for the rows that stay unchanged
        kinds = ("k", "v", "rot_k") if model.cfg.positional_embedding_type == "rotary" else ("k", "v")
        starts |= {f"blocks.{lay}.attn.hook_{kind}" for lay in range(min(layers), model.cfg.n_layers) for kind in kinds}
    source_logits, source_cache = model.run_with_cache(source_tokens, names_filter=lambda n: n in patched)
    target_logits, target_cache = model.run_with_cache(target_tokens, names_filter=lambda n: n in starts)
    source_value = float(check_metric_value(metric(source_logits)))
    target_value = float(check_metric_value(metric(target_logits)))
    needed = _rows_read(metric, target_logits, clean_tokens, stacked) if local else None
    clean_value, corrupt_value = (
        (source_value, target_value) if direction == "denoise" else (target_value, source_value)
    )

    batch, n_pos = target_tokens.shape
    grid = _grid(component, positions, layers, heads, n_pos, model_device(model))
    results = []
    for lay in layers:
        # Patches are ordered layer first, so this layer's patches are one contiguous run.
        lo, hi = int((grid.layer < lay).sum()), int((grid.layer <= lay).sum())
        per_chunk = patches_per_chunk(model, batch, n_pos, memory_budget_mb, from_layer=lay, head_local=local)
        if reference:
            per_chunk = 1  # hooks may depend on the batch (resampling, per-example patterns): never stack
        for start in range(lo, hi, per_chunk):
            stop = min(start + per_chunk, hi)
            head_index = grid.head[start:stop] if grid.head is not None else None
            pos_index = grid.pos[start:stop] if grid.pos is not None else None
            if local:
                logits = _run_head_local(model, component, lay, stop - start, head_index, pos_index, source_cache,
                                         target_cache, (target_logits, extras["shortformer_pos_embed"], needed))
            else:
                logits = _run_hooked(model, component, lay, stop - start, head_index, pos_index, source_cache,
                                     target_cache, target_tokens, from_tokens=reference,
                                     extras=_repeat(extras, stop - start))  # fmt: skip
            results.append(_stacked_metric(_copies(logits, stop - start, batch), metric, stacked))
    values = torch.cat(results).reshape(grid.shape).float().cpu()
    return PatchResult(
        values=values,
        dims=grid.dims,
        coords=grid.coords,
        clean_value=clean_value,
        corrupt_value=corrupt_value,
        component=component,
        positions=positions,
        direction=direction,
        pos_labels=_pos_labels(model, clean_tokens),
        method=method,
    )


def _patched_head(target: Tensor, source: Tensor, pos: Tensor | None) -> Tensor:
    """`source` [n, batch, pos, ...] where pos is None, else `target` with row pos[i] of copy i from `source`."""
    if pos is None:
        return source
    copy = torch.arange(len(pos), device=pos.device)
    patched = target.clone()
    patched[copy, :, pos] = source[copy, :, pos]
    return patched


def _run_hooked(
    model, component, layer, n, head, pos, source_cache, target_cache, target_tokens, from_tokens=False, extras=None
) -> Tensor:
    """Logits [n * batch, pos, vocab] of n copies of the target run, copy i patched at (layer, head[i], pos[i])
    by a hook on the component's activation; the copies start from the target's residual stream at `layer`,
    or from the tokens when `from_tokens` (so that hooks on earlier layers run once, as in a plain forward)."""
    name = get_act_name(component, layer)
    source = source_cache[name]

    def hook(act: Tensor, hook) -> Tensor:
        act = act.contiguous()
        _set_slices(act.view(n, -1, *act.shape[1:]), source, component, head, pos)
        return act

    if from_tokens:
        return model.run_with_hooks(target_tokens.repeat(n, 1), fwd_hooks=[(name, hook)])
    resid = target_cache[get_act_name("resid_pre", layer)].repeat(n, 1, 1)
    return model.run_with_hooks(resid, start_at_layer=layer, fwd_hooks=[(name, hook)], **(extras or {}))


def _run_head_local(model, component, layer, n, head, pos, source_cache, target_cache, target) -> Tensor:
    """As `_run_hooked`, but only the patched head of `layer` is recomputed for each copy.

    A patch of head h's q, k, v, pattern or z changes nothing else in its layer, so each copy takes the
    target's z, recomputes z[:, :, h] from the patched activation exactly as the attention module does,
    adds `F.linear(z, W_O, b_O)` to the target's resid_pre, and runs the later layers from there.
    Patches of one position of z, q or pattern change one row of z only (see `_run_row_local`).
    """
    if pos is not None and component in ("z", "q", "pattern"):
        return _run_row_local(model, component, layer, n, head, pos, source_cache, target_cache, target)
    attn = model.blocks[layer].attn
    act = lambda kind, cache=target_cache: cache[get_act_name(kind, layer)]  # noqa: E731
    batch, n_pos = act("z").shape[:2]
    z = act("z")[None].repeat(n, 1, 1, 1, 1)  # [n, batch, pos, head, d_head]
    copy = torch.arange(n, device=z.device)
    if component == "z":
        _set_slices(z, act("z", source_cache), "z", head, pos)
    else:
        # One head per copy: [n, batch, pos, d_head] for q/k/v, [n, batch, dest, src] for the pattern.
        pattern = act("pattern")[:, head].transpose(0, 1)
        q, k, v = (act(kind)[:, :, head].permute(2, 0, 1, 3) for kind in ("q", "k", "v"))
        if component == "pattern":
            pattern = _patched_head(pattern, act("pattern", source_cache)[:, head].transpose(0, 1), pos)
        else:
            source = act(component, source_cache)[:, :, head].permute(2, 0, 1, 3)
            patched = _patched_head({"q": q, "k": k, "v": v}[component], source, pos)
            q, k, v = (patched if kind == component else x for kind, x in zip("qkv", (q, k, v)))
        if component in ("q", "k"):
            flat = lambda x: x.reshape(n * batch, n_pos, 1, -1)  # noqa: E731
            scores = attn.calculate_attention_scores(flat(q), flat(k))
            if _causal(model, attn):
                scores = attn.apply_causal_mask(scores)
            pattern = _softmax(scores).view(n, batch, n_pos, n_pos)
        z[copy, :, :, head] = pattern @ v
    out = F.linear(z.view(n * batch, n_pos, -1), _w_o(attn), attn.b_O)
    resid_mid = act("resid_pre") + out.view(n, batch, n_pos, -1)
    # a k or v patch at position p changes no query row before p: the MLP and later layers start at row p
    starts = torch.zeros(n, dtype=torch.long, device=resid_mid.device) if pos is None else pos
    return _by_start(model, layer + 1, resid_mid, starts, target_cache, target, finish=layer)


def _run_row_local(model, component, layer, n, head, pos, source_cache, target_cache, target) -> Tensor:
    """Copy i patches head[i] of z, q or pattern at position pos[i] only: that changes z, hence the block's
    output, at that one query position. Each copy is the target's resid_post with row pos[i] recomputed."""
    attn = model.blocks[layer].attn
    act = lambda kind, cache=target_cache: cache[get_act_name(kind, layer)]  # noqa: E731
    batch, n_pos = act("z").shape[:2]
    copy = torch.arange(n, device=pos.device)
    z_row = act("z")[:, pos].transpose(0, 1).clone()  # [n, batch, head, d_head]
    if component == "z":
        z_row[copy, :, head] = act("z", source_cache)[:, pos, head].transpose(0, 1)
    else:
        v = act("v")[:, :, head].permute(2, 0, 1, 3)  # [n, batch, key_pos, d_head]
        if component == "pattern":
            pattern = act("pattern", source_cache)[:, head, pos].transpose(0, 1)  # [n, batch, key_pos]
        else:
            q = act("q", source_cache)[:, pos, head].transpose(0, 1)  # [n, batch, d_head]
            k = act("k")[:, :, head].permute(2, 0, 1, 3)
            scores = attn.calculate_attention_scores(
                q.reshape(n * batch, 1, 1, -1), k.reshape(n * batch, n_pos, 1, -1)
            ).view(n, batch, n_pos)
            if _causal(model, attn):
                future = torch.arange(n_pos, device=pos.device) > pos[:, None]  # [n, key_pos]
                scores = torch.where(future[:, None], attn.IGNORE.to(scores.device), scores)
            pattern = _softmax(scores)
        z_row[copy, :, head] = (pattern[:, :, None] @ v).squeeze(2)
    out = F.linear(z_row.reshape(n, batch, -1), _w_o(attn), attn.b_O)  # [n, batch, d_model]
    new_rows = suffix.finish_block(model, layer, act("resid_pre")[:, pos].transpose(0, 1) + out)  # [n, batch, d]
    return _by_start(model, layer + 1, (act("resid_post"), new_rows), pos, target_cache, target)


def _by_start(model, start, resid, first_row, target_cache, target, finish: int | None = None) -> Tensor:
    """Logits [n * batch, pos, vocab] of n copies whose residual stream entering layer `start` is `resid`
    [n, batch, pos, d_model], copy i equal to the target's before row first_row[i]: the copies are grouped
    by that row and each group runs the later layers on its rows from there (`suffix.run_from`). With
    `finish`, `resid` is that layer's resid_mid, and its MLP runs on the same rows first. `resid` may also
    be (base [batch, pos, d_model], rows [n, batch, d_model]): copy i is `base` with row first_row[i]
    replaced (a one-row patch), so no full copy per patch is made."""
    target_logits, shortformer_pos_embed, needed = target
    one_row = isinstance(resid, tuple)
    n, batch = (resid[1] if one_row else resid).shape[:2]
    kept = torch.arange(target_logits.shape[1], device=target_logits.device) if needed is None else needed
    out = target_logits[:, kept][None].repeat(n, 1, 1, 1)  # [n, batch, kept row, vocab]; changed rows below
    for r0 in first_row.unique().tolist():
        group = (first_row == r0).nonzero().flatten()
        if one_row:
            base, rows_new = resid
            x = base[None, :, r0:].repeat(len(group), 1, 1, 1)
            x[:, :, 0] = rows_new[group]
        else:
            x = resid[group, :, r0:]
        if finish is not None:
            x = suffix.finish_block(model, finish, x)
        rows, logits = suffix.run_from(model, start, x, r0, target_cache, target_logits, shortformer_pos_embed,
                                       needed)  # fmt: skip
        if logits is not None:
            at = torch.searchsorted(kept, rows)  # rows is a subset of kept, both sorted
            out[group[:, None], :, at[None, :]] = logits.view(len(group), batch, len(rows), -1).transpose(1, 2)
    if needed is None:
        return out.view(n * batch, *target_logits.shape[1:])
    return suffix.RowLogits(target_logits, kept, out)


def _rows_read(metric, target_logits: Tensor, clean_tokens: Tensor, stacked) -> Tensor | None:
    """The logit rows (positions) the metric reads, when a small candidate set passes `suffix.reads_only`:
    the task's answer positions for its own metric, else the last position; None (every row) otherwise."""
    task_rows = getattr(stacked, "rows", None)
    candidates = task_rows if task_rows is not None else torch.tensor([target_logits.shape[1] - 1])
    candidates = candidates.unique().to(target_logits.device)
    return candidates if suffix.reads_only(metric, target_logits, candidates) else None


def _causal(model: HookedTransformer, attn) -> bool:
    return (getattr(attn, "_attention_dir_override", None) or model.cfg.attention_dir) == "causal"


def _softmax(scores: Tensor) -> Tensor:
    """The attention module's softmax over keys, with NaN rows (all keys masked) set to zero."""
    pattern = F.softmax(scores, dim=-1)
    return torch.where(torch.isnan(pattern), torch.zeros_like(pattern), pattern)


def _w_o(attn) -> Tensor:
    """W_O as the attention module feeds it to F.linear: [d_model, head * d_head]."""
    return einops.rearrange(attn.W_O, "head d_head d_model -> d_model (head d_head)").contiguous()


# --- plotting -----------------------------------------------------------------------------------------
def _title(result: PatchResult, normalized: bool) -> str:
    """The figure's title in words: what was patched into what, and what the colour means."""
    what = "the residual stream" if result.component == "resid_pre" else f"each head's {result.component}"
    where = "at all positions at once" if result.positions == "all" else "one position at a time"
    if result.direction == "denoise":
        ran = f"Patching {what} from the clean run into the corrupt run, {where}"
        scale = "share of the clean&minus;corrupt gap restored (1: fully restored)"
    else:
        ran = f"Patching {what} from the corrupt run into the clean run, {where}"
        scale = "share of the clean behaviour kept (0: fully broken)"
    title = f"{ran}<br><sup>{scale if normalized else 'the metric after each patch'}"
    if result.positions == "each" and any(" " not in label for label in result.pos_labels):
        title += ("; positions are absolute: where inputs differ in length, a column mixes the patch's effect "
                  "with the share of inputs holding a given token there")  # fmt: skip
    return title + "</sup>"


def _plot(result: PatchResult, normalized: bool, title: str | None):
    from plotly.subplots import make_subplots

    from headcoop.plot import TEMPLATE, heatmap

    values = result.normalized() if normalized else result.values
    title = title or _title(result, normalized)
    layers = result.coords["layer"]
    layer_names = [layer_name(lay) for lay in layers]
    hover = "%{customdata}<br>value %{z:.4g}<extra></extra>"
    if result.dims == ("layer",):
        fig = heatmap(values[None], x=layer_names, y=["resid_pre"], title=title, xlabel="layer")
        fig.data[0].update(customdata=[[f"resid_pre {name}" for name in layer_names]], hovertemplate=hover)
        return fig
    if result.dims == ("layer", "pos"):
        labels = result.pos_labels
        fig = heatmap(values, x=labels, y=layer_names, title=title, xlabel="position", ylabel="layer")
        names = [[f"resid_pre {ln}, pos {p}" for p in labels] for ln in layer_names]
        fig.data[0].update(customdata=names, hovertemplate=hover)
        return fig
    heads = result.coords["head"]
    if result.dims == ("layer", "head"):
        fig = heatmap(values, x=[f"H{h}" for h in heads], y=layer_names, title=title, xlabel="head", ylabel="layer")
        names = [[head_name(lay, h) for h in heads] for lay in layers]
        fig.data[0].update(customdata=names, hovertemplate=hover)
        return fig
    # (layer, pos|dest_pos, head): one panel per layer, head x position.
    labels = result.pos_labels
    pos_title = "destination position" if result.dims[1] == "dest_pos" else "position"
    bound = float(values.abs().max()) or 1.0
    fig = make_subplots(rows=len(layers), cols=1, subplot_titles=[f"layer {lay}" for lay in layers],
                        vertical_spacing=0.3 / max(1, len(layers)))
    for row, lay in enumerate(layers):
        names = [head_name(lay, h) for h in heads]
        panel = heatmap(values[row].T, x=labels, y=names)
        trace = panel.data[0]
        trace.update(zmin=-bound, zmax=bound, zmid=None, coloraxis=None, showscale=row == 0,
                     customdata=[[f"{name}, {pos_title} {p}" for p in labels] for name in names],
                     hovertemplate=hover)
        fig.add_trace(trace, row=row + 1, col=1)
        fig.update_xaxes(type="category", title_text=pos_title if row == len(layers) - 1 else None, row=row + 1, col=1)
        fig.update_yaxes(type="category", autorange="reversed", row=row + 1, col=1)
    fig.update_layout(title=title, template=TEMPLATE, height=max(300, 60 + 30 * len(heads) * len(layers)))
    return fig


__all__: Sequence[str] = ["patch", "PatchResult", "patches_per_chunk", "COMPONENTS", "POSITIONS", "DIRECTIONS"]
