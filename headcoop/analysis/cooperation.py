"""Which mechanism joins two heads: redundant, division of labour, superposition, competition, independent,
or undetermined, from per-input evidence (issue 23).

    result = hc.cooperation(model)               # the task's inputs, accuracy, mean ablation
    result.mechanism, result.roles               # the model's verdict; "supports" / "competes" / "inactive"
    result.to_dataframe()                        # one row per pair: mechanism and the evidence behind it

Averages of the coalition game cannot separate the mechanisms (a division of labour and superposition both
give a zero or positive interaction index); which inputs each head answers can. For every pair (i, j) and
every input b the instrument reads the 2 x 2 game f11, f10, f01, f00 (the metric with both, only i, only j,
neither of the two active) in two contexts: "full" (every other head as in the model) and "isolated"
(every other player ablated), from `CoalitionGame.row_logits`, the same engine as `hc.interactions`.

Per input, in the binary reading (metric "accuracy": f is 0 or 1; the answer's logit strictly above every
other, so a tie is no answer), the pair *matters* when f11 = 1 and
f00 = 0, and then the input is OR (f10 = f01 = 1), AND (f10 = f01 = 0), i-only or j-only. In a continuous
reading (logit_diff, prob, loss as -loss), it matters when D = f11 - f00 > tau_m = threshold x mean |v(all) - v(none)| x 2 / k, and with a_i =
(f10 - f00) / D and a_j likewise: OR when both >= 0.8, AND when both <= 0.2, i-only when a_i >= 0.8 and
a_j <= 0.2, shared when both lie in (0.2, 0.8) and |a_i + a_j - 1| <= 0.2 (the effects add).

Evidence per head, on the logit difference ld (answer minus `wrong`, else minus the best other token):
its direct effect (mean DLA on ld, `hc.dla`, the final norm's scale frozen), total effect (ld with the
head minus ld without it, others as in the model), isolated effect (ld of the head alone minus ld of no
player). Role, with tau = threshold x mean |ld(all) - ld(none)| / k (k players: a tenth of a head's fair
share by default): the sign of the first of direct, total,
isolated effect whose mean exceeds tau in size ("supports" +, "competes" -); "inactive" if none does.

Pair verdict, in this order (every share is of the inputs where the pair matters, in the full context, or
in the isolated one when the pair matters on fewer than `min_share` of the inputs in the full one):
1. "competition": one head competes and the other supports;
2. "undetermined" when a head is inactive, when the metric is additive over the two heads by construction
   (logit_diff, both heads in the last layer of an attention-only model without norms: every interaction
   is 0 whatever the weights), or when the pair matters on fewer than `min_share` of the inputs in both
   contexts;
3. "redundant": OR on at least half;
4. "superposition": AND on at least half, and on at least half of those both heads write to several
   outputs and share only the answer (superposed writes: each head's DLA minus its mean over the vocabulary
   is at least half of that on the answer (> 0) on >= 2 tokens, and the two sets meet only at the answer);
   "independent": AND on at least half without superposed writes, the logit difference additive there
   (|ld11 - ld10 - ld01 + ld00| <= 0.2 |ld11 - ld00|) on at least half;
5. "division": i-only and j-only each on at least 20%, together at least half;
6. "independent": shared (continuous readings) on at least half;
7. otherwise "undetermined" (the evidence conflicts); `reason` says which rule decided.

The model's `mechanism` is the one held by more than half of all pairs, else "undetermined": no net sum,
so one pair cannot tip it. Backup and self-repair per head (McGrath et al. 2023; Rushing & Nanda 2024):
self_repair = direct - total effect; `compensation[i, j]` = the rise of head j's direct effect when head
i alone is ablated; j backs up i when that rise is at least half of i's direct effect (and that exceeds tau).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Literal, get_args

import pandas as pd
import plotly.graph_objects as go
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor
from headcoop.tl import HookedTransformer

from headcoop.analysis.ablation import ablate
from headcoop.analysis.coalitions import CoalitionGame
from headcoop.analysis.copies import per_input_metric
from headcoop.analysis.common import check_choice, parse_heads, require_model, require_task
from headcoop.bridge import user_hooks
from headcoop.analysis.estimators import HeadGame, top_interactions
from headcoop.analysis.interactions import interactions
from headcoop.analysis.vocabulary import ABLATION_HOWS, METRIC_NAMES, AblationHow, MetricName, head_name
from headcoop.checks import check_float, check_int, check_seed
from headcoop.plot import Displayed
from headcoop.tasks.base import Batch

MECHANISMS = ("redundant", "division", "superposition", "competition", "independent", "undetermined")
ROLES = ("supports", "competes", "inactive")
CLASSES = ("or", "and", "i_only", "j_only", "shared")
INPUT_CLASSES = ("not_needed", "or", "and", "a_only", "b_only", "shared", "other")  # codes of `input_class`
WriteReading = Literal["half_answer", "positive", "centered"]
WRITE_READINGS: tuple[str, ...] = get_args(WriteReading)


@dataclasses.dataclass(frozen=True, repr=False)
class Cooperation(Displayed):
    """The mechanism of every pair of heads and the role of every head (module docstring).

    pairs: one row per pair (`to_dataframe`); heads: one row per head (role, direct / total / isolated
    effect, self_repair, backs_up); compensation [head, head]; roles {head: role}; mechanism (the model's
    verdict) and shares {mechanism: share of pairs}; metric, how, method (how the values were computed);
    input_class [pair, batch] (codes into INPUT_CLASSES, in the pair's `context`) and input_superposed
    [pair, batch] (superposed writes, reading "half_answer"), the per-input evidence (`per_input`); v_full,
    v_empty: the metric's mean with every player and with none (loss negated: higher is better)."""

    heads: tuple[str, ...]
    pairs: pd.DataFrame
    head_table: pd.DataFrame
    compensation: Float[Tensor, "head head"]
    roles: dict
    mechanism: str
    shares: dict
    metric: str
    how: str
    method: str
    threshold: float
    v_full: float
    v_empty: float
    input_class: Int[Tensor, "pair batch"]
    input_superposed: Bool[Tensor, "pair batch"]

    def per_input(self) -> pd.DataFrame:
        """One row per (pair, input): head_a, head_b, input (index into the inputs), context, class (the
        pair's 2 x 2 game on that input: not_needed, or, and, a_only, b_only, shared, other) and superposed
        (both heads write to several outputs and share only the answer; False without DLA)."""
        n_pairs, n_inputs = self.input_class.shape
        pairs = self.pairs.loc[self.pairs.index.repeat(n_inputs), ["head_a", "head_b", "context"]].reset_index(drop=True)
        pairs.insert(2, "input", torch.arange(n_inputs).repeat(n_pairs).numpy())
        pairs["class"] = pd.Categorical.from_codes(self.input_class.flatten().long().numpy(), INPUT_CLASSES)
        pairs["superposed"] = self.input_superposed.flatten().numpy()
        return pairs

    def to_dataframe(self) -> pd.DataFrame:
        """One row per pair: head_a, head_b, mechanism, reason, context, the shares of the inputs where the
        pair matters that are OR / AND / a-only / b-only / shared, superposed (share of AND inputs with
        superposed writes), additive_ld, interaction (Shapley interaction index; NaN above max_exact heads),
        interaction_full (f11 - f10 - f01 + f00 with every other head present, mean over inputs), matters
        (share of inputs)."""
        return self.pairs.copy()

    def plot(self, title: str | None = None) -> go.Figure:
        """The mechanism of every pair (a heatmap coloured by mechanism) and each head's role."""
        n = len(self.heads)
        code = {m: k for k, m in enumerate(MECHANISMS)}
        z = [[None] * n for _ in range(n)]
        text = [[""] * n for _ in range(n)]
        for row in self.pairs.itertuples():
            i, j = self.heads.index(row.head_a), self.heads.index(row.head_b)
            z[i][j] = z[j][i] = code[row.mechanism]
            text[i][j] = text[j][i] = f"{row.head_a} & {row.head_b}: {row.mechanism} ({row.reason})"
        colours = ["#4c78a8", "#72b7b2", "#e45756", "#f58518", "#54a24b", "#bab0ac"]
        scale = []
        for k, colour in enumerate(colours):
            scale += [(k / len(colours), colour), ((k + 1) / len(colours), colour)]
        labels = [f"{h} ({self.roles[h]})" for h in self.heads]
        fig = go.Figure(go.Heatmap(z=z, x=labels, y=labels, text=text, hoverinfo="text", zmin=-0.5,
                                   zmax=len(MECHANISMS) - 0.5, colorscale=scale,
                                   colorbar=dict(tickvals=list(range(len(MECHANISMS))), ticktext=list(MECHANISMS))))  # fmt: skip
        from headcoop.plot import TEMPLATE

        fig.update_yaxes(autorange="reversed")
        fig.update_layout(template=TEMPLATE, title=title or (
            f"Mechanism of each pair of heads: {self.mechanism} overall ({self.metric}, {self.how} ablation)<br><sup>"
            f"per-input 2x2 games; direct effects by DLA with the final norm's scale frozen; {self.method}</sup>"))  # fmt: skip
        return fig

    def __repr__(self) -> str:
        counts = self.pairs["mechanism"].value_counts().to_dict()
        shown = ", ".join(f"{counts[m]} {m}" for m in MECHANISMS if m in counts)
        competing = [h for h, r in self.roles.items() if r == "competes"]
        return (f"Cooperation({len(self.heads)} heads, {self.metric}, {self.how} ablation: {self.mechanism}; "
                f"pairs {shown}; competing heads: {', '.join(competing) or 'none'}; {self.method})")  # fmt: skip


def _per_input(metric: str, logits: Tensor, answer: Tensor, wrong: Tensor | None) -> Tensor:
    """[coalition, batch] values of a named metric at each input (higher is better: loss is negated).
    Accuracy is strict: a tie for the top logit is not an answer (argmax would pick by token order)."""
    values = per_input_metric(metric, logits, answer, wrong, ties="none")
    return -values if metric == "loss" else values


def _classes(f11, f10, f01, f00, binary: bool, tau: float) -> tuple[Tensor, dict[str, Tensor]]:
    """(matters [batch], {class: [batch] bool}) of one pair's 2 x 2 game per input (module docstring)."""
    if binary:
        matters = (f11 > 0.5) & (f00 < 0.5)
        i_on, j_on = f10 > 0.5, f01 > 0.5
        return matters, {"or": i_on & j_on, "and": ~i_on & ~j_on, "i_only": i_on & ~j_on, "j_only": ~i_on & j_on,
                         "shared": torch.zeros_like(matters)}  # fmt: skip
    delta = f11 - f00
    matters = delta > tau
    safe = torch.where(matters, delta, torch.ones_like(delta))
    a_i, a_j = (f10 - f00) / safe, (f01 - f00) / safe
    hi_i, hi_j, lo_i, lo_j = a_i >= 0.8, a_j >= 0.8, a_i <= 0.2, a_j <= 0.2
    mid = ~hi_i & ~lo_i & ~hi_j & ~lo_j & ((a_i + a_j - 1).abs() <= 0.2)
    return matters, {"or": hi_i & hi_j, "and": lo_i & lo_j, "i_only": hi_i & lo_j, "j_only": lo_i & hi_j, "shared": mid}


def superposed_writes(
    dla_a: Float[Tensor, "batch vocab"],
    dla_b: Float[Tensor, "batch vocab"],
    answer: Int[Tensor, " batch"],
    outputs: Int[Tensor, " output"] | None = None,
    reading: WriteReading = "half_answer",
) -> tuple[Bool[Tensor, " batch"], Bool[Tensor, " batch"]]:
    """(several, superposed) per input: whether heads a and b (direct logit attributions [batch, vocab])
    each write to at least 2 of the `outputs` (token ids; default the whole vocabulary), and whether, in
    addition, the outputs both heads write to are the answer alone ("they will only constructively
    interfere on the correct token"). Which outputs a head writes to, by `reading`:

    "half_answer": its DLA minus its mean over the outputs is at least half of that on the answer, which
                   must be above 0 (so a decoy written more strongly than the answer does not hide the answer);
    "positive": its DLA is above 0 (raw contributions, as the SkipPair post's figure shows them);
    "centered": its DLA is above its mean over the outputs (softmax ignores a shift common to all logits).
    The answer must be one of the outputs."""
    check_choice("reading", reading, WRITE_READINGS)
    if dla_a.shape != dla_b.shape or dla_a.ndim != 2 or answer.shape != dla_a.shape[:1]:
        raise ValueError(f"superposed_writes needs dla_a, dla_b [batch, vocab] and answer [batch], got "
                         f"{tuple(dla_a.shape)}, {tuple(dla_b.shape)} and {tuple(answer.shape)}")  # fmt: skip
    vocab = dla_a.shape[-1]
    bad = answer[(answer < 0) | (answer >= vocab)].tolist()
    if bad:
        raise ValueError(f"superposed_writes: answer ids {bad[:5]} lie outside the {vocab} outputs of dla_a/dla_b")
    if outputs is not None:
        outputs = torch.as_tensor(outputs, dtype=torch.long, device=dla_a.device)
        if len(set(outputs.tolist())) != len(outputs):
            dup = sorted({o for o in outputs.tolist() if outputs.tolist().count(o) > 1})
            raise ValueError(f"superposed_writes: outputs repeat {dup}; name each output once")
        if bool(((outputs < 0) | (outputs >= vocab)).any()):
            raise ValueError(f"superposed_writes: outputs {outputs.tolist()[:10]} must be ids in 0..{vocab - 1}")
        position = torch.full((dla_a.shape[-1],), -1, dtype=torch.long, device=dla_a.device)
        position[outputs] = torch.arange(len(outputs), device=dla_a.device)
        answer = position[answer.to(dla_a.device)]
        if (answer < 0).any():
            raise ValueError("superposed_writes: every answer must be one of `outputs`")
        dla_a, dla_b = dla_a[:, outputs], dla_b[:, outputs]
    rows = torch.arange(len(answer), device=dla_a.device)
    answer = answer.to(dla_a.device)
    sets = []
    for d in (dla_a.double(), dla_b.double()):
        if reading == "positive":
            sets.append(d > 0)
            continue
        d = d - d.mean(-1, keepdim=True)
        if reading == "centered":
            sets.append(d > 0)
            continue
        on_answer = d[rows, answer][:, None]
        sets.append((d >= 0.5 * on_answer) & (on_answer > 0))
    several = (sets[0].sum(-1) >= 2) & (sets[1].sum(-1) >= 2)
    both = sets[0] & sets[1]
    return several, several & both[rows, answer] & (both.sum(-1) == 1)


def _additive_by_construction(model: HookedTransformer, metric: str, a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Whether `metric` is additive over heads a and b whatever the weights: logit_diff, an attention-only
    model without norms or soft-capping, both heads in the last layer (nothing reads their outputs)."""
    cfg = model.cfg
    last = cfg.n_layers - 1
    return (metric == "logit_diff" and cfg.attn_only and cfg.normalization_type is None
            and not (cfg.output_logits_soft_cap or 0) > 0 and a[0] == last and b[0] == last)  # fmt: skip


ALL_PAIRS_UP_TO = 32  # heads: per-input evidence for every pair up to here (496 pairs, 2 coalitions each)


def _head_dla(model, tokens, pos, answer, wrong) -> tuple[Tensor, Tensor] | str:
    """(per-head DLA [batch, layer, head, vocab], on ld [batch, layer, head]) of the current model (hooks
    included), or why there is none: the model's architecture has no exact decomposition
    (`check_decomposable`), or hooks installed on the model change the forward pass after the heads (their
    outputs would no longer sum to the logits); any other failure of `hc.dla` is raised."""
    from headcoop.analysis.dla import check_decomposable, dla

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
    heads = result.heads().double()  # [batch, layer, head, vocab]
    rows = torch.arange(len(answer))
    answer = answer.to(heads.device)
    if wrong is None:  # the best other token of the full logits
        wrong = result.total().double().scatter(-1, answer[:, None], float("-inf")).argmax(-1)
    wrong = wrong.to(heads.device)
    return heads, heads[rows, :, :, answer] - heads[rows, :, :, wrong]


@torch.no_grad()
def cooperation(
    model: HookedTransformer,
    task=None,
    heads=None,
    how: AblationHow = "mean",
    metric: MetricName = "accuracy",
    inputs=None,
    reference=None,
    seed: int = 0,
    threshold: float = 0.1,
    min_share: float = 0.1,
    n: int = 512,
    max_exact: int = 16,
    top_pairs: int | None = None,
    screen_budget: int | None = None,
) -> Cooperation:
    """The mechanism of every pair of heads and the role of every head (module docstring).

    task:      the task whose inputs are used (default the model's); inputs: a Batch (answers known),
               default task.sample(n, seed).
    heads:     the players, in any form `hc.ablate` takes; default every head.
    how:       "zero", "mean" or "resample" ablation of heads outside a coalition (`reference`, `seed` as
               `hc.ablate`).
    metric:    the per-input reading: "accuracy" (default; argmax is the answer), "logit_diff", "prob",
               "loss".
    max_exact: the Shapley interaction index of each pair (`interaction`) is computed exactly with
               `hc.interactions` up to this many heads; above, it is NaN while every pair still gets
               per-input evidence (up to 32 heads: 2 coalitions per pair).
    top_pairs: with more than 32 heads (or top_pairs given, above max_exact), every pair is ranked by
               shapiq's SVARM-IQ at `screen_budget` coalitions (default max(2,000, 20 x heads)), and only the
               top_pairs strongest (default 20) get an interaction (64 draws each) and per-input evidence: the
               pair table holds those pairs only, and the repr says so. `interaction_full` (the pair's
               interaction with every other head present, mean over inputs) is always given. No rule uses
               either.
    threshold: tau as a share of |v(all) - v(none)| (module docstring); min_share: the share of inputs a
               pair must matter on.
    """
    require_model(model, "cooperation")
    check_choice("how", how, ABLATION_HOWS)
    check_choice("metric", metric, METRIC_NAMES)
    check_float("threshold", threshold, 0.0, 1.0)
    check_float("min_share", min_share, 0.0, 1.0)
    check_int("n", n, 1)
    check_int("max_exact", max_exact, 2, 24)
    if top_pairs is not None:
        check_int("top_pairs", top_pairs, 1)
    if screen_budget is not None:
        check_int("screen_budget", screen_budget, 2)
    check_seed(seed)
    if task is None and (inputs is None or (reference is None and how != "zero")):
        task = require_task(model, "hc.cooperation's inputs" if inputs is None else f'the reference of how="{how}"')
    batch = inputs if inputs is not None else task.sample(n, seed=seed)
    if not isinstance(batch, Batch):
        raise TypeError(f"inputs= must be a Batch (answers known, e.g. task.sample(n) or Batch.from_answers), "
                        f"got {type(batch).__name__}")  # fmt: skip
    if reference is None and how != "zero":
        reference = task.sample(512, seed=seed + 1)
    players = [(lay, h) for lay in range(model.cfg.n_layers) for h in range(model.cfg.n_heads)] if heads is None \
        else parse_heads(model, heads)  # fmt: skip
    k = len(players)
    if k < 2:
        raise ValueError(f"cooperation needs at least 2 heads, got {k}")
    names = tuple(head_name(*p) for p in players)
    game = CoalitionGame(model, players, tokens=batch, metric="logit_diff", how=how, seed=seed,
                         reference=None if how == "zero" else reference)  # fmt: skip
    measured = game.measurement  # the inputs, read positions and answers, resolved once (copies.measure)
    answer, wrong, pos = measured.answer, measured.wrong, measured.positions

    # the coalitions: all, none, all but i, i alone, all but i and j, i and j alone
    pairs = list(itertools.combinations(range(k), 2))
    inter = torch.full((k, k), float("nan"))
    pairs_note = ""
    if k <= max_exact:
        inter = interactions(model, tokens=batch, heads=list(names), metric=metric, how=how,
                             reference=None if how == "zero" else reference, seed=seed, method="exact").interaction  # fmt: skip
    elif top_pairs is not None or k > ALL_PAIRS_UP_TO:  # per-input evidence for the strongest pairs only
        top_pairs = top_pairs if top_pairs is not None else 20
        screen = screen_budget if screen_budget is not None else max(2000, 20 * k)
        ranking = CoalitionGame(model, players, tokens=batch, metric=metric, how=how, seed=seed,
                                reference=None if how == "zero" else reference)  # fmt: skip
        inter, _, pairs = top_interactions(HeadGame(ranking), top_pairs, screen, 64, seed)
        pairs = sorted(pairs)
        pairs_note = (f"; per-input evidence for the top {len(pairs)} of {k * (k - 1) // 2:,} pairs by |interaction| "
                      f"only (shapiq SVARM-IQ at {screen:,} coalitions, then 64 draws per pair)")  # fmt: skip
    else:
        pairs_note = f"; Shapley interaction index not computed ({k} heads > max_exact={max_exact})"
    full, empty = torch.ones(k, dtype=torch.bool), torch.zeros(k, dtype=torch.bool)
    masks = [full, empty]
    for i in range(k):
        masks += [full.clone().index_fill_(0, torch.tensor([i]), False), empty.clone().index_fill_(0, torch.tensor([i]), True)]
    for i, j in pairs:
        both = torch.tensor([i, j])
        masks += [full.clone().index_fill_(0, both, False), empty.clone().index_fill_(0, both, True)]
    logits = game.row_logits(torch.stack(masks)).cpu()  # [coalition, batch, vocab]
    answer_c, wrong_c = answer.cpu(), wrong.cpu()
    values = _per_input(metric, logits, answer_c, wrong_c)  # [coalition, batch]
    ld = _per_input("logit_diff", logits, answer_c, wrong_c)
    without = lambda i: 2 + 2 * i  # noqa: E731
    alone = lambda i: 3 + 2 * i  # noqa: E731
    pair_at = {pair: 2 + 2 * k + 2 * m for m, pair in enumerate(pairs)}

    # thresholds scale with the number of players: a head's fair share of the whole effect is 1/k of it,
    # a pair's 2/k
    tau_ld = threshold * float((ld[0] - ld[1]).abs().mean()) / k
    tau_m = threshold * max(float((values[0] - values[1]).abs().mean()), 1e-12) * 2 / k
    dla_full = _head_dla(model, batch.tokens, pos, answer, wrong)
    no_dla = dla_full if isinstance(dla_full, str) else None
    dla_full = None if no_dla else dla_full

    # --- heads: roles, self-repair, compensation
    rows = []
    direct = torch.zeros(k, dtype=torch.float64)
    if dla_full is not None:
        direct = torch.stack([dla_full[1][:, lay, h].mean() for lay, h in players]).cpu()
    roles = {}
    for i, name in enumerate(names):
        total = float((ld[0] - ld[without(i)]).mean())
        isolated = float((ld[alone(i)] - ld[1]).mean())
        effects = ([float(direct[i])] if dla_full is not None else []) + [total, isolated]
        role = next(("supports" if e > 0 else "competes" for e in effects if abs(e) > tau_ld), "inactive")
        roles[name] = role
        rows.append(dict(head=name, role=role, direct_effect=float(direct[i]) if dla_full is not None else float("nan"),
                         total_effect=total, isolated_effect=isolated,
                         self_repair=float(direct[i]) - total if dla_full is not None else float("nan")))  # fmt: skip
    compensation = torch.zeros(k, k, dtype=torch.float64)
    if dla_full is not None:
        for i, name in enumerate(names):
            # ablating head i changes no head's direct effect in its own or an earlier layer, unless through
            # a final norm's scale: those entries are 0 without a run
            if model.cfg.normalization_type is None and not any(lay > players[i][0] for lay, _ in players):
                continue
            with ablate(model, heads=[name], how=how, reference=None if how == "zero" else reference, seed=seed):
                after = _head_dla(model, batch.tokens, pos, answer, wrong)
            if after is not None:
                compensation[i] = torch.stack([after[1][:, lay, h].mean() for lay, h in players]).cpu() - direct
                compensation[i, i] = 0.0
    for i, row in enumerate(rows):
        row["backs_up"] = ", ".join(names[j] for j in range(k) if direct[j] > tau_ld
                                    and compensation[j, i] >= 0.5 * direct[j])  # fmt: skip
    head_table = pd.DataFrame(rows).set_index("head")

    # --- pairs
    binary = metric == "accuracy"
    table, input_class, input_superposed = [], [], []
    for (i, j) in pairs:
        a, b = names[i], names[j]
        at = pair_at[(i, j)]
        contexts = {
            "full": (values[0], values[without(j)], values[without(i)], values[at], ld[0], ld[without(j)], ld[without(i)], ld[at]),
            "isolated": (values[at + 1], values[alone(i)], values[alone(j)], values[1],
                         ld[at + 1], ld[alone(i)], ld[alone(j)], ld[1]),
        }  # fmt: skip
        sup = None if dla_full is None else superposed_writes(dla_full[0][:, players[i][0], players[i][1]].cpu(),
                                                              dla_full[0][:, players[j][0], players[j][1]].cpu(), answer_c)[1]  # fmt: skip
        evidence, codes = {}, {}
        for context, (f11, f10, f01, f00, l11, l10, l01, l00) in contexts.items():
            matters, classes = _classes(f11, f10, f01, f00, binary, tau_m)
            code = torch.full(matters.shape, INPUT_CLASSES.index("other"), dtype=torch.int8)
            for c, name in zip(CLASSES, ("or", "and", "a_only", "b_only", "shared")):
                code[classes[c]] = INPUT_CLASSES.index(name)
            codes[context] = code.masked_fill_(~matters, 0)
            count = max(int(matters.sum()), 1)
            share = {c: float((classes[c] & matters).sum()) / count for c in CLASSES}
            and_inputs = classes["and"] & matters
            additive = ((l11 - l10 - l01 + l00).abs() <= 0.2 * (l11 - l00).abs().clamp(min=tau_ld)) & and_inputs
            superposed = float("nan") if sup is None else float((sup & and_inputs).sum()) / max(int(and_inputs.sum()), 1)
            evidence[context] = dict(matters=float(matters.float().mean()), **share, superposed=superposed,
                                     additive_ld=float(additive.sum()) / max(int(and_inputs.sum()), 1))  # fmt: skip
        context = "full" if evidence["full"]["matters"] >= min_share or evidence["isolated"]["matters"] < min_share \
            else "isolated"  # fmt: skip
        e = evidence[context]
        input_class.append(codes[context])
        input_superposed.append(sup if sup is not None else torch.zeros(len(answer_c), dtype=torch.bool))
        mechanism, reason = _decide(model, metric, players[i], players[j], a, b, roles, e, min_share)
        table.append(dict(head_a=a, head_b=b, mechanism=mechanism, reason=reason, context=context,
                          matters=e["matters"], **{c: e[c] for c in CLASSES}, superposed=e["superposed"],
                          additive_ld=e["additive_ld"], interaction=float(inter[i, j]),
                          interaction_full=float((values[0] - values[without(j)] - values[without(i)] + values[at]).mean()),
                          isolated_matters=evidence["isolated"]["matters"]))  # fmt: skip
    frame = pd.DataFrame(table).rename(columns={"i_only": "a_only", "j_only": "b_only"})
    counts = frame["mechanism"].value_counts()
    shares = {m: float(counts.get(m, 0)) / len(frame) for m in MECHANISMS}
    overall = next((m for m in MECHANISMS if shares[m] > 0.5), "undetermined")
    return Cooperation(heads=names, pairs=frame, head_table=head_table, compensation=compensation.float(),
                       roles=roles, mechanism=overall, shares=shares, metric=metric, how=how,
                       method=f"{len(masks)} coalitions per input; {game.method}"
                              + pairs_note
                              + ("" if no_dla is None else f"; no direct effects ({no_dla})"),
                       threshold=threshold, v_full=float(values[0].mean()), v_empty=float(values[1].mean()),
                       input_class=torch.stack(input_class),
                       input_superposed=torch.stack(input_superposed))  # fmt: skip


def _decide(model, metric, pa, pb, a: str, b: str, roles: dict, e: dict, min_share: float) -> tuple[str, str]:
    """(mechanism, reason) of one pair from its evidence (module docstring, rules 1-7)."""
    ra, rb = roles[a], roles[b]
    if {ra, rb} == {"supports", "competes"}:
        loser = a if ra == "competes" else b
        return "competition", f"{loser} pushes against the answer"
    if "inactive" in (ra, rb):
        return "undetermined", f"{a if ra == 'inactive' else b} is inactive"
    if _additive_by_construction(model, metric, pa, pb):
        return "undetermined", "the metric is additive over these heads by construction"
    if e["matters"] < min_share:
        return "undetermined", f"the pair matters on {e['matters']:.0%} of inputs"
    if e["or"] >= 0.5:
        return "redundant", f"either alone answers {e['or']:.0%}"
    if e["and"] >= 0.5:
        if e["superposed"] >= 0.5:
            return "superposition", f"both needed on {e['and']:.0%}, superposed writes on {e['superposed']:.0%} of those"
        if e["additive_ld"] >= 0.5:
            return "independent", f"both needed on {e['and']:.0%}, logit difference additive on {e['additive_ld']:.0%}"
        return "undetermined", f"both needed on {e['and']:.0%}, neither superposed nor additive"
    if e["i_only"] >= 0.2 and e["j_only"] >= 0.2 and e["i_only"] + e["j_only"] >= 0.5:
        return "division", f"{a} alone on {e['i_only']:.0%}, {b} alone on {e['j_only']:.0%}"
    if e["shared"] >= 0.5:
        return "independent", f"effects add on {e['shared']:.0%}"
    return "undetermined", "the evidence conflicts"


__all__ = ["cooperation", "Cooperation", "MECHANISMS", "ROLES", "INPUT_CLASSES", "superposed_writes"]
