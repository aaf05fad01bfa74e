"""The axes a mechanism word is read from, each measured on its own (issue 37), from tensors the instrument
has already computed: `hc.cooperation` turns them into words.

- necessity (`necessity_classes`): per input, which of two heads the metric needs (OR, AND, i-only,
  j-only, shared), from the pair's 2 x 2 game f11, f10, f01, f00;
- writes (`write_sets`, `conditional_rank`, `superposed`): which of the task's completions each head pushes
  up (a positive direct logit contribution, as the SkipPair post reads its figure), whether it pushes up
  several completions consistent with the source token it attends to, and whether only the correct
  completion is pushed up by both heads;
- attention (`attended_sources`, `distributed`): which source token each head attends to from the read row,
  and whether two heads attend to different ones;
- sign (`effect_interval`): a head's mean effect over inputs with its 95% interval;
- conditional writes (`containing_outputs`, `conditional_writes`): whether what a head writes from the
  token it attends to depends on the tokens it does not attend to (the SkipPair post's definition);
- same computation (`same_computation`, `class_weights`): whether heads' per-input pushes are one
  function (the Count01 paper's pseudo-ensemble), baseline-free.

Every function is a plain tensor computation with its shapes; none runs the model.
"""

from __future__ import annotations

import math

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

NECESSITY = ("or", "and", "i_only", "j_only", "shared")


def necessity_classes(
    f11: Float[Tensor, "*pair batch"], f10: Float[Tensor, "*pair batch"], f01: Float[Tensor, "*pair batch"],
    f00: Float[Tensor, "*pair batch"], binary: bool, tau: float | Tensor, cutoff: float = 0.2,
) -> tuple[Bool[Tensor, "*pair batch"], dict[str, Bool[Tensor, "*pair batch"]]]:  # fmt: skip
    """(matters, {class: mask}) of a pair's 2 x 2 game per input (f: the metric with both heads, only i, only
    j, neither; higher is better). Binary (accuracy, a tie counts as no answer): the pair matters where
    f11 = 1 and f00 = 0; then OR (f10 = f01 = 1), AND (both 0), i-only, j-only. Continuous: it matters where
    D = f11 - f00 > tau; with a_i = (f10 - f00) / D: OR when a_i, a_j >= 1 - cutoff, AND when both <= cutoff,
    i-only when a_i >= 1 - cutoff and a_j <= cutoff, shared when both lie between and |a_i + a_j - 1| <= cutoff."""
    if binary:
        matters = (f11 > 0.5) & (f00 < 0.5)
        i_on, j_on = f10 > 0.5, f01 > 0.5
        return matters, {"or": i_on & j_on, "and": ~i_on & ~j_on, "i_only": i_on & ~j_on, "j_only": ~i_on & j_on,
                         "shared": torch.zeros_like(matters)}  # fmt: skip
    delta = f11 - f00
    matters = delta > tau
    safe = torch.where(matters, delta, torch.ones_like(delta))
    a_i, a_j = (f10 - f00) / safe, (f01 - f00) / safe
    hi_i, hi_j, lo_i, lo_j = a_i >= 1 - cutoff, a_j >= 1 - cutoff, a_i <= cutoff, a_j <= cutoff
    mid = ~hi_i & ~lo_i & ~hi_j & ~lo_j & ((a_i + a_j - 1).abs() <= cutoff)
    return matters, {"or": hi_i & hi_j, "and": lo_i & lo_j, "i_only": hi_i & lo_j, "j_only": lo_i & hi_j, "shared": mid}


def effect_interval(effect: Float[Tensor, "*head batch"]) -> tuple[Tensor, Tensor, Tensor]:
    """(mean, low, high) over the inputs (last axis) of per-input effects: the 95% interval of the mean by
    the normal approximation (mean -/+ 1.96 standard errors)."""
    effect = effect.double()
    n = effect.shape[-1]
    mean = effect.mean(-1)
    se = effect.std(-1) / math.sqrt(n) if n > 1 else torch.zeros_like(mean)
    return mean, mean - 1.96 * se, mean + 1.96 * se


def attended_sources(
    pattern: Float[Tensor, "batch head key"], tokens: Int[Tensor, "batch key"]
) -> tuple[Int[Tensor, "batch head"], Int[Tensor, "batch head"], Float[Tensor, "batch head"]]:
    """(position, token, weight) each head attends to most from the read row: the argmax of its attention
    pattern, the token there and the attention it gets."""
    weight, position = pattern.max(-1)
    token = tokens.gather(1, position)
    return position, token, weight


def distributed(source_i: Int[Tensor, " batch"], source_j: Int[Tensor, " batch"]) -> Bool[Tensor, " batch"]:
    """Per input, whether two heads attend (most) to different source tokens: the sources are distributed
    between them ("they distribute important source tokens between them")."""
    return source_i != source_j


def consistent_outputs(
    source: Int[Tensor, " batch"], answer: Int[Tensor, " batch"], outputs: Int[Tensor, " output"]
) -> Bool[Tensor, "batch output"]:
    """Per input, the completions consistent with what a head attends to: the answers of every input on
    which the head attends to the same source token (what the head can know from its source)."""
    position = {int(o): k for k, o in enumerate(outputs.tolist())}
    table: dict[int, set[int]] = {}
    for s, a in zip(source.tolist(), answer.tolist()):
        table.setdefault(s, set()).add(position.get(a, -1))
    out = torch.zeros(len(source), len(outputs), dtype=torch.bool)
    for b, s in enumerate(source.tolist()):
        cols = [c for c in table[s] if c >= 0]
        out[b, cols] = True
    return out


def write_sets(dla: Float[Tensor, "batch output"], reading: str = "positive") -> Bool[Tensor, "batch output"]:
    """Which of the outputs (columns) a head writes to on each input, from its direct logit contributions
    over them: "positive" (above 0, the post's figure: "positive logit contributions") or "centered" (above
    its mean over the outputs: a contrast reading, since softmax ignores a shift common to all logits)."""
    if reading == "positive":
        return dla > 0
    if reading == "centered":
        return dla > dla.mean(-1, keepdim=True)
    raise ValueError(f"unknown write reading {reading!r}; valid values are ['positive', 'centered']")


def superposed(
    writes_i: Bool[Tensor, "batch output"], writes_j: Bool[Tensor, "batch output"],
    consistent_i: Bool[Tensor, "batch output"], consistent_j: Bool[Tensor, "batch output"],
    answer_col: Int[Tensor, " batch"],
) -> tuple[Bool[Tensor, " batch"], Bool[Tensor, " batch"]]:  # fmt: skip
    """(multi, only_answer) per input: multi where each head writes to at least 2 completions consistent with
    its source ("In contexts where both heads write to multiple outputs"); only_answer where the answer is
    the one completion both heads write to ("they will only constructively interfere on the correct
    token"). answer_col: the answer's column in the outputs (-1 where the answer is not a completion)."""
    multi = ((writes_i & consistent_i).sum(-1) >= 2) & ((writes_j & consistent_j).sum(-1) >= 2)
    both = writes_i & writes_j
    rows = torch.arange(len(answer_col))
    on_answer = both[rows, answer_col.clamp(min=0)] & (answer_col >= 0)
    return multi, on_answer & (both.sum(-1) == 1)


def conditional_rank(dla: Float[Tensor, "batch output"], source: Int[Tensor, " batch"], tol: float = 0.1) -> int:
    """The rank of what a head writes as a function of the source token it attends to: the matrix of its
    mean contributions over the completions (one row per attended source token), counting singular values
    of at least `tol` times the largest. A head whose map from attended sources to outputs has rank 1 writes
    one fixed pattern scaled by a signed number: to the pattern's positive part, or with the sign flipped to
    its negative part, so at most two different sets of outputs for different sources."""
    rows = [dla[source == s].double().mean(0) for s in source.unique().tolist()]
    matrix = torch.stack(rows)
    values = torch.linalg.svdvals(matrix)
    if len(values) == 0 or float(values[0]) == 0.0:
        return 0
    return int((values >= tol * values[0]).sum())


def containing_outputs(
    source: Int[Tensor, " batch"], tokens: Int[Tensor, "batch key"], answer: Int[Tensor, " batch"],
    outputs: Int[Tensor, " output"], upto: Int[Tensor, " batch"],
) -> Bool[Tensor, "batch output"]:  # fmt: skip
    """Per input, the completions "containing" the token a head attends to: the answers of every input whose
    prompt (positions up to `upto`, the read row) holds that token anywhere, whether attended or not."""
    position = {int(o): k for k, o in enumerate(outputs.tolist())}
    seen = torch.arange(tokens.shape[1])[None, :] <= upto[:, None]
    table: dict[int, set[int]] = {}
    for row, ok, a in zip(tokens.tolist(), seen.tolist(), answer.tolist()):
        for t in {t for t, keep in zip(row, ok) if keep}:
            table.setdefault(t, set()).add(position.get(a, -1))
    out = torch.zeros(len(source), len(outputs), dtype=torch.bool)
    for b, s in enumerate(source.tolist()):
        out[b, [c for c in table.get(s, ()) if c >= 0]] = True
    return out


def conditional_writes(
    dla: Float[Tensor, "batch output"], consistent: Bool[Tensor, "batch output"],
    containing: Bool[Tensor, "batch output"], margin: float = 0.1,
) -> tuple[Bool[Tensor, " batch"], Bool[Tensor, " batch"]]:  # fmt: skip
    """(evidence, conditional) per input for one head. The SkipPair post: "the information copied from an
    attended-to token depends on the information at source tokens to which it is not attending". The rivals
    are the completions that contain the attended token but are not consistent with what the head's
    attention implies about the tokens it does not attend to (`consistent_outputs`); evidence where there is
    at least one rival and one consistent completion; conditional where every consistent completion is
    written above every rival by more than `margin` times the head's largest |write|. A head writing every
    completion containing its token alike is not conditional, whatever it writes elsewhere."""
    rival = containing & ~consistent
    evidence = rival.any(-1) & consistent.any(-1)
    big = torch.finfo(dla.dtype).max
    low = torch.where(consistent, dla, torch.full_like(dla, big)).min(-1).values
    high = torch.where(rival, dla, torch.full_like(dla, -big)).max(-1).values
    gap = margin * dla.abs().max(-1).values
    return evidence, evidence & (low - high > gap)


def same_computation(push: Float[Tensor, "head sample"], floor: float = 0.1) -> dict:
    """How far heads compute one function, from each head's per-input push (its contribution to the centred
    completion logits, one sample per (input, completion)): {active [head] (push std at least `floor` times
    the largest), r [head, head] (Pearson correlations), share (the share of the active heads' push variance
    on one direction: the top principal component over inputs), r_min, r_median (over pairs of active
    heads)}. Baseline-free: no head is ablated."""
    push = push.double()
    std = push.std(-1)
    active = std >= floor * std.max().clamp(min=1e-12)
    centred = push - push.mean(-1, keepdim=True)
    norm = centred.norm(dim=-1).clamp(min=1e-12)
    r = (centred @ centred.T) / (norm[:, None] * norm[None, :])
    idx = active.nonzero().flatten()
    sub = centred[idx]
    values = torch.linalg.svdvals(sub) ** 2 if len(idx) else torch.zeros(1, dtype=push.dtype)
    share = float(values[0] / values.sum().clamp(min=1e-30)) if len(idx) else float("nan")
    upper = r[idx][:, idx][torch.triu(torch.ones(len(idx), len(idx), dtype=torch.bool), 1)]
    return dict(active=active, r=r, share=share, r_min=float(upper.min()) if len(upper) else float("nan"),
                r_median=float(upper.median()) if len(upper) else float("nan"))  # fmt: skip


def class_weights(
    push: Float[Tensor, "head batch"], shares: Float[Tensor, "batch token"]
) -> Float[Tensor, "head token"]:
    """How each head weighs the evidence of each token class: least-squares weights w with push[h] =
    shares @ w[h] over the inputs, `shares` the share of each token type among an input's prompt tokens
    (the shares sum to 1, so no intercept is needed: a constant push is spread over the classes)."""
    solution = torch.linalg.lstsq(shares.double(), push.double().T).solution  # [token, head]
    return solution.T


def same_function(response: Float[Tensor, "head sample"], floor: float = 0.1) -> dict:
    """How far heads compute one function, from each head's responses to counterfactual edits (the change of
    its push per (edit, completion); `edits.py`): {rms [head], active [head] (rms at least `floor` times the
    largest), cos [head, head] (uncentred: a response is a change, 0 is no change), sign [active head]
    (of the cosine with the first active head), share (of the active heads' response energy on one
    direction), cos_min, cos_median (of |cos| over pairs of active heads)}. Proportional responses, of
    either sign, are one function: |cos| = 1 and share = 1."""
    response = response.double()
    rms = response.pow(2).mean(-1).sqrt()
    active = rms >= floor * rms.max().clamp(min=1e-12)
    norm = response.norm(dim=-1).clamp(min=1e-12)
    cos = (response @ response.T) / (norm[:, None] * norm[None, :])
    idx = active.nonzero().flatten()
    values = torch.linalg.svdvals(response[idx]) ** 2 if len(idx) else torch.zeros(1, dtype=response.dtype)
    share = float(values[0] / values.sum().clamp(min=1e-30)) if len(idx) else float("nan")
    upper = cos[idx][:, idx].abs()[torch.triu(torch.ones(len(idx), len(idx), dtype=torch.bool), 1)]
    sign = torch.sign(cos[idx[0], idx]) if len(idx) else torch.zeros(0, dtype=response.dtype)
    return dict(rms=rms, active=active, cos=cos, sign=sign, share=share,
                cos_min=float(upper.min()) if len(upper) else float("nan"),
                cos_median=float(upper.median()) if len(upper) else float("nan"))  # fmt: skip


def response_features(
    response: Float[Tensor, "head edit output"], old: Int[Tensor, " edit"], new: Int[Tensor, " edit"],
    position: Int[Tensor, " edit"],
) -> dict[tuple[str, object], Float[Tensor, " head"]]:  # fmt: skip
    """Per feature an edit moves, how much each head responds to it: {("substitution", (old, new)) or
    ("position", p): [head] the root-mean-square response over those edits, as a share of the head's
    root-mean-square response over every edit (1: as much as on average; 0: none)."""
    energy = response.double().pow(2).sum(-1)  # [head, edit]
    overall = energy.mean(-1).sqrt().clamp(min=1e-30)
    out: dict[tuple[str, object], Tensor] = {}
    for o, n in sorted(set(zip(old.tolist(), new.tolist()))):
        mask = (old == o) & (new == n)
        out[("substitution", (o, n))] = energy[:, mask].mean(-1).sqrt() / overall
    for p in sorted(set(position.tolist())):
        out[("position", p)] = energy[:, position == p].mean(-1).sqrt() / overall
    return out


__all__ = ["same_function", "response_features", "NECESSITY", "containing_outputs", "conditional_writes", "same_computation", "class_weights", "necessity_classes", "effect_interval", "attended_sources", "distributed",
           "consistent_outputs", "write_sets", "superposed", "conditional_rank"]  # fmt: skip
