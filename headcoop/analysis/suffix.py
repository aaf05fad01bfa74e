"""The layers after a patched one, run on the rows that can change and only those (exact).

With causal attention, a change to the residual stream at rows r0.. (and nothing before) changes no row
before r0 in any later layer. So each later layer runs on rows r0.. only: their queries, keys and values
are recomputed, the keys and values of rows before r0 are the target run's cached ones, and the MLP and
norms are per-row anyway. In the last layer only the rows the metric reads need their output (`needed`);
every other row of the logits is the target run's own. This is `HookedTransformerKeyValueCache`'s idea
(an unchanged prefix is not recomputed) applied to a stack of patched copies.

The blocks are TransformerLens's own modules (ln1, `calculate_qkv_matrices`, `calculate_attention_scores`,
`calculate_z_scores`, ln2 / MLP via `apply_mlp`, ln_final, unembed), so the arithmetic is theirs; the tests
compare every patch against `transformer_lens.patching`. `supported` names the models it serves.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer


def supported(model: HookedTransformer) -> bool:
    """Standard TransformerLens blocks the row-wise suffix reproduces: causal `Attention` (no grouped
    queries, sinks, QK norm, clipping, logit soft-capping or dynamic rotary scaling), sequential attention
    then MLP, no norm after a block's outputs, standard, shortformer or rotary positions."""
    cfg = model.cfg
    return (
        cfg.attention_dir == "causal"
        and cfg.positional_embedding_type in ("standard", "shortformer", "rotary")
        and not getattr(cfg, "use_dynamic_ntk_rope", False)
        and not cfg.parallel_attn_mlp
        and not cfg.use_normalization_before_and_after
        and not cfg.use_attn_result
        and not cfg.use_split_qkv_input
        and not cfg.use_attn_in
        and not getattr(cfg, "load_in_4bit", False)
        and not getattr(cfg, "use_attention_sinks", False)
        and not getattr(cfg, "use_qk_norm", False)
        and not getattr(cfg, "use_logn_attn", False)
        and getattr(cfg, "clip_qkv", None) is None
        and not (cfg.attn_scores_soft_cap or 0) > 0
        and not (cfg.output_logits_soft_cap or 0) > 0
        and (cfg.n_key_value_heads is None or cfg.n_key_value_heads == cfg.n_heads)
        and all(type(block.attn).__name__ == "Attention" for block in model.blocks)
        and all(getattr(block.attn, "_attention_dir_override", None) in (None, "causal") for block in model.blocks)
    )


def mask_future(scores: Float[Tensor, "... key"], attn, q_pos: Int[Tensor, "..."], align: str = "q") -> Tensor:
    """`scores` with every key after its query's position set to the module's IGNORE (the causal mask at
    chosen query rows, the one copy every row-wise path uses). q_pos holds the query positions; `align`
    says where its axes sit in scores' leading axes: "q" (q_pos is the query-row axis, just before keys),
    "copy" (one position per leading copy; scores [copy, ..., key])."""
    future = torch.arange(scores.shape[-1], device=scores.device) > q_pos.to(scores.device)[..., None]
    if align == "copy":
        future = future.view(future.shape[0], *[1] * (scores.ndim - 2), future.shape[-1])
    return torch.where(future, attn.IGNORE.to(scores.device), scores)


def unembed(model: HookedTransformer, x: Float[Tensor, "... row d_model"]) -> Float[Tensor, "... row vocab"]:
    """Logits of residual-stream rows: the final norm (where the model has one), then the unembedding."""
    return model.unembed(model.ln_final(x) if model.cfg.normalization_type is not None else x)


def finish_block(model: HookedTransformer, layer: int, resid_mid: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
    """resid_post of `layer` from its resid_mid (attention already added): + MLP(ln2(resid_mid)) unless
    the model is attention-only. Works on any rows: the MLP and its norm act per row."""
    if model.cfg.attn_only:
        return resid_mid
    block = model.blocks[layer]
    shape = resid_mid.shape
    flat = resid_mid.reshape(-1, 1, shape[-1])
    return resid_mid + block.apply_mlp(block.ln2(flat)).reshape(shape)


@torch.no_grad()
def run_from(
    model: HookedTransformer,
    start: int,
    x: Float[Tensor, "copy batch row d_model"],
    r0: int,
    target_cache,
    target_logits: Float[Tensor, "batch pos vocab"],
    shortformer_pos_embed: Float[Tensor, "batch pos d_model"] | None,
    needed: Int[Tensor, " row"] | None,
) -> tuple[Int[Tensor, " row"], Float[Tensor, "copy_batch row vocab"] | None]:
    """Logits of copies whose residual stream entering layer `start` is the target's, except rows r0..
    (given in `x`, one [batch, n_pos - r0, d_model] block per copy): (rows, their logits [copy * batch, row,
    vocab]) for the rows that can change (r0.., and of those only `needed`, when given); every other row
    is the target's. (rows empty, None) when the metric reads no row that can change."""
    n, batch, _, d_model = x.shape
    n_pos = target_logits.shape[1]
    device = x.device
    rows = torch.arange(r0, n_pos, device=device)  # absolute positions of x's rows
    for layer in range(start, model.cfg.n_layers):
        block, attn = model.blocks[layer], model.blocks[layer].attn
        last = layer == model.cfg.n_layers - 1
        keep = torch.ones(len(rows), dtype=torch.bool, device=device)
        if last and needed is not None:
            keep = torch.isin(rows, needed.to(device))
            if not keep.any():  # the metric reads no row this patch can change
                return rows[:0], None
        flat = x.reshape(n * batch, len(rows), d_model)
        normed = block.ln1(flat)
        qk_in = normed
        if shortformer_pos_embed is not None:
            qk_in = normed + shortformer_pos_embed[:, rows].repeat(n, 1, 1)
        rotary = model.cfg.positional_embedding_type == "rotary"
        q, k, v = attn.calculate_qkv_matrices(qk_in if rotary else qk_in[:, keep], qk_in, normed)
        if rotary:  # rows r0.. sit at absolute positions r0..: rotate with that offset, then keep the rows
            q, k = attn.apply_rotary(q, r0)[:, keep], attn.apply_rotary(k, r0)
        if r0 > 0:  # the prefix's keys (rotated, for rotary) and values from the target run
            prefix = lambda kind: target_cache[f"blocks.{layer}.attn.hook_{kind}"][:, :r0].repeat(n, 1, 1, 1)  # noqa: E731
            k, v = torch.cat([prefix("rot_k" if rotary else "k"), k], 1), torch.cat([prefix("v"), v], 1)
        scores = attn.calculate_attention_scores(q, k)  # [copy*batch, head, q_row, key]
        q_pos = rows[keep]
        scores = mask_future(scores, attn, q_pos)
        pattern = F.softmax(scores, dim=-1)
        pattern = torch.where(torch.isnan(pattern), torch.zeros_like(pattern), pattern).to(model.cfg.dtype)
        z = attn.calculate_z_scores(v, pattern)  # [copy*batch, q_row, head, d_head]
        w = attn.W_O.reshape(-1, d_model).T  # [d_model, head * d_head], as the module's F.linear
        out = F.linear(z.reshape(z.shape[0], z.shape[1], -1), w.contiguous(), attn.b_O)
        resid_mid = flat[:, keep] + out
        x = finish_block(model, layer, resid_mid).view(n, batch, -1, d_model)
        rows = q_pos
    if start >= model.cfg.n_layers and needed is not None:  # the patched layer was the last: read rows only
        keep = torch.isin(rows, needed.to(device))
        if not keep.any():
            return rows[:0], None
        x, rows = x[:, :, keep], rows[keep]
    return rows, unembed(model, x.reshape(n * batch, len(rows), d_model))  # [copy*batch, row, vocab]


@dataclass(frozen=True)
class RowLogits:
    """Logits of n patched copies that differ from the target run's only at some rows: copy i's logits
    are `base` [batch, pos, vocab] with rows `rows` replaced by `values[i]` [batch, row, vocab]. Saves
    materialising n full copies when the metric reads a few rows."""

    base: Float[Tensor, "batch pos vocab"]
    rows: Int[Tensor, " row"]
    values: Float[Tensor, "copy batch row vocab"]

    def full(self) -> Float[Tensor, "copy batch pos vocab"]:
        out = self.base[None].repeat(len(self.values), 1, 1, 1)
        out[:, :, self.rows] = self.values
        return out

    def each(self):
        """Copy i's full logits [batch, pos, vocab], one copy at a time, in one reused buffer: a value
        computed from a yielded tensor must be copied before the next one is taken."""
        buffer = self.base.clone()
        for values in self.values:
            buffer[:, self.rows] = values
            yield buffer


def reads_only(metric, logits: Float[Tensor, "batch pos vocab"], rows: Tensor) -> bool:
    """Whether `metric` reads no logits outside `rows` (positions): its value on `logits` is unchanged when
    every other row is filled with NaN, with seeded random values, and with the negated logits."""
    reference = metric(logits)
    other = torch.ones(logits.shape[1], dtype=torch.bool, device=logits.device)
    other[rows.to(logits.device)] = False
    if not other.any():
        return True
    gen = torch.Generator().manual_seed(0)
    fills = (
        torch.full_like(logits, float("nan")),
        (torch.randn(logits.shape, generator=gen) * 100).to(logits.device, logits.dtype),
        -logits,
    )
    for fill in fills:
        changed = torch.where(other[None, :, None], fill, logits)
        try:
            value = metric(changed)
        except Exception:  # noqa: BLE001 - a metric that fails on such rows reads them
            return False
        if not torch.equal(torch.as_tensor(value), torch.as_tensor(reference)):
            return False
    return True
