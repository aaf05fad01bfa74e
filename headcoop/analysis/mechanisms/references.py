"""What an ablated head writes under each ablation kind of `hc.cooperation`'s family, aligned by role.

Mean and resample take their values at the same offset from the answer position (the read row) as the
input's own position, never by index: on a variable-length task the '=' of one string is replaced by what
heads write at the '=' of others (Count01: a plain per-index mean draws 4% of its values from '='
positions). Identical draws (a reference that bootstrap resampling cannot change) collapse into one.
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor

from headcoop.analysis.engine.ablation import reference_z, resample_order
from headcoop.analysis.engine.inputs import as_tokens
from headcoop.tasks.base import Batch, generator

KINDS = ("zero", "mean", "resample")


def draw_references(task, reference, draws: int, seed: int) -> list:
    """The references of one ablation: `draws` independent task samples of 512 (seeds seed + 1 + d), or
    bootstrap resamples of the given reference (draw 0 is the reference itself)."""
    if reference is None:
        return [task.sample(512, seed=seed + 1 + d) for d in range(draws)]
    out = [reference]
    n = len(reference)
    for d in range(1, draws):
        pick = torch.randint(0, n, (n,), generator=generator(seed + 1000 + d))
        out.append(reference[pick] if isinstance(reference, Batch) else torch.as_tensor(reference)[pick])
    return out


def aligned_mean(ref_z: Float[Tensor, "ref ref_pos head d_head"], ref_ans: Int[Tensor, " ref"],
                 ans: Int[Tensor, " batch"], width: int) -> Float[Tensor, "batch pos head d_head"]:  # fmt: skip
    """At input b's position p, the mean over references r of z_r at ref_ans[r] + (p - ans[b]) (the same
    offset from the answer position), where that position exists; the per-position mean where no reference
    has it."""
    n_ref, ref_w = ref_z.shape[:2]
    offsets = torch.arange(-(width - 1), width)  # [offset]
    at = ref_ans.cpu()[None, :] + offsets[:, None]  # [offset, ref]
    ok = (at >= 0) & (at < ref_w)
    gathered = ref_z[torch.arange(n_ref)[None, :], at.clamp(0, ref_w - 1)]  # [offset, ref, head, d_head]
    count = ok.sum(1)  # [offset]
    table = (gathered * ok.to(ref_z.dtype)[..., None, None]).sum(1) / count.clamp(min=1).to(ref_z.dtype)[:, None, None]
    p = torch.arange(width)[None, :]  # [1, pos]
    index = p - ans.cpu()[:, None] + width - 1  # [batch, pos]
    fallback = ref_z.mean(0)[p.clamp(max=ref_w - 1)].expand(len(ans), -1, -1, -1)
    return torch.where((count[index] > 0)[..., None, None], table[index], fallback)


def aligned_resample(ref_z: Float[Tensor, "ref ref_pos d_head"], ref_ans: Int[Tensor, " ref"],
                     ans: Int[Tensor, " batch"], width: int, order: Int[Tensor, " ref"]
                     ) -> Float[Tensor, "batch pos d_head"]:  # fmt: skip
    """Input b takes reference order[b % n_ref]'s z at the same offset from that reference's answer position;
    where the reference has no such position, the aligned mean over references there."""
    n = len(ans)
    pick = order[torch.arange(n) % len(order)]
    p = torch.arange(width)[None, :]
    at = ref_ans.cpu()[pick][:, None] + p - ans.cpu()[:, None]  # [batch, pos]
    ok = (at >= 0) & (at < ref_z.shape[1])
    value = ref_z[pick[:, None], at.clamp(0, ref_z.shape[1] - 1)]
    mean = aligned_mean(ref_z[:, :, None], ref_ans, ans, width)[:, :, 0]
    return torch.where(ok[..., None], value, mean)


def replacements(model, players, batch: Batch, how: str, references: list, seed: int, runs: dict | None = None
                 ) -> tuple[list[dict], list]:  # fmt: skip
    """([{player: [batch, pos, d_head]} per distinct draw], [the answers the replacement carries, [batch] or
    None, per draw]): what each player writes when ablated under one kind. Draws giving the same values as
    an earlier draw are dropped (a reading counted once). runs: {draw: (reference tokens, their z)} shared by
    the kinds of one call, so that mean and resample run each reference batch once."""
    runs = {} if runs is None else runs
    n, width = batch.tokens.shape
    if how == "zero":
        return [{p: torch.zeros(n, width, model.cfg.d_head) for p in players}], [None]
    layers = sorted({lay for lay, _ in players})
    out: list[dict] = []
    carried: list = []
    for d, ref in enumerate(references):
        ref_tokens = as_tokens(model, ref)
        ref_ans = ref.answer_pos if isinstance(ref, Batch) else torch.full((len(ref_tokens),), ref_tokens.shape[1] - 1)
        ans = batch.answer_pos.cpu()
        if d not in runs or not torch.equal(runs[d][0], ref_tokens) or not set(layers) <= set(runs[d][1]):
            runs[d] = (ref_tokens, {lay: z.cpu() for lay, z in reference_z(model, ref_tokens, set(layers)).items()})
        ref_z = runs[d][1]
        values, injected = {}, None
        order = resample_order(len(ref_tokens), seed + d)
        for lay, head in players:
            z = ref_z[lay][:, :, head]  # [ref, ref_pos, d_head]
            if how == "mean":
                values[(lay, head)] = aligned_mean(z[:, :, None], ref_ans, ans, width)[:, :, 0]
            else:
                values[(lay, head)] = aligned_resample(z, ref_ans, ans, width, order)
        if how == "resample" and isinstance(ref, Batch):
            injected = ref.answer.cpu()[order[torch.arange(n) % len(order)]]
        if any(all(torch.equal(values[p], seen[p]) for p in players) for seen in out):
            continue
        out.append(values)
        carried.append(injected)
    return out, carried


def blind(clean_z: dict, values: dict, players, rows: Tensor, pos: Tensor, tol: float = 0.05) -> list[bool]:
    """Per player, whether an ablation cannot see it: its replacement is what it writes anyway, within `tol`
    of its largest |z|, at every position up to the read row of every input (a head whose output does not
    depend on the input is not removed by a mean or a resample)."""
    out = []
    width = int(pos.max()) + 1  # only non-zero kinds are checked: a head whose z is 0 everywhere writes nothing
    upto = torch.arange(width)[None, :] <= pos.cpu()[:, None]  # [batch, pos]
    for p in players:
        own, repl = clean_z[p][:, :width].double(), values[p][:, :width].double()
        gap = ((own - repl).abs().amax(-1) * upto).max()
        scale = own.abs().max().clamp(min=1e-12)
        out.append(bool(gap <= tol * scale))
    return out


__all__ = ["KINDS", "draw_references", "aligned_mean", "aligned_resample", "replacements", "blind"]
