"""The evidence `hc.cooperation` reads words from: the clean run's direct effects and attention, the
heads' per-input pushes (same computation), and, per ablation reading, the metric of every coalition with
the effects and 2 x 2 classes derived from it.
"""

from __future__ import annotations

from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens.utilities import get_act_name

from headcoop.analysis.engine.copies import per_input_metric
from headcoop.analysis.mechanisms.axes import class_weights, effect_interval, necessity_classes, same_computation
from headcoop.analysis.mechanisms.words import CLASSES
from headcoop.models.bridge import user_hooks
from headcoop.models.tl import HookedTransformer


class RowMetric:
    """A user's per-input metric (logits [batch, pos, vocab] -> [batch], one value per input, higher is better)
    read from the logits at each input's read row, as `hc.cooperation`'s evidence keeps them: its logits are
    [batch, pos, vocab] with row pos[b] of input b holding them and every other row zero. `checked` confirms,
    on the clean run's full logits, that this gives the values the full logits give (the metric reads the read
    rows only), or says where it does not."""

    def __init__(self, metric, pos: Tensor, n_pos: int):
        self.metric, self.pos, self.n_pos = metric, pos.cpu(), n_pos
        self.name = f"a custom metric ({getattr(metric, '__name__', type(metric).__name__)})"

    def __str__(self) -> str:
        return self.name

    def _values(self, logits: Tensor) -> Tensor:
        got = self.metric(logits)
        try:
            values = torch.as_tensor(got)
        except (TypeError, ValueError, RuntimeError):
            values = None
        if values is None:  # None, text, a dict: nothing torch reads as numbers
            raise TypeError(f"hc.cooperation's metric must return a tensor of real numbers, one per input, got "
                            f"{type(got).__name__} {str(got)[:60]!r}")  # fmt: skip
        if values.is_complex():
            raise TypeError(f"hc.cooperation's metric must return real numbers, got complex values ({values.dtype})")
        if values.shape != (len(logits),):
            raise ValueError(f"hc.cooperation reads its words input by input, so its metric must return one value per "
                             f"input ([{len(logits)}] for these logits), got shape {tuple(values.shape)}: e.g. "
                             "lambda logits: logits[rows, answer_pos, answer] - logits[rows, answer_pos, wrong] "
                             "(no mean), or a named metric")  # fmt: skip
        values = values.double().cpu()
        bad = (~torch.isfinite(values)).nonzero().flatten()
        if len(bad):
            raise ValueError(f"hc.cooperation's metric must be a finite number on every input: it is "
                             f"{float(values[bad[0]])} on input {int(bad[0])} ({len(bad)} of {len(values)} inputs)")  # fmt: skip
        return values

    def __call__(self, rows: Float[Tensor, "*lead batch vocab"]) -> Float[Tensor, "*lead batch"]:
        lead, (batch, vocab) = rows.shape[:-2], rows.shape[-2:]
        out = []
        for one in rows.reshape(-1, batch, vocab):
            full = one.new_zeros(batch, self.n_pos, vocab)
            full[torch.arange(batch), self.pos] = one
            out.append(self._values(full))
        return torch.stack(out).reshape(*lead, batch)

    def _independent(self, logits: Tensor, whole: Tensor) -> None:
        """Each input's value may not depend on the other inputs (the words read inputs one by one): the logits
        of one half of the batch are moved (seeded noise, the batch's size kept) and the other half's values
        must stay; ValueError naming the first input that moves."""
        half = len(logits) // 2
        if half < 1:
            return
        noise = torch.randn(logits.shape, generator=torch.Generator().manual_seed(0), dtype=logits.dtype)
        scale = float(logits.std()) if logits.numel() > 1 else 1.0
        for moved, kept in ((slice(half, None), slice(None, half)), (slice(None, half), slice(half, None))):
            other = logits.clone()
            other[moved] += (scale or 1.0) * noise[moved].to(logits.device)
            values = self._values(other)
            coupled = (~torch.isclose(whole[kept], values[kept], rtol=1e-6, atol=1e-9)).nonzero().flatten()
            if len(coupled):
                i = int(coupled[0]) + (kept.start or 0)
                raise ValueError(f"hc.cooperation's metric couples the inputs: input {i} gets {float(whole[i]):.6g}, and "
                                 f"{float(values[i]):.6g} when only the other inputs' logits change ({len(coupled)} "
                                 "inputs move). A value centred or normalised over the batch (a softmax over inputs, "
                                 "minus the batch mean) changes the words with the other inputs; compute each input's "
                                 "value from its own logits")  # fmt: skip

    def checked(self, full_logits: Float[Tensor, "batch pos vocab"]) -> "RowMetric":
        rows = torch.arange(len(full_logits))
        whole = self._values(full_logits.double())
        alone = self(full_logits.double()[rows, self.pos.to(full_logits.device)].cpu())
        self._independent(full_logits.double(), whole)
        bad = (~torch.isclose(whole, alone, rtol=1e-6, atol=1e-9)).nonzero().flatten()
        if len(bad):
            raise ValueError(f"hc.cooperation reads each coalition's logits at the inputs' answer positions, and this "
                             f"metric reads other positions too: on input {int(bad[0])} it is {float(whole[bad[0]]):.6g} "
                             f"on the full logits and {float(alone[bad[0]]):.6g} on the answer row alone ({len(bad)} of "
                             f"{len(rows)} inputs differ). Read logits[rows, answer_pos] only, or pass a named metric")  # fmt: skip
        return self


def per_input(metric, logits: Tensor, answer: Tensor, wrong: Tensor | None) -> Tensor:
    """[..., batch] values of a metric per input from the logits at the read rows [..., batch, vocab], higher is
    better: a named one (loss negated; accuracy counts a tie for the top logit as no answer, the rule
    `hc.interactions` shares) or a `RowMetric`."""
    if isinstance(metric, RowMetric):
        return metric(logits)
    values = per_input_metric(metric, logits, answer, wrong, ties="none")
    return -values if metric == "loss" else values


def signed(metric: str, logits: Tensor, answer: Tensor, wrong: Tensor | None) -> Tensor:
    """The user's metric read continuously, for signs and roles: accuracy's margin (the answer's logit minus
    the best other), else the metric itself (higher is better)."""
    if metric == "accuracy":
        return per_input_metric("logit_diff", logits, answer, None)
    return per_input(metric, logits, answer, wrong)


def additive_by_construction(model: HookedTransformer, a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Whether logits are linear in heads a's and b's outputs whatever the weights: an attention-only model
    without norms or soft-capping, both heads in the last layer (nothing reads their outputs)."""
    cfg = model.cfg
    last = cfg.n_layers - 1
    return (bool(cfg.attn_only) and cfg.normalization_type is None and not (cfg.output_logits_soft_cap or 0) > 0
            and a[0] == last and b[0] == last)  # fmt: skip


def head_dla(model: HookedTransformer, tokens: Tensor, pos: Tensor) -> Tensor | str:
    """Each head's direct logit attribution [batch, layer, head, vocab] at the read rows (the final norm's
    scale frozen), or why there is none (no exact DLA for the model, or installed hooks make it inexact)."""
    from headcoop.analysis.engine.inputs import check_decomposable
    from headcoop.analysis.nodes.dla import dla

    try:
        check_decomposable(model, "cooperation's direct effects")
    except ValueError:
        return "no exact DLA for this model"
    hooks = user_hooks(model)
    try:
        result = dla(model, tokens, pos=pos)
    except ValueError as err:
        if hooks and "hooks installed" in str(err):
            return f"the hooks installed at {', '.join(hooks[:4])} make DLA inexact"
        raise
    return result.heads().double().cpu()


def player_dla(
    model: HookedTransformer, tokens: Tensor, pos: Tensor, players, cache: dict | None = None
) -> Tensor | str:
    """The players' direct logit attribution [batch, player, vocab] (float64) at the read rows, the final norm's
    scale frozen, or why there is none: `head_dla`'s numbers for the players only (each head's z at its read
    row through W_O, the frozen norm and W_U), without every other component's full-vocabulary DLA (at GPT-2
    size that was 1.7 GB for 4 heads). cache: the clean run's z at the players' layers and the final norm's
    scale (`clean_run`), else one run. With a hook installed on the model, `head_dla` itself (its sum check
    decides whether the hooks leave DLA exact)."""
    from headcoop.analysis.engine.inputs import check_decomposable
    from headcoop.analysis.engine.norms import norm_kind, through_norm

    try:
        check_decomposable(model, "cooperation's direct effects")
    except ValueError:
        return "no exact DLA for this model"
    if user_hooks(model):
        every = head_dla(model, tokens, pos)
        return every if isinstance(every, str) else torch.stack([every[:, lay, h] for lay, h in players], 1)
    norm = getattr(model, "ln_final", None)
    if cache is None:
        names = {get_act_name("z", lay) for lay, _ in players} | {"ln_final.hook_scale"}
        cache = dict(model.run_with_cache(tokens, names_filter=lambda n: n in names)[1])
    rows, at = torch.arange(len(tokens), device=tokens.device), pos.to(tokens.device)
    parts = torch.stack([cache[get_act_name("z", lay)][rows, at, h] @ model.blocks[lay].attn.W_O[h]
                         for lay, h in players], 1)  # [batch, player, d_model]  # fmt: skip
    scale = cache["ln_final.hook_scale"][rows, at] if norm_kind(norm) is not None else None
    normed, _ = through_norm(parts, norm, scale)
    return (normed @ model.W_U).double().cpu()


def clean_run(model: HookedTransformer, tokens: Tensor, pos: Tensor, players) -> tuple[Tensor, dict, dict, dict]:
    """(logits at the read rows [batch, vocab], {layer: attention pattern of the read rows [batch, head,
    key]}, {player: z [batch, pos, d_head]}, the cache: z and the residual stream entering each player's layer
    and the final norm's scale, for `player_dla` and composition's and backup's runs) of the clean run, in one
    forward pass."""
    layers = sorted({lay for lay, _ in players})
    names = {get_act_name("pattern", lay) for lay in layers} | {get_act_name("z", lay) for lay in layers}
    kept = {get_act_name("z", lay) for lay in layers} | {get_act_name("resid_pre", lay) for lay in layers}
    kept |= {"ln_final.hook_scale"}
    logits, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names | kept)
    rows = torch.arange(len(tokens), device=tokens.device)
    patterns = {lay: cache[get_act_name("pattern", lay)][rows, :, pos.to(tokens.device)].cpu() for lay in layers}
    z = {(lay, h): cache[get_act_name("z", lay)][:, :, h].cpu() for lay, h in players}
    return logits[rows, pos.to(tokens.device)].double().cpu(), patterns, z, {n: cache[n] for n in kept if n in cache}


def prompt_shares(tokens: Int[Tensor, "batch pos"], upto: Int[Tensor, " batch"], most: int = 16
                  ) -> tuple[Float[Tensor, "batch token"], list[int]]:  # fmt: skip
    """(the share of each token type among an input's prompt tokens (positions before the read row), the
    token ids): the `most` most frequent types, the rest pooled into the last column (id -1)."""
    before = torch.arange(tokens.shape[1])[None, :] < upto.cpu()[:, None]
    ids, counts = tokens.cpu()[before].unique(return_counts=True)
    keep = ids[counts.argsort(descending=True)][:most].tolist()
    cols = [((tokens.cpu() == t) & before).sum(1) for t in keep]
    total = before.sum(1).clamp(min=1)
    rest = total - sum(cols) if cols else total
    shares = torch.stack(cols + ([rest] if bool((rest > 0).any()) else []), 1).double() / total[:, None]
    return shares, keep + ([-1] if shares.shape[1] > len(keep) else [])


def same_computation_axis(push: Float[Tensor, "head batch output"], shares: Tensor, floor: float) -> dict:
    """The same-computation axis (`same_computation`) of per-input pushes on the centred completion logits,
    with each head's class weights (`class_weights`, on the push's first completion column)."""
    contrast = push - push.mean(-1, keepdim=True)  # a shift common to every completion changes no answer
    centred = contrast - contrast.mean(1, keepdim=True)  # each completion's mean over the inputs (Pearson)
    result = same_computation(centred.flatten(1), floor)
    result["weights"] = class_weights(contrast[..., -1], shares) if contrast.shape[-1] > 1 else None
    return result


class Evidence:
    """The per-input evidence of one ablation reading (one draw): metric values of every coalition, and
    the heads' effects. v: the metric [mask, batch]; s: its continuous reading; ld: the logit difference
    (answer minus a fixed wrong token); masks in the order all, none, (all but i, i alone) per head,
    (all but i and j, i and j alone) per pair."""

    def __init__(self, v: Tensor, s: Tensor, ld: Tensor, k: int, pairs: list, binary: bool):
        self.v, self.s, self.ld, self.k, self.pairs, self.binary = v, s, ld, k, pairs, binary
        self._necessity: dict = {}
        self._fixed: dict = {}
        self.replaced_inputs: dict | None = None  # {context: [pair, batch]}: inputs this ablation cannot show
        idx_without = torch.tensor([2 + 2 * i for i in range(k)])
        idx_alone = idx_without + 1
        self.total = s[0][None] - s[idx_without]  # [k, batch]
        self.isolated = s[idx_alone] - s[1][None]
        self.total_ci = effect_interval(self.total)
        self.isolated_ci = effect_interval(self.isolated)
        self.scale_s = float(torch.maximum(self.total_ci[0].abs(), self.isolated_ci[0].abs()).sum())
        self.total_v = v[0][None] - v[idx_without]
        self.total_v_ci = effect_interval(self.total_v)
        self.isolated_v_ci = effect_interval(v[idx_alone] - v[1][None])
        if not binary:  # a continuous metric is its own continuous reading
            self.total_v_ci, self.isolated_v_ci = self.total_ci, self.isolated_ci
        scale_v = torch.maximum(self.total_v_ci[0].abs(), self.isolated_v_ci[0].abs()).sum()
        self.scale_v = max(float(scale_v), 1e-12)
        self.alone = v[idx_alone]  # [k, batch] each head alone
        at = torch.tensor([2 + 2 * k + 2 * m for m in range(len(pairs))], dtype=torch.long)
        ii = torch.tensor([i for i, _ in pairs], dtype=torch.long)
        jj = torch.tensor([j for _, j in pairs], dtype=torch.long)
        w, a = 2 + 2 * jj, 3 + 2 * ii
        self.full = (v[0][None].expand(len(pairs), -1), v[w], v[2 + 2 * ii], v[at])
        self.isol = (v[at + 1], v[a], v[3 + 2 * jj], v[1][None].expand(len(pairs), -1))
        self.full_s = (s[0][None].expand(len(pairs), -1), s[w], s[2 + 2 * ii], s[at])
        self.isol_s = (s[at + 1], s[a], s[3 + 2 * jj], s[1][None].expand(len(pairs), -1))
        self.full_ld = (ld[0][None].expand(len(pairs), -1), ld[w], ld[2 + 2 * ii], ld[at])
        self.isol_ld = (ld[at + 1], ld[a], ld[3 + 2 * jj], ld[1][None].expand(len(pairs), -1))

    def roles(self, role: float, held: dict | None = None) -> tuple[list[str], list[str]]:
        """(role per head, which reading decided it: "v" the metric, "s" its continuous reading). The total
        effect decides (the metric, then for accuracy the margin); the isolated effect only where no total
        effect is significant, so it never reverses one. A head with a backup (`held`: {head: (total on the
        metric, total on the continuous reading) [batch] with its backup held at its unablated output}) is
        read before the compensation."""
        tau_v, tau_s = role * self.scale_v / self.k, role * self.scale_s / self.k
        out, kinds = [], []
        held = held or {}
        totals: list[tuple[str, Any, float]]
        for i in range(self.k):
            totals = [("v", self.total_v_ci, tau_v)] + ([("s", self.total_ci, tau_s)] if self.binary else [])
            if i in held:
                tv, ts = (tuple(torch.full((self.k,), float(x)) for x in effect_interval(h)) for h in held[i])
                totals = [("v", tv, tau_v)] + ([("s", ts, tau_s)] if self.binary else [])
            isolated = [("v", self.isolated_v_ci, tau_v)] + ([("s", self.isolated_ci, tau_s)] if self.binary else [])
            found, kind = "inactive", ""
            for which, (mean, lo, hi), tau in totals + isolated:
                m, low, high = float(mean[i]), float(lo[i]), float(hi[i])
                if m > tau and low > 0:
                    found, kind = "supports", which
                    break
                if m < -tau and high < 0:
                    found, kind = "competes", which
                    break
            out.append(found)
            kinds.append(kind)
        return out, kinds

    def necessity(self, th: dict) -> dict:
        """Per context ("full", "isolated"): shares per pair [pair] of the 2 x 2 classes among the inputs
            where the pair matters (less the inputs `replaced_inputs` marks: `unseen`, their share), those inputs
        [pair, batch], and per head of the pair (a, b) the share of them
            where it changes the metric (with its partner present or removed: `moves_a`, `moves_b`; removed with its
            partner present, its own removal: `own_a`, `own_b`) and whether
            it changes the metric at all (`effect_a`, `effect_b` [pair]: a significant mean effect, either way,
            with its partner present or removed; accuracy also on its margin); and
            `use_full` [pair]: the full model where the pair matters there on at least min_share of inputs.
            Computed once per (role, cutoff, min_share): the other thresholds do not enter it."""
        key = (th["role"], th["cutoff"], th["min_share"])
        if key not in self._necessity:
            self._necessity[key] = self._necessity_of(th)
        return self._necessity[key]

    def _necessity_of(self, th: dict) -> dict:
        tau = th["role"] * self.scale_v * 2 / self.k  # the pair's joint effect: two heads' fair shares
        tau_v = th["role"] * self.scale_v / self.k  # one head's effect: the threshold roles use
        tau_s = th["role"] * self.scale_s / self.k
        result = {}
        for context in ("full", "isolated"):
            fixed = self._context(context, tau, th["cutoff"])
            matters, classes, count, effects = fixed["matters"], fixed["classes"], fixed["count"], fixed["effects"]
            significant = self._beyond(effects, tau_v)
            if self.binary:  # accuracy: also its margin, as roles read it
                significant |= self._beyond(fixed["margins"], tau_s)
            extra = {}
            for side, k in (("a", 0), ("b", 2)):
                pairs = fixed[f"pairs_{side}"]
                moves = fixed[f"changes_{side}"] if self.binary else \
                    self._changes(pairs[0], pairs[1], tau) | self._changes(pairs[2], pairs[3], tau)  # fmt: skip
                extra[f"moves_{side}"] = (moves & matters).sum(-1).double() / count
                own = self._changes(pairs[0], pairs[1], tau)  # removed with its partner present
                extra[f"own_{side}"] = (own & matters).sum(-1).double() / count
                extra[f"effect_{side}"] = significant[k] | significant[k + 1]
                extra[f"sign_{side}"] = fixed[f"sign_{side}"]
            result[context] = dict(matters=matters.double().mean(-1), additive=fixed["additive"], classes=classes,
                                   mask=matters, unseen=fixed["unseen"], **fixed["share"], **extra)  # fmt: skip
        use_full = (result["full"]["matters"] >= th["min_share"]) | (result["isolated"]["matters"] < th["min_share"])
        return dict(use_full=use_full, **result)

    def _context(self, context: str, tau: float, cutoff: float) -> dict:
        """What a context's necessity reading shares across role thresholds: the 2 x 2 classes, the effects'
        intervals, the signs. On accuracy the classes do not depend on tau, so they are computed once per
        cutoff; on a continuous metric once per (tau, cutoff)."""
        key = (context, None if self.binary else tau, cutoff)
        if key in self._fixed:
            return self._fixed[key]
        f, l, fs = (
            (self.full, self.full_ld, self.full_s) if context == "full" else (self.isol, self.isol_ld, self.isol_s)
        )
        matters, classes = necessity_classes(*f, self.binary, tau, cutoff)
        unseen = torch.zeros(len(self.pairs))
        if self.replaced_inputs is not None:  # inputs where a replacement does what its head does: no evidence
            out_ = matters & self.replaced_inputs[context]
            unseen = out_.sum(-1).double() / matters.sum(-1).clamp(min=1).double()
            matters = matters & ~out_
        count = matters.sum(-1).clamp(min=1).double()
        share = {c: (classes[c] & matters).sum(-1).double() / count for c in CLASSES}
        f11, f10, f01, f00 = f
        l11, l10, l01, l00 = l
        needed = (classes["and"] | classes["shared"]) & matters
        additive = ((l11 - l10 - l01 + l00).abs() <= cutoff * (l11 - l00).abs().clamp(min=1e-9)) & needed
        s11, s10, s01, s00 = fs
        effects = torch.stack([f11 - f01, f10 - f00, f11 - f10, f01 - f00])  # [a with, a without, b with, b without]
        out = dict(matters=matters, classes=classes, count=count, share=share, effects=effect_interval(effects),
                   additive=additive.sum(-1).double() / needed.sum(-1).clamp(min=1).double(), unseen=unseen)  # fmt: skip
        margins = torch.stack([s11 - s01, s10 - s00, s11 - s10, s01 - s00])
        if self.binary:
            out["margins"] = effect_interval(margins)
        for side, (with_, without, alone, none), k in (("a", (f11, f01, f10, f00), 0), ("b", (f11, f10, f01, f00), 2)):
            out[f"pairs_{side}"] = (with_, without, alone, none)
            if self.binary:
                out[f"changes_{side}"] = self._changes(with_, without, tau) | self._changes(alone, none, tau)
            direction = effects[k].mean(-1) + effects[k + 1].mean(-1)
            if self.binary:
                direction = torch.where(direction == 0, margins[k].mean(-1) + margins[k + 1].mean(-1), direction)
            out[f"sign_{side}"] = torch.sign(direction)
        self._fixed[key] = out
        return out

    @staticmethod
    def _beyond(interval: tuple[Tensor, Tensor, Tensor], tau: float) -> Tensor:
        """A mean effect above tau in size with its 95% interval excluding 0 (interval: `effect_interval`)."""
        mean, lo, hi = interval
        return ((mean > tau) & (lo > 0)) | ((mean < -tau) & (hi < 0))

    def _changes(self, x: Tensor, y: Tensor, tau: float) -> Tensor:
        return ((x > 0.5) != (y > 0.5)) if self.binary else ((x - y).abs() > tau)


__all__ = ["RowMetric", "per_input", "signed", "additive_by_construction", "head_dla", "player_dla", "clean_run", "prompt_shares",
           "same_computation_axis", "Evidence"]  # fmt: skip
