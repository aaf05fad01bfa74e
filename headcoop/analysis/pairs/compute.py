"""`hc.pair_map`: every pair of heads' interaction, exact where the budget allows, else screened and bounded.

For heads i, j and the metric v (a mean over the inputs, higher is better) with the ablation `how`:

    effect_i  = v(all but i) - v(all)                 (removing i alone)
    pair      = v(all but i, j) - v(all)              (removing both)
    interaction I_ij = pair - effect_i - effect_j     (both removed minus each removed alone)
    relative  = I_ij / max(|pair|, |effect_i|, |effect_j|)   (-1: the pair's joint effect is all interaction)

I_ij < 0: removing both costs more than the two removals apart (backups: either head covers the other);
I_ij > 0: it costs less (each needs the other: a conjunction, or one head's effect runs through the other).
The words themselves are `hc.cooperation`'s, read for the pairs that matter (`named`).

Paths:
- exact: every coalition "all but i" and "all but i, j" on the coalition game (`CoalitionGame`): on the layered
  path, the pairs of one head i run as one block, so the run with i removed is computed once per block up to
  the layer of the other head (shared prefixes), and each pair costs the layers from its later head on.
- screen (when the exact map's predicted time exceeds `budget_s`, or method="screen"): a second-order
  attribution. For the clean run and each run with one head i removed, one forward and backward pass give
  every head j's attribution a_j(-i) = sum over inputs and positions of (replacement_j - z_j) . d v / d z_j;
  the estimate is I^_ij = (a_j(-i) - a_j + a_i(-j) - a_i) / 2 (first order in j's removal, exact in i's).
  A non-differentiable metric (accuracy) is screened on the logit difference, and the result says so. The
  `verify` pairs of largest |I^| and `sample` pairs drawn from the rest are then computed exactly; among the
  sampled, those whose exact |I| exceeds the smallest exact |I| of the verified top bound the pairs the
  screen missed (`engine.verification.miss_bound`, a 95% Clopper-Pearson interval over the rest).
"""

from __future__ import annotations

import itertools
import math
import time
import warnings
from collections.abc import Callable
from typing import Any, cast

import pandas as pd
import torch
from torch import Tensor
from transformer_lens.utilities import get_act_name

from headcoop.analysis.engine.copies import Score
from headcoop.analysis.engine.inputs import check_choice, parse_players, require_model, require_task
from headcoop.analysis.engine.verification import miss_bound, pick
from headcoop.analysis.games.coalitions import CoalitionGame, layered_passes
from headcoop.analysis.pairs.result import PairMap, relative
from headcoop.analysis.vocabulary import ABLATION_HOWS, PAIR_METHODS, AblationHow, PairMethod, head_name
from headcoop.checks import check_finite, check_float, check_int, check_seed
from headcoop.display.progress import advance, expect, set_total
from headcoop.display.progress import task as progress_task
from headcoop.tasks.base import Batch
from headcoop.threads import fitted_threads

BUDGET_S = 3600.0  # the default time budget of the exact map: one hour on the machine it runs on
THRESHOLD = 0.1  # a pair interacts when |I| is at least this share of the largest single head's |effect|
NAMED = 4  # pairs named by hc.cooperation's reading family (the strongest above the threshold); each is one
# 2-head hc.cooperation: about 8 minutes at GPT-2-small size on 2 busy cores (docs/benchmarks.md)
VERIFY, SAMPLE = 200, 200  # the screen's exactly computed top, and its random sample of the rest


def _inputs(model, inputs, answer, wrong, n: int, seed: int) -> Batch:
    """The Batch the map reads: `inputs` as given (a Batch, or tokens with `answer` / `wrong`), else the
    model's task's mechanism inputs."""
    if isinstance(inputs, Batch):
        if answer is not None or wrong is not None:
            raise ValueError("answer= and wrong= go with tokens; a Batch carries its own answers (leave them out, "
                             "or pass the tokens with answer= and wrong=)")  # fmt: skip
        batch = inputs
    elif inputs is not None:
        if not isinstance(inputs, (Tensor, list, tuple)) or isinstance(inputs, str):
            raise TypeError(f"pair_map's inputs= must be a Batch or tokens [batch, pos] (a tensor of token ids) with "
                            f"answer= and wrong=, got {type(inputs).__name__}; text: tokenize it first "
                            f"(hc.Batch.from_prompts)")  # fmt: skip
        if answer is None or wrong is None:
            raise ValueError("pair_map needs answer= and wrong= with tokens (or a Batch: hc.Batch.from_answers)")
        batch = Batch.from_answers(torch.as_tensor(inputs), answer, wrong)
    else:
        batch = require_task(model, "pair_map's inputs").mechanism_inputs(n, seed=seed)
    if len(batch.tokens) == 0:
        raise ValueError("pair_map's inputs are empty (0 inputs): the map needs at least one")
    return batch


def _masks(k: int, pairs: list[tuple[int, int]]) -> Tensor:
    masks = torch.ones(len(pairs), k, dtype=torch.bool)
    for row, (i, j) in enumerate(pairs):
        masks[row, i] = masks[row, j] = False
    return masks


def _singles(k: int) -> Tensor:
    """[1 + k, k]: every player active, then each player removed alone."""
    masks = torch.ones(1 + k, k, dtype=torch.bool)
    masks[torch.arange(k) + 1, torch.arange(k)] = False
    return masks


def _blocks(pairs: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """The pairs grouped by their first head (in player order), the layered path's shared-prefix blocks."""
    return [list(group) for _, group in itertools.groupby(sorted(pairs), key=lambda p: p[0])]


def _passes(game: CoalitionGame, blocks: list[Tensor]) -> float:
    """Forward-pass equivalents (of the batch) of coalition masks run block by block (`layered_passes` of
    each); one pass per coalition off the layered path."""
    if not game.layered or game.linear:
        return float(sum(len(block) for block in blocks))
    return sum(layered_passes(game.model, game.players, block) for block in blocks)


def _pair_passes(game: CoalitionGame, pairs: list[tuple[int, int]]) -> float:
    k = len(game.players)
    return _passes(game, [_masks(k, block) for block in _blocks(pairs)])


def exact_passes(game: CoalitionGame) -> float:
    """Forward-pass equivalents of the exact map of `game`'s players: the singles and every pair, block by
    block (the report's predictor; `pair_map` times the singles and scales this)."""
    k = len(game.players)
    return _passes(game, [_singles(k)]) + _pair_passes(game, list(itertools.combinations(range(k), 2)))


def screen_passes(game: CoalitionGame, verify: int = VERIFY, sample: int = SAMPLE) -> float:
    """Forward-pass equivalents of the screened map: the singles, k + 1 forward and backward passes (3 passes
    each) and the verified and sampled pairs at the exact map's mean cost per pair."""
    k = len(game.players)
    pairs = k * (k - 1) // 2
    per_pair = _pair_passes(game, list(itertools.combinations(range(k), 2))) / max(pairs, 1)
    return _passes(game, [_singles(k)]) + 3 * (k + 1) + per_pair * min(pairs, verify + sample)


def _exact(game: CoalitionGame, pairs: list[tuple[int, int]]) -> Tensor:
    """v(all but i, j) for each pair, block by block (one block: the pairs of one first head; the engine
    advances the open progress bar by each block's coalitions)."""
    k = len(game.players)
    out: dict = {}
    for block in _blocks(pairs):
        values = game.values(_masks(k, block)).cpu()
        out.update(zip(block, values.tolist()))
    return torch.tensor([out[p] for p in pairs], dtype=torch.float64)


def _screen_score(game: CoalitionGame) -> tuple[Score, str]:
    """A differentiable score for the screen: the game's own, or the logit difference for accuracy."""
    score = game.score
    if score.named is not None and score.named[0] == "accuracy":
        _, answer, wrong, pos = score.named
        if wrong is None:
            raise ValueError("the screen of an accuracy map reads the logit difference, which needs wrong=")
        return Score.of_name("logit_diff", answer, wrong, pos), "logit_diff (accuracy has no gradient)"
    return score, ""


def _attributions(game: CoalitionGame, score: Score, removed: int | None) -> Tensor:
    """a_j for every player j [k] with player `removed` replaced (None: the clean run): one forward and one
    backward pass, the replacement taken from the game (`module docstring`)."""
    model, players = game.model, game.players
    layers = sorted({lay for lay, _ in players})
    kept: dict[int, Tensor] = {}

    def hook_for(layer: int) -> Callable:
        def hook(z: Tensor, hook=None) -> Tensor:
            if removed is not None and players[removed][0] == layer:
                z = z.clone()
                z[:, :, players[removed][1]] = game.replacement[players[removed]].to(z)
            z.retain_grad()
            kept[layer] = z
            return z

        return hook

    with torch.enable_grad():
        with model.hooks(fwd_hooks=[(get_act_name("z", lay), hook_for(lay)) for lay in layers]):
            logits = model(game.tokens)
        value = score.one(logits)
        value.backward()
    out = torch.zeros(len(players), dtype=torch.float64)
    for idx, (lay, head) in enumerate(players):
        z, grad = kept[lay][:, :, head].detach(), cast(Tensor, kept[lay].grad)[:, :, head]  # after backward
        change = game.replacement[(lay, head)].to(z) - z
        out[idx] = 0.0 if idx == removed else float((change * grad).double().sum())
    model.zero_grad(set_to_none=True)
    return out


def _screen(game: CoalitionGame, score: Score) -> Tensor:
    """I^ [k, k]: the second-order attribution estimate of every pair's interaction (module docstring)."""
    k = len(game.players)
    clean = _attributions(game, score, None)
    advance(done=1)
    rows = torch.zeros(k, k, dtype=torch.float64)
    for i in range(k):
        rows[i] = _attributions(game, score, i) - clean
        advance(done=1)
    estimate = (rows + rows.T) / 2
    estimate.fill_diagonal_(0.0)
    return estimate


def pair_map(
    model, inputs=None, metric: str | Callable = "logit_diff", how: AblationHow = "mean", reference=None, *,
    heads=None, answer=None, wrong=None, n: int = 64, seed: int = 0, method: PairMethod = "auto",
    budget_s: float = BUDGET_S, verify: int = VERIFY, sample: int = SAMPLE, threshold: float = THRESHOLD,
    named: int = NAMED, memory_budget_mb: float = 256, progress: bool | None = None,
) -> PairMap:  # fmt: skip
    """Every pair of heads' interaction (module docstring), the pairs that matter named by `hc.cooperation`.

    inputs:    a Batch (answers known), or tokens [batch, pos] with answer= and wrong= [batch]; default the
               model's task's mechanism inputs (n of them, seeded).
    metric:    "logit_diff" (default), "accuracy", "prob", "loss" or a callable (logits -> scalar), higher is
               better; how: "zero", "mean" or "resample" (reference: the ablation's reference inputs,
               default the task's samples, or the inputs themselves for a model with no task).
    heads:     the players (any form `hc.ablate` takes; default every head).
    method:    "auto" (exact when the predicted time is within budget_s, else the screen; budget_s=0: no
               limit), "exact", "screen".
    verify, sample: the screen's exact top and random sample of the rest (the miss bound).
    threshold: a pair interacts when |I| >= threshold x the largest single head's |effect| (0: every pair
               whose |I| > 0).
    named:     how many of the strongest interacting pairs `hc.cooperation` names (0: none); each costs one
               2-head hc.cooperation (about 8 minutes at GPT-2-small size on 2 cores), read on the map's
               metric where hc.cooperation has it by name, else on accuracy (a callable gives one number per
               batch; the words read each input), as the named table's `read_on` says. Should naming fail,
               the map is returned unnamed with a warning (never lost).
    progress:  a tqdm bar whose total (coalitions, or screen runs and coalitions) is known before any run.
    Runs with torch's threads fitted to the idle cores unless the count is the user's (`headcoop.threads`).
    """
    with fitted_threads():
        return _pair_map(model, inputs, metric, how, reference, heads, answer, wrong, n, seed, method, budget_s,
                         verify, sample, threshold, named, memory_budget_mb, progress)  # fmt: skip


def _pair_map(model, inputs, metric, how, reference, heads, answer, wrong, n, seed, method, budget_s, verify, sample,
              threshold, named, memory_budget_mb, progress) -> PairMap:  # fmt: skip
    require_model(model, "pair_map")
    check_finite(model, "hc.pair_map")
    check_choice("how", how, ABLATION_HOWS)
    check_choice("method", method, PAIR_METHODS)
    budget_s = check_float("budget_s", budget_s, 0.0) or math.inf  # 0: no limit, as everywhere in the API
    check_float("threshold", threshold, 0.0)
    for name, value in (("verify", verify), ("sample", sample), ("named", named), ("n", n)):
        check_int(name, value, 0)
    check_seed(seed)
    batch = _inputs(model, inputs, answer, wrong, n, seed)
    players = parse_players(model, heads, "pair_map")
    k = len(players)
    if reference is None and getattr(model, "task", None) is None and (how != "zero" or named):
        reference = batch  # stated in the result's ablation (the naming's mean and resample read it too)
    start = time.perf_counter()
    game = CoalitionGame(model, players, tokens=batch, metric=metric, how=how,
                         reference=None if how == "zero" else reference, seed=seed,
                         memory_budget_mb=memory_budget_mb)  # fmt: skip
    pairs = list(itertools.combinations(range(k), 2))
    with progress_task("hc.pair_map", progress, unit="run", expected=1 + k + len(pairs)):
        expect(1 + k + len(pairs))  # the exact map's runs; the screen lowers it to its own once chosen
        singles = _singles(k)
        tick = time.perf_counter()
        v = game.values(singles).cpu()
        calibration_s = time.perf_counter() - tick
        singles_passes, pairs_passes = _passes(game, [singles]), _pair_passes(game, pairs)
        predicted_s = pairs_passes * calibration_s / max(singles_passes, 1e-9)
        v_full, effect = float(v[0]), v[1:] - v[0]
        exact = method == "exact" or (method == "auto" and predicted_s <= budget_s)
        interaction = torch.full((k, k), float("nan"), dtype=torch.float64)
        pair_effect = torch.full((k, k), float("nan"), dtype=torch.float64)
        estimate, missed, screened_on = None, {}, ""
        top: Any = []  # the verified pairs' indices: a tensor once the screen picks them
        drawn: Any = []
        if exact:
            chosen = pairs
        else:
            score, screened_on = _screen_score(game)
            verify_n = min(verify, len(pairs))
            set_total(1 + k + (k + 1) + verify_n + min(sample, len(pairs) - verify_n))
            estimate = _screen(game, score)
            flat = torch.tensor([abs(float(estimate[i, j])) for i, j in pairs])
            top, drawn, rest = pick(flat, verify_n, sample, seed)
            chosen = [pairs[int(t)] for t in top] + [pairs[int(t)] for t in drawn]
        values = _exact(game, chosen)
        for (i, j), value in zip(chosen, values.tolist()):
            pair_effect[i, j] = pair_effect[j, i] = value - v_full
            interaction[i, j] = interaction[j, i] = interaction_of(v_full, float(v[1 + i]), float(v[1 + j]), value)
        if not exact:
            exact_of = torch.tensor([interaction[i, j] for i, j in chosen])
            missed = miss_bound(exact_of[: len(top)], exact_of[len(top) :], rest)
    seconds = time.perf_counter() - start
    screen_runs = 0 if exact else k + 1  # each a forward and a backward pass: 3 forward-pass equivalents
    chosen_passes = pairs_passes if exact else _pair_passes(game, chosen)
    cost = dict(coalitions=1 + k + len(chosen), pairs=len(pairs), passes=singles_passes + chosen_passes
                + 3 * screen_runs, predicted_exact_s=predicted_s, seconds=seconds, screen_runs=screen_runs)  # fmt: skip
    result = PairMap(
        heads=tuple(head_name(*p) for p in players), interaction=interaction, pair_effect=pair_effect,
        effect=effect.double(), v_full=v_full, estimate=estimate, exact=exact, missed=missed,
        threshold_share=threshold, metric=metric if isinstance(metric, str) else callable_name(metric),
        how=how, ablation=game.ablation, method=_describe(game, exact, screened_on, len(top), len(drawn)),
        cost=cost, named=pd.DataFrame(),
    )  # fmt: skip
    if named:  # a failure here keeps the computed map: returned unnamed, with how to name it
        try:
            result = result.with_words(model, batch, reference, named, seed)
        except Exception as error:  # noqa: BLE001 - the map is the call's work; the naming is its extra
            warnings.warn(f"hc.pair_map: the map is computed, but naming its pairs failed ({type(error).__name__}: "
                          f"{error}); the map is returned unnamed. Name them with "
                          f"result.with_words(model, inputs, reference, named={named})", stacklevel=3)  # fmt: skip
    return result


def callable_name(metric: Callable) -> str:
    """How a user's metric is recorded: never a built-in's name ("loss" is ours; a user's `loss` is not)."""
    return f"callable {getattr(metric, '__name__', type(metric).__name__)}"


def _describe(game: CoalitionGame, exact: bool, screened_on: str, verify: int, sample: int) -> str:
    path = game.method
    if exact:
        return f"exact: every pair's coalition computed ({path})"
    on = f" on {screened_on}" if screened_on else ""
    return (f"screened: second-order attribution{on} ranks every pair (an estimate), its top {verify} and "
            f"{sample} pairs drawn from the rest computed exactly ({path})")  # fmt: skip


def interaction_of(v_full: float, v_i: float, v_j: float, v_ij: float) -> float:
    """I_ij = v(all but i, j) - v(all but i) - v(all but j) + v(all): the reference formula (module docstring)."""
    return v_ij - v_i - v_j + v_full


__all__ = [
    "pair_map",
    "interaction_of",
    "relative",
    "exact_passes",
    "screen_passes",
    "PAIR_METHODS",
    "BUDGET_S",
    "THRESHOLD",
]
