"""Which mechanism joins two heads, each word its source's defining property measured directly (issue 48),
kept only where a family of readings agrees.

    result = hc.cooperation(model)               # the task's inputs, accuracy, the default reading family
    result.summary                               # what the heads do, on the sources' terms, first
    result.mechanism, result.agreement           # the model's word and its share of the votes
    result.to_dataframe()                        # one row per pair: word, agreement, what flips it, the axes
    result.same                                  # the same-computation axis, one row per head

The axes (`axes.py`): necessity (the pair's 2 x 2 game on the user's metric), writes and attention (the clean
run: `writes.py`), sign (total and isolated effects), same computation (the heads' per-input pushes, no
ablation), composition and backup (`repair.py`). The words and their order (`words.py`), each quoted from
its source in `WORD_SOURCES`. The readings: each ablation kind ("zero", "mean", "resample"; mean and resample
aligned by the offset from the answer position: `references.py`), its distinct reference draws, and each
threshold at half and twice its default, each other reading of "writes to", and the universal reading of
"... only constructively interfere on the correct token". Each ablation kind carries one equal vote; a reading that cannot see a pair
abstains ("unseen"). A word stands where at least `agree` of the votes give it; else "undetermined", and
`flips_under` names the word and the readings where it holds least.

Context: a pair's 2 x 2 game is read in the full model (every other head as it is) where the pair matters
there on at least `min_share` of inputs; else with every other head ablated ("isolated"), and the row says
so. Where no pair matters in the full model, the summary's first line says it, with the margins.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import cast

import torch

from headcoop.analysis.engine.copies import per_input_metric
from headcoop.analysis.engine.inputs import check_choice, parse_players, require_model, require_task
from headcoop.analysis.games.coalitions import CoalitionGame, all_masks
from headcoop.analysis.games.estimators import HeadGame, top_interactions
from headcoop.analysis.games.interactions import exact_shapley
from headcoop.analysis.mechanisms import tables
from headcoop.analysis.mechanisms.assemble import (
    clean_evidence,
    coalition_blind,
    replaced_inputs,
    replacement_blind,
    zeroed_keys,
    zeroed_mask,
)  # fmt: skip
from headcoop.analysis.mechanisms.edits import edit_responses, plan_edits
from headcoop.analysis.mechanisms.evidence import Evidence, RowMetric, additive_by_construction, per_input, signed
from headcoop.analysis.mechanisms.references import KINDS, blind, draw_references, replacements
from headcoop.analysis.mechanisms.repair import HookedRuns, backup, composition, head_direct
from headcoop.analysis.mechanisms.result import Cooperation
from headcoop.analysis.mechanisms.words import (
    INPUT_CLASSES,
    MECHANISMS,
    ROLES,
    THRESHOLDS,
    WORD_SOURCES,
)  # fmt: skip
from headcoop.analysis.mechanisms.writes import check_outputs, superposed_writes
from headcoop.analysis.vocabulary import METRIC_NAMES, READING_HOWS, MetricName, ReadingHow, head_name
from headcoop.checks import check_float, check_int, check_memory_budget, check_seed
from headcoop.display.progress import expect, with_progress
from headcoop.tasks.base import Batch

ALL_PAIRS_UP_TO = 32
# the default bound on the exact Shapley interaction index, which no word reads: 2^12 coalitions are cheap;
# 2^16 (Count01's 16 heads) cost 3.1 s of a 9.3 s default call on 2 cores, so Count01 passes max_exact=16
INTERACTION_UP_TO = 12


def parse_hows(how) -> tuple[str, ...]:
    """The ablation kinds of `how=` ("family": zero, mean and resample; "mean-aligned" is the old name of
    the aligned "mean", which every mean now is)."""
    if not isinstance(how, (str, list, tuple)):
        raise TypeError(f'how must be "family", one of {list(READING_HOWS)} or a list of them, got {how!r}')
    hows = (how,) if isinstance(how, str) else tuple(how)
    if not hows:
        raise ValueError(f"how= needs at least one ablation of {list(READING_HOWS)}")
    for h in hows:
        check_choice("how", h, READING_HOWS + (("family",) if isinstance(how, str) else ()))
    if hows == ("family",):
        return KINDS
    return tuple(dict.fromkeys("mean" if h == "mean-aligned" else h for h in hows))


def parse_thresholds(thresholds, threshold, min_share, band, agree) -> tuple[dict, tuple[float, float]]:
    """(the thresholds, the band's two factors), each checked."""
    check_float("agree", agree, 0.5, 1.0)
    th = dict(THRESHOLDS)
    if thresholds is not None and not isinstance(thresholds, dict):
        raise TypeError(
            f"thresholds must be a dict of threshold name -> value (names {list(THRESHOLDS)}), got {thresholds!r}"
        )
    for name, value in (thresholds or {}).items():
        if name not in THRESHOLDS:
            raise ValueError(f"unknown threshold {name!r}; valid names are {list(THRESHOLDS)}")
        th[name] = value
    if threshold is not None:
        th["role"] = threshold
    if min_share is not None:
        th["min_share"] = min_share
    for name, value in th.items():
        check_float(f"thresholds[{name!r}]", value, 0.0, 1.0)
    if not isinstance(band, (tuple, list)):
        raise TypeError(f"band must be two positive factors (default (0.5, 2.0)), got {band!r}")
    if len(band) != 2:
        raise ValueError(f"band must be two positive factors (default (0.5, 2.0)), got {band!r}")
    low, high = (check_float(f"band[{i}]", f, 0, low_open=True) for i, f in enumerate(band))
    return th, (low, high)


def pushes_up(direct: torch.Tensor) -> torch.Tensor:
    """[batch, vocab] where a direct write [batch, vocab] is above float noise (1e-6 of its largest |write|)."""
    return direct > 1e-6 * direct.abs().max(-1, keepdim=True).values


def planned_runs(k: int, kinds: int, max_exact: int, top_pairs: int | None) -> int:
    """The modified runs a call makes on k heads (its progress bar's total): the exact interaction index's
    coalitions (every one, above 5 heads and up to max_exact; below, the primary kind's own),
    and per ablation kind (zero always, as the replacements' comparison) the coalitions of `coalition_masks`
    (the draws stacked on the batch axis), and per replacing kind each head's pairs' coalitions with the head
    zeroed (`zeroed_coalitions`, in the same call; with top_pairs, as if every read pair had heads of its own). Above max_exact with top_pairs, shapiq's screening adds its own runs to the total as it announces them."""
    pairs = k * (k - 1) // 2
    exact = 2**k if 5 < k <= max_exact else 0  # up to 5 heads the index reads the primary kind's coalitions
    read = pairs if k <= max_exact or top_pairs is None else min(pairs, top_pairs)
    zeroed = min(k, 2 * read) + 4 * read  # per replacing kind: each head's pairs' coalitions, it zeroed
    return exact + kinds * (2 + 2 * k + 2 * read) + (kinds - 1) * zeroed


def coalition_masks(k: int, pairs: list) -> torch.Tensor:
    """[mask, k] the coalitions: all, none, (all but i, i alone) per head, (all but i and j, i and j alone)
    per pair."""
    full, empty = torch.ones(k, dtype=torch.bool), torch.zeros(k, dtype=torch.bool)
    masks = [full, empty]
    for i in range(k):
        at = torch.tensor([i])
        masks += [full.clone().index_fill_(0, at, False), empty.clone().index_fill_(0, at, True)]
    for i, j in pairs:
        both = torch.tensor([i, j])
        masks += [full.clone().index_fill_(0, both, False), empty.clone().index_fill_(0, both, True)]
    return torch.stack(masks)


def ranked_pairs(model, batch, players, metric, how, refs, seed, max_exact, top_pairs, screen_budget):
    """Above max_exact heads: (Shapley interaction index [k, k] estimated for the ranked pairs (NaN elsewhere),
    the pairs read, a note): shapiq's ranking of the strongest pairs with top_pairs (the primary ablation's
    first reference), else every pair with the index not computed."""
    k = len(players)
    pairs = list(itertools.combinations(range(k), 2))
    if top_pairs is None:
        return (
            torch.full((k, k), float("nan")),
            pairs,
            f"; Shapley interaction index not computed ({k} heads > max_exact={max_exact})",
        )
    screen = screen_budget if screen_budget is not None else max(2000, 20 * k)
    ranking = CoalitionGame(model, players, tokens=batch, metric=metric, how="zero" if how == "zero" else "mean",
                            seed=seed, reference=None if how == "zero" else refs[0])  # fmt: skip
    inter, _, pairs = top_interactions(HeadGame(ranking), top_pairs, screen, 64, seed)
    return inter, sorted(pairs), (f"; per-input evidence for the top {len(pairs)} of {k * (k - 1) // 2:,} pairs by "
                                  f"|interaction| only (shapiq SVARM-IQ at {screen:,} coalitions, then 64 draws per pair)")  # fmt: skip


def interaction_index(model, run, kind: dict, metric) -> torch.Tensor:
    """[k, k] the exact Shapley interaction index of every pair (no rule reads it) under the primary ablation's
    first draw, the replacement the words' first reading uses: from that reading's own coalitions where they
    hold all 2^k (up to 5 heads: no run of its own), else one game over every coalition with the same
    replacement values. metric: the mean over inputs (a name, or the user's callable); higher is better."""
    k = len(run.players)
    subsets = all_masks(k)
    at = {tuple(m.tolist()): c for c, m in enumerate(run.masks)}
    if all(tuple(s.tolist()) in at for s in subsets):
        v = kind["draws"][0][0].v  # [mask, batch]: the metric per input, higher is better (loss negated)
        values = torch.stack([v[at[tuple(s.tolist())]].double().mean() for s in subsets])
    else:
        game = CoalitionGame(model, run.players, tokens=run.batch, metric=metric, replacements=kind["first"],
                             how="zero" if kind["how"] == "zero" else "mean")  # fmt: skip
        values = game.values(subsets)
        values = -values if metric == "loss" else values
    return exact_shapley(values, k)[1]


def unseen_heads(model, run, values: dict, tol: float = 0.05) -> list[str | None]:
    """Per player, why a mean or resample replacement cannot show it (None where it can): its replacement is
    what it writes anyway (`blind`), or, where nothing reads the head but the logits (the last layer of an
    attention-only model without norms), the head writes nothing the metric reads (logit_diff: the answer
    minus the wrong token; otherwise the completions' differences) on any input, within `tol` of the largest
    such write of any head, while its replacement does: the effect measured is the replacement's."""
    same = blind(run.z, values, run.players, run.rows, run.pos, tol)
    out = ["writes the same whatever the input: this ablation leaves it as it is" if b else None for b in same]
    if run.no_dla is not None:
        return out

    def read(write):  # [batch, vocab] -> [batch, ...]: what of a write the metric can tell apart
        if run.metric == "logit_diff" and run.wrong is not None:
            return (write[run.rows, run.answer] - write[run.rows, run.wrong])[:, None]
        return write - write.mean(-1, keepdim=True)

    clean = [read(run.heads_dla[:, i]).abs().amax() for i in range(run.k)]
    scale = float(torch.stack(clean).max().clamp(min=1e-12))
    for i, p in enumerate(run.players):
        if out[i] is None and additive_by_construction(model, p, p) and float(clean[i]) <= tol * scale:
            repl = read(head_direct(model, values[p], p, run.rows, run.pos.cpu(), None)).abs().amax()
            if float(repl) > tol * scale:
                out[i] = ("writes nothing the metric reads, and its replacement does: this ablation measures "
                          "the replacement, not the head")  # fmt: skip
    return out


def zeroed_coalitions(k: int, pairs: list, how: str) -> tuple[list[tuple], torch.Tensor, torch.Tensor]:
    """(keys (head i, `zeroed_keys` key), masks [key, k], zeroed [key, k]) of the coalitions in which head i is
    zeroed and every other absent head takes this ablation's replacement: what the replacement of head i is
    compared with inside its pairs' 2 x 2 games (`coalition_blind`); none under zero ablation."""
    keys = [] if how == "zero" else [(i, key) for i in range(k) for key in zeroed_keys(pairs, i)]
    masks = torch.zeros(len(keys), k, dtype=torch.bool)
    zeroed = torch.zeros(len(keys), k, dtype=torch.bool)
    for c, (i, key) in enumerate(keys):
        masks[c], zeroed[c, i] = zeroed_mask(k, i, key), True
    return keys, masks, zeroed


def zeroed_runs(run, keys: list[tuple], logits: torch.Tensor) -> dict:
    """{(head i, key): metric [draw, batch]} of `zeroed_coalitions`' keys, from their logits [key, draw, batch,
    vocab] (run in the same call as the game's coalitions, sharing their prefixes)."""
    out = {}
    for c, key in enumerate(keys):
        out[key] = per_input(run.metric, logits[c].double(), run.answer, run.wrong)  # [draw, batch]
    return out


def ablation_readings(model, run, hows, task, reference, draws, seed, th) -> dict:
    """Per ablation kind, every distinct draw's evidence, which heads it cannot see, the answers resample
    injects, the logits of every coalition on the first draw, and composition and backup on that draw."""
    out = {}
    drawn = draw_references(task, reference, draws, seed) if set(hows) - {"zero"} else None
    runs: dict = {}  # each reference batch run once, shared by mean and resample
    zero_ev = None  # zero ablation's evidence: what a replacement is compared with (`replacement_blind`)
    # composition's and backup's runs, shared, from the clean run's cache
    hooked = HookedRuns(model, run.batch.tokens, run.pos, run.players, (run.logits_clean, run.clean_cache))
    for h in ("zero",) + tuple(x for x in hows if x != "zero"):  # zero first: the others are compared with it
        refs: list = [None] if h == "zero" else cast(list, drawn)  # drawn whenever an ablation other than zero is read
        values, answers = replacements(model, run.players, run.batch, h, refs, seed, runs)
        stacked = {p: torch.cat([v[p] for v in values]) for p in run.players}
        inputs = Batch.cat([run.batch] * len(values)) if len(values) > 1 else run.batch
        game = CoalitionGame(model, run.players, tokens=inputs, metric="logit_diff", how="zero" if h == "zero" else "mean",
                             reference=None if h == "zero" else refs[0], seed=seed, replacements=stacked)  # fmt: skip
        # one call: the coalitions with one head zeroed share the game's prefixes
        keys, zmasks, zflags = zeroed_coalitions(run.k, run.pairs, h)
        every = game.row_logits(torch.cat([run.masks, zmasks]), zeroed=torch.cat([torch.zeros_like(run.masks), zflags]))
        every = every.cpu().reshape(len(run.masks) + len(keys), len(values), len(run.batch), -1)
        logits = every[: len(run.masks)]  # as computed (float32 on most models): each draw's .double() is exact
        draws_ev = []
        for d in range(len(values)):
            lg = logits[:, d]
            exact = lg.double()
            ev = Evidence(per_input(run.metric, exact, run.answer, run.wrong), signed(run.metric, exact, run.answer, run.wrong),
                          per_input_metric("logit_diff", exact, run.answer, run.fixed_wrong), run.k, run.pairs, run.binary)  # fmt: skip
            unseen = [None] * run.k if h == "zero" else unseen_heads(model, run, values[d])
            injected = (
                None
                if h != "resample"
                else (
                    answers[d],
                    {
                        p: pushes_up(head_direct(model, values[d][p], p, run.rows, run.pos.cpu(), None))
                        for p in run.players
                    },
                )
            )
            draws_ev.append((ev, unseen, injected, lg))
        blind_pairs = None
        if h != "zero":  # judged over every draw of the kind: one draw's replacement is a sample of it
            evs = [x[0] for x in draws_ev]
            pooled = replacement_blind(run, zero_ev, evs, th, h)
            draws_ev = [(ev, [u or b for u, b in zip(unseen, pooled)], inj, lg) for ev, unseen, inj, lg in draws_ev]
            zeroed = zeroed_runs(run, keys, every[len(run.masks) :])
            blind_pairs = coalition_blind(run, zero_ev, evs, zeroed, th, h)
            for d, ev in enumerate(evs):
                ev.replaced_inputs = replaced_inputs(run, zero_ev, ev, zeroed, d, th)
        if h == "zero":
            zero_ev = draws_ev[0][0]
            if "zero" not in hows:  # run only to compare the replacements with
                continue
        first = values[0]
        comp = composition(hooked, h, run.players, run.cross, first, draws_ev[0][0], run.metric, run.answer, run.wrong)
        repair = None
        if run.no_dla is None and run.cross:
            tau = th["role"] * draws_ev[0][0].scale_s / run.k
            repair = backup(hooked, run.players, run.names, run.cross, first, h, run.answer,
                            run.sign_wrong, run.direct, run.metric, run.wrong, run.logits_clean, th, tau)  # fmt: skip
        out[h] = dict(draws=draws_ev, composition=comp, backup=repair, method=game.method, n_refs=len(refs),
                      blind_pairs=blind_pairs, first=first, how=h)  # fmt: skip
    return out


@with_progress("hc.cooperation", cheaper="fewer heads=, draws=1 or how='mean' is cheaper")
@torch.no_grad()
def cooperation(
    model, task=None, heads=None, how: ReadingHow | tuple | list | str = "family", metric: MetricName | Callable = "accuracy",
    inputs=None, reference=None, seed: int = 0, threshold: float | None = None, min_share: float | None = None,
    n: int = 512, max_exact: int = INTERACTION_UP_TO, top_pairs: int | None = None, screen_budget: int | None = None,
    draws: int = 4, thresholds: dict | None = None, band: tuple[float, float] = (0.5, 2.0), agree: float = 0.9,
    outputs=None, memory_budget_mb: float = 256, progress: bool | None = None,
) -> Cooperation:  # fmt: skip
    """The word of every pair of heads, the role of every head and the same-computation axis over a family
    of readings (module docstring).

    task:      the task whose inputs are used (default the model's); inputs: a Batch (answers known),
               default task.mechanism_inputs(n, seed).
    heads:     the players, in any form `hc.ablate` takes; default every head.
    how:       "family" (zero, mean and resample, mean and resample aligned by role), one of them, or a list.
    metric:    "accuracy" (default; a tie is no answer), "logit_diff", "prob", "loss", or a callable giving one
               value per input (logits [batch, pos, vocab] -> [batch], higher is better: the words are read
               input by input, so not the mean other analyses take), reading the answer positions only
               (`evidence.RowMetric`: checked on the clean run).
    reference: the ablation reference (default task samples of 512); draws: reference draws per ablation
               (identical draws count once).
    thresholds: overrides of `THRESHOLDS` (threshold= and min_share= set "role" and "min_share"); band: the
               factors each threshold is read at besides 1; agree: the share of votes a word needs.
    outputs:   the completions the writes are read over (token ids; default the task's, else every answer).
    memory_budget_mb: the memory the function axis's edited runs may add to the model's (their chunks').
    progress:  a tqdm bar over the call's runs, shown after 2 s (default: `hc.set_progress`).
    max_exact: the Shapley interaction index of each pair (`interaction`, no rule uses it) is computed
               exactly up to this many heads (default 12: 2^12 coalitions; at most hc.interactions'
               MAX_EXACT, 16); above, NaN, or shapiq's ranking with top_pairs / screen_budget.
    """
    require_model(model, "cooperation")
    if isinstance(metric, str) or not callable(metric):
        if not isinstance(metric, str):
            raise TypeError(f"metric must be a name {list(METRIC_NAMES)} or a callable, got {type(metric).__name__}")
        check_choice("metric", metric, METRIC_NAMES)
    hows = parse_hows(how)
    check_int("n", n, 1)
    check_int("max_exact", max_exact, 2, 24)  # hc.interactions names its own bound (MAX_EXACT) above it
    check_int("draws", draws, 1, 64)
    for name, value, low in (("top_pairs", top_pairs, 1), ("screen_budget", screen_budget, 2)):
        if value is not None:
            check_int(name, value, low)
    check_seed(seed)
    memory_budget_mb = check_memory_budget(memory_budget_mb)
    th, band = parse_thresholds(thresholds, threshold, min_share, band, agree)
    if outputs is not None:  # checked before any run: the completions the writes are read over
        outputs = check_outputs(outputs, model.cfg.d_vocab_out)
    if task is None and (inputs is None or (reference is None and hows != ("zero",))):
        task = require_task(model, "hc.cooperation's inputs" if inputs is None else "the ablation reference")
    batch = inputs if inputs is not None else task.mechanism_inputs(n, seed=seed)
    if not isinstance(batch, Batch):
        raise TypeError(f"inputs= must be a Batch (answers known, e.g. task.sample(n) or Batch.from_answers), "
                        f"got {type(batch).__name__}")  # fmt: skip
    players = parse_players(model, heads, "cooperation")
    k = len(players)
    if k > ALL_PAIRS_UP_TO and top_pairs is None:
        raise ValueError(f"cooperation reads every pair of up to {ALL_PAIRS_UP_TO} heads; {k} given: pass heads= "
                         f"(the heads to compare) or top_pairs= (the strongest pairs by interaction)")  # fmt: skip
    names = tuple(head_name(*p) for p in players)
    owner = task if task is not None else getattr(model, "task", None)
    features = owner.features() if owner is not None and hasattr(owner, "features") else None
    plan = plan_edits(model, batch, players, features, seed=seed)  # the function axis's edits and their cost
    expect(
        planned_runs(k, len(hows) + ("zero" not in hows), max_exact, top_pairs) + math.ceil(plan["forwards"])
    )  # the bar's total, known before any run: it never grows (the edits counted in forward passes of the batch)
    primary = "mean" if "mean" in hows else hows[0]
    refs = None if primary == "zero" else draw_references(task, reference, 1, seed)
    reading = metric if isinstance(metric, str) else \
        RowMetric(metric, batch.answer_pos, batch.tokens.shape[1]).checked(model(batch.tokens))  # fmt: skip
    mean = metric if isinstance(metric, str) else (lambda logits: torch.as_tensor(metric(logits)).double().mean())
    pairs, pairs_note = list(itertools.combinations(range(k), 2)), ""
    if k > max_exact:  # the index estimated (shapiq) for the strongest pairs, which are the ones read
        inter, pairs, pairs_note = ranked_pairs(model, batch, players, mean, primary, refs, seed, max_exact, top_pairs,
                                                screen_budget)  # fmt: skip
        if metric == "loss":  # the words read the loss negated (higher is better): the index takes the same sign
            inter = -inter
    run = clean_evidence(model, task, batch, players, names, pairs, reading, outputs, coalition_masks(k, pairs))
    readings = ablation_readings(model, run, hows, task, reference, draws, seed, th)
    if k <= max_exact:
        inter = interaction_index(model, run, readings[primary], mean)
    edits = edit_responses(model, batch, players, run.outs, features, memory_budget_mb=memory_budget_mb, seed=seed,
                           plan=plan)  # fmt: skip
    edits["features"] = features
    return tables.result(model, run, readings, hows, primary, th, band, agree, inter, pairs_note, edits)


__all__ = ["cooperation", "Cooperation", "MECHANISMS", "ROLES", "INPUT_CLASSES", "THRESHOLDS", "WORD_SOURCES",
           "READING_HOWS", "superposed_writes", "ALL_PAIRS_UP_TO"]  # fmt: skip
