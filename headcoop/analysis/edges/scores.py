"""Edge attribution: one score per edge of the residual graph, from every writer to every reader.

Writers: the token embedding ("embed"), the positional embedding ("pos_embed", where the model adds one to the
residual stream), each head's output ("L0H3") and each MLP's output ("MLP0"). Readers: each head's query, key
and value input ("L1H2" via "q", "k", "v"), each MLP's input ("MLP1" via "in") and the logits ("logits" via
"direct"). A writer feeds every reader after it: a head of layer l feeds the MLP of layer l and everything
in later layers.

**Exact edge patching** (`estimator="exact"`, and the verification of the estimates): `edges/exact.py`, the
one specification and reference that `hc.path_patch` shares: the target run (corrupt for "denoise") with one
reader's input computed from the target's residual stream plus one writer's change of output, its norm at the
target's scale; on the stacked-copies engine, with canonical two-step path patching as the reference, taken
whenever any hook is installed on the model.

**Estimates**: edge attribution patching ("eap", Syed et al. 2023) scores an edge by the first-order change
of the metric, delta_w . d metric / d input_r, with the gradient at the target run and the norm scales
frozen as in the exact patch (so the estimate is the exact patch's own linearisation); "eap-ig" (Hanna et al.
2024) averages that gradient over `steps` runs whose embeddings move from the target's to the source's.
`verify=k` patches the k edges with the largest |estimate| exactly and `sample=s` more at random (seeded): the
false-negative count among the sampled edges and its Clopper-Pearson interval say what the estimate may have
missed, as `hc.attribute` does for nodes.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import time
from typing import Any, cast

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
from torch import Tensor
from transformer_lens.utilities import get_act_name

from headcoop.analysis.edges.exact import edge_copies, prepended, reader_sites, writer_outputs
from headcoop.analysis.edges.graph import (
    ATTN_READERS,
    Reader,
    Writer,
    check_edge_model,
    graph,
    qkv_weights,
    reader_name,
    writer_name,
)  # fmt: skip
from headcoop.analysis.engine.ablation import describe_ablation, replacement, shifted_order
from headcoop.analysis.engine.copies import Hooks, chunks, clean_corrupt, gradient_part_size, route, target_run
from headcoop.analysis.engine.inputs import check_choice, require_model
from headcoop.analysis.engine.norms import norm_kind, norm_weights
from headcoop.analysis.engine.verification import miss_bound, pick, wide_bound
from headcoop.analysis.vocabulary import ABLATIONS, DIRECTIONS, EDGE_ESTIMATORS, Ablation, Direction, EdgeEstimator
from headcoop.checks import (
    check_finite,
    check_int,
    check_memory_budget,
    check_metric_value,
    check_seed,
    check_steps,
)  # fmt: skip
from headcoop.display.progress import advance, with_progress
from headcoop.models.bridge import is_bridge
from headcoop.models.tl import HookedTransformer
from headcoop.storage.results import Result


def _final_kind(model) -> str | None:
    """The final norm's kind (None: no final norm), whose hook_normalized is x / scale before its weight."""
    return norm_kind(getattr(model, "ln_final", None))


def norm_transpose(module, g: Tensor, scale: Tensor | None) -> Tensor:
    """The transpose of a norm's Jacobian at a frozen scale applied to g: what d metric / d output becomes as
    d metric / d input when the scale does not move (LN: centre(g w / scale); RMS: g w / scale)."""
    kind = norm_kind(module)
    if kind is None:
        return g
    weight, _ = norm_weights(module)
    if kind in ("LN", "RMS") and weight is not None:
        g = g * weight
    g = g / cast(Tensor, scale).to(g.dtype)  # a norm's gradient is read at its held scale
    return g - g.mean(-1, keepdim=True) if kind in ("LN", "LNPre") else g


# --- gradients at the readers ----------------------------------------------------------------------------
def _reader_grads(model: HookedTransformer, tokens: Tensor, score, readers: list[Reader],
                  embeds: tuple[Tensor, Tensor | None] | None = None, through_hooks: bool = False,
                  record: tuple[set[str], dict] | None = None, fold=None) -> tuple[dict[Reader, Tensor], Tensor]:  # fmt: skip
    """d metric / d (each reader's residual input) [batch, pos, d_model] at one run of `tokens` (embeddings
    replaced by `embeds` = (token, positional) when given), each reader's own norm scale frozen, and the
    metric's value.

    One forward and backward pass gives the gradient at each reader's activation (q/k/v, an MLP's
    pre-activation: after every hook there, which the exact patch's reader also sets after them; the final
    norm's output before any hook there). Mapping it back to the residual input: by hand (the norm at its
    frozen scale, W_Q / W_in transposed) when no hook is installed; with `through_hooks`, by autograd across
    the hooks on the reader's norm and q/k/v or MLP input (`_local_vjps`), so that a hook there is inside the
    derivative. record = (hook names, dict): the run's activations at those names are stored in the dict
    (detached; the writers' outputs, so that EAP needs no second pass of the target). fold: a callable given
    the residual-input gradients group by group (`FOLD_GROUP` readers of one layer at a time) instead of
    keeping them: then the returned dict is empty, and the memory is one group's, not every reader's."""
    kept: dict[str, Tensor] = {}

    def keep(act, hook):
        act = act if act.requires_grad else act.detach().requires_grad_(True)
        kept[hook.name] = act
        return act

    seen: dict[str, Tensor] = {}  # each norm's scale, and the residual streams the local maps start from

    def remember(act, hook):
        seen[hook.name] = act.detach()
        return act

    final = _final_site(model)
    names = {name for r in readers if r[0] != "logits" for name, _ in reader_sites(model, r)}
    hooks: Hooks = [(n, keep) for n in sorted(names)] + [(lambda n: n.endswith("hook_scale"), remember)]
    if through_hooks:
        hooks.append((lambda n: n.endswith(("hook_resid_pre", "hook_resid_mid", "hook_pos_embed")), remember))
    if record is not None:
        names_kept, store = record

        def keep_record(act, hook):
            store[hook.name] = act.detach()
            return act

        hooks.append((lambda n: n in names_kept, keep_record))
    if embeds is not None:
        token_embed, pos_embed = embeds
        hooks.append(("hook_embed", lambda act, hook: token_embed.to(act)))
        if pos_embed is not None:
            held: Tensor = pos_embed
            hooks.append(("hook_pos_embed", lambda act, hook: held.to(act)))
    # the final norm's output is read before any hook there (so that one is inside the derivative)
    first = [(final, keep)] if any(r[0] == "logits" for r in readers) else []
    with torch.enable_grad(), prepended(model, first if through_hooks else []):
        logits = model.run_with_hooks(tokens, fwd_hooks=hooks + ([] if through_hooks else first))
        value = score.one(logits)
        _check_differentiable(value)
        order = sorted(kept)
        found = dict(zip(order, torch.autograd.grad(value, [kept[n] for n in order], allow_unused=True)))
        del logits
        kept.clear()
    grads = {n: torch.zeros_like(g) if g is None else g.detach() for n, g in found.items()}
    out: dict[Reader, Tensor] = {}
    for group in _reader_groups(readers):
        got = _residual_grads(model, group, grads, seen, through_hooks)
        if fold is None:
            out.update(got)
        else:
            fold(got)
    return out, value.detach()


def _stored(store: dict, name: str, act: Tensor) -> Tensor:
    """`act`, kept in `store` under `name` (a hook that records and passes on)."""
    store[name] = act
    return act


FOLD_GROUP = 16  # readers whose residual-input gradients are computed, folded in and freed together


def _reader_groups(readers: list[Reader]) -> list[list[Reader]]:
    """The readers in groups of at most FOLD_GROUP, each of one layer (the logits alone)."""
    groups: list[list[Reader]] = []
    for _, same in itertools.groupby(readers, key=lambda r: None if r[0] == "logits" else r[1]):
        group = list(same)
        groups += [group[i : i + FOLD_GROUP] for i in range(0, len(group), FOLD_GROUP)]
    return groups


def _final_site(model) -> str:
    """Where the logits reader's gradient is read: the final norm's x / scale; a Bridge computes its
    hook_normalized beside the Hugging Face norm, off the path to the logits, so there the norm's output (the
    unembedding's input), transposed in `_residual_grads`; without a final norm, the last residual stream."""
    if not _final_kind(model):
        return get_act_name("resid_post", model.cfg.n_layers - 1)
    return "unembed.hook_in" if is_bridge(model) else "ln_final.hook_normalized"


def _residual_grads(model: HookedTransformer, readers: list[Reader], grads: dict[str, Tensor],
                    seen: dict[str, Tensor], through_hooks: bool) -> dict[Reader, Tensor]:  # fmt: skip
    """Each reader's residual-input gradient [batch, pos, d_model] from the gradients at the readers'
    activations (`grads`, by hook name) and the run's norm scales (`seen`): `_local_vjps` across the hooks
    with `through_hooks`, else by hand."""
    cfg = model.cfg
    out = _local_vjps(model, readers, grads, seen) if through_hooks else {}
    heads = [r for r in readers if r not in out and r[0] in ATTN_READERS]
    for (lay, via), same in itertools.groupby(sorted(heads, key=lambda r: (r[1], r[3])), key=lambda r: (r[1], r[3])):
        group = list(same)  # one layer's q, k or v inputs at once: [batch, pos, reader, d_model]
        W = torch.stack([qkv_weights(model, lay, via, r[2])[0] for r in group])
        g = torch.einsum("bpmh,mdh->bpmd", grads[get_act_name(via, lay)][:, :, [r[2] for r in group]], W)
        scale = seen.get(f"blocks.{lay}.ln1.hook_scale")
        g = norm_transpose(getattr(model.blocks[lay], "ln1", None), g, None if scale is None else scale[..., None, :])
        out.update({r: g[:, :, m] for m, r in enumerate(group)})
    for r in readers:
        if r in out:
            continue
        lay = r[1] if r[0] != "logits" else cfg.n_layers - 1
        if r[0] in ATTN_READERS:
            W = qkv_weights(model, lay, r[3], r[2])[0]
            g = grads[get_act_name(r[3], lay)][:, :, r[2]] @ W.T
            out[r] = norm_transpose(
                getattr(model.blocks[lay], "ln1", None), g, seen.get(f"blocks.{lay}.ln1.hook_scale")
            )
        elif r[0] == "mlp":
            mlp = model.blocks[lay].mlp
            g = grads[f"blocks.{lay}.mlp.hook_pre"] @ (mlp.W_gate if cfg.gated_mlp else mlp.W_in).T
            if cfg.gated_mlp:
                g = g + grads[f"blocks.{lay}.mlp.hook_pre_linear"] @ mlp.W_in.T
            out[r] = norm_transpose(
                getattr(model.blocks[lay], "ln2", None), g, seen.get(f"blocks.{lay}.ln2.hook_scale")
            )
        else:
            g = grads[_final_site(model)]
            if _final_kind(model) and is_bridge(model):
                g = norm_transpose(model.ln_final, g, seen["ln_final.hook_scale"])
            elif _final_kind(model):  # x / scale at a frozen scale, then centred (LN): its transpose
                g = g / seen["ln_final.hook_scale"]
                g = g - g.mean(-1, keepdim=True) if _final_kind(model) in ("LN", "LNPre") else g
            out[r] = g
    return {r: g.detach() for r, g in out.items()}


def _local_vjps(
    model: HookedTransformer, readers: list[Reader], grads: dict[str, Tensor], seen: dict[str, Tensor]
) -> dict[Reader, Tensor]:
    """The head and MLP readers' residual-input gradients by autograd across every hook on the way from the
    residual stream to the reader's activation: per layer, one pass of that block alone (`start_at_layer`)
    from the run's resid_pre (and resid_mid, for its MLP) as leaves, the block's norm scales held at the run's
    (frozen); then one vector-Jacobian product per reader with the gradient at its activation."""
    out: dict[Reader, Tensor] = {}
    for lay in sorted({r[1] for r in readers if r[0] != "logits"}):
        here = [r for r in readers if r[0] != "logits" and r[1] == lay]
        x = seen[get_act_name("resid_pre", lay)].clone().requires_grad_(True)
        mid_name = get_act_name("resid_mid", lay)
        mid = seen[mid_name].clone().requires_grad_(True) if mid_name in seen else None
        hooks: Hooks = [(f"blocks.{lay}.{ln}.hook_scale", lambda a, hook, s=seen[f"blocks.{lay}.{ln}.hook_scale"]: s.to(a))
                 for ln in ("ln1", "ln2") if f"blocks.{lay}.{ln}.hook_scale" in seen]  # fmt: skip
        if mid is not None:
            hooks.append((mid_name, lambda a, hook: mid))
        acts: dict[str, Tensor] = {}
        for name in {name for r in here for name, _ in reader_sites(model, r)}:
            hooks.append((name, lambda a, hook, name=name: _stored(acts, name, a)))
        pos = seen.get("hook_pos_embed") if model.cfg.positional_embedding_type == "shortformer" else None
        with torch.enable_grad():
            model.run_with_hooks(
                x, start_at_layer=lay, stop_at_layer=lay + 1, shortformer_pos_embed=pos, fwd_hooks=hooks
            )
            for r in here:
                sites = reader_sites(model, r)
                outs = [acts[n] if h is None else acts[n][:, :, h] for n, h in sites]
                wants = [grads[n] if h is None else grads[n][:, :, h] for n, h in sites]
                (g,) = torch.autograd.grad(outs, [x if r[0] in ATTN_READERS else cast(Tensor, mid)], grad_outputs=wants,
                                           retain_graph=True, allow_unused=True)  # fmt: skip
                out[r] = torch.zeros_like(x) if g is None else g
    return out


def _check_differentiable(value) -> None:
    if not isinstance(value, Tensor) or not value.requires_grad:
        raise ValueError("hc.edges' estimates need a metric differentiable in the logits (a logit difference, "
                         f"a log-probability); this one returned {value!r} with no gradient: use "
                         "estimator='exact' for it")  # fmt: skip


def _integrated_grads(
    model,
    tokens: Tensor,
    score,
    readers: list[Reader],
    source_cache,
    target_cache,
    steps: int,
    gradients=None,
    fold=None,
) -> dict[Reader, Tensor]:
    """EAP-IG's gradients: each reader's, averaged over `steps` runs whose token and positional embeddings move
    from the target's to the source's (alpha = 1/steps .. 1). fold: as `_reader_grads`' (each step's gradients,
    divided by `steps`, folded in; the returned dict is then empty)."""
    grads: dict[Reader, Tensor] = {}
    pos = "hook_pos_embed" in source_cache.cache_dict
    add = (lambda g: fold({r: v / steps for r, v in g.items()})) if fold is not None else None
    advance(more=steps)  # each step one forward and backward pass: the bar's total and its cost estimate count them
    for k in range(1, steps + 1):
        alpha = k / steps

        def between(name: str) -> Tensor:
            return target_cache[name] + alpha * (source_cache[name] - target_cache[name])

        g, _ = (gradients or _reader_grads)(model, tokens, score, readers, fold=add,
                             embeds=(between("hook_embed"), between("hook_pos_embed") if pos else None))  # fmt: skip
        for r, v in g.items():
            grads[r] = grads.get(r, 0) + v / steps
        advance(done=1)
    return grads


def _verify(frame: pd.DataFrame, ordered: list, verify: int, sample: int, seed: int, exact) -> tuple[dict, int]:
    """Patch exactly (`exact(edges)` -> changes of the metric) the `verify` edges with the largest |score| and
    `sample` others drawn with `seed` (`verification.pick`); fill frame's exact / top / sampled; return the
    false-negative bound (`verification.miss_bound`, the one `hc.attribute` gives) and the number of edges patched."""
    top, picked, rest = pick(torch.tensor(frame.score.abs().to_numpy()), verify, sample, seed)
    top_at, picked_at = top.numpy(), picked.numpy()
    chosen = sorted(set(top_at.tolist()) | set(picked_at.tolist()))
    frame.loc[chosen, "exact"] = exact([ordered[i] for i in chosen]).double().cpu().numpy()
    frame.loc[top_at, "top"] = True
    frame.loc[picked_at, "sampled"] = True
    effect = lambda idx: torch.tensor(frame.loc[idx, "exact"].to_numpy())  # noqa: E731
    return miss_bound(effect(top_at), effect(picked_at), rest), len(chosen)


class Folded:
    """delta_w . grad_r summed over batch, positions and d_model for every edge of `ordered`, folded in as the
    readers' gradients arrive (`__call__`, a group at a time, as `_reader_grads` gives them; a reader folded in
    again adds up, as EAP-IG's steps and the parts of a batch do), so that no reader's gradient outlives its
    group (issue 51: the gradients of every reader at once were EAP's largest cost in memory). Each reader's
    writers are a prefix of `writers` (the graph's forward order): readers of a group with equally many writers
    take one matrix product of their gradients [m, batch * pos * d_model] with that prefix of the writers'
    changes `deltas` [n_writers, batch, pos, d_model] (`delta_matrix`; or a callable giving it, called when
    first needed), each product times `scale` (a part's share of the batch)."""

    def __init__(self, ordered: list, writers: list, deltas=None):
        self.deltas, self.writers, self.scale = deltas, writers, 1.0
        self.k: dict = {}  # reader -> how many writers feed it, in the order of `ordered`
        for _, r in ordered:
            self.k[r] = self.k.get(r, 0) + 1
        self.sums: dict = {}

    def __call__(self, group: dict) -> None:
        if callable(self.deltas):
            self.deltas = self.deltas()
        D = self.deltas.reshape(len(self.writers), -1)
        for k in sorted({self.k[r] for r in group if r in self.k}):
            here = [r for r in group if self.k.get(r) == k]
            G = torch.stack([group[r].reshape(-1).to(D) for r in here])
            for r, row in zip(here, (G @ D[:k].T) * self.scale):
                self.sums[r] = self.sums[r] + row if r in self.sums else row

    def scores(self) -> Tensor:
        """[edges] in the order of `ordered` (reader-major, each reader's writers in forward order); a reader
        never folded in scores zero."""
        dtype = next(iter(self.sums.values())).dtype if self.sums else torch.float32
        return torch.cat([self.sums[r] if r in self.sums else torch.zeros(k, dtype=dtype) for r, k in self.k.items()])


class _Rows:
    """Inputs lo..hi of a cached run of n inputs (a tensor whose first axis is not that batch, such as a
    positional embedding of batch 1, is kept whole): a part of the batch, read as the cached run is."""

    def __init__(self, cache, lo: int, hi: int, n: int):
        whole = cache.cache_dict if hasattr(cache, "cache_dict") else cache
        self.cache_dict = {k: v[lo:hi] if v.shape[0] == n else v for k, v in whole.items()}

    def __getitem__(self, name: str) -> Tensor:
        return self.cache_dict[name]


def _estimate(model, estimator: str, score, readers, writers, ordered, sites, source_cache, target_tokens, target,
              D, steps: int, gradients, size: int) -> tuple[Folded, float]:  # fmt: skip
    """EAP's or EAP-IG's scores (a `Folded`) and the target's metric, the inputs in parts of `size` (a named
    metric is a mean over inputs, so each part's gradient counts by its share of the batch). target: the cached
    target run and D its writers' changes, or None: each part's own (EAP's one gradient pass per part records
    that part's writers; EAP-IG runs the part's target once for its embeddings)."""
    n = len(target_tokens)
    folded, value = Folded(ordered, writers), 0.0
    for lo, hi in chunks(0, n, size):
        part, src = (score.part(lo, hi), _Rows(source_cache, lo, hi, n)) if size < n else (score, source_cache)
        folded.scale = (hi - lo) / n
        if target is None and estimator == "eap":
            acts: dict[str, Tensor] = {}
            folded.deltas = functools.partial(delta_matrix, model, writers, src, acts)
            _, got = gradients(model, target_tokens[lo:hi], part, readers, record=(sites, acts), fold=folded)
            value += folded.scale * _finite(got, "the metric on the target inputs")
            continue
        if target is None:
            with torch.no_grad():
                tgt = target_run(model, target_tokens[lo:hi], part, lambda name: name in sites)
            folded.deltas = functools.partial(delta_matrix, model, writers, src, tgt.cache)
            value += folded.scale * _finite(tgt.value, "the metric on the target inputs")
            cached: Any = tgt.cache
        else:
            folded.deltas = D[:, lo:hi]
            cached = _Rows(target.cache, lo, hi, n) if size < n else target.cache
        if estimator == "eap":
            gradients(model, target_tokens[lo:hi], part, readers, fold=folded)
        else:
            _integrated_grads(model, target_tokens[lo:hi], part, readers, src, cached, steps, gradients, folded)
    return folded, value if target is None else target.value


def _part_size(model, estimator: str, score, target_tokens, n_writers: int, memory_budget_mb: float,
               hooked: bool) -> int:  # fmt: skip
    """Inputs per gradient pass (`gradient_part_size`); exact patching runs the whole batch (its engine sizes
    its own stacked copies)."""
    n, n_pos = target_tokens.shape
    if estimator == "exact":
        return n
    return gradient_part_size(model, score, n, n_pos, memory_budget_mb, "hc.edges", n_writers, hooked)


def _whole_target(model, target_tokens, score, writers, source_cache) -> tuple:
    """(the target run with every activation cached, its writers' changes D [writer, batch, pos, d_model], the
    same as a dict by writer)."""
    with torch.no_grad():
        target = target_run(model, target_tokens, score, lambda name: True)
    _finite(target.value, "the metric on the target inputs")
    D = delta_matrix(model, writers, source_cache, target.cache)
    return target, D, {w: D[i] for i, w in enumerate(writers)}


def _exact_in_parts(model, chosen, sub: list, writers, score, source_cache, target_tokens, size: int,
                    memory_budget_mb: float) -> Tensor:  # fmt: skip
    """Exact patching of the edges `sub` (changes of the metric [edges]) with the inputs in parts of `size`: each
    part's target run cached and patched on its own, its changes counted by its share of the batch (a named
    metric is a mean over inputs), so that no run of the whole batch is cached."""
    n = len(target_tokens)
    total: Any = 0.0  # a tensor once the first part is added
    for lo, hi in chunks(0, n, size):
        with torch.no_grad():
            target = target_run(model, target_tokens[lo:hi], score.part(lo, hi), lambda name: True)
        src = _Rows(source_cache, lo, hi, n)
        D = delta_matrix(model, writers, src, target.cache)
        deltas = {w: D[i] for i, w in enumerate(writers)}
        changes = chosen.evaluate(target, edge_copies(model, sub, deltas, target, src), memory_budget_mb) - target.value
        total = total + (hi - lo) / n * changes
    return total


def delta_matrix(model: HookedTransformer, writers: list[Writer], source, target) -> Tensor:
    """Each writer's change of output, source minus target: [n_writers, batch, pos, d_model], one writer at a
    time (`writer_outputs`), so that nothing but the result is held for all of them."""
    first = writer_outputs(model, target, writers[:1])[writers[0]]
    D = first.new_empty(len(writers), *first.shape).detach()
    for i, w in enumerate(writers):
        D[i] = (writer_outputs(model, source, [w])[w] - writer_outputs(model, target, [w])[w]).detach()
    return D


def _products(deltas: dict, grads: dict, ordered: list, writers: list) -> Tensor:
    """`Folded`'s scores from whole dicts of the writers' changes and the readers' gradients (the tests' way)."""
    folded = Folded(ordered, writers, torch.stack([deltas[w] for w in writers]))
    folded(grads)
    return folded.scores()


# --- the result -----------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, repr=False)
class EdgeResult(Result):
    """One row per edge (`to_dataframe()`): writer, reader, via, `score` (the estimated change of the metric by
    patching that edge alone; exact for estimator="exact"), `exact` (the exact change where verified, NaN
    elsewhere), `top` / `sampled` (the verified edges). missed: the false-negative bound over the sampled
    edges (`engine.verification.miss_bound`, the same as `hc.attribute`'s: "estimate", "low", "high" count
    edges of the rest, "share", "share_low", "share_high" are fractions of it); cost: passes,
    seconds and parts (how many parts of the batch the gradient passes ran in, within memory_budget_mb); assumptions: in words (also in the repr and the plot title)."""

    frame: pd.DataFrame
    clean_value: float
    corrupt_value: float
    target_value: float
    direction: str
    estimator: str
    method: str
    missed: dict
    cost: dict
    assumptions: tuple[str, ...] = ()
    ablation: str = ""  # what a patched edge carries (`describe_ablation`)

    def to_dataframe(self) -> pd.DataFrame:
        return self.frame.copy()

    def ranked(self) -> pd.DataFrame:
        """The edges by |score|, largest first."""
        return self.frame.reindex(self.frame.score.abs().sort_values(ascending=False).index)

    def __repr__(self) -> str:
        top = self.ranked().head(3)
        shown = "; ".join(f"{r.writer}->{r.reader} ({r.via}) {r.score:+.3g}" for _, r in top.iterrows())
        miss = (
            (
                f"; missed: {self.missed['above']}/{self.missed['sampled']} sampled above the top's smallest "
                f"|exact|: {self.missed['estimate']:.3g} ({self.missed['low']:.3g}..{self.missed['high']:.3g}) of the "
                f"{self.missed['rest']} others)"
            )
            if self.missed
            else ""
        )
        said = f"; assumes {'; '.join(self.assumptions)}" if self.assumptions else ""
        checked = ""
        if self.estimator != "exact":  # what exact patching has checked of the estimate (issue 51)
            top, sampled = int(self.frame["top"].sum()), int(self.frame["sampled"].sum())
            checked = (
                "; unverified: no edge patched exactly (pass verify=k and sample=s to check the estimate)"
                if not (top or sampled)
                else f"; verified: {top} top and {sampled} sampled edges patched exactly"
            )
            checked += wide_bound(self.missed, top, "edges")
        how = f"; edge carries {self.ablation}" if self.ablation and not self.ablation.startswith("corrupt") else ""
        return (f"EdgeResult({len(self.frame)} edges, {self.estimator}, {self.direction}, clean={self.clean_value:.4g}, "
                f"corrupt={self.corrupt_value:.4g}{how}; strongest: {shown}{miss}{checked}{said})")  # fmt: skip

    def plot(self, k: int = 30) -> go.Figure:
        """The k strongest edges as a layered graph: writers and readers placed by their place in the forward
        pass, line width by |score|, red where patching the edge raises the metric, blue where it lowers it."""
        k = check_int("k", k, 1)
        top = self.ranked().head(k)
        nodes = sorted(set(top.writer) | set(top.reader), key=_node_key)
        column: dict[int, list[str]] = {}
        for name in nodes:
            column.setdefault(_node_key(name)[0], []).append(name)
        place = {name: (x, i - (len(names) - 1) / 2) for x, names in column.items() for i, name in enumerate(names)}
        fig = go.Figure()
        biggest = float(top.score.abs().max()) if len(top) else 1.0
        for _, r in top.iterrows():
            (x0, y0), (x1, y1) = place[r.writer], place[r.reader]
            fig.add_trace(go.Scatter(x=[x0, x1], y=[y0, y1], mode="lines", hoverinfo="text", showlegend=False,
                                     text=f"{r.writer} -> {r.reader} ({r.via}): {r.score:+.4g}",
                                     line=dict(width=1 + 6 * abs(r.score) / (biggest or 1.0),
                                               color="firebrick" if r.score > 0 else "royalblue")))  # fmt: skip
        fig.add_trace(go.Scatter(x=[place[n][0] for n in nodes], y=[place[n][1] for n in nodes], mode="markers+text",
                                 text=nodes, textposition="top center", showlegend=False,
                                 marker=dict(size=10, color="black")))  # fmt: skip
        title = f"{min(k, len(self.frame))} strongest of {len(self.frame)} edges ({self.estimator})"
        if self.assumptions:
            title += f"<br><sup>assumes {'; '.join(self.assumptions)}</sup>"
        fig.update_layout(title=title, xaxis=dict(visible=False), yaxis=dict(visible=False), height=500)
        return fig


def _node_key(name: str) -> tuple[int, int]:
    """(column, row) of a node in the layered drawing: embeddings, then per layer heads and MLP, then logits."""
    if name in ("embed", "pos_embed"):
        return 0, 0 if name == "embed" else 1
    if name == "logits":
        return 10**6, 0
    if name.startswith("MLP"):
        return 2 * int(name[3:]) + 2, 0
    if "KV" in name:  # a key/value head of a grouped-query model, drawn below the query heads
        layer, group = name[1:].split("KV")
        return 2 * int(layer) + 1, 1000 + int(group)
    layer, head = name[1:].split("H")
    return 2 * int(layer) + 1, int(head)


RESIDUAL_HOOKS = ("hook_resid_pre", "hook_resid_mid", "hook_resid_post", "hook_attn_out")


def _assumptions(model, estimator: str, hooks: tuple[str, ...]) -> tuple[str, ...]:
    """What the scores assume, in words: frozen norm scales; for an estimate under hooks on the residual stream
    between writers and readers, that it carries each writer's change to its readers unchanged (the exact
    patches, verified ones included, carry it through those hooks)."""
    said = (
        ["each reader's norm scale and the final norm's frozen at the target run's"]
        if model.cfg.normalization_type
        else []
    )
    between = [h for h in hooks if h.endswith(RESIDUAL_HOOKS)]
    if estimator != "exact" and between:
        said.append(
            f"the gradients are taken across every hook, but each writer's change reaches its readers "
            f"without the residual-stream hooks at {', '.join(between[:3])} (the exact patches pass through them)"
        )
    return tuple(said)


def _estimator(estimator: str, method: str | None) -> str:
    """`estimator`, or the older spelling `method=` (a DeprecationWarning: `method` names the engine's path
    everywhere else, as `EdgeResult.method` does)."""
    import warnings

    check_choice("estimator", estimator, EDGE_ESTIMATORS)
    if method is None:
        return estimator
    check_choice("method", method, EDGE_ESTIMATORS)
    if estimator != "eap" and estimator != method:
        raise ValueError(f"method={method!r} and estimator={estimator!r} name the same choice; pass estimator= only")
    warnings.warn("hc.edges(method=...) is estimator=...; method= is deprecated here", DeprecationWarning, stacklevel=4)
    return method


CANONICAL = "canonical two-step path patching per edge (writer replaced, other heads and MLPs frozen; then the reader)"


# --- the analysis ----------------------------------------------------------------------------------------
@with_progress("hc.edges", cheaper="estimator='eap' (gradients, verify= of them checked exactly) is cheaper")
def edges(
    model: HookedTransformer,
    clean=None,
    corrupt=None,
    metric=None,
    estimator: EdgeEstimator = "eap",
    verify: int = 0,
    sample: int = 0,
    direction: Direction = "denoise",
    steps: int = 5,
    seed: int = 0,
    memory_budget_mb: float = 256,
    progress: bool | None = None,
    method: str | None = None,
    how: Ablation = "corrupt",
) -> EdgeResult:
    """One score per edge of the model (module docstring): the change of `metric` when the target run (corrupt
    for "denoise") gets one writer's output from the source run at one reader's input.

    estimator: "eap" (gradient estimate: 1 forward pass of the source, 1 forward and 1 backward of the target),
    "eap-ig" (the gradient averaged over `steps` interpolations of the embeddings) or "exact" (every edge
    patched on the engine). verify / sample: the verify edges with the largest |estimate| and `sample` more,
    drawn with `seed`, patched exactly (columns `exact`, `top`, `sampled`; `missed` the false-negative bound).
    clean, corrupt, metric, direction: as `hc.patch`; method: the deprecated spelling of `estimator`.
    how: what the patched edge carries, by the one ablation (`engine.ablation.replacement`): "corrupt" (the paired
    corrupt run's writer output) or, with direction="noise" (the clean run with one edge ablated, as
    `hc.faithfulness` ablates), "mean" (over the corrupt inputs, per position), "zero" or "resample".
    memory_budget_mb: what the analysis may add to the loaded model: exact patching's stacked copies, and the
    inputs of one gradient pass (EAP, EAP-IG), run in parts beyond it where the metric is a named one (a mean
    over inputs; a callable runs at once). progress: as `hc.patch`. Returns an EdgeResult (`.to_dataframe()`:
    one row per edge; `.plot()`: the strongest edges as a layered graph)."""
    estimator, verify, sample, steps = _checked(model, estimator, method, direction, verify, sample, steps, how)
    seed, memory_budget_mb = check_seed(seed), check_memory_budget(memory_budget_mb)
    writers, readers, all_edges = graph(model)
    clean_tokens, corrupt_tokens, score = clean_corrupt(model, clean, corrupt, metric)
    source_tokens, target_tokens = (
        (clean_tokens, corrupt_tokens) if direction == "denoise" else (corrupt_tokens, clean_tokens)
    )
    chosen = route(model, "auto", "stacked", "stacked copies from the reader's layer", "edge", reference=CANONICAL)
    gradients = _gradient_pass(model, estimator, chosen.hooks)
    ordered = sorted(all_edges, key=lambda e: model.cfg.n_layers if e[1][0] == "logits" else e[1][1])
    sites = writer_sites(writers)
    started = time.perf_counter()
    with torch.no_grad():
        source_logits, source_cache = model.run_with_cache(source_tokens, names_filter=lambda n: n in sites)
    source_value = _finite(score.one(source_logits), "the metric on the source inputs")
    del source_logits  # [batch, pos, vocab]: at GPT-2 size as large as a part's whole gradient pass
    source_cache = source_cache if how == "corrupt" else AblatedRun(source_cache, how, *target_tokens.shape)
    n = len(target_tokens)
    size = _part_size(model, estimator, score, target_tokens, len(writers), memory_budget_mb, bool(chosen.hooks))
    whole = size == n and (estimator != "eap" or verify or sample)  # the whole target run, cached
    target, D, deltas = _whole_target(model, target_tokens, score, writers, source_cache) if whole else (None,) * 3
    target_value = target.value if target is not None else None
    if estimator != "exact":  # EAP at its floor (target None): the target's one pass gives its writers too
        folded, target_value = _estimate(model, estimator, score, readers, writers, ordered, sites, source_cache,
                                         target_tokens, target, D, steps, gradients, size)  # fmt: skip

    def exact(sub: list) -> Tensor:
        if target is None:
            return _exact_in_parts(
                model, chosen, sub, writers, score, source_cache, target_tokens, size, memory_budget_mb
            )
        return (
            chosen.evaluate(target, edge_copies(model, sub, deltas, target, source_cache), memory_budget_mb)
            - target.value
        )

    scores = exact(ordered) if estimator == "exact" else folded.scores()
    if not bool(torch.isfinite(scores).all()):
        raise ValueError(f"hc.edges' {estimator} scores hold NaN or inf (the model's logits or the metric's gradient "
                         "overflow on these inputs): check the metric and the inputs, or use a float64 model")  # fmt: skip
    passes = {"exact": float(len(ordered)), "eap": 3.0 + bool(verify or sample), "eap-ig": 1.0 + 3.0 * steps}[estimator]
    frame = pd.DataFrame(
        [dict(writer=writer_name(w), reader=reader_name(r)[0], via=reader_name(r)[1]) for w, r in ordered]
    )
    frame["score"] = scores.detach().double().cpu().numpy()
    frame["exact"] = frame["score"] if estimator == "exact" else np.nan
    frame["top"] = frame["sampled"] = False
    estimate_s, verify_s = time.perf_counter() - started, 0.0
    missed: dict = {}
    if estimator != "exact" and (verify or sample):
        started = time.perf_counter()
        missed, patched = _verify(frame, ordered, verify, sample, seed, exact)
        verify_s, passes = time.perf_counter() - started, passes + patched
    target_value = cast(float, target_value)  # the target run was scored (exact) or estimated (gradients)
    clean_value, corrupt_value = (
        (source_value, target_value) if direction == "denoise" else (target_value, source_value)
    )
    return EdgeResult(frame=frame, clean_value=clean_value, corrupt_value=corrupt_value, target_value=target_value,
                      direction=direction, estimator=estimator, method=chosen.label, missed=missed,
                      cost=dict(passes=passes, estimate_s=estimate_s, verification_s=verify_s, parts=-(-n // size)),
                      assumptions=_assumptions(model, estimator, chosen.hooks),
                      ablation=describe_ablation(how, len(source_tokens), "corrupt", order="shifted"))  # fmt: skip


def _gradient_pass(model, estimator: str, hooks: tuple[str, ...]):
    """The readers' gradient pass (`_reader_grads`): across installed hooks by autograd, block by block, which a
    TransformerBridge cannot run (its blocks do not start mid-model): there the gradient estimators refuse,
    naming the hooks and the fix."""
    if hooks and estimator != "exact" and is_bridge(model):
        raise ValueError(f"hc.edges' {estimator} takes the gradient across installed hooks block by block, which a "
                         f"TransformerBridge cannot run (its blocks do not start mid-model), and hooks sit at "
                         f"{', '.join(hooks[:3])}: remove them (handle.remove(), model.reset_hooks()) or use "
                         "estimator='exact', which runs the hooked reference path")  # fmt: skip
    return functools.partial(_reader_grads, through_hooks=bool(hooks))  # a hook: autograd across it


def _checked(model, estimator: str, method, direction: str, verify, sample, steps,
             how: str = "corrupt") -> tuple[EdgeEstimator, int, int, int]:  # fmt: skip
    """hc.edges' model and arguments checked (an error naming the bad one): the estimator, verify, sample, steps,
    the ablation (`how`; other than "corrupt" only when noising)."""
    require_model(model, "edges")
    check_finite(model, "hc.edges")
    check_edge_model(model)
    estimator = _estimator(estimator, method)
    check_choice("direction", direction, DIRECTIONS)
    check_choice("how", how, ABLATIONS)
    if how != "corrupt" and direction != "noise":
        raise ValueError(f'how={how!r} ablates an edge of the clean run: it needs direction="noise" (denoising '
                         'patches the corrupt run with the clean run\'s values, and has no other reading)')  # fmt: skip
    steps = check_steps(steps)  # each step is a forward and a backward pass (the cap hc.attribute shares)
    return cast(EdgeEstimator, estimator), check_int("verify", verify, 0), check_int("sample", sample, 0), steps


def writer_sites(writers: list[Writer]) -> set[str]:
    """The hook points holding the writers' activations (`exact.writer_activation`)."""
    return {"hook_embed" if w[0] == "embed" else "hook_pos_embed" if w[0] == "pos_embed" else
            get_act_name("z" if w[0] == "head" else "mlp_out", w[1]) for w in writers}  # fmt: skip


class AblatedRun:
    """A cached corrupt run whose writer activations are replaced by an ablation of them (`replacement`: "mean",
    "zero" or "resample" for a clean batch of [batch, n_pos]): what an ablated edge carries, read by
    `writer_outputs`, the exact engine and EAP-IG as they read a cached run."""

    def __init__(self, cache, how: str, batch: int, n_pos: int):
        n_ref = max(v.shape[0] for v in cache.cache_dict.values())  # the positional embedding may have batch 1
        order = shifted_order(n_ref) if how == "resample" else None
        self.cache_dict = {n: replacement(v.expand(n_ref, *v.shape[1:]), how, batch, n_pos, order)
                           for n, v in cache.cache_dict.items()}  # fmt: skip

    def __getitem__(self, name: str) -> Tensor:
        return self.cache_dict[name]


def _finite(value, what: str) -> float:
    """A metric value as a float; ValueError naming it when it is NaN or inf."""
    value = float(check_metric_value(value, "metric"))
    if not np.isfinite(value):
        raise ValueError(f"hc.edges: {what} is {value} (NaN or inf): the model's logits or the metric overflow here")
    return value


__all__ = ["edges", "EdgeResult"]
