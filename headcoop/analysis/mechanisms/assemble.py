"""From evidence to words: the clean run's axes (`Run`), and every reading's pair words and roles."""

from __future__ import annotations

import dataclasses
import torch
from torch import Tensor

from headcoop.analysis.mechanisms.axes import attended_sources, effect_interval
from headcoop.analysis.mechanisms.evidence import additive_by_construction, clean_run, head_dla, prompt_shares
from headcoop.analysis.mechanisms.repair import composition_share
from headcoop.analysis.mechanisms.words import (
    ABSTAIN, CLASSES, Reading, band, model_word, necessity_word, superposition_word,
)  # fmt: skip
from headcoop.analysis.mechanisms.writes import Writes


@dataclasses.dataclass
class Run:
    """What every reading shares: the inputs, the players and pairs, the clean run's axes."""

    batch: object
    players: list
    names: tuple
    pairs: list
    metric: str
    masks: Tensor
    answer: Tensor
    wrong: Tensor | None
    fixed_wrong: Tensor
    sign_wrong: Tensor
    pos: Tensor
    logits_clean: Tensor
    z: dict
    heads_dla: object
    direct: Tensor
    writes: Writes
    by_construction: list
    shares: Tensor
    share_ids: list
    outs: Tensor
    later: bool

    @property
    def k(self) -> int:
        return len(self.players)

    @property
    def binary(self) -> bool:
        return self.metric == "accuracy"

    @property
    def rows(self) -> Tensor:
        return torch.arange(len(self.answer))

    @property
    def no_dla(self) -> str | None:
        return self.heads_dla if isinstance(self.heads_dla, str) else None

    @property
    def cross(self) -> list:
        return [(m, i, j) for m, (i, j) in enumerate(self.pairs) if self.players[i][0] != self.players[j][0]]


def clean_evidence(model, task, batch, players, names, pairs, metric, outputs, masks) -> Run:
    """The clean run's axes (one forward pass and DLA): logits, attention, z, direct effects, writes."""
    device = batch.tokens.device
    pos = batch.answer_pos.to(device)
    answer = batch.answer.cpu()
    logits_clean, patterns, z = clean_run(model, batch.tokens, pos, players)
    wrong = batch.wrong.cpu() if batch.wrong is not None else None
    best_other = logits_clean.scatter(-1, answer[:, None], float("-inf")).argmax(-1)
    sign_wrong = best_other if metric == "accuracy" or wrong is None else wrong
    heads_dla = head_dla(model, batch.tokens, pos)
    rows = torch.arange(len(batch))
    direct = torch.full((len(players),), float("nan"), dtype=torch.float64)
    if not isinstance(heads_dla, str):
        direct = torch.stack([(heads_dla[rows, lay, h, answer] - heads_dla[rows, lay, h, sign_wrong]).mean()
                              for lay, h in players])  # fmt: skip
    source = torch.stack([attended_sources(patterns[lay][:, h:h + 1], batch.tokens.cpu())[1][:, 0]
                          for lay, h in players], 1)  # [batch, player]: the token each head attends most  # fmt: skip
    declared = None if task is None or outputs is not None else task.completions()
    outs = torch.as_tensor(outputs if outputs is not None else declared if declared is not None else answer.unique(),
                           dtype=torch.long).cpu()  # fmt: skip
    vocab = model.cfg.d_vocab_out
    if outs.ndim != 1 or bool(((outs < 0) | (outs >= vocab)).any()):
        raise ValueError(f"outputs= must be a list of token ids in 0..{vocab - 1}, got {outs.tolist()[:10]}")
    outs = torch.cat([outs, answer.unique()]).unique()  # every answer is a completion
    writes = Writes(heads_dla, players, pairs, answer, outs, source, batch.tokens.cpu(), pos.cpu())
    shares, share_ids = prompt_shares(batch.tokens, pos)
    return Run(batch=batch, players=players, names=names, pairs=pairs, metric=metric, masks=masks, answer=answer,
               wrong=wrong, fixed_wrong=wrong if wrong is not None else best_other, sign_wrong=sign_wrong, pos=pos,
               logits_clean=logits_clean, z=z, heads_dla=heads_dla, direct=direct, writes=writes,
               by_construction=[additive_by_construction(model, players[i], players[j]) for i, j in pairs],
               shares=shares, share_ids=share_ids, outs=outs,
               later=not model.cfg.attn_only or any(lay < model.cfg.n_layers - 1 for lay, _ in players))  # fmt: skip


def replacement_blind(run: Run, zero, evs: list, th: dict, how: str) -> list[str | None]:
    """Per player, why this ablation's replacement cannot show it (None where it can): zeroing the head
    (every other head as it is) changes the metric on at least `min_share` of the inputs with a significant
    mean effect (beyond the role threshold, its 95% interval excluding 0), and its replacement's effect against
    the head zeroed equals the head's own: the head's effect against its replacement is not significant
    (within the threshold or its interval holding 0), or the replacement carries all of the head's effect as
    the words read "all" (at least 1 - `cutoff` of it). The replacement then does what the head does, so
    "inactive", "competition" or "redundant" would be the replacement's words, not the head's. Changes:
    accuracy flips; a continuous metric moves by more than the threshold (the role threshold's share of one
    head's fair share of the summed effects). zero: the zero ablation's `Evidence`; evs: every draw's of this
    kind, pooled (a resample draw is one sample of the replacement)."""
    out: list[str | None] = []
    tau = th["role"] * zero.scale_v / run.k

    def significant(effect: Tensor) -> bool:
        mean, lo, hi = (float(x) for x in effect_interval(effect))
        return (mean > tau and lo > 0) or (mean < -tau and hi < 0)

    for i in range(run.k):
        full, without_zero = zero.v[0], zero.v[2 + 2 * i]
        without = torch.cat([ev.v[2 + 2 * i] for ev in evs])
        changes = ((full > 0.5) != (without_zero > 0.5)) if run.binary else ((full - without_zero).abs() > tau)
        shown = float(changes.double().mean())
        own = full - without_zero
        against = full.repeat(len(evs)) - without  # the head against its replacement, every draw
        carried = abs(float(against.mean())) <= th["cutoff"] * abs(float(own.mean()))  # the words' "all of it"
        if shown >= th["min_share"] and significant(own) and (not significant(against) or carried):
            replaced = float((without - without_zero.repeat(len(evs))).mean())
            out.append(f"cannot be seen by {how} ablation: zeroing it changes the metric on {shown:.0%} of inputs "
                       f"(mean effect {float(own.mean()):+.3g}), and its {how} replacement does what the head does "
                       f"(effect {replaced:+.3g} against the head zeroed; the head against it {float(against.mean()):+.3g}, "
                       + (f"at most {th['cutoff']:.0%} of the head's own)" if carried else
                          f"not beyond {tau:.3g} with 95% confidence)"))  # fmt: skip
        else:
            out.append(None)
    return out


def injected_wins(run: Run, ev, logits: Tensor, injected: tuple | None, nec: dict) -> list:
    """Per pair, under resample: among the inputs where the pair matters and a head alone fails, the share
    where a failing head-alone run is topped (ties included) by another input's information: the
    injected input's answer, or a completion the resampled partner's injected value pushes up directly.
    The loss is then another input's answer, not the head's absence. None where nothing was injected or no
    head alone fails. injected: (the injected inputs' answers [batch] or None, {player: [batch, vocab]})."""
    if injected is None:
        return [None] * len(run.pairs)
    answers, pushed = injected
    out = []
    for m, (i, j) in enumerate(run.pairs):
        full = bool(nec["use_full"][m])
        e = nec["full"] if full else nec["isolated"]
        # (coalition keeping one head of the pair, the partner it resamples)
        runs = ((2 + 2 * j, j), (2 + 2 * i, i)) if full else ((3 + 2 * i, j), (3 + 2 * j, i))
        fails, hits = [], []
        for c, partner in runs:
            rival = logits[c].scatter(-1, run.answer[:, None], float("-inf")).argmax(-1)
            failed = (ev.v[c] < 0.5) if run.binary else (logits[c].argmax(-1) != run.answer)
            by_answer = (rival == answers) if answers is not None else torch.zeros_like(failed)
            fails.append(failed)
            hits.append(failed & (by_answer | pushed[run.players[partner]][run.rows, rival]))
        some = (fails[0] | fails[1]) & e["mask"][m]
        confounded = some & (hits[0] | hits[1])
        out.append(float(confounded.sum()) / int(some.sum()) if bool(some.any()) else None)
    return out


def pair_word(run: Run, m: int, roles, nec, thr, comp, unseen, lost, cache: dict) -> tuple[str, str]:
    """(word, reason) of pair m under one reading (words.py's module docstring, rules 1-7); cache: the write
    shares of every pair for this necessity reading, keyed by (context, floor, write reading), filled here."""
    i, j = run.pairs[m]
    a, b = run.names[i], run.names[j]
    if unseen[i] or unseen[j]:
        who, why = (a, unseen[i]) if unseen[i] else (b, unseen[j])
        return ABSTAIN, f"{who} {why}"
    # decided once per draw at the default majority: every threshold reading of the draw abstains from the words
    # read from the 2 x 2 game (inactive, superposition, the necessity words); competition and composition are
    # read from total effects
    injected = None if lost is None else (ABSTAIN, (
        f"resample injects another input's information: on {lost:.0%} of the inputs a head alone fails, what tops "
        "it is a completion the resampled partner pushes"))  # fmt: skip
    context = "full" if bool(nec["use_full"][m]) else "isolated"
    e = nec[context]
    if not bool(e["effect_a"][m]) or not bool(e["effect_b"][m]):
        if injected:
            return injected
        who, other = (a, b) if not bool(e["effect_a"][m]) else (b, a)
        return "inactive", f"{who} changes the metric neither with {other} present nor without it ({context})"
    ra, rb = roles[i], roles[j]
    if {ra, rb} == {"supports", "competes"}:
        return "competition", f"{a if ra == 'competes' else b} pushes against the answer"
    if ra == rb == "competes":
        return "undetermined", "both heads push against the answer"
    if comp is not None and comp >= thr["composition"]:
        return "composition", f"{comp:.0%} of the earlier head's effect runs through the later head's inputs"
    if injected:
        return injected
    if ra == rb == "supports":
        key = (context, thr["floor"], thr["writes"])
        if key not in cache:
            cache[key] = run.writes.shares(thr["floor"], thr["writes"], e["mask"])
        sp = cache[key][m]
        found = superposition_word(a, b, thr, dict(sp, moves_a=float(e["moves_a"][m]), moves_b=float(e["moves_b"][m]),
                                                   own_a=float(e["own_a"][m]), own_b=float(e["own_b"][m])))  # fmt: skip
        if found:
            return found
    matters = float(e["matters"][m])
    if matters < thr["min_share"]:
        return "undetermined", f"the pair matters on {matters:.0%} of inputs ({context})"
    word, reason = necessity_word(a, b, thr, {c: float(e[c][m]) for c in CLASSES}, run.by_construction[m] and not run.binary,
                                  (float(e["own_a"][m]), float(e["own_b"][m])))  # fmt: skip
    return word, reason + (" (isolated: every other head ablated; the pair matters in the full model on "
                           f"{float(nec['full']['matters'][m]):.0%} of inputs)" if context == "isolated" else "")


def read_all(run: Run, by_kind: dict, hows, th, factors) -> dict:
    """Every reading's words, reasons, roles and model word. Long: one loop over kinds, draws and threshold
    readings with the caches that keep it fast (roles per role threshold, necessity per its thresholds)."""
    threshold_readings = band(th, factors)
    out = dict(readings=[], words=[], reasons=[], roles=[], model=[], held={})
    for h in hows:
        held = held_totals(run, by_kind[h])
        out["held"][h] = held
        comp = by_kind[h]["composition"]
        for d, (ev, unseen, injected, lg) in enumerate(by_kind[h]["draws"]):
            lost = [x if x is not None and x >= th["majority"] else None
                    for x in injected_wins(run, ev, lg, injected, ev.necessity(th))]  # fmt: skip
            roles_cache, shares_caches = {}, {}
            for name, f, thr in threshold_readings:
                if thr["role"] not in roles_cache:
                    roles_cache[thr["role"]] = ev.roles(thr["role"], held)
                roles, kinds = roles_cache[thr["role"]]
                nec = ev.necessity(thr)  # cached by the evidence per (role, cutoff, min_share)
                shares_cache = shares_caches.setdefault((thr["role"], thr["cutoff"], thr["min_share"]), {})
                words, reasons = [], []
                for m in range(len(run.pairs)):
                    share = composition_share(comp.get(m), ev, roles, kinds, thr["role"])
                    word, reason = pair_word(run, m, roles, nec, thr, share, unseen, lost[m], shares_cache)
                    words.append(word)
                    reasons.append(reason)
                out["readings"].append(Reading(h, d, name, f))
                out["words"].append(words)
                out["reasons"].append(reasons)
                out["roles"].append(with_partner_roles(run, roles, nec, unseen))
                out["model"].append(model_word(words))
    return out


def with_partner_roles(run: Run, roles: list[str], nec: dict, unseen: list) -> list[str]:
    """Roles with two corrections: a head that no total or isolated effect shows but that changes the metric
    with a partner removed (a redundant feeder) takes that effect's sign; a head this ablation cannot see
    abstains."""
    out = list(roles)
    for m, (i, j) in enumerate(run.pairs):
        e = nec["full"] if bool(nec["use_full"][m]) else nec["isolated"]
        for h, side in ((i, "a"), (j, "b")):
            if out[h] == "inactive" and bool(e[f"effect_{side}"][m]) and float(e[f"sign_{side}"][m]) != 0:
                out[h] = "supports" if float(e[f"sign_{side}"][m]) > 0 else "competes"
    return [ABSTAIN if u else r for r, u in zip(out, unseen)]


def held_totals(run: Run, kind: dict) -> dict:
    """{earlier head: (total on the metric, on its continuous reading) [batch] with its strongest backup held
    at its unablated output}, from the kind's backup rows."""
    if kind["backup"] is None:
        return {}
    rows, _, held = kind["backup"]
    ev = kind["draws"][0][0]
    out = {}
    for row in sorted(rows, key=lambda r: -r["own_compensation"]):
        e, later = run.names.index(row["of"]), run.names.index(row["backup"])
        if row["backs_up"] and e not in out:
            v_held, s_held = held[(e, later)]
            out[e] = (ev.v[0] - v_held, ev.s[0] - s_held)
    return out


__all__ = ["Run", "clean_evidence", "replacement_blind", "injected_wins", "pair_word", "read_all", "with_partner_roles", "held_totals"]
