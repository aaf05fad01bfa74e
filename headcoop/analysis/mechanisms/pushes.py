"""Each head's push on the completions at the read rows, for a batch of inputs and their counterfactual edits
(issue 72): the function axis's measurement (`edits.edit_responses`).

A head's push is its total effect (the completions' logits with every head, less with its z zeroed) where
something later reads it, else its direct push (its output through the final norm, the scale frozen at the
run's, and the unembedding). Only the completions `outs` go through the unembedding.

Two paths, the same numbers:

- `reference_pushes`: every edited input run whole with plain hooks on hook_z (`repair.run_with`), its direct
  pushes by `hc.dla` (`evidence.head_dla`), in chunks within `memory_budget_mb`. The obviously-correct one.
- `prefix_pushes`: an edit at position p leaves every row before p as its input's (a causal model), so each
  input runs once per condition (every head, or one head's z zeroed) with its keys and values kept, and each
  edit runs rows p.. only from there (`kernels.run_from`), the last layer at the read rows only. It steps
  aside to the reference wherever a hook is installed, on a Bridge, where the model needs an attention mask,
  or where `kernels.supported` says the row-wise suffix does not reproduce the model's blocks.

`push_rows` counts the block rows either path runs, as forward passes of the batch: the cost known before any
run (the report's predictor and the result's sentence read it).
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens.utilities import get_act_name

from headcoop.analysis.engine import kernels
from headcoop.analysis.engine.ablation import hooks_added
from headcoop.analysis.engine.copies import chunks, continuation, copies_per_chunk
from headcoop.analysis.engine.norms import frozen_norm, norm_kind
from headcoop.models.bridge import is_bridge, user_hooks


def _centred(values: Tensor) -> Tensor:
    """[..., out] less its mean over the completions (a shift common to every completion changes no answer)."""
    return values - values.mean(-1, keepdim=True)


def fast_path(model) -> str | None:
    """None where `prefix_pushes` reproduces the model's run, else why it steps aside to the reference."""
    if is_bridge(model):
        return "a TransformerBridge runs from its tokens"
    hooks = user_hooks(model)
    if hooks:
        return f"hooks are installed at {', '.join(hooks[:3])}"
    if not kernels.supported(model):
        return "the row-wise suffix does not reproduce this model's blocks (kernels.supported)"
    return None


def push_rows(n_pos: Int[Tensor, " row"], first: Int[Tensor, " row"], n_inputs: int, starts: list[int],
              n_layers: int, fast: bool) -> float:  # fmt: skip
    """Block rows the pushes run, in rows of every layer: rows [input + edit] run to n_pos (each one's read row
    + 1). Per condition (`starts`: the unablated run's 0, each zeroed head's layer) the inputs' rows whole; on
    the prefix-shared path each edit's rows from its first changed row (`first`) on, from the condition's start
    layer; on the reference's every edited input whole, per condition from layer 0."""
    inputs, edits = int(n_pos[:n_inputs].sum()), n_pos[n_inputs:]
    if not fast:
        return float((inputs + int(edits.sum())) * len(starts))
    run = int((edits - first[n_inputs:]).sum())
    return float(inputs * len(starts) + run * sum(n_layers - s for s in starts) / n_layers)


@torch.no_grad()
def reference_pushes(model, tokens: Int[Tensor, "row pos"], pos: Int[Tensor, " row"], players, total: list[bool],
                     outs: Tensor, memory_budget_mb: float, bar: "RowCounter | None" = None) -> Float[Tensor, "head row out"]:  # fmt: skip
    """[head, row, out] each head's centred push at each row's read position by full runs with plain hooks: the
    total effect for the heads `total` marks, the direct push (`evidence.head_dla`) for the others."""
    from headcoop.analysis.mechanisms.evidence import head_dla
    from headcoop.analysis.mechanisms.repair import run_with

    size = copies_per_chunk(model, 1, tokens.shape[1], memory_budget_mb)
    if not all(total):  # hc.dla holds every component's logits [row, component, vocab] (and a double copy)
        cfg = model.cfg
        per_row = (cfg.n_layers * (cfg.n_heads + 1) + 3) * cfg.d_vocab_out * 12
        size = max(1, min(size, int(memory_budget_mb * 2**20 // per_row)))
    out = torch.zeros(len(players), len(tokens), len(outs), dtype=torch.float64)
    bar = bar or RowCounter(None)
    for lo, hi in chunks(0, len(tokens), size):
        t, p = tokens[lo:hi].to(model.cfg.device), pos[lo:hi].to(model.cfg.device)
        if not all(total):
            dla = head_dla(model, t, p)
            if isinstance(dla, str):
                raise ValueError(f"no direct push: {dla}")
            for i, (lay, h) in enumerate(players):
                if not total[i]:
                    out[i, lo:hi] = _centred(dla[:, lay, h][:, outs])
        if any(total):
            full, _ = run_with(model, t, p, {})
            for i, (lay, h) in enumerate(players):
                if total[i]:
                    zero = torch.zeros(*t.shape, model.cfg.d_head)
                    without, _ = run_with(model, t, p, {(lay, h): zero})
                    out[i, lo:hi] = _centred((full - without)[:, outs])
        bar.ran(t.numel() * (1 + sum(total)))
    return out


class RowCounter:
    """Counts block rows run into the open progress bar, `unit` rows to a run (None: no counting); `close`
    brings the count to the runs announced for them."""

    def __init__(self, unit: int | None):
        self.unit, self.rows, self.counted = unit, 0.0, 0

    def ran(self, rows: float) -> None:
        if self.unit:
            self.rows += rows
            self._to(int(self.rows // self.unit))

    def close(self, runs: int) -> None:
        if self.unit:
            self._to(runs)

    def _to(self, runs: int) -> None:
        from headcoop.display.progress import advance

        if runs > self.counted:
            advance(runs - self.counted)
            self.counted = runs


def _logits_at(model, resid: Float[Tensor, "row d_model"], outs: Tensor) -> Float[Tensor, "row out"]:
    """The completions' logits of final residual-stream rows: the final norm (where there is one), then the
    unembedding's columns `outs` only."""
    x = resid[:, None]
    if model.cfg.normalization_type is not None:
        x = model.ln_final(x)
    outs = outs.to(x.device)
    return (x[:, 0] @ model.W_U[:, outs] + model.b_U[outs]).double().cpu()


def _final_scale(model, resid: Float[Tensor, "row d_model"]) -> Tensor | None:
    """The final norm's scale [row, 1] on these rows (its own hook_scale), None without a norm."""
    ln = getattr(model, "ln_final", None)
    if norm_kind(ln) is None or ln is None:
        return None
    seen: dict = {}

    def keep(x, hook):
        seen["scale"] = x.detach()

    with hooks_added(model, [("ln_final.hook_scale", keep)]):
        ln(resid[:, None])
    return seen["scale"][:, 0]


def _direct(model, z: Float[Tensor, "row d_head"], head: tuple[int, int], scale, outs: Tensor) -> Tensor:
    """[row, out] a head's direct push from its z at the read rows: through W_O, the final norm at `scale`
    (no bias), the unembedding's columns `outs`."""
    out = z @ model.blocks[head[0]].attn.W_O[head[1]]
    ln = getattr(model, "ln_final", None)
    out = frozen_norm(ln, out, scale, bias=False) if scale is not None else out
    return (out @ model.W_U[:, outs.to(out.device)]).double().cpu()


@torch.no_grad()
def prefix_pushes(model, tokens: Int[Tensor, "input pos"], pos: Int[Tensor, " input"], edits: dict, players,
                  total: list[bool], outs: Tensor, memory_budget_mb: float,
                  bar: RowCounter | None = None) -> Float[Tensor, "head row out"]:  # fmt: skip
    """[head, input + edit, out] the pushes of the inputs then of their edits (`edits`: tokens [edit, pos], read,
    source, position [edit]), each edit's rows before its position taken from its input's run under the same
    condition, and a zeroed head's run started at its own layer from the unablated run's residual stream there
    (module docstring). Equal to `reference_pushes` on the inputs and edits stacked."""
    cfg, device = model.cfg, model.cfg.device
    width = int(max(int(pos.max()), int(edits["read"].max()) if len(edits["read"]) else 0)) + 1
    tokens, etoks = tokens[:, :width].to(device), edits["tokens"][:, :width].to(device)
    n, e = len(tokens), len(etoks)
    zeroed = [p for p, t in zip(players, total) if t]
    direct_layers = sorted({lay for (lay, _), t in zip(players, total) if not t})
    caches = {c: _source_run(model, tokens, c, direct_layers if c is None else []) for c in [None, *zeroed]}
    rows_n, at_pos = torch.arange(n, device=device), pos.to(device)
    final = get_act_name("resid_post", cfg.n_layers - 1)
    resid = {c: torch.zeros(n + e, cfg.d_model, device=device, dtype=cfg.dtype) for c in caches}
    for c, cache in caches.items():
        resid[c][:n] = cache[final][rows_n, at_pos]
    z_read = {lay: torch.zeros(n + e, cfg.n_heads, cfg.d_head, device=device) for lay in direct_layers}
    for lay in direct_layers:
        z_read[lay][:n] = caches[None][get_act_name("z", lay)][rows_n, at_pos]
    shortformer = continuation(model, etoks)["shortformer_pos_embed"]
    embed = model.embed(etoks) + (model.pos_embed(etoks) if cfg.positional_embedding_type == "standard" else 0)
    size = copies_per_chunk(model, 1, width, memory_budget_mb, rows_out=1)
    bar = bar or RowCounter(None)
    bar.ran(len(caches) * int(pos.to(torch.long).add(1).sum()))
    for p in edits["position"].unique().tolist():
        at = (edits["position"] == p).nonzero().flatten()
        for lo, hi in chunks(0, len(at), size):
            idx = at[lo:hi].to(device)
            src, reads = edits["source"][idx.cpu()].to(device), edits["read"][idx.cpu()].to(device)
            one = torch.arange(len(idx), device=device)
            short = None if shortformer is None else shortformer[idx]
            keep_z: dict = {lay: None for lay in direct_layers}
            entering: dict = {lay: None for lay, _ in zeroed}
            for c, cache in caches.items():  # the unablated run first: the zeroed ones start from its residuals
                start = 0 if c is None else c[0]
                x = embed[idx][None, :, p:] if c is None else entering[c[0]]
                prefix = {name: cache[name][src] for name in _kv_names(model, start)}
                rows, last = kernels.run_from(
                    model, start, x, p, prefix, etoks[:1], short,
                    reads.unique(), zero=c, keep_z=keep_z if c is None else None, readout=lambda x: x,
                    keep_resid=entering if c is None else None,
                )  # fmt: skip
                if last is None:  # cannot happen: an edit's read row is at or after its position
                    raise RuntimeError(f"edits at position {p} read no row at or after it")
                resid[c][n + idx] = last[one, torch.searchsorted(rows, reads)]
                bar.ran(float((reads + 1 - p).sum()) * (cfg.n_layers - start) / cfg.n_layers)
            for lay, (z_rows, z) in keep_z.items():
                z_read[lay][n + idx] = z[one, torch.searchsorted(z_rows, reads)]
    logits = {c: _logits_at(model, r, outs) for c, r in resid.items()}
    scale = _final_scale(model, resid[None])
    out = [logits[None] - logits[(lay, h)] if t else _direct(model, z_read[lay][:, h], (lay, h), scale, outs)
           for (lay, h), t in zip(players, total)]  # fmt: skip
    return _centred(torch.stack(out))


def _source_run(model, tokens: Tensor, zero: tuple[int, int] | None, z_layers: list[int]) -> dict:
    """One run of the inputs, `zero`'s z zeroed (None: every head as it is): {hook name: activation} of every
    layer's keys (rotated, for rotary) and values, which the edits' prefixes read, the last residual stream,
    and z of `z_layers`."""
    cfg = model.cfg
    names = (
        set(_kv_names(model, 0))
        | {get_act_name("resid_post", cfg.n_layers - 1)}
        | {get_act_name("z", lay) for lay in z_layers}
    )
    hooks = [] if zero is None else [(get_act_name("z", zero[0]), _zero_hook(zero[1]))]
    with hooks_added(model, hooks):
        _, cache = model.run_with_cache(tokens, names_filter=lambda name: name in names)
    return dict(cache.items())


def _kv_names(model, start: int) -> list[str]:
    """The hook names of the keys (rotated, for rotary) and values of layers `start`.. (a prefix's)."""
    kind = "rot_k" if model.cfg.positional_embedding_type == "rotary" else "k"
    return [get_act_name(k, lay) for lay in range(start, model.cfg.n_layers) for k in (kind, "v")]


def _zero_hook(head: int):
    def hook(z: Tensor, hook=None) -> Tensor:
        z = z.clone()
        z[:, :, head] = 0
        return z

    return hook


__all__ = ["fast_path", "push_rows", "reference_pushes", "prefix_pushes", "RowCounter"]
