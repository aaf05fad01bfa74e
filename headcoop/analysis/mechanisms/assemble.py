"""From evidence to words: the clean run's axes (`Run`), and every reading's pair words and roles."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor

from headcoop.analysis.mechanisms.axes import attended_sources, effect_interval
from headcoop.analysis.mechanisms.evidence import additive_by_construction, clean_run, player_dla, prompt_shares
from headcoop.analysis.mechanisms.repair import composition_share
from headcoop.analysis.mechanisms.words import (
    ABSTAIN,
    CLASSES,
    Reading,
    band,
    model_word,
    necessity_word,
    superposition_word,
)  # fmt: skip
from headcoop.analysis.mechanisms.writes import Writes


@dataclasses.dataclass
class Run:
    """What every reading shares: the inputs, the players and pairs, the clean run's axes."""

    batch: Any  # the task's Batch
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
    clean_cache: dict  # z and the residual stream entering each player's layer, the final norm's scale
    heads_dla: Any  # [batch, player, vocab] (`player_dla`), or the reason there is none (str)
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
    logits_clean, patterns, z, cache = clean_run(model, batch.tokens, pos, players)
    wrong = batch.wrong.cpu() if batch.wrong is not None else None
    best_other = logits_clean.scatter(-1, answer[:, None], float("-inf")).argmax(-1)
    sign_wrong = best_other if metric == "accuracy" or wrong is None else wrong
    heads_dla = player_dla(model, batch.tokens, pos, players, cache)
    rows = torch.arange(len(batch))
    direct = torch.full((len(players),), float("nan"), dtype=torch.float64)
    if not isinstance(heads_dla, str):
        direct = torch.stack([(heads_dla[rows, i, answer] - heads_dla[rows, i, sign_wrong]).mean()
                              for i in range(len(players))])  # fmt: skip
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
               logits_clean=logits_clean, z=z, clean_cache=cache, heads_dla=heads_dla, direct=direct, writes=writes,
               by_construction=[additive_by_construction(model, players[i], players[j]) for i, j in pairs],
               shares=shares, share_ids=share_ids, outs=outs,
               later=not model.cfg.attn_only or any(lay < model.cfg.n_layers - 1 for lay, _ in players))  # fmt: skip


def replacement_blind(run: Run, zero, evs: list, th: dict, how: str) -> list[str | None]:
    """Per player, why this ablation's replacement cannot show it (None where it can), in the full model with
    every other head as it is (`replaced_like_zero` on the zero ablation's run without the head): zero: the zero
    ablation's `Evidence`; evs: every draw's of this kind, pooled (a resample draw is one sample of the
    replacement)."""
    out: list[str | None] = []
    for i in range(run.k):
        present, zeroed = zero.v[0], zero.v[2 + 2 * i]  # the full model needs no replacement: one run
        replaced = torch.cat([ev.v[2 + 2 * i] for ev in evs])
        out.append(replaced_like_zero(run, zero, (present, zeroed), (present.repeat(len(evs)), replaced), th, how,
                                      "with every other head present"))  # fmt: skip
    return out


def replaced_like_zero(run: Run, zero, zeroing: tuple[Tensor, Tensor], replacing: tuple[Tensor, Tensor], th: dict,
                       how: str, where: str) -> str | None:  # fmt: skip
    """Why this ablation's replacement cannot show a head in one coalition (None where it can): zeroing the
    head (zeroing: the metric with it and with it zeroed [n], the rest of the coalition as it is) changes the metric on at least
    `min_share` of the inputs with a significant mean effect (beyond the role threshold, its 95% interval
    excluding 0), and its replacement (replacing: the metric with it and with its replacement [m], every draw)
    does what zeroing does: the head's effect against its replacement is not significant (within the
    threshold or its interval holding 0), the replacement carries all of the head's effect as the words read
    "all" (at least 1 - `cutoff` of it), or it does more, the same way (the head against it significant with
    the other sign: its role would read reversed). The replacement then does what the head does, so
    "inactive", "competition" or "redundant" would be the replacement's words, not the head's. Changes: accuracy flips; a continuous metric moves by more than the threshold (the
    role threshold's share of one head's fair share of the summed effects, on the zero ablation's scale)."""
    tau = th["role"] * zero.scale_v / run.k

    def significant(effect: Tensor) -> bool:
        mean, lo, hi = (float(x) for x in effect_interval(effect))
        return (mean > tau and lo > 0) or (mean < -tau and hi < 0)

    (present, zeroed), (present_r, replaced) = zeroing, replacing
    changes = ((present > 0.5) != (zeroed > 0.5)) if run.binary else ((present - zeroed).abs() > tau)
    shown = float(changes.double().mean())
    own, against = present - zeroed, present_r - replaced
    carried = abs(float(against.mean())) <= th["cutoff"] * abs(float(own.mean()))  # the words' "all of it"
    reversed_ = significant(against) and float(against.mean()) * float(own.mean()) < 0  # it outdoes the head
    if not (shown >= th["min_share"] and significant(own) and (not significant(against) or carried or reversed_)):
        return None
    how_much = ("more than the head does, the same way, so the head reads reversed against it" if reversed_ and not carried
                else "what the head does")  # fmt: skip
    return (f"cannot be seen by {how} ablation {where}: zeroing it changes the metric on {shown:.0%} of inputs "
            f"(mean effect {float(own.mean()):+.3g}), and its {how} replacement does {how_much} (effect "
            f"{float(replaced.mean() - zeroed.mean()):+.3g} against the head zeroed; the head against it {float(against.mean()):+.3g}, "
            + (f"at most {th['cutoff']:.0%} of the head's own)" if carried else
               "the other sign, beyond the threshold with 95% confidence)" if reversed_ else
               f"not beyond {tau:.3g} with 95% confidence)"))  # fmt: skip


def zeroed_keys(pairs: list, i: int) -> list[tuple]:
    """The coalitions of the 2 x 2 games of head i's pairs (besides the full model's) in which head i is
    zeroed while every other absent head takes this ablation's replacement: ("none",) every other head
    replaced (isolated, partner removed), ("without", j) all but j (full, partner removed), ("alone", j) j
    alone (isolated, partner present)."""
    partners = [b if a == i else a for a, b in pairs if i in (a, b)]
    return ([("none",)] if partners else []) + [(kind, j) for j in partners for kind in ("without", "alone")]


def zeroed_mask(k: int, i: int, key: tuple) -> Tensor:
    """[k] the coalition of `key` (`zeroed_keys`): True where a head keeps its own output; head i is never kept."""
    mask = torch.zeros(k, dtype=torch.bool)
    if key[0] == "without":
        mask[:] = True
        mask[[i, key[1]]] = False
    elif key[0] == "alone":
        mask[key[1]] = True
    return mask


def coalition_blind(run: Run, zero, evs: list, zeroed: dict, th: dict, how: str) -> list[dict]:
    """Per pair, per context ("full", "isolated"), why this ablation cannot show a head of the pair in a
    coalition of that context's 2 x 2 game other than the full model (`replacement_blind` covers that one),
    or None: `replaced_like_zero` with the head zeroed and every other absent head replaced (zeroed: {(i,
    key): metric [draw, batch]}, `zeroed_keys`), pooled over the draws."""
    cat = lambda xs: torch.cat(list(xs))  # noqa: E731
    out = []
    for m, (i, j) in enumerate(run.pairs):
        found: dict = {"full": None, "isolated": None}
        for a, b, s in ((i, j, "a"), (j, i, "b")):
            f = 1 if s == "a" else 2  # the full game's run without the partner: full[1] lacks j, full[2] lacks i
            alone_a = 1 if s == "a" else 2  # the isolated game's run with the head alone
            partner_alone = 2 if s == "a" else 1
            checks = (
                ("full", cat(ev.full[f][m] for ev in evs), zeroed[(a, ("without", b))].flatten(),
                 cat(ev.full[3][m] for ev in evs), f"with {run.names[b]} removed"),
                ("isolated", cat(ev.isol[0][m] for ev in evs), zeroed[(a, ("alone", b))].flatten(),
                 cat(ev.isol[partner_alone][m] for ev in evs), f"with {run.names[b]} alone beside it"),
                ("isolated", cat(ev.isol[alone_a][m] for ev in evs), zeroed[(a, ("none",))].flatten(),
                 cat(ev.isol[3][m] for ev in evs), "alone"),
            )  # fmt: skip
            for context, present, off, replaced, where in checks:
                if found[context] is None:
                    why = replaced_like_zero(run, zero, (present, off), (present, replaced), th, how, where)
                    found[context] = None if why is None else f"{run.names[a]} {why}"
        out.append(found)
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


def replaced_inputs(run: Run, zero, ev, zeroed: dict, d: int, th: dict) -> dict:
    """{context: [pair, batch] bool}: per pair, the inputs where this ablation's replacement of a head of the
    pair does what the head does, in a coalition of that context's 2 x 2 game: zeroing the head changes the
    metric there and replacing it does not (a resampled input with the head's own token, a mean that carries
    the head's effect on this input). Such an input shows nothing about the head's necessity, so it is left
    out of the inputs where the pair matters. zero: the zero ablation's `Evidence`; ev: draw d's of this kind;
    zeroed: `zeroed_runs`' metric [draw, batch] per (head, coalition)."""
    tau = th["role"] * zero.scale_v / run.k

    def moves(x: Tensor, y: Tensor) -> Tensor:
        return ((x > 0.5) != (y > 0.5)) if run.binary else ((x - y).abs() > tau)

    ii = torch.tensor([i for i, _ in run.pairs], dtype=torch.long)
    jj = torch.tensor([j for _, j in run.pairs], dtype=torch.long)
    z = lambda key_of: torch.stack([zeroed[key_of(i, j)][d] for i, j in run.pairs])  # noqa: E731  [pair, batch]
    f11, f10, f01, f00 = ev.full
    g11, g10, g01, g00 = ev.isol
    # (context, with the head, the head zeroed, the head replaced): i, then j; partner present, then removed
    cases = (("full", f11, zero.v[2 + 2 * ii], f01), ("full", f10, z(lambda i, j: (i, ("without", j))), f00),
             ("full", f11, zero.v[2 + 2 * jj], f10), ("full", f01, z(lambda i, j: (j, ("without", i))), f00),
             ("isolated", g11, z(lambda i, j: (i, ("alone", j))), g01), ("isolated", g10, z(lambda i, j: (i, ("none",))), g00),
             ("isolated", g11, z(lambda i, j: (j, ("alone", i))), g10), ("isolated", g01, z(lambda i, j: (j, ("none",))), g00))  # fmt: skip
    out = {"full": torch.zeros_like(f11, dtype=torch.bool), "isolated": torch.zeros_like(f11, dtype=torch.bool)}
    for context, with_, off, replaced in cases:
        out[context] |= moves(with_, off) & ~moves(with_, replaced)
    return out


# the words a replacement that does what the head does fakes in a coalition of the 2 x 2 game other than the
# full model ("competition" is read from the full model's total effects: `replacement_blind` covers it)
REPLACEABLE = ("inactive", "redundant")


def pair_word(run: Run, m: int, roles, nec, thr, comp, unseen, lost, cache: dict, blind=None) -> tuple[str, str]:
    """(word, reason) of pair m under one reading (words.py's module docstring, rules 1-7); cache: the write
    shares of every pair for this necessity reading, keyed by (context, floor, write reading), filled here;
    blind: per pair {context: why a head of the pair cannot be seen in a coalition of that context's 2 x 2
    game} (`coalition_blind`), or None: a word it could fake (`REPLACEABLE`, or a mixture with "either
    alone") abstains with that reason."""
    word, reason = _pair_word(run, m, roles, nec, thr, comp, unseen, lost, cache)
    why = None if blind is None else blind[m]["full" if bool(nec["use_full"][m]) else "isolated"]
    if why and (word in REPLACEABLE or (word == "mixture" and "either alone" in reason)):
        return ABSTAIN, why
    return word, reason


def _pair_word(run: Run, m: int, roles, nec, thr, comp, unseen, lost, cache: dict) -> tuple[str, str]:
    i, j = run.pairs[m]
    a, b = run.names[i], run.names[j]
    if unseen[i] or unseen[j]:
        who, why = (a, unseen[i]) if unseen[i] else (b, unseen[j])
        return ABSTAIN, f"{who} {why}"
    context = "full" if bool(nec["use_full"][m]) else "isolated"
    # decided once per draw at the default majority: every threshold reading of the draw abstains from the words
    # read from the 2 x 2 game (inactive, superposition, the necessity words); competition and composition are
    # read from total effects
    injected = None if lost is None else (ABSTAIN, (
        f"resample injects another input's information: on {lost:.0%} of the inputs a head alone fails, what tops "
        "it is a completion the resampled partner pushes"))  # fmt: skip
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
        unseen = float(e["unseen"][m])
        return "undetermined", f"the pair matters on {matters:.0%} of inputs ({context})" + (
            f"; {unseen:.0%} of the inputs where it matters are left out, where a replacement does what its head "
            "does" if unseen > 0 else "")  # fmt: skip
    word, reason = necessity_word(a, b, thr, {c: float(e[c][m]) for c in CLASSES}, run.by_construction[m] and not run.binary,
                                  (float(e["own_a"][m]), float(e["own_b"][m])))  # fmt: skip
    return word, reason + (
        " (isolated: every other head ablated; the pair matters in the full model on "
        f"{float(nec['full']['matters'][m]):.0%} of inputs)"
        if context == "isolated"
        else ""
    )


def read_all(run: Run, by_kind: dict, hows, th, factors) -> dict:
    """Every reading's words, reasons, roles and model word. Long: one loop over kinds, draws and threshold
    readings with the caches that keep it fast (roles per role threshold, necessity per its thresholds)."""
    threshold_readings = band(th, factors)
    out: dict[str, Any] = dict(readings=[], words=[], reasons=[], roles=[], model=[], held={})
    for h in hows:
        held = held_totals(run, by_kind[h])
        out["held"][h] = held
        comp = by_kind[h]["composition"]
        for d, (ev, unseen, injected, lg) in enumerate(by_kind[h]["draws"]):
            lost = [x if x is not None and x >= th["majority"] else None
                    for x in injected_wins(run, ev, lg, injected, ev.necessity(th))]  # fmt: skip
            roles_cache: dict = {}
            shares_caches: dict = {}
            for name, f, thr in threshold_readings:
                if thr["role"] not in roles_cache:
                    roles_cache[thr["role"]] = ev.roles(thr["role"], held)
                roles, kinds = roles_cache[thr["role"]]
                nec = ev.necessity(thr)  # cached by the evidence per (role, cutoff, min_share)
                shares_cache = shares_caches.setdefault((thr["role"], thr["cutoff"], thr["min_share"]), {})
                words, reasons = [], []
                for m in range(len(run.pairs)):
                    share = composition_share(comp.get(m), ev, roles, kinds, thr["role"])
                    word, reason = pair_word(run, m, roles, nec, thr, share, unseen, lost[m], shares_cache,
                                             by_kind[h].get("blind_pairs"))  # fmt: skip
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


__all__ = [
    "Run",
    "clean_evidence",
    "replacement_blind",
    "replaced_like_zero",
    "zeroed_keys",
    "zeroed_mask",
    "coalition_blind",
    "replaced_inputs",
    "injected_wins",
    "pair_word",
    "read_all",
    "with_partner_roles",
    "held_totals",
]
