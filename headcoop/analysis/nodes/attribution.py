"""Attribution patching, checked: gradient estimates of every patch of a sweep, then the top cells and a random
sample of the rest patched exactly on the stacked-copies engine, with a bound on what the estimate missed.

Every cell of `hc.patch`'s grid (a head's z, q, k, v or pattern at one position or at all, a layer's
resid_pre, attn_out or mlp_out) gets an estimate of the metric after that patch, from a few passes instead of
one per cell (target = the run patched into, source = the run patched from, as in `hc.patch`: "denoise" runs
corrupt with clean activations, "noise" the reverse):

- ``"atp"`` (attribution patching, Nanda 2023): first order at the target run,
  ``metric(target) + sum((a_source - a_target) * d metric / d a)`` over the patched slice and the batch.
  Two forward passes and one backward pass for every cell at once. Exact where the metric is linear in the
  patched activation (z of a one-layer attention-only model under the logit difference).
- ``"atp*"`` (Kramar et al. 2024, arXiv 2403.00745), two fixes against false negatives:
  the *QK fix*: a q or k patch changes the attention pattern through a softmax that saturates; its effect on
  the pattern is computed exactly (each patched query's row, or each patched key's column, re-normalised) and
  linearised from the pattern only (``sum(d_pattern * d metric / d pattern)``);
  *GradDrop*: the ranking score is ``1/(L-1) sum_l |estimate with the gradient through layer l's output
  dropped|`` (l over the L blocks; a block's output is its attn_out and mlp_out), so that direct and
  indirect effects that cancel in the plain gradient cannot both vanish. GradDrop is a magnitude: the signed
  estimate (``values``) is the QK-fixed one; the ranking (``score``) is the larger of GradDrop's and
  |estimate|: GradDrop guards against cancellation, and a node whose whole effect runs through one later
  block (a layer-0 head read by layer 1 of a two-layer model) has every dropped term 0 and would otherwise
  rank last with a true effect of the whole gap. A one-layer model has
  nothing to drop: there the score is |estimate|, as the result's ``assumptions`` says.
- ``"ig"`` (integrated gradients along the corrupt-clean path, as EAP-IG, Hanna et al. 2024): the input
  residual stream moves from the target's to the source's in ``steps`` midpoint steps; the gradients at each
  activation are averaged over them and multiplied by ``a_source - a_target``.

Verification: the ``verify`` cells with the largest score and ``sample`` cells drawn at random from the rest
(``seed``) are patched exactly with the engine (`headcoop.analysis.nodes.patching.sweep`, the path `hc.patch` takes,
exact with any hook installed). From the sample, a count with a Clopper-Pearson 95% interval of the cells
outside the top whose exact effect exceeds the smallest exact effect among the top cells (AtP*'s
false-negative bound). ``verify="all"`` runs the whole exact sweep: then recall@k and the correlations are
measured, not estimated.

Costs are counted in forward-pass equivalents (a backward pass counted as two forward passes).
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from collections.abc import Sequence
from typing import Any, Literal, cast

import numpy as np
import pandas as pd
import torch
from torch import Tensor
from transformer_lens.utilities import get_act_name

from headcoop.analysis.engine.copies import chunks, clean_corrupt, gradient_part_size, hooks_in_the_way
from headcoop.analysis.engine.grid import PatchGrid, kv_heads, normalized, pos_labels, select_cells
from headcoop.analysis.engine.inputs import check_choice, model_device
from headcoop.analysis.engine.kernels import scores_of, softmax_keys
from headcoop.analysis.engine.verification import miss_bound, pick, wide_bound
from headcoop.analysis.nodes.patching import sweep
from headcoop.analysis.vocabulary import (
    ATTRIBUTION_METHODS,
    COMPONENTS,
    DIRECTIONS,
    POSITIONS,
    RESID_COMPONENTS,
    AttributionMethod,
    Component,
    Direction,
    Positions,
    head_name,
    layer_name,
)  # fmt: skip
from headcoop.checks import check_bool, check_finite, check_int, check_memory_budget, check_steps
from headcoop.display.progress import advance, with_progress
from headcoop.models.bridge import require_model
from headcoop.models.tl import HookedTransformer
from headcoop.storage.results import Result


@dataclasses.dataclass(frozen=True)
class AttributionResult(Result):
    """Estimates of every patch of a sweep, with the verified cells' exact values.

    values:     the estimated metric after each patch, laid out as `hc.patch`'s PatchResult.values (same
                `dims`, `coords`): the two compare cell by cell.
    score:      the ranking magnitude, same shape: |estimate - target value|, or GradDrop's for "atp*".
    exact:      the exact metric after the patch where verified, NaN elsewhere.
    top, sampled: bool masks of the verified cells: the `verify` best by score, and the random sample.
    missed:     the false-negative bound: {"threshold": the smallest exact |effect| among the top cells,
                "rest": cells outside the top, "sampled", "above": sampled cells whose exact |effect| exceeds
                the threshold, "estimate", "low", "high": that count scaled to the rest, with its 95%
                Clopper-Pearson interval}; empty when nothing was verified.
    cost:       forward-pass equivalents of the estimate and of the verification (a backward pass = 2), and
                the seconds each took ("estimate_s", "verification_s").
    assumptions: what the estimate assumes, in words (also in the repr and the plot title).
    """

    values: Tensor
    score: Tensor
    exact: Tensor
    top: Tensor
    sampled: Tensor
    dims: tuple[str, ...]
    coords: dict[str, list[int]]
    clean_value: float
    corrupt_value: float
    target_value: float
    component: str
    positions: str
    direction: str
    estimator: str
    pos_labels: list[str]
    missed: dict
    cost: dict
    assumptions: tuple[str, ...]
    method: str = ""  # the path of the verification's exact patches, as PatchResult.method

    @property
    def verified(self) -> Tensor:
        """Bool mask of the cells patched exactly."""
        return ~torch.isnan(self.exact)

    @property
    def effect(self) -> Tensor:
        """Estimated change of the metric by each patch: values - the target run's value."""
        return self.values - self.target_value

    def normalized(self) -> Tensor:
        """As PatchResult.normalized: (values - corrupt) / (clean - corrupt)."""
        return normalized(self.values, self.clean_value, self.corrupt_value)

    def recall(self, k: int = 10) -> float:
        """Share of the exact top-k cells (by |exact effect|) among the top-k by score; needs every cell
        verified (verify="all"), else ValueError. NaN where the exact top k is not determined (a tie at the
        k-th place, e.g. when most patches change nothing)."""
        if not bool(self.verified.all()):
            raise ValueError("recall@k needs the exact value of every cell: run hc.attribute(..., verify='all')")
        return cast(float, self.compare(self.exact, k)[f"recall@{min(k, self.values.numel())}"])

    def correlation(self) -> dict[str, float]:
        """Pearson and Spearman correlation of estimated and exact effects over the verified cells."""
        mask = self.verified.reshape(-1)
        est, ex = (
            self.effect.reshape(-1)[mask].double().numpy(),
            (self.exact.reshape(-1)[mask] - self.target_value).double().numpy(),
        )
        if len(est) < 3 or est.std() == 0 or ex.std() == 0:
            return {"pearson": float("nan"), "spearman": float("nan"), "cells": int(len(est))}
        rank = lambda x: pd.Series(x).rank().to_numpy()  # noqa: E731
        return {"pearson": float(np.corrcoef(est, ex)[0, 1]), "spearman": float(np.corrcoef(rank(est), rank(ex))[0, 1]),
                "cells": int(len(est))}  # fmt: skip

    def compare(self, exact, k: int = 10) -> dict[str, float | list[int]]:
        """Against a full exact sweep (`hc.patch`'s PatchResult, or its values, same layout): Pearson and
        Spearman correlation of estimated and exact effects over every cell, recall@k (the share of the exact
        top-k by |effect| among the top-k by score; NaN where a tie at the k-th place leaves the exact top k
        undetermined), and the exact top-k cells the score missed (flat indices)."""
        if isinstance(exact, (Tensor, np.ndarray)):
            values = torch.as_tensor(exact)
        elif isinstance(getattr(exact, "values", None), Tensor):
            values = exact.values
        else:
            raise TypeError(f"compare needs the exact sweep: hc.patch's PatchResult or its values (a tensor of shape "
                            f"{tuple(self.values.shape)}), got {type(exact).__name__} {exact!r:.60}")  # fmt: skip
        check_int("k", k, 1)
        if not bool(torch.isfinite(values).all()):
            raise ValueError(f"compare: {int((~torch.isfinite(values)).sum())} of the {values.numel()} exact values are "
                             "NaN or inf; correlations and recall over them mean nothing")  # fmt: skip
        if tuple(values.shape) != tuple(self.values.shape):
            raise ValueError(
                f"exact values of shape {tuple(values.shape)} do not match this result's {tuple(self.values.shape)}"
            )
        est = self.effect.reshape(-1).double()
        ex = values.reshape(-1).double().cpu() - self.target_value
        k = min(k, est.numel())
        truth = set(ex.abs().topk(k).indices.tolist())
        ours = set(self.score.reshape(-1).topk(k).indices.tolist())
        recall = len(truth & ours) / k if _top_k_determined(ex.abs(), k) else float("nan")
        corr = lambda a, b: (  # noqa: E731
            float(torch.corrcoef(torch.stack([a, b]))[0, 1]) if a.std() > 0 and b.std() > 0 else float("nan")
        )
        rank = lambda x: x.argsort().argsort().double()  # noqa: E731
        return {"pearson": corr(est, ex), "spearman": corr(rank(est), rank(ex)), f"recall@{k}": recall,
                "missed": sorted(truth - ours) if recall == recall else []}  # fmt: skip

    def __repr__(self) -> str:
        m = self.missed
        bound = (f", missed outside the top: {m['estimate']:.3g} ({m['low']:.3g}..{m['high']:.3g}) of {m['rest']}"
                 if m else "") + wide_bound(m, int(self.top.sum()), "cells")  # fmt: skip
        return (f"AttributionResult({self.estimator!r} {self.direction} {self.component!r}, positions={self.positions!r}, "
                f"dims={self.dims}, shape={tuple(self.values.shape)}, verified={int(self.verified.sum())}{bound}; "
                f"assumes: {'; '.join(self.assumptions)})")  # fmt: skip

    def to_dataframe(self) -> pd.DataFrame:
        """One row per cell: a column per dim, `estimate` (the metric after the patch, estimated), `score`,
        `exact` (NaN where not verified), `verified`, `top`, `sampled`."""
        frame = self.as_patch_result().to_dataframe().rename(columns={"value": "estimate"}).drop(columns="normalized")
        frame["score"] = self.score.reshape(-1).numpy()
        frame["exact"] = self.exact.reshape(-1).numpy()
        frame["verified"] = self.verified.reshape(-1).numpy()
        frame["top"], frame["sampled"] = self.top.reshape(-1).numpy(), self.sampled.reshape(-1).numpy()
        if "head" in frame:
            frame.insert(0, "name", [head_name(lay, h) for lay, h in zip(frame["layer"], frame["head"])])
        return frame

    def as_patch_result(self):
        """The estimates as a PatchResult (same grid; `method` names the estimate), for its heatmaps and helpers."""
        from headcoop.analysis.nodes.patching import PatchResult

        return PatchResult(values=self.values, dims=self.dims, coords=self.coords, clean_value=self.clean_value,
                           corrupt_value=self.corrupt_value, component=self.component, positions=self.positions,
                           direction=self.direction, pos_labels=self.pos_labels, method=f"estimate: {self.estimator}")  # fmt: skip

    def plot(self, kind: Literal["scatter", "map"] = "scatter", title: str | None = None):
        """A plotly figure (never shown). "scatter": the estimated against the exact effect of the verified
        cells, top and sampled cells apart, with the line where they agree. "map": the estimates as
        `hc.patch`'s heatmap (normalised where the baselines differ), the title saying they are estimates,
        what was verified and the false-negative bound."""
        if kind == "map":
            check_choice("kind", kind, ("scatter", "map"))
            m = self.missed
            checked = (f"{int(self.top.sum())} top cells and {int(self.sampled.sum())} sampled verified exactly"
                       + (f"; estimated {m['estimate']:.3g} ({m['low']:.3g}..{m['high']:.3g}) cells outside the top exceed "
                          "the top's smallest exact effect" if m else "") if bool(self.verified.any()) else "nothing verified")  # fmt: skip
            normalized = self.clean_value != self.corrupt_value
            title = title or (f"{self.estimator} ESTIMATE of patching each head's {self.component} ({self.direction})"
                              f"<br><sup>{'; '.join(self.assumptions)}; {checked}</sup>")  # fmt: skip
            return self.as_patch_result().plot(normalized=normalized, title=title)
        check_choice("kind", kind, ("scatter", "map"))
        import plotly.graph_objects as go

        from headcoop.display.plot import TEMPLATE

        frame = self.to_dataframe()
        frame = frame[frame.verified]
        fig = go.Figure()
        for name, part in (("top by score", frame[frame.top]), ("random sample", frame[frame.sampled & ~frame.top])):
            label = (part["name"] if "name" in part else part.layer.map(layer_name)).astype(str)
            if "pos" in part or "dest_pos" in part:
                label = label + ", pos " + part.get("pos", part.get("dest_pos")).astype(str)
            fig.add_trace(go.Scatter(x=part.exact - self.target_value, y=part.estimate - self.target_value, mode="markers",
                                     name=name, text=label, hovertemplate="%{text}<br>exact %{x:.4g}<br>estimate %{y:.4g}<extra></extra>"))  # fmt: skip
        if len(frame):
            lo = float(min((frame.exact - self.target_value).min(), (frame.estimate - self.target_value).min()))
            hi = float(max((frame.exact - self.target_value).max(), (frame.estimate - self.target_value).max()))
            fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="estimate = exact",
                                     line=dict(dash="dot", color="grey")))  # fmt: skip
        title = title or (f"{self.estimator} estimates of patching {self.component} ({self.direction}) against exact "
                          f"patching<br><sup>assumes: {'; '.join(self.assumptions)}</sup>")  # fmt: skip
        fig.update_layout(title=title, template=TEMPLATE, xaxis_title="exact effect on the metric",
                          yaxis_title="estimated effect")  # fmt: skip
        return fig


# --- the passes ---------------------------------------------------------------------------------------
class _Gate(torch.autograd.Function):
    """Identity forward; backward zeroes the gradient while state["layer"] == layer (GradDrop). A new node in
    the graph, so a kept activation at the same hook (attn_out, mlp_out) receives its gradient through the
    gate: a tensor hook on the kept tensor itself is skipped by autograd.grad when something further upstream
    is also requested (measured: last-block attn_out/mlp_out scored L/(L-1) |AtP|)."""

    @staticmethod
    def forward(ctx, act, state, layer):
        ctx.state, ctx.layer = state, layer
        return act.view_as(act)

    @staticmethod
    def backward(ctx, grad):
        return (torch.zeros_like(grad) if ctx.state["layer"] == ctx.layer else grad), None, None


def _run(model, tokens, names: list[str], start=None, graddrop: dict | None = None):
    """One forward pass of `tokens` with the activations `names` kept in the graph (in order), and
    (`start`: a function of the input residual stream) the input residual stream replaced. graddrop:
    {"layer": None | l}: the gradient through block l's attn_out and mlp_out is zeroed while it is l."""
    kept: dict[str, Tensor] = {}

    def keep(act, hook):
        kept[hook.name] = act
        return act

    def begin(act, hook):
        new = start(act) if start is not None else act
        return new.detach().requires_grad_(True)  # every later activation is in the graph, frozen weights or not

    hooks = [("blocks.0.hook_resid_pre", begin)] + [(n, keep) for n in names]
    if graddrop is not None:

        def gate(layer):
            def fn(act, hook):  # a new tensor downstream: the kept activation's own gradient passes the gate
                return _Gate.apply(act, graddrop, layer) if act.requires_grad else act

            return fn

        for lay in range(model.cfg.n_layers):
            hooks.append((f"blocks.{lay}.hook_attn_out", gate(lay)))
            if not model.cfg.attn_only and model.cfg.d_mlp:
                hooks.append((f"blocks.{lay}.hook_mlp_out", gate(lay)))
    logits = model.run_with_hooks(tokens, fwd_hooks=hooks)
    return logits, [kept[n] for n in names]


def _grads(value: Tensor, acts: list[Tensor], retain_graph: bool = False) -> list[Tensor]:
    """d value / d act for each act (zeros where the value does not depend on it); ValueError when the
    metric is not differentiable (argmax accuracy, a Python float) or not finite (logits that overflow)."""
    if not isinstance(value, Tensor) or not value.requires_grad:
        raise ValueError(
            "hc.attribute needs a metric differentiable in the logits (a logit difference, a log-probability); "
            f"this one returned {value!r} with no gradient (argmax accuracy or a Python number cannot be "
            "attributed): use hc.patch for it"
        )
    if not bool(torch.isfinite(value.detach())):
        raise ValueError(f"hc.attribute: the metric of the target run is {float(value.detach())}, not finite (do the "
                         "logits overflow?); no gradient estimate can be made")  # fmt: skip
    g = torch.autograd.grad(value, acts, retain_graph=retain_graph, allow_unused=True)
    return [torch.zeros_like(a) if gi is None else gi for a, gi in zip(acts, g)]


def _per_cell(component: str, positions: str, prod: Tensor) -> Tensor:
    """Sum an elementwise product [batch, ...] of one layer into that layer's cells: [pos, head] / [head]
    for head components, [dest, head] / [head] for pattern, [pos] / [] for the residual components."""
    if component == "pattern":
        per = prod.sum(-1).sum(0).transpose(0, 1)  # [batch, head, dest, src] -> [dest, head]
    else:
        per = prod.sum(-1).sum(0)  # [pos, head] or [pos]
    return per.sum(0) if positions == "all" else per


def _group(model, per_head: Tensor) -> Tensor:
    """Sum query heads [..., n_heads] into their key/value heads [..., n_kv] (grouped-query models)."""
    n_kv = kv_heads(model)
    if n_kv == model.cfg.n_heads:
        return per_head
    return per_head.reshape(*per_head.shape[:-1], n_kv, model.cfg.n_heads // n_kv).sum(-1)


def _qk_fixed(model, layer: int, component: str, positions: str, acts: dict, source: dict, g_pattern: Tensor) -> Tensor:
    """AtP*'s QK fix for one layer: the exact pattern after each q or k patch, linearised from the pattern."""
    attn = model.blocks[layer].attn
    q_t, k_t = acts["q"].detach().double(), acts["k"].detach().double()
    p_t, g = acts["pattern"].detach().double(), g_pattern.double()
    q_s, k_s = source["q"].double(), source["k"].double()
    with torch.no_grad():
        if component == "q":
            p_new = softmax_keys(scores_of(model, attn, q_s, k_t))
            per = ((p_new - p_t) * g).sum(-1).sum(0).transpose(0, 1)  # [dest, head]
            return per.sum(0) if positions == "all" else per
        if positions == "all":
            p_new = softmax_keys(scores_of(model, attn, q_t, k_s))
            return _group(model, ((p_new - p_t) * g).sum((-1, -2)).sum(0))
        t = scores_of(model, attn, q_t, k_t)  # [batch, head, dest, src]
        ks = scores_of(model, attn, q_t, k_s)
        n = t.shape[-1]
        idx = torch.arange(n, device=t.device)
        out = torch.zeros(t.shape[1], n, dtype=t.dtype, device=t.device)  # [head, patched src]
        for h in range(t.shape[1]):  # one head at a time: [batch, dest, patched src, src]
            new = t[:, h, :, None, :].expand(-1, -1, n, -1).clone()
            new[:, :, idx, idx] = ks[:, h]
            p_new = softmax_keys(new)
            out[h] = ((p_new - p_t[:, h, :, None, :]) * g[:, h, :, None, :]).sum(-1).sum((0, 1))
        return _group(model, out.transpose(0, 1))  # [pos, head]


def _qk_fix_applies(model, layers: list[int], acts: dict) -> bool:
    """Whether `kernels.scores_of` reproduces the cached pattern of every layer (rotary, scale and mask as the module
    has them); where it does not (e.g. ALiBi, soft-capping), AtP* keeps plain AtP for q and k and says so."""
    with torch.no_grad():
        for lay in layers:
            attn = model.blocks[lay].attn
            a = acts[lay]
            if not torch.allclose(softmax_keys(scores_of(model, attn, a["q"].detach(), a["k"].detach())),
                                  a["pattern"].detach(), atol=1e-4):  # fmt: skip
                return False
    return True


def _top_k_determined(magnitude: Tensor, k: int) -> bool:
    """Whether the k largest of `magnitude` are one set: no tie at the k-th place."""
    if k >= magnitude.numel():
        return True
    values = magnitude.sort(descending=True).values
    return bool(values[k - 1] > values[k])


# --- the entry point ----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Sweep:
    """What `attribute`'s gradient passes need of a sweep: the estimator (`method`), the patched component's
    hook names per layer (`names`; `all_names` with the QK fix's q, k and pattern), and whether GradDrop runs."""

    model: HookedTransformer
    method: str
    component: str
    positions: str
    layers: list
    names: list
    all_names: list
    qk_fix: bool
    steps: int
    dropping: bool

    def fix_applies(self, act_of: dict) -> bool:
        return self.qk_fix and _qk_fix_applies(
            self.model,
            self.layers,
            {lay: {x: act_of[f"blocks.{lay}.attn.hook_{x}"] for x in ("q", "k", "pattern")} for lay in self.layers},
        )

    def estimates(self, grads: list, act_of: dict, src: dict) -> Tensor:
        """[layer, ...] the estimate of every cell from the gradients at `all_names` (then freed: a GradDrop
        pass keeps its cells' estimates, not its gradients), the source's activations `src`."""
        grad_map, use_fix, per_layer = dict(zip(self.all_names, grads)), self.fix_applies(act_of), []
        for lay, name in zip(self.layers, self.names):
            if use_fix:
                a = {x: act_of[f"blocks.{lay}.attn.hook_{x}"] for x in ("q", "k", "pattern")}
                s = {x: src[f"blocks.{lay}.attn.hook_{x}"] for x in ("q", "k")}
                per = _qk_fixed(self.model, lay, self.component, self.positions, a, s,
                                grad_map[f"blocks.{lay}.attn.hook_pattern"])  # fmt: skip
            else:
                per = _per_cell(
                    self.component, self.positions, ((src[name] - act_of[name]).double() * grad_map[name].double())
                )
            per_layer.append(per)
        return torch.stack(per_layer)

    def part(self, tokens: Tensor, score, src: dict, src_resid: Tensor | None) -> tuple:
        """(estimate [layer, ...], GradDrop's per dropped layer, the metric of the target run, its activations)
        of the inputs `tokens` (a part of the batch, or all of it)."""
        model, names = self.model, self.all_names
        with torch.enable_grad():
            if self.method == "ig":
                grads = None
                advance(more=self.steps)  # each step one forward and backward pass: the bar and its estimate count them
                for i in range(self.steps):
                    alpha = (i + 0.5) / self.steps
                    logits, acts = _run(model, tokens, names, start=lambda x, a=alpha: x + a * (src_resid - x))
                    g = _grads(score.one(logits), acts)
                    grads = g if grads is None else [a + b for a, b in zip(grads, g)]
                    advance(done=1)
                with torch.no_grad():
                    logits, acts = _run(model, tokens, names)
                act_of = dict(zip(names, [a.detach() for a in acts]))
                return (
                    self.estimates([g / self.steps for g in cast(list, grads)], act_of, src),  # steps >= 1
                    [],
                    float(score.one(logits)),
                    act_of,
                )
            state: dict[str, int | None] = {"layer": None}
            logits, acts = _run(model, tokens, names, graddrop=state if self.dropping else None)
            value = score.one(logits)
            act_of = dict(zip(names, [a.detach() for a in acts]))
            estimate = self.estimates(_grads(value, acts, retain_graph=self.dropping), act_of, src)
            dropped = []
            n_layers = model.cfg.n_layers
            for lay in range(n_layers if self.dropping else 0):
                state["layer"] = lay
                dropped.append(self.estimates(_grads(value, acts, retain_graph=lay < n_layers - 1), act_of, src))
            return estimate, dropped, float(value.detach()), act_of


@with_progress("hc.attribute", cheaper="a smaller verify= / sample= is cheaper")
def attribute(
    model: HookedTransformer,
    clean=None,
    corrupt=None,
    metric=None,
    component: Component = "z",
    positions: Positions = "each",
    method: AttributionMethod | None = None,
    verify: int | str = 20,
    sample: int = 20,
    seed: int = 0,
    steps: int = 10,
    graddrop: bool = True,
    direction: Direction = "denoise",
    head=None,
    layer: int | None = None,
    memory_budget_mb: float = 256,
    estimator: AttributionMethod = "atp",
    progress: bool | None = None,
) -> AttributionResult:
    """Gradient estimates of every patch of a sweep, the top ones and a random sample verified exactly.

    model, clean, corrupt, metric, component, positions, direction, head, layer: as `hc.patch` (same defaults
    except positions, "each" here); the result's grid and `.values` are laid out as `hc.patch`'s.
    estimator: "atp" (first order), "atp*" (QK fix + GradDrop) or "ig" (integrated gradients, `steps` steps);
             see the module docstring. graddrop=False: "atp*" ranks by |QK-fixed estimate| (the QK fix alone).
             (`method=` is its older name, kept as a deprecated alias: `method` elsewhere names the engine's path.)
    verify:  how many cells, best by score, to patch exactly (0: none); "all": the whole exact sweep.
    sample:  how many further cells, drawn at random (`seed`) from the rest, to patch exactly: the
             false-negative bound comes from them.
    Returns an AttributionResult ([layer, pos, head] etc. as PatchResult; `exact` NaN where not verified).
    progress: as `hc.patch` (one bar over the call's runs, and the estimate before a long call).
    Long: three estimators share one gradient pass and its bookkeeping (their checks and assumptions are helpers).
    """
    require_model(model, "hc.attribute")
    check_finite(model, "hc.attribute")
    memory_budget_mb = check_memory_budget(memory_budget_mb)
    if torch.is_inference_mode_enabled():
        raise RuntimeError("hc.attribute needs gradients, which torch.inference_mode() turns off; call it outside "
                           "that block (torch.no_grad() is fine: hc.attribute turns gradients on itself)")  # fmt: skip
    check_choice("component", component, COMPONENTS)
    check_choice("positions", positions, POSITIONS)
    check_choice("direction", direction, DIRECTIONS)
    method = _estimator(estimator, method)  # below, `method` is the estimator (the result's field keeps its name)
    if verify != "all":
        check_int("verify", verify, 0)
    check_int("sample", sample, 0)
    check_steps(steps)  # the cap hc.edges shares: each step is a forward and a backward pass
    check_int("seed", seed, 0)
    check_bool("graddrop", graddrop)
    layers, heads = select_cells(model, component, head, layer)
    clean_tokens, corrupt_tokens, score_fn = clean_corrupt(model, clean, corrupt, metric)
    source_tokens, target_tokens = (
        (clean_tokens, corrupt_tokens) if direction == "denoise" else (corrupt_tokens, clean_tokens)
    )
    n_layers = model.cfg.n_layers
    names = [get_act_name(component, lay) for lay in layers]
    qk_fix = method == "atp*" and component in ("q", "k")
    fix_names = [f"blocks.{lay}.attn.hook_{x}" for lay in layers for x in ("q", "k", "pattern")] if qk_fix else []
    all_names = list(dict.fromkeys(names + fix_names))
    assumptions: list[str] = []
    cost = {"estimate": 0.0}
    started = time.perf_counter()
    with torch.no_grad():
        source_logits, source_cache = model.run_with_cache(source_tokens, names_filter=lambda n: n in all_names)
        source_value = float(score_fn.one(source_logits))
    cost["estimate"] += 1
    source = {n: source_cache[n] for n in all_names}
    del source_logits, source_cache

    dropping = method == "atp*" and graddrop and n_layers > 1
    sweep = _Sweep(model, method, component, positions, layers, names, all_names, qk_fix, steps, dropping)
    n = len(target_tokens)  # in parts within memory_budget_mb where the metric is a mean over inputs
    size = gradient_part_size(
        model,
        score_fn,
        n,
        target_tokens.shape[1],
        memory_budget_mb,
        "hc.attribute",
        hooked=bool(hooks_in_the_way(model)),
    )
    src_resid = None
    if method == "ig":
        with torch.no_grad():
            _, resid_cache = model.run_with_cache(source_tokens, names_filter=lambda n: n == "blocks.0.hook_resid_pre")
        src_resid = resid_cache["blocks.0.hook_resid_pre"]
    estimate: Any = 0.0  # a tensor once the first part is added
    dropped: list[Tensor] = []
    target_value = 0.0
    for lo, hi in chunks(0, n, size):
        share, rows = (hi - lo) / n, (lambda t: t[lo:hi] if t.shape[0] == n else t)  # noqa: E731
        got, drops, value, act_of = sweep.part(target_tokens[lo:hi], score_fn.part(lo, hi) if size < n else score_fn,
                                         {k: rows(v) for k, v in source.items()},
                                         rows(src_resid) if src_resid is not None else None)  # fmt: skip
        estimate, target_value = estimate + share * got, target_value + share * value
        dropped = [share * d for d in drops] if not dropped else [a + share * d for a, d in zip(dropped, drops)]
    cost["estimate"] += 3 * steps + 1 if method == "ig" else 3 + 2 * n_layers * dropping
    cost["parts"] = -(-n // size)
    assumptions += _assumptions(
        method, steps, n_layers, dropping, graddrop, qk_fix and sweep.fix_applies(act_of), qk_fix
    )

    grid = PatchGrid.build(component, positions, layers, heads, clean_tokens.shape[1], model_device(model))
    estimate, score = _scored(estimate, dropped, grid, heads if component not in RESID_COMPONENTS else None,
                              method, n_layers, source_value)  # fmt: skip
    values = estimate + target_value
    clean_value, corrupt_value = (
        (source_value, target_value) if direction == "denoise" else (target_value, source_value)
    )
    cost["estimate_s"] = time.perf_counter() - started
    started = time.perf_counter()
    exact, top, sampled, missed, exact_method = _verify(model, component, grid, clean_tokens, corrupt_tokens, score_fn,
                                                        direction, score, verify, sample, seed, target_value,
                                                        memory_budget_mb, cost, size)  # fmt: skip
    cost["verification_s"] = time.perf_counter() - started
    if hooks_in_the_way(model):
        assumptions.append("gradients through the hooks installed on the model")
    return AttributionResult(
        values=values, score=score, exact=exact, top=top, sampled=sampled, dims=grid.dims, coords=grid.coords,
        clean_value=clean_value, corrupt_value=corrupt_value, target_value=target_value, component=component,
        positions=positions, direction=direction, estimator=method, pos_labels=pos_labels(model, clean_tokens),
        missed=missed, cost=cost, assumptions=tuple(assumptions), method=exact_method,
    )  # fmt: skip


def _scored(estimate: Tensor, dropped: list, grid: PatchGrid, heads, method: str, n_layers: int,
            source_value: float) -> tuple[Tensor, Tensor]:  # fmt: skip
    """(estimate, score) on the grid's shape: the score is |estimate|, raised by GradDrop's for AtP*; a NaN or
    inf anywhere is a ValueError (nothing could be ranked)."""
    if heads:
        estimate = estimate[..., heads]
    estimate = estimate.reshape(grid.shape).float().cpu()
    if method == "atp*" and dropped:
        if heads:
            dropped = [d[..., heads] for d in dropped]
        graddrop_score = (sum(d.abs() for d in dropped) / (n_layers - 1)).reshape(grid.shape).float().cpu()
        score = torch.maximum(graddrop_score, estimate.abs())  # GradDrop only raises a node (module docstring)
    else:
        score = estimate.abs()
    bad = int((~torch.isfinite(estimate)).sum() + (~torch.isfinite(score)).sum())
    if bad or not math.isfinite(source_value):
        raise ValueError(
            f"hc.attribute: {bad} estimates or scores are NaN or inf (source metric {source_value}); the model's "
            "logits or gradients overflow in float32 (check the weights' scale), so no cell can be ranked"
        )
    return estimate, score


def _estimator(estimator: str, method: str | None) -> AttributionMethod:
    """The estimator chosen (`estimator=`, or `method=`, its deprecated older name), checked by name."""
    check_choice("estimator", estimator, ATTRIBUTION_METHODS)
    if method is None:
        return cast(AttributionMethod, estimator)  # checked by name above
    check_choice("method", method, ATTRIBUTION_METHODS)
    if estimator != "atp" and estimator != method:
        raise ValueError(f"method={method!r} and estimator={estimator!r} name the same choice; pass estimator= only")
    warnings.warn(
        "hc.attribute(method=...) is estimator=...; method= is deprecated here", DeprecationWarning, stacklevel=4
    )  # fmt: skip  (4: past this helper, hc.attribute and the progress decorator)
    return cast(AttributionMethod, method)


def _assumptions(method: str, steps: int, n_layers: int, dropping: bool, graddrop: bool, fixed: bool,
                 qk_fix: bool) -> list[str]:  # fmt: skip
    """What an estimate assumes, in the words its result's repr and plot title show."""
    if method == "ig":
        out = [f"integrated gradients, {steps} midpoint steps along the input residual stream"]
    elif dropping:
        out = [f"first order; GradDrop ranking over {n_layers} blocks"]
    elif method == "atp*":
        out = ["first order; one block, so no GradDrop: the score is |estimate|" if graddrop else
               "first order; no GradDrop (graddrop=False): the score is |estimate|"]  # fmt: skip
    else:
        out = ["first order in the patched activation"]
    if qk_fix:
        out.append("QK fix: the pattern after each q/k patch exact, linearised from the pattern" if fixed else
                   "QK fix not applicable to this attention (its scores are not reproduced): plain AtP for q/k")  # fmt: skip
    return out


def _verify(model, component, grid: PatchGrid, clean_tokens, corrupt_tokens, score_fn, direction, score: Tensor,
            verify, sample: int, seed: int, target_value: float, memory_budget_mb: float, cost: dict,
            size: int | None = None):  # fmt: skip
    """Patch exactly the top cells by score and a random sample of the rest; the false-negative bound. size: the
    inputs per part where the gradient passes ran in parts (each part patched alone, counted by its share: the
    metric is a mean over inputs), so that no run of the whole batch is cached."""
    n = score.numel()
    k = n if verify == "all" else min(int(verify), n)
    top_idx, sample_idx, rest = pick(score.reshape(-1), k, sample, seed)
    chosen = torch.cat([top_idx, sample_idx])
    exact = torch.full((n,), float("nan"))
    method_label = ""
    if len(chosen):
        by_layer = chosen[torch.argsort(grid.layer[chosen], stable=True)]  # the engine takes layers in order
        sub = grid.take(by_layer)
        n_in = len(clean_tokens)
        values: Any = 0.0  # a tensor once the first part is added
        for lo, hi in chunks(0, n_in, size or n_in):
            part = score_fn.part(lo, hi) if (size or n_in) < n_in else score_fn
            got, _, _, method_label = sweep(model, component, sub, clean_tokens[lo:hi], corrupt_tokens[lo:hi], part,
                                            direction, memory_budget_mb=memory_budget_mb)  # fmt: skip
            values = values + (hi - lo) / n_in * got.double()
        exact[by_layer] = values.float().cpu()
        cost["verification"] = 2 + len(chosen)  # two baseline passes and one patched copy per cell (at most)
    top = torch.zeros(n, dtype=torch.bool)
    top[top_idx] = True
    sampled = torch.zeros(n, dtype=torch.bool)
    sampled[sample_idx] = True
    missed = miss_bound(exact[top_idx] - target_value, exact[sample_idx] - target_value, rest)
    shape = score.shape
    return exact.reshape(shape), top.reshape(shape), sampled.reshape(shape), missed, method_label


__all__: Sequence[str] = ["attribute", "AttributionResult"]
