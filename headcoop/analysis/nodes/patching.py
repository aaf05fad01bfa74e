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
each. Here a sweep is a specification on the stacked-copies engine (``headcoop.analysis.engine.copies``): a
grid of patches, a setter and the metric. The engine stacks the patches along the batch axis: a chunk of
P patches of one layer is one pass over P copies of the target batch ([P * batch, pos]), copy p carrying
patch p. P comes from ``memory_budget_mb`` (the engine's one memory formula). Three ways to run a chunk
(``method``), each compared with transformer_lens and with the reference in the tests:

- reference (``method="reference"``, and whenever any hook is installed): one forward pass from the tokens
  per patch with a hook on the component, as ``transformer_lens.patching`` does.
- stacked (``head_local=False``, and always for resid_pre): ``run_with_hooks`` from the target's residual
  stream at the patched layer (``start_at_layer``; earlier layers are not rerun), with one hook on the
  patched activation that overwrites, in copy p, exactly the slice (head[p], pos[p]) from the source
  run -- one advanced-index assignment with index tensors per chunk, not one per patch.
- head-local (the default where the blocks allow it, `kernels.supported`: standard causal attention with
  standard, shortformer or rotary positions (rotary: z, v and pattern patches; its cached q and k are
  before the rotation), LayerNorm / RMSNorm and MLPs allowed, no grouped queries, sinks or soft-capping,
  no padding mask): a patch of head h's q, k, v, pattern or z changes only
  z[:, :, h] in its layer, so the rest of that layer is taken from the cached target run. Each copy
  recomputes head h alone (scores with the module's own ``calculate_attention_scores`` and causal mask,
  softmax, ``pattern @ v``), applies ``F.linear(z, W_O, b_O)``, adds the target's resid_pre and runs the
  block's MLP, as the block does; a one-position patch of z, q or pattern changes a single row of z, so
  only that row is recomputed. Later layers then run row-wise from the first row the patch can change
  (``headcoop.analysis.engine.kernels``: with causal attention no earlier row changes; the keys and values of
  earlier rows come from the target's cache), and the last layer only at the rows the metric reads
  (checked on every call, see ``kernels.reads_only``).

The metric is evaluated per copy on the stacked logits: the task's logit difference is vectorised over
the patch axis; a user metric is called on each copy's [batch, pos, vocab] slice (no forward pass).
Results stay on the device until one transfer at the end; only the activations needed are cached.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from typing import Literal, cast

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor
from transformer_lens.utilities import get_act_name

from headcoop.analysis.engine import kernels
from headcoop.analysis.engine.copies import (
    Copies,
    Rows,
    Target,
    clean_corrupt,
    continuation,
    copies_per_chunk,
    route,
    target_run,
)  # fmt: skip
from headcoop.analysis.engine.grid import PatchGrid, normalized, pos_labels, select_cells
from headcoop.analysis.engine.inputs import check_choice, model_device, parse_heads, require_model
from headcoop.analysis.engine.kernels import attention_out, causal, softmax_keys
from headcoop.analysis.vocabulary import (
    COMPONENTS,
    DIRECTIONS,
    PATCH_METHODS,
    POSITIONS,
    RESID_COMPONENTS,
    Component,
    Direction,
    PatchMethod,
    Positions,
    head_name,
    layer_name,
)  # fmt: skip
from headcoop.checks import check_bool, check_finite, check_memory_budget
from headcoop.display.progress import with_progress
from headcoop.models.tl import HookedTransformer
from headcoop.storage.results import Result

Metric = Callable[[Float[Tensor, "batch pos vocab"]], Float[Tensor, ""]]


# --- the result ---------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class PatchResult(Result):
    """The metric after each patch, with labelled axes.

    values:        tensor whose axes are named by `dims`:
                   z/q/k/v/pattern, positions="all":  ("layer", "head")
                   z/q/k/v,         positions="each": ("layer", "pos", "head")
                   pattern,         positions="each": ("layer", "dest_pos", "head")  (the query position
                                                      whose attention row is patched)
                   resid_pre / attn_out / mlp_out, "all": ("layer",);  "each": ("layer", "pos")
    coords:        for each dim, the model index of each entry (e.g. the layers and heads patched).
    clean_value:   the metric on the unpatched clean run; corrupt_value: on the unpatched corrupt run.
    pos_labels:    one label per position ("3 =" where every clean row holds "=" there, else "3").
    method:        how the patched runs were computed: "head-local", "stacked", or "reference: one pass per
                   patch (...)" with method="reference" or hooks installed on the model (see `patch`).
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
        return normalized(self.values, self.clean_value, self.corrupt_value)

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
# --- the patch grid -----------------------------------------------------------------------------------
def _set_slices(act: Tensor, source: Tensor, component: str, head: Tensor | None, pos: Tensor | None) -> None:
    """In place: in copy i of `act` ([n, batch, ...]) put `source`'s slice (head[i], pos[i]).

    act: [n, batch, pos, head, d] for q/k/v/z, [n, batch, head, dest, src] for pattern,
    [n, batch, pos, d_model] for resid_pre, attn_out, mlp_out; source: the same without the leading n.
    """
    copy = torch.arange(act.shape[0], device=act.device)
    if component in RESID_COMPONENTS:
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


def _prefix_reusable(model: HookedTransformer, component: str) -> bool:
    """Whether the head-local shortcut reproduces the model's own computation: blocks whose attention
    output is `F.linear(z, W_O, b_O)` added to resid_pre (then the MLP, per row), scores from the hooked q/k
    by `calculate_attention_scores` and the causal mask alone, and later layers the row-wise suffix
    (`headcoop.analysis.engine.kernels`) runs exactly."""
    if component in RESID_COMPONENTS or not kernels.supported(model):
        return False
    # the cached q and k of a rotary model are before the rotation the scores use: q/k patches go stacked
    return not (model.cfg.positional_embedding_type == "rotary" and component in ("q", "k"))


def patches_per_chunk(
    model: HookedTransformer,
    batch: int,
    n_pos: int,
    memory_budget_mb: float,
    from_layer: int = 0,
    head_local: bool = False,
) -> int:
    """How many patched copies of a [batch, n_pos] input share one pass (`copies.copies_per_chunk`, the
    engine's one memory formula)."""
    return copies_per_chunk(model, batch, n_pos, memory_budget_mb, from_layer=from_layer, head_local=head_local)


# --- patching -----------------------------------------------------------------------------------------
@with_progress("hc.patch", cheaper="positions='all', or hc.attribute (gradient estimates, verified), is cheaper")
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
    head_local: bool | None = None,
    method: PatchMethod = "auto",
    heads=None,
    progress: bool | None = None,
) -> PatchResult:
    """Activation patching of one head or every head (or the residual stream), all patches batched.

    model:       any attention-only HookedTransformer; with `model.task`, nothing else is needed.
    head, layer: which heads to patch. None means all: `head=3` patches head 3 in every layer (one
                 value per layer), `head=3, layer=1` that single head, `layer=1` every head of layer 1.
                 Out of range -> IndexError. resid_pre, attn_out and mlp_out take no head.
    clean, corrupt: [batch, pos] tokens in any form `as_tokens` takes (Batch, texts, ids), same shape.
                 Default: the task's `patching_inputs()`; with clean a Batch, corrupt defaults to
                 `task.corrupt(clean)`.
    metric:      logits [batch, pos, vocab] -> scalar tensor. Default: the task's mean logit difference
                 (right answer minus alternative at the answer position) on the clean Batch.
    component:   "z" (head output), "q", "k", "v", "pattern", or per layer with no head axis "resid_pre",
                 "attn_out" (the attention block's output) or "mlp_out" (models with MLPs).
                 In a grouped-query model the head axis of "k" and "v" counts key/value heads: patching
                 one changes every query head that shares it.
    positions:   "all" patches every position at once; "each" one patch per position (per destination
                 position for "pattern", like transformer_lens's pattern-by-pos).
    direction:   "denoise" runs corrupt with clean activations patched in; "noise" the reverse.
    memory_budget_mb: memory for one stacked pass; sets how many patches share a pass.
    head_local:  deprecated, the older knob for method= (False: method="stacked"); a DeprecationWarning.
    method:      "auto" (head-local where it applies, else stacked; the reference whenever a hook is
                 installed), "head-local", "stacked", or "reference": the slow, obviously-correct path, one
                 forward pass from the tokens per patch with a hook on the component, as
                 `transformer_lens.patching` does. The tests compare the fast paths with it through this switch.

    heads:       only these heads, in any form `hc.ablate` takes ("L0H1", (3, 2), [...]; instead of head/layer):
                 the result keeps the full [layer, (pos,) head] grid with NaN for the heads left out.

    Hooks already on the model (inside `hc.ablate`, `hc.set_attention`, or a user's own) are honoured:
    every shortcut above would bypass them or stack the batch they may depend on, so with any hook
    installed each patch is one plain forward pass from the tokens, as `transformer_lens.patching` does
    (exact, and as slow as it); `result.method` says which way ran.
    ValueError for a model with NaN/inf weights or a metric that does not return a scalar.
    Returns a PatchResult; `values` has dims ("layer", "head"), ("layer", "pos", "head"),
    ("layer", "dest_pos", "head"), ("layer",) or ("layer", "pos") (see PatchResult).
    progress: a tqdm bar over the call's modified runs, shown after 2 s, with a one-line estimate when they
    predict more than two minutes (default: the process setting `hc.set_progress`, on unless turned off).
    Long: the docstring documents each argument; the body is 47 lines.
    """
    require_model(model, "hc.patch")
    check_finite(model, "hc.patch")
    check_choice("component", component, COMPONENTS)
    check_choice("positions", positions, POSITIONS)
    check_choice("direction", direction, DIRECTIONS)
    memory_budget_mb = check_memory_budget(memory_budget_mb)
    check_choice("method", method, PATCH_METHODS)
    if head_local is not None:  # the older knob for the same choice: method= says it (one knob per choice)
        check_bool("head_local", head_local)
        warnings.warn(
            "hc.patch(head_local=...) is method='head-local' (True) or method='stacked' (False); pass method= instead",
            DeprecationWarning,
            stacklevel=3,
        )  # fmt: skip  (3: past the progress decorator)
        if method == "auto" and not head_local:
            method = "stacked"
    chosen = None
    if heads is not None:
        if head is not None or layer is not None:
            raise ValueError("give heads= or head/layer, not both")
        if component in RESID_COMPONENTS:
            raise ValueError(f"component {component!r} has no head axis, so heads= does not apply")
        chosen = set(parse_heads(model, heads))
    layers, head_ids = select_cells(model, component, head, layer)
    clean_tokens, corrupt_tokens, score = clean_corrupt(model, clean, corrupt, metric)
    grid = PatchGrid.build(component, positions, layers, head_ids, clean_tokens.shape[1], model_device(model))
    cells = grid
    if chosen is not None:  # a kv head of a grouped-query model counts as chosen when a query head sharing it is
        per_kv = (
            model.cfg.n_heads // (model.cfg.n_key_value_heads or model.cfg.n_heads) if component in ("k", "v") else 1
        )
        keep = torch.tensor([any((int(lay), int(h) * per_kv + j) in chosen for j in range(per_kv))
                             for lay, h in zip(grid.layer.tolist(), cast(Tensor, grid.head).cpu().tolist())])  # fmt: skip
        cells = grid.take(keep.nonzero().flatten())
    values, clean_value, corrupt_value, label = sweep(model, component, cells, clean_tokens, corrupt_tokens, score,
                                                      direction, method, memory_budget_mb)  # fmt: skip
    if chosen is not None:
        full = torch.full((len(grid.layer),), float("nan"), dtype=values.dtype, device=values.device)
        full[keep.nonzero().flatten().to(values.device)] = values
        values = full
    return PatchResult(
        values=values.reshape(grid.shape).float().cpu(),
        dims=grid.dims,
        coords=grid.coords,
        clean_value=clean_value,
        corrupt_value=corrupt_value,
        component=component,
        positions=positions,
        direction=direction,
        pos_labels=pos_labels(model, clean_tokens),
        method=label,
    )


@torch.no_grad()
def sweep(model: HookedTransformer, component: str, grid: PatchGrid, clean_tokens: Tensor, corrupt_tokens: Tensor,
          score, direction: str, method: str = "auto", memory_budget_mb: float = 256,
          ) -> tuple[Float[Tensor, " patch"], float, float, str]:  # fmt: skip
    """The exact metric after each patch of `grid` (any cells, their layers nondecreasing), on the engine:
    (values [n_patches] on the model's device, clean value, corrupt value, the method label). `hc.patch`
    runs it on a full grid; `hc.attribute` on the cells it verifies."""
    layers = sorted(set(grid.layer.tolist()))
    source_tokens, target_tokens = (
        (clean_tokens, corrupt_tokens) if direction == "denoise" else (corrupt_tokens, clean_tokens)
    )
    extras = continuation(model, target_tokens)
    # the head-local scores use the causal mask alone: not with a padding mask
    possible = _prefix_reusable(model, component) and extras["attention_mask"] is None
    if method == "head-local" and not possible:
        raise ValueError(f"method='head-local' does not apply to component {component!r} of this model (its "
                         "blocks or a padding mask need the whole layer recomputed); use 'auto' or 'stacked'")  # fmt: skip
    fast: Literal["local", "stacked"] = "local" if possible and method in ("head-local", "auto") else "stacked"
    chosen = route(model, method, fast, "head-local" if fast == "local" else "stacked", "patch")
    path = chosen.path
    patched = {get_act_name(component, lay) for lay in layers}
    # The target run supplies each copy's starting point: the residual stream entering the patched layer,
    # and, for the head-local shortcut, that layer's activations the patch leaves alone.
    kept = ("resid_pre", "resid_post", "z", "q", "k", "v", "pattern") if path == "local" else ("resid_pre",)
    starts = {get_act_name(name, lay) for lay in layers for name in kept}
    if path == "local":  # the suffix reads later layers' cached keys and values for the rows that stay unchanged
        kinds = ("k", "v", "rot_k") if model.cfg.positional_embedding_type == "rotary" else ("k", "v")
        starts |= {f"blocks.{lay}.attn.hook_{kind}" for lay in range(min(layers), model.cfg.n_layers) for kind in kinds}
    source_logits, source_cache = model.run_with_cache(source_tokens, names_filter=lambda n: n in patched)
    source_value = float(score.one(source_logits))
    del source_logits  # [batch, pos, vocab]: at GPT-2 size larger than the patched activations
    target = target_run(model, target_tokens, score, lambda n: n in starts, rows=path == "local")
    target_value = cast(float, target.value)  # a scored target's metric (a number: the metric is a scalar)
    clean_value, corrupt_value = (
        (source_value, target_value) if direction == "denoise" else (target_value, source_value)
    )
    copies = patch_copies(model, component, grid, source_cache, target)
    values = chosen.evaluate(target, copies, memory_budget_mb)
    return values, clean_value, corrupt_value, chosen.label


def patch_copies(model, component: str, grid: PatchGrid, source_cache, target: Target) -> Copies:
    """The specification of a patch sweep for the engine: copy i patches (layer[i], head[i], pos[i])."""
    name = lambda lay: get_act_name(component, lay)  # noqa: E731

    def hook(layer: int, lo: int, hi: int):
        head = grid.head[lo:hi] if grid.head is not None else None
        pos = grid.pos[lo:hi] if grid.pos is not None else None
        source = source_cache[name(layer)]

        def fn(act: Tensor, hook) -> Tensor:
            act = act.contiguous()
            _set_slices(act.view(hi - lo, -1, *act.shape[1:]), source, component, head, pos)
            return act

        return [(name(layer), fn)]

    layers = grid.layer.tolist()

    def local(layer: int, lo: int, hi: int) -> Rows:
        head = grid.head[lo:hi] if grid.head is not None else None
        pos = grid.pos[lo:hi] if grid.pos is not None else None
        return _head_local(model, component, layer, hi - lo, head, pos, source_cache, target)

    return Copies(
        layers=layers,
        setter=lambda lo, hi: hook(layers[lo], lo, hi),
        reference=lambda i: model.run_with_hooks(target.tokens, fwd_hooks=hook(layers[i], i, i + 1)),
        local=local,
        reference_hooks=lambda i: hook(layers[i], i, i + 1),
    )


def _patched_head(target: Tensor, source: Tensor, pos: Tensor | None) -> Tensor:
    """`source` [n, batch, pos, ...] where pos is None, else `target` with row pos[i] of copy i from `source`."""
    if pos is None:
        return source
    copy = torch.arange(len(pos), device=pos.device)
    patched = target.clone()
    patched[copy, :, pos] = source[copy, :, pos]
    return patched


def _head_local(model, component, layer, n, head, pos, source_cache, target: Target) -> Rows:
    """n copies patched at (layer, head[i], pos[i]) with only the patched head of `layer` recomputed.

    A patch of head h's q, k, v, pattern or z changes nothing else in its layer, so each copy takes the
    target's z, recomputes z[:, :, h] from the patched activation exactly as the attention module does,
    adds `F.linear(z, W_O, b_O)` to the target's resid_pre, and runs the later layers from there.
    Patches of one position of z, q or pattern change one row of z only (see `_row_local`).
    """
    if pos is not None and component in ("z", "q", "pattern"):
        return _row_local(model, component, layer, n, head, pos, source_cache, target)
    attn = model.blocks[layer].attn
    act = lambda kind, cache=target.cache: cache[get_act_name(kind, layer)]  # noqa: E731
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
            pattern = kernels.pattern_of(model, attn, flat(q), flat(k)).view(n, batch, n_pos, n_pos)
        z[copy, :, :, head] = pattern @ v
    out = attention_out(attn, z.view(n * batch, n_pos, *z.shape[-2:]))
    resid_mid = act("resid_pre") + out.view(n, batch, n_pos, -1)
    # a k or v patch at position p changes no query row before p: the MLP and later layers start at row p
    starts = torch.zeros(n, dtype=torch.long, device=resid_mid.device) if pos is None else pos
    return Rows(layer + 1, resid_mid, starts, finish=layer)


def _row_local(model, component, layer, n, head, pos, source_cache, target: Target) -> Rows:
    """Copy i patches head[i] of z, q or pattern at position pos[i] only: that changes z, hence the block's
    output, at that one query position. Each copy is the target's resid_post with row pos[i] recomputed."""
    attn = model.blocks[layer].attn
    act = lambda kind, cache=target.cache: cache[get_act_name(kind, layer)]  # noqa: E731
    batch, n_pos = act("z").shape[:2]
    copy = torch.arange(n, device=pos.device)
    z_row = act("z")[:, pos].transpose(0, 1).clone()  # [n, batch, head, d_head]
    if component == "z":
        z_row[copy, :, head] = act("z", source_cache)[:, pos, head].transpose(0, 1)
    else:  # one query row per copy: one matrix product per head over its copies, not n * batch tiny ones
        by_head = [(h, (head == h).nonzero().flatten()) for h in head.unique().tolist()]
        if component == "pattern":
            pattern = act("pattern", source_cache)[:, head, pos].transpose(0, 1)  # [n, batch, key_pos]
        else:
            q = act("q", source_cache)[:, pos, head].transpose(0, 1)  # [n, batch, d_head]
            scores = torch.empty(n, batch, n_pos, dtype=q.dtype, device=q.device)
            for h, at in by_head:  # [batch, copies, d_head] @ [batch, d_head, key_pos]
                scores[at] = (q[at].transpose(0, 1) @ act("k")[:, :, h].transpose(1, 2)).transpose(0, 1)
            scores = scores / attn.attn_scale
            if causal(model, attn):
                scores = kernels.mask_future(scores, attn, pos, align="copy")
            pattern = softmax_keys(scores)
        for h, at in by_head:  # [batch, copies, key_pos] @ [batch, key_pos, d_head]
            z_row[at, :, h] = (pattern[at].transpose(0, 1) @ act("v")[:, :, h]).transpose(0, 1)
    out = attention_out(attn, z_row.reshape(n, batch, *z_row.shape[-2:]))  # [n, batch, d_model]
    new_rows = kernels.finish_block(model, layer, act("resid_pre")[:, pos].transpose(0, 1) + out)  # [n, batch, d]
    return Rows(layer + 1, (act("resid_post"), new_rows), pos)


# --- plotting -----------------------------------------------------------------------------------------
def _title(result: PatchResult, normalized: bool) -> str:
    """The figure's title in words: what was patched into what, and what the colour means."""
    what = {
        "resid_pre": "the residual stream",
        "attn_out": "each attention block's output",
        "mlp_out": "each MLP's output",
    }.get(result.component, f"each head's {result.component}")
    where = "at all positions at once" if result.positions == "all" else "one position at a time"
    if result.direction == "denoise":
        ran = f"Patching {what} from the clean run into the corrupt run, {where}"
        scale = "share of the clean − corrupt gap restored (1: fully restored)"
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

    from headcoop.display.plot import TEMPLATE, crowded_ticks, heatmap, wrapped_title

    values = result.normalized() if normalized else result.values
    title = title or _title(result, normalized)
    layers = result.coords["layer"]
    layer_names = [layer_name(lay) for lay in layers]
    hover = "%{customdata}<br>value %{z:.4g}<extra></extra>"
    if result.dims == ("layer",):
        fig = heatmap(values[None], x=layer_names, y=[result.component], title=title, xlabel="layer")
        fig.data[0].update(customdata=[[f"{result.component} {name}" for name in layer_names]], hovertemplate=hover)
        return fig
    if result.dims == ("layer", "pos"):
        labels = result.pos_labels
        fig = heatmap(values, x=labels, y=layer_names, title=title, xlabel="position", ylabel="layer")
        names = [[f"{result.component} {ln}, pos {p}" for p in labels] for ln in layer_names]
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
    fig = make_subplots(
        rows=len(layers),
        cols=1,
        subplot_titles=[f"layer {lay}" for lay in layers],
        vertical_spacing=0.3 / max(1, len(layers)),
    )
    for row, lay in enumerate(layers):
        row_names = [head_name(lay, h) for h in heads]
        panel = heatmap(values[row].T, x=labels, y=row_names)
        trace = panel.data[0]
        trace.update(
            zmin=-bound,
            zmax=bound,
            zmid=None,
            coloraxis=None,
            showscale=row == 0,
            customdata=[[f"{name}, {pos_title} {p}" for p in labels] for name in row_names],
            hovertemplate=hover,
        )
        fig.add_trace(trace, row=row + 1, col=1)
        fig.update_xaxes(type="category", title_text=pos_title if row == len(layers) - 1 else None, row=row + 1, col=1,
                         **crowded_ticks(labels))  # fmt: skip
        fig.update_yaxes(type="category", autorange="reversed", row=row + 1, col=1)
    title, top = wrapped_title(title)  # the subtitle's lines, and room for them above the first panel's own title
    fig.update_layout(title=title, template=TEMPLATE, margin=dict(t=top + 30),
                      height=max(300, top + 30 + 30 * len(heads) * len(layers)))  # fmt: skip
    return fig


__all__: Sequence[str] = ["patch", "PatchResult", "patches_per_chunk", "COMPONENTS", "POSITIONS", "DIRECTIONS"]
