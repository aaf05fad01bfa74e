"""Composition and backup between heads of different layers (`hc.cooperation`): plain hooks on hook_z, so
each measurement is a forward pass that works on HookedTransformers and TransformerBridges alike.

**Composition**: the drop of the metric when only the later head's z takes the value it has with the earlier
head ablated (every path from the earlier head into the later one's q, k and v inputs; the rest of the run
as it is): Elhage et al. 2021's Q/K/V-composition.

**Backup** (McGrath et al. 2023; Rushing & Nanda 2024), for i in an earlier layer than j: ablate i; j's
compensation is the rise of its direct effect, split into what j's own output change gives (the final
norm's scale frozen at the unablated run's) and what the norm's rescaling gives (the rest). j backs up i
when its own change restores at least half of i's direct effect (both above the role threshold), or at
least half of the answers that are lost when j is also held at its unablated output.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformer_lens.utilities import get_act_name

from headcoop.analysis.engine.ablation import hooks_added, z_hooks
from headcoop.analysis.mechanisms.evidence import Evidence, per_input, signed

BACKUP_COLUMNS = ["backup", "of", "how", "own_compensation", "norm_compensation", "logit_share", "answers_lost",
                  "answers_restored", "backs_up"]  # fmt: skip


def run_with(model, tokens, pos, values: dict, cache_names=()) -> tuple[Tensor, dict]:
    """(logits at the read rows, cache) with each (layer, head) of `values` writing its given z."""
    cache = {}

    def keep(x, hook):
        cache[hook.name] = x.detach()

    with hooks_added(model, z_hooks(values) + [(name, keep) for name in cache_names]):
        logits = model(tokens)
    return logits[torch.arange(len(tokens)), pos].double().cpu(), cache


class HookedRuns:
    """The plain-hook runs composition and backup read on one batch, each run once per call (the clean run,
    and each earlier head's ablated run, shared by composition and backup) and started at the first layer it
    changes, from the residual stream of a run identical below that layer (TransformerLens's start_at_layer:
    the blocks below give the same numbers, so they are not run again). A TransformerBridge, a model with
    shortformer positions or an attention mask, or any hook installed on the model runs every run from the
    tokens (`from_tokens`). clean: the clean run's (logits at the read rows, cache of `names`), if made."""

    def __init__(self, model, tokens: Tensor, pos: Tensor, players: list[tuple[int, int]], clean: tuple | None = None):
        from headcoop.analysis.engine.copies import hooks_in_the_way
        from headcoop.models.bridge import is_bridge

        self.model, self.tokens, self.pos = model, tokens, pos
        self.layers = sorted({lay for lay, _ in players})
        self.has_norm = getattr(model, "ln_final", None) is not None and model.cfg.normalization_type is not None
        self.names = [get_act_name("z", lay) for lay in self.layers] + [get_act_name("resid_pre", lay) for lay in
                                                                         self.layers]  # fmt: skip
        self.names += ["ln_final.hook_scale"] if self.has_norm else []
        self.from_tokens = (is_bridge(model) or bool(hooks_in_the_way(model))
                            or model.cfg.positional_embedding_type == "shortformer")  # fmt: skip
        if not self.from_tokens:
            self.from_tokens = model.input_to_embed(tokens)[3] is not None  # an attention mask: padding
        self._clean: tuple | None = clean  # (logits at the read rows, cache) of a clean run made already
        self._ablated: dict = {}

    def clean(self) -> tuple[Tensor, dict]:
        """(logits at the read rows, cache of the players' layers' z and residual stream, the final norm's
        scale) of the unablated run."""
        if self._clean is None:
            self._clean = self.run({}, keep=True)
        return self._clean

    def ablated(self, key, values: dict) -> tuple[Tensor, dict]:
        """The run with `values` (one earlier head's replacement), cached under `key`."""
        if key not in self._ablated:
            self._ablated[key] = self.run(values, keep=True, below=self.clean()[1])
        return self._ablated[key]

    def run(self, values: dict, keep: bool = False, below: dict | None = None,
            start: int | None = None) -> tuple[Tensor, dict]:  # fmt: skip
        """(logits at the read rows [batch, vocab] float64, cache) with each (layer, head) of `values` writing
        its z; `below`: the cache of a run that equals this one below `start` (default the first layer
        `values` changes; a player layer)."""
        start = min((lay for lay, _ in values), default=None) if start is None else start
        if self.from_tokens or below is None or start is None or start == 0:
            return run_with(self.model, self.tokens, self.pos, values, self.names if keep else ())
        cache = {k: v for k, v in below.items() if _layer_of(k, start) < start}  # what the blocks below wrote
        with hooks_added(self.model, z_hooks(values) + [(n, _keeper(cache)) for n in (self.names if keep else ())]):
            logits = self.model(below[get_act_name("resid_pre", start)], start_at_layer=start)
        return logits[torch.arange(len(self.tokens)), self.pos].double().cpu(), cache


def _layer_of(name: str, after: int) -> int:
    """The block of a cached activation's name ("blocks.3.attn.hook_z": 3); `after` for one after the blocks."""
    parts = name.split(".")
    return int(parts[1]) if parts[0] == "blocks" else after


def _keeper(cache: dict):
    def keep(x, hook):
        cache[hook.name] = x.detach()

    return keep


def head_direct(model, z: Tensor, head: tuple[int, int], rows, pos, scale: Tensor | None) -> Tensor:
    """[batch, vocab] head's direct contribution to the logits at the read rows from its z [batch, pos,
    d_head], through the final norm with its scale held at `scale` ([batch, 1])."""
    from headcoop.analysis.engine.norms import frozen_norm

    out = (
        z[rows, pos.to(z.device)].to(model.W_U.device, model.W_U.dtype) @ model.blocks[head[0]].attn.W_O[head[1]]
    ).cpu()
    ln = getattr(model, "ln_final", None)
    out = frozen_norm(ln, out, scale, bias=False) if scale is not None else out
    return (out @ model.W_U.cpu()).double()


def composition(runs: HookedRuns, how: str, players, cross, repl_first, ev: Evidence, metric, answer,
                wrong) -> dict:  # fmt: skip
    """{pair index: (earlier head, later head, through on the metric, through on its continuous reading)}:
    the drop of the metric when only the later head's z takes the value it has with the earlier head
    ablated (`how`: repl_first's kind; every path from the earlier head into the later one's q, k and v; the
    rest of the run as it is). Plain hooks on hook_z (`HookedRuns`): HookedTransformers and TransformerBridges
    alike."""
    out = {}
    by_earlier: dict[int, list] = {}
    for m, i, j in cross:
        e, l = (i, j) if players[i][0] < players[j][0] else (j, i)
        by_earlier.setdefault(e, []).append((m, l))
    clean = runs.clean()[1]
    for e, items in by_earlier.items():
        _, ablated = runs.ablated((how, e), {players[e]: repl_first[players[e]]})
        for m, l in items:
            lay, head = players[l]
            logits, _ = runs.run({players[l]: ablated[get_act_name("z", lay)][:, :, head]}, below=clean)
            through_v = float((ev.v[0] - per_input(metric, logits, answer, wrong)).mean())
            through_s = float((ev.s[0] - signed(metric, logits, answer, wrong)).mean())
            out[m] = (e, l, through_v, through_s)
    return out


def redundant_readers(model, run, frame, th: dict) -> dict[int, tuple[str, float]]:
    """{pair row: (reader, share)} for each redundant pair of heads that later heads read: the later head which,
    held at its clean output while both heads are zeroed, restores the largest share (at least `majority`) of
    the metric the pair's removal loses (the pair's effect runs through that reader's inputs). Plain hooks
    on hook_z; zero ablation."""
    out: dict = {}
    if not bool((frame.mechanism == "redundant").any()):
        return out
    tokens, pos = run.batch.tokens, run.pos
    zeros = lambda p: torch.zeros(*tokens.shape, model.cfg.d_head)  # noqa: E731
    zl = sorted({get_act_name("z", lay) for lay, _ in run.players})
    full = per_input(run.metric, run.logits_clean, run.answer, run.wrong)
    _, clean = run_with(model, tokens, pos, {}, zl)
    for m, row in frame.iterrows():
        i, j = run.names.index(row.head_a), run.names.index(row.head_b)
        layer = run.players[i][0]
        laters = [x for x, p in enumerate(run.players) if p[0] > max(layer, run.players[j][0])]
        if row.mechanism != "redundant" or not laters:
            continue
        removed = {run.players[i]: zeros(i), run.players[j]: zeros(j)}
        logits, _ = run_with(model, tokens, pos, removed)
        lost = float((full - per_input(run.metric, logits, run.answer, run.wrong)).mean())
        if lost <= 0:
            continue
        best = None
        for x in laters:
            lay, head = run.players[x]
            held = {**removed, run.players[x]: clean[get_act_name("z", lay)][:, :, head]}
            kept, _ = run_with(model, tokens, pos, held)
            share = 1 - float((full - per_input(run.metric, kept, run.answer, run.wrong)).mean()) / lost
            if share >= th["majority"] and (best is None or share > best[1]):
                best = (run.names[x], share)
        if best:
            out[m] = best
    return out


def composition_share(comp, ev: Evidence, roles: list[str], kinds: list[str], role: float) -> float | None:
    """The share of the earlier head's total effect (on the reading that decided its role) that runs through
    the later head's inputs, where that total effect is significant and has the role's sign; else None."""
    if comp is None:
        return None
    e, _, through_v, through_s = comp
    kind = kinds[e] or "s"
    mean, lo, hi = ev.total_v_ci if kind == "v" else ev.total_ci
    tau = role * (ev.scale_v if kind == "v" else ev.scale_s) / ev.k
    total = float(mean[e])
    sign = {"supports": 1, "competes": -1}.get(roles[e], 0)
    if sign == 0 or sign * total <= tau or (float(lo[e]) <= 0 <= float(hi[e])):
        return None
    return (through_v if kind == "v" else through_s) / total


def share_or_nan(comp, ev: Evidence, th: dict, held: dict | None = None) -> float:
    roles, kinds = ev.roles(th["role"], held)
    share = composition_share(comp, ev, roles, kinds, th["role"])
    return float("nan") if share is None else share


def backup(runs: HookedRuns, players, names, cross, repl_first, how, answer, sign_wrong, direct, metric, wrong,
           logits_clean, th, tau: float) -> tuple[list, Tensor, dict]:  # fmt: skip
    """Backup rows (module docstring) for every (earlier head i, later head j), compensation [i, j], and the
    metric and its continuous reading per input [batch] with i ablated and j held at its unablated output
    ({(i, j): (values, continuous)})."""
    model, tokens, pos = runs.model, runs.tokens, runs.pos
    k = len(players)
    rows = torch.arange(len(tokens))
    comp = torch.zeros(k, k, dtype=torch.float64)
    out = []
    has_norm = runs.has_norm
    scale_name = "ln_final.hook_scale"
    _, clean = runs.clean()
    scale0 = clean[scale_name][rows, pos].cpu() if has_norm else None  # [batch, 1]
    pairs: dict = {}
    for _, i, j in cross:
        e, l = (i, j) if players[i][0] < players[j][0] else (j, i)
        pairs.setdefault(e, []).append(l)
    ok_clean = per_input("accuracy", logits_clean, answer, None) > 0.5
    held_values = {}
    for e, laters in pairs.items():
        value = {players[e]: repl_first[players[e]]}
        ablated_logits, abl = runs.ablated((how, e), value)
        scale1 = abl[scale_name][rows, pos].cpu() if has_norm else None
        ok_free = per_input("accuracy", ablated_logits, answer, None) > 0.5
        for l in laters:
            lay, head = players[l]
            zname = get_act_name("z", lay)
            before = head_direct(model, clean[zname][:, :, head], players[l], rows, pos, scale0)
            frozen = head_direct(model, abl[zname][:, :, head], players[l], rows, pos, scale0)
            free = head_direct(model, abl[zname][:, :, head], players[l], rows, pos, scale1)
            ld = lambda d: d[rows, answer] - d[rows, sign_wrong]  # noqa: E731
            own = float((ld(frozen) - ld(before)).mean())
            norm = float((ld(free) - ld(frozen)).mean())
            held = dict(value)
            held[players[l]] = clean[zname][:, :, head]
            held_logits, _ = runs.run(held, below=abl, start=lay)  # the ablated run's below the later head's layer
            ok_held = per_input("accuracy", held_logits, answer, None) > 0.5
            held_values[(e, l)] = (
                per_input(metric, held_logits, answer, wrong),
                signed(metric, held_logits, answer, wrong),
            )
            lost = ok_clean & ~ok_held
            restored = float((lost & ok_free).sum()) / max(int(lost.sum()), 1)
            share = own / float(direct[e]) if float(direct[e]) > 1e-9 else float("nan")
            material = float(direct[e]) > tau and own > tau  # a head with no direct effect has nothing to back up
            backs = (float(lost.double().mean()) >= th["min_share"] and restored >= th["majority"]) or \
                (material and share >= th["majority"])  # fmt: skip
            comp[e, l] = own + norm
            out.append(dict(backup=names[l], of=names[e], how=how, own_compensation=own, norm_compensation=norm,
                            logit_share=share, answers_lost=float(lost.double().mean()), answers_restored=restored,
                            backs_up=bool(backs)))  # fmt: skip
    return out, comp, held_values


__all__ = [
    "BACKUP_COLUMNS",
    "HookedRuns",
    "run_with",
    "head_direct",
    "composition",
    "redundant_readers",
    "composition_share",
    "share_or_nan",
    "backup",
]
