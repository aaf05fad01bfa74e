"""Which mechanism joins two heads, read from separate axes and kept only where a family of readings agrees
(issue 37).

    result = hc.cooperation(model)               # the task's inputs, accuracy, the default reading family
    result.mechanism, result.agreement           # the model's word and the share of readings that give it
    result.to_dataframe()                        # one row per pair: word, agreement, what flips it, the axes
    result.readings                              # one row per reading: how, draw, threshold band, words

**The axes** (`headcoop.analysis.mechanisms.axes`), per pair (i, j) and input:

- *necessity*: the pair's 2 x 2 game on the user's metric (both, only i, only j, neither active; every other
  head as in the model: the "full" context, or every other head ablated: "isolated" where the pair
  matters on fewer than `min_share` of inputs in the full one): OR, AND, i-only, j-only, shared. Accuracy
  counts a tie for the top logit as no answer, as `hc.interactions` does (`per_input_metric(ties="none")`).
- *writes* (the clean run; direct logit attribution with the final norm's scale frozen): which of the
  task's completions (`outputs`, default every answer of the inputs) each head pushes up (a positive
  contribution: "will only constructively interfere on the correct token" reads positive logit
  contributions), whether it pushes up at least 2 completions *consistent with the source token it attends
  to* (answers of inputs where it attends that token), the rank of its map from attended sources to writes,
  and whether the answer is the only completion both heads push up;
- *attention*: which source token each head attends to most from the read row; distributed where the two
  differ ("they distribute important source tokens between them");
- *sign*: each head's total effect (the metric with every head minus without it) and isolated effect (alone
  minus none), with 95% intervals over inputs, on the user's metric read continuously (accuracy: the margin
  logit(answer) - the best other logit; loss negated); its direct effect (DLA) beside it.

**Roles.** A head "supports" (or "competes") when its total effect exceeds tau in size with an interval
that excludes 0, else by its isolated effect likewise; else "inactive". tau = `role` x S / k, with S the
sum over the k heads of max(|total|, |isolated|): relative to the heads' absolute effects, not their net
sum. A head that a later head backs up (below) is read with that backup held at its unablated output: its
effect before the compensation (else an over-compensating backup makes it look like it opposes the
answer). `via` says whether the support is direct (the direct effect carries at least half of it) or
through later heads (composition).

**Words**, in this order (each word's source in `WORD_SOURCES`):

1. "inactive": a head of the pair has no effect on the metric under this reading;
2. "competition": one head supports and the other competes (total effect against the answer);
3. "composition": i sits in an earlier layer than j and at least `composition` of i's total effect runs
   through j (only j's z set to what it computes with i ablated: every path from i into j's q, k and v
   inputs, the rest of the run as it is), with the sign of i's role: Elhage et al. 2021's
   Q/K/V-composition, as a previous-token head feeds an induction head;
4. "superposition": the post's OV-coherent mechanism: both heads support, each map from attended sources
   to writes has rank >= 2 (singular values above `rank_tol` of the largest), both write to several
   consistent completions on at least `min_share` of inputs, on at least `majority` of those the answer
   is the only completion both push up, and they attend to different source tokens on at least `majority`
   of inputs. Whether both heads are needed on an input is not part of it (the post's own
   "least favourite token repeated" contexts are answered by one head);
5. necessity (in the chosen context, among inputs where the pair matters; "undetermined" below
   `min_share`): "redundant" when OR on at least `majority`; "division" when i-only and j-only each on at
   least `division` and together `majority`; "independent" when AND or shared on `majority` and the
   logit difference (answer minus the fixed wrong token) adds over the two heads
   (|ld11 - ld10 - ld01 + ld00| <= `cutoff` |ld11 - ld00|) on `majority` of them, but "not testable" where
   the logit difference is additive over the two heads by construction (an attention-only model without
   norms with both heads in the last layer: true whatever the weights);
6. otherwise "undetermined", with what conflicts.

**Readings.** Every word is computed under a family of readings: each ablation in `how` ("zero", "mean",
"resample", and "mean-aligned": the mean over references of z at the same offset from their answer
position, so a variable-length task's '=' is averaged with other '='s), `draws` draws of the reference
for each of mean / resample / mean-aligned (independent task samples, or bootstrap resamples of a given
reference), and each threshold at half and at twice its default (one at a time; a share is at most
(1 + default) / 2). A pair's word stands where at least `agree` of the readings give it; else
"undetermined", and `flips_under` names the most common other word and the group of readings (an
ablation, or one threshold at one factor) where it holds least often ("redundant in 48% of readings, 0%
under resample"); `words` holds every reading's word. The model's word per reading is the word
of more than half of its active pairs (pairs whose heads both have an effect), and stands the same way.
Composition and backup are measured on each ablation's first draw.

**Backup** (McGrath et al. 2023; Rushing & Nanda 2024), for i in an earlier layer than j: ablate i; j's
compensation is the rise of its direct effect, split into what j's own output change gives (the final
norm's scale frozen at the unablated run's) and what the norm's rescaling gives (the rest). j backs up i
when its own change restores at least half of i's direct effect (both i's direct effect and the
compensation above the role threshold), or at least half of the answers that are lost when j is also held
at its unablated output (`answers_restored`, where those are at least `min_share` of the inputs). Both
shares are shown.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter


import pandas as pd
import plotly.graph_objects as go
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor
from transformer_lens.utilities import get_act_name

from headcoop.progress import with_progress
from headcoop.analysis.engine.ablation import hooks_added, reference_z, resample_order, z_hooks
from headcoop.analysis.games.coalitions import CoalitionGame
from headcoop.analysis.engine.inputs import as_tokens, check_choice, parse_heads, require_model, require_task
from headcoop.analysis.engine.copies import per_input_metric
from headcoop.analysis.games.estimators import HeadGame, top_interactions
from headcoop.analysis.games.interactions import MAX_EXACT, interactions
from headcoop.analysis.mechanisms.axes import (
    attended_sources, conditional_rank, consistent_outputs, distributed, effect_interval, necessity_classes,
    superposed, write_sets,
)  # fmt: skip
from headcoop.analysis.vocabulary import (
    METRIC_NAMES, READING_HOWS, WRITE_READINGS, MetricName, ReadingHow, WriteReading, head_name,
)  # fmt: skip
from headcoop.bridge import user_hooks
from headcoop.checks import check_float, check_int, check_seed
from headcoop.results import Result
from headcoop.tasks.base import Batch, generator
from headcoop.tl import HookedTransformer

MECHANISMS = ("superposition", "redundant", "division", "composition", "competition", "independent",
              "not testable", "inactive", "undetermined")  # fmt: skip
ROLES = ("supports", "competes", "inactive", "undetermined")
INPUT_CLASSES = ("not_needed", "or", "and", "a_only", "b_only", "shared", "other")  # codes of `input_class`
CLASSES = ("or", "and", "i_only", "j_only", "shared")
# the thresholds of the rules (module docstring) and their defaults; each is banded at half and twice
THRESHOLDS = {"role": 0.1, "min_share": 0.1, "majority": 0.5, "division": 0.2, "cutoff": 0.2, "rank_tol": 0.1,
              "composition": 0.5, "floor": 0.1}  # fmt: skip

WORD_SOURCES = {  # text in double quotes is verbatim from ../shared/seeds (tests/analysis/mechanisms/test_cooperation.py checks it)
    "superposition": 'The SkipPair post: "In contexts where both heads write to multiple outputs, they will only '
                     'constructively interfere on the correct token."; "they distribute important source tokens '
                     'between them, and constructively interfere to produce the correct answer"; "We think this shows '
                     'an interesting example of heads performing computation in superposition."',
    "redundant": 'Either head alone gives the answer where the pair matters (OR): the Count01 paper\'s question, '
                 '"whether the attention heads behave as a pseudo-ensemble, all solving the same subtask".',
    "division": 'Each head answers its own share of the inputs (i-only and j-only): the Count01 paper\'s other case, '
                '"they perform different subtasks, meaning that they can only solve the original task in '
                'conjunction", read per input.',
    "composition": "Elhage et al. 2021 (A Mathematical Framework for Transformer Circuits): a later head reads an "
                   "earlier head's output through its query, key or value (Q-, K- and V-composition), as a "
                   "previous-token head feeds an induction head.",
    "competition": 'One head\'s total effect on the metric supports the answer, the other\'s opposes it: the Count01 '
                   'paper\'s title asks "Do Attention Heads Compete or Cooperate during Counting?" and defines neither.',
    "independent": "Both heads are needed (AND) or share the effect, and their logit effects add where additivity "
                   "could have failed: no interaction.",
    "not testable": "Additivity holds by construction (logits linear in the two heads' outputs): the measurement "
                    "cannot tell independent heads from any other.",
    "inactive": "A head of the pair has no effect on the metric under the reading.",
    "undetermined": "The axes conflict, or the readings disagree (flips_under names where).",
    "backs up": "McGrath et al. 2023 (The Hydra Effect): later heads compensate when an earlier one is ablated; "
                "Rushing & Nanda 2024 (self-repair): part of that compensation is the final LayerNorm's rescaling, "
                "which is split off here.",
}


@dataclasses.dataclass(frozen=True)
class Reading:
    """One reading of the family: an ablation, a draw of its reference, and one threshold at a factor."""

    how: str
    draw: int
    threshold: str | None = None
    factor: float = 1.0

    @property
    def label(self) -> str:
        where = self.how if self.how == "zero" else f"{self.how} draw {self.draw}"
        return where if self.threshold is None else f"{where}, {self.threshold} x{self.factor:g}"


@dataclasses.dataclass(frozen=True, repr=False)
class Cooperation(Result):
    """The word of every pair of heads and the role of every head, each with the share of readings that
    agree (module docstring).

    pairs: one row per pair (`to_dataframe`); head_table: one row per head; backup: one row per (earlier,
    later) head pair and ablation; readings: one row per reading (its model word and word counts); words:
    [pair, reading] the word of each pair under each reading; roles {head: role}; mechanism and agreement
    (the model's word and its share of readings); shares {word: share of pairs}; metric, how (the primary
    reading, whose evidence `per_input` shows), hows (the family), method; flips and by_ablation (what
    flips the model's word, each ablation's word); input_class [pair, batch] (the primary reading's 2 x 2
    classes), input_multi [pair, batch] (both heads write to several consistent completions) and
    input_superposed [pair, batch] (and the answer is the only one both write to)."""

    heads: tuple[str, ...]
    pairs: pd.DataFrame
    head_table: pd.DataFrame
    backup: pd.DataFrame
    readings: pd.DataFrame
    words: pd.DataFrame
    compensation: Float[Tensor, "head head"]
    roles: dict
    mechanism: str
    agreement: float
    flips: str
    by_ablation: str
    shares: dict
    metric: str
    how: str
    hows: tuple[str, ...]
    method: str
    thresholds: dict
    agree: float
    v_full: float
    v_empty: float
    input_class: Int[Tensor, "pair batch"]
    input_superposed: Bool[Tensor, "pair batch"]
    input_multi: Bool[Tensor, "pair batch"]

    @property
    def threshold(self) -> float:
        """The role threshold (a share of a head's fair share of the heads' absolute effects)."""
        return self.thresholds["role"]

    def per_input(self) -> pd.DataFrame:
        """One row per (pair, input) under the primary reading: head_a, head_b, input, context, class (the
        pair's 2 x 2 game: not_needed, or, and, a_only, b_only, shared, other) and superposed (both heads
        write to several consistent completions and push up only the answer together)."""
        n_pairs, n_inputs = self.input_class.shape
        pairs = self.pairs.loc[self.pairs.index.repeat(n_inputs), ["head_a", "head_b", "context"]].reset_index(drop=True)
        pairs.insert(2, "input", torch.arange(n_inputs).repeat(n_pairs).numpy())
        pairs["class"] = pd.Categorical.from_codes(self.input_class.flatten().long().numpy(), INPUT_CLASSES)
        pairs["superposed"] = self.input_superposed.flatten().numpy()
        return pairs

    def to_dataframe(self) -> pd.DataFrame:
        """One row per pair: head_a, head_b, mechanism (the word that stands), agreement (share of readings
        giving the pair's most common word), flips_under (the most common word other than "undetermined", its
        share of readings and the group of readings where it holds least), by_ablation (each ablation's most
        common word and its share), reason;
        the primary reading's axes: context, matters, or / and / a_only / b_only / shared (shares of the
        inputs where the pair matters), additive_ld; multi, only_answer, distributed, rank_a, rank_b
        (writes and attention); composition (share of the earlier head's effect through the later one);
        interaction (Shapley interaction index, NaN above max_exact heads) and interaction_full."""
        return self.pairs.copy()

    def plot(self, title: str | None = None) -> go.Figure:
        """A heatmap of every pair's word (hover: agreement and reason) with each head's role on the axes."""
        from headcoop.plot import TEMPLATE

        n = len(self.heads)
        code = {m: k for k, m in enumerate(MECHANISMS)}
        z = [[None] * n for _ in range(n)]
        text = [[""] * n for _ in range(n)]
        for row in self.pairs.itertuples():
            i, j = self.heads.index(row.head_a), self.heads.index(row.head_b)
            z[i][j] = z[j][i] = code[row.mechanism]
            text[i][j] = text[j][i] = (f"{row.head_a} & {row.head_b}: {row.mechanism} "
                                       f"({row.agreement:.0%} of readings; {row.reason})")  # fmt: skip
        colours = ["#e45756", "#4c78a8", "#72b7b2", "#b279a2", "#f58518", "#54a24b", "#9d755d", "#eeeeee", "#bab0ac"]
        scale = []
        for k, colour in enumerate(colours):
            scale += [(k / len(colours), colour), ((k + 1) / len(colours), colour)]
        labels = [f"{h} ({self.roles[h]})" for h in self.heads]
        fig = go.Figure(go.Heatmap(z=z, x=labels, y=labels, text=text, hoverinfo="text", zmin=-0.5,
                                   zmax=len(MECHANISMS) - 0.5, colorscale=scale,
                                   colorbar=dict(tickvals=list(range(len(MECHANISMS))), ticktext=list(MECHANISMS))))  # fmt: skip
        fig.update_yaxes(autorange="reversed", automargin=True)
        fig.update_xaxes(automargin=True)
        fig.update_layout(template=TEMPLATE, margin=dict(l=140), title=title or (
            f"Mechanism of each pair of heads: {self.mechanism} ({self.agreement:.0%} of {len(self.readings)} "
            f"readings; {self.metric})<br><sup>readings: {', '.join(self.hows)} ablation x reference draws x "
            f"threshold bands; direct effects by DLA with the final norm's scale frozen</sup>"))  # fmt: skip
        return fig

    def __repr__(self) -> str:
        counts = self.pairs["mechanism"].value_counts().to_dict()
        shown = ", ".join(f"{counts[m]} {m}" for m in MECHANISMS if m in counts)
        competing = [h for h, r in self.roles.items() if r == "competes"]
        flips = f"; {self.flips}" if self.flips else ""
        return (f"Cooperation({len(self.heads)} heads, {self.metric}: {self.mechanism} in {self.agreement:.0%} of "
                f"{len(self.readings)} readings{flips}; by ablation: {self.by_ablation}; pairs {shown}; competing heads: {', '.join(competing) or 'none'}; "
                f"{self.method})")  # fmt: skip


# --- the metric per input -------------------------------------------------------------------------------
def _per_input(metric: str, logits: Tensor, answer: Tensor, wrong: Tensor | None) -> Tensor:
    """[..., batch] values of a named metric per input, higher is better (loss negated); accuracy counts a
    tie for the top logit as no answer (the rule `hc.interactions` shares)."""
    values = per_input_metric(metric, logits, answer, wrong, ties="none")
    return -values if metric == "loss" else values


def _signed(metric: str, logits: Tensor, answer: Tensor, wrong: Tensor | None) -> Tensor:
    """The user's metric read continuously, for signs and roles: accuracy's margin (the answer's logit minus
    the best other), else the metric itself (higher is better)."""
    if metric == "accuracy":
        return per_input_metric("logit_diff", logits, answer, None)
    return _per_input(metric, logits, answer, wrong)


def superposed_writes(
    dla_a: Float[Tensor, "batch vocab"],
    dla_b: Float[Tensor, "batch vocab"],
    answer: Int[Tensor, " batch"],
    outputs: Int[Tensor, " output"] | None = None,
    reading: WriteReading = "positive",
    source_a: Int[Tensor, " batch"] | None = None,
    source_b: Int[Tensor, " batch"] | None = None,
) -> tuple[Bool[Tensor, " batch"], Bool[Tensor, " batch"]]:
    """(multi, superposed) per input for heads a and b (direct logit attributions [batch, vocab]): multi where
    each writes to at least 2 of the `outputs` (token ids; default every answer in `answer`), counting only
    outputs consistent with its attended source token where `source_a` / `source_b` are given; superposed
    where, in addition, the answer is the only output both write to. Which outputs a head writes to, by
    `reading`: "positive" (its contribution is above 0, the post's reading and the default), "centered"
    (above its mean over the outputs, a contrast reading), "half_answer" (centred, and at least half the
    centred contribution to the answer, which must be above 0)."""
    check_choice("reading", reading, WRITE_READINGS)
    if dla_a.shape != dla_b.shape or dla_a.ndim != 2 or answer.shape != dla_a.shape[:1]:
        raise ValueError(f"superposed_writes needs dla_a, dla_b [batch, vocab] and answer [batch], got "
                         f"{tuple(dla_a.shape)}, {tuple(dla_b.shape)} and {tuple(answer.shape)}")  # fmt: skip
    vocab = dla_a.shape[-1]
    answer = torch.as_tensor(answer).long().cpu()
    bad = answer[(answer < 0) | (answer >= vocab)].tolist()
    if bad:
        raise ValueError(f"superposed_writes: answer ids {bad[:5]} lie outside the {vocab} outputs of dla_a/dla_b")
    outputs = answer.unique() if outputs is None else _check_outputs(outputs, vocab)
    if len(set(outputs.tolist())) != len(outputs):
        dup = sorted({o for o in outputs.tolist() if outputs.tolist().count(o) > 1})
        raise ValueError(f"superposed_writes: outputs repeat {dup}; name each output once")
    if bool(((outputs < 0) | (outputs >= vocab)).any()):
        raise ValueError(f"superposed_writes: outputs {outputs.tolist()[:10]} must be ids in 0..{vocab - 1}")
    position = torch.full((vocab,), -1, dtype=torch.long)
    position[outputs] = torch.arange(len(outputs))
    col = position[answer]
    if (col < 0).any():
        raise ValueError("superposed_writes: every answer must be one of `outputs`")
    sets = []
    for d in (dla_a.double().cpu()[:, outputs], dla_b.double().cpu()[:, outputs]):
        if reading == "half_answer":
            d = d - d.mean(-1, keepdim=True)
            on_answer = d[torch.arange(len(col)), col][:, None]
            sets.append((d >= 0.5 * on_answer) & (on_answer > 0))
        else:
            sets.append(write_sets(d, reading))
    everything = torch.ones(len(col), len(outputs), dtype=torch.bool)
    cons = [everything if s is None else consistent_outputs(torch.as_tensor(s).cpu(), answer, outputs)
            for s in (source_a, source_b)]  # fmt: skip
    multi, only = superposed(sets[0], sets[1], cons[0], cons[1], col)
    return multi, multi & only


def _additive_by_construction(model: HookedTransformer, a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Whether the logit difference is additive over heads a and b whatever the weights: an attention-only
    model without norms or soft-capping, both heads in the last layer (nothing reads their outputs)."""
    cfg = model.cfg
    last = cfg.n_layers - 1
    return (bool(cfg.attn_only) and cfg.normalization_type is None and not (cfg.output_logits_soft_cap or 0) > 0
            and a[0] == last and b[0] == last)  # fmt: skip


# --- the clean run: writes and attention -------------------------------------------------------------
def _head_dla(model: HookedTransformer, tokens: Tensor, pos: Tensor) -> Tensor | str:
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


def _patterns(model: HookedTransformer, tokens: Tensor, pos: Tensor, layers: list[int]) -> dict[int, Tensor]:
    """{layer: [batch, head, key]} attention patterns of the read rows in the clean run."""
    names = {get_act_name("pattern", lay): lay for lay in layers}
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
    rows = torch.arange(len(tokens), device=tokens.device)
    return {lay: cache[name][rows, :, pos.to(tokens.device)].cpu() for name, lay in names.items()}


# --- the family of ablation references ----------------------------------------------------------------
def _draw_references(task, reference, how: str, draws: int, seed: int) -> list:
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


def _aligned_mean(ref_z: Tensor, ref_ans: Tensor, ans: Tensor, width: int) -> Tensor:
    """[batch, pos, head, d_head]: at input b's position p, the mean over references r of z_r at
    ref_ans[r] + (p - ans[b]) (the same offset from the answer position), where that position exists; the
    per-position mean where no reference has it."""
    n_ref, ref_w = ref_z.shape[:2]
    plain = ref_z.mean(0)  # [ref_pos, head, d_head]
    offsets = torch.arange(-(width - 1), width)  # [offset]
    at = ref_ans.cpu()[None, :] + offsets[:, None]  # [offset, ref]
    ok = (at >= 0) & (at < ref_w)
    gathered = ref_z[torch.arange(n_ref)[None, :], at.clamp(0, ref_w - 1)]  # [offset, ref, head, d_head]
    weight = ok.to(ref_z.dtype)[..., None, None]
    count = ok.sum(1)  # [offset]
    table = (gathered * weight).sum(1) / count.clamp(min=1).to(ref_z.dtype)[:, None, None]  # [offset, head, d_head]
    p = torch.arange(width)[None, :]  # [1, pos]
    index = p - ans.cpu()[:, None] + width - 1  # [batch, pos]
    fallback = plain[p.clamp(max=ref_w - 1)].expand(len(ans), -1, -1, -1)
    return torch.where((count[index] > 0)[..., None, None], table[index], fallback)


def _replacements(model, players, batch: Batch, how: str, references: list, seed: int) -> dict:
    """{player: [draws * batch, pos, d_head]}: what each player writes when ablated, one block of inputs per
    reference draw (stacked on the batch axis)."""
    n, width = batch.tokens.shape
    layers = sorted({lay for lay, _ in players})
    if how == "zero":
        return {p: torch.zeros(n, width, model.cfg.d_head) for p in players}
    blocks: dict = {p: [] for p in players}
    for d, ref in enumerate(references):
        ref_tokens = as_tokens(model, ref)
        if ref_tokens.shape[1] < width:
            raise ValueError(f"inputs of length {width} are longer than the {how}-ablation reference "
                             f"({ref_tokens.shape[1]} positions)")  # fmt: skip
        ref_z = {lay: z.cpu() for lay, z in reference_z(model, ref_tokens, set(layers)).items()}
        for lay, head in players:
            z = ref_z[lay][:, :, head]  # [ref, ref_pos, d_head]
            if how == "mean":
                value = z[:, :width].mean(0).expand(n, -1, -1)
            elif how == "resample":
                order = resample_order(len(z), seed + d)
                value = z[order[torch.arange(n) % len(z)], :width]
            else:  # mean-aligned
                value = _aligned_mean(z[:, :, None], ref.answer_pos, batch.answer_pos, width)[:, :, 0]
            blocks[(lay, head)].append(value)
    return {p: torch.cat(v) for p, v in blocks.items()}


# --- composition and backup (plain hooks: each measurement is a forward pass) ---------------------------
def _run_with(model, tokens, pos, values: dict, cache_names=()) -> tuple[Tensor, dict]:
    """(logits at the read rows, cache) with each (layer, head) of `values` writing its given z."""
    cache = {}

    def keep(x, hook):
        cache[hook.name] = x.detach()

    with hooks_added(model, z_hooks(values) + [(name, keep) for name in cache_names]):
        logits = model(tokens)
    return logits[torch.arange(len(tokens)), pos].double().cpu(), cache


def _head_direct(model, z: Tensor, head: tuple[int, int], rows, pos, scale: Tensor | None) -> Tensor:
    """[batch, vocab] head's direct contribution to the logits at the read rows from its z [batch, pos,
    d_head], through the final norm with its scale held at `scale` ([batch, 1])."""
    from headcoop.analysis.engine.norms import frozen_norm

    out = (z[rows, pos].to(model.W_U.dtype) @ model.blocks[head[0]].attn.W_O[head[1]]).cpu()
    ln = getattr(model, "ln_final", None)
    out = frozen_norm(ln, out, scale, bias=False) if scale is not None else out
    return (out @ model.W_U.cpu()).double()


# --- words --------------------------------------------------------------------------------------------
def _band(thresholds: dict, band: tuple[float, float]) -> list[tuple[str | None, float, dict]]:
    """The threshold readings: the defaults, then each threshold at each factor of `band` (a share at most
    (1 + default) / 2)."""
    out = [(None, 1.0, dict(thresholds))]
    for name, value in thresholds.items():
        for factor in band:
            changed = dict(thresholds)
            changed[name] = min(value * factor, (1 + value) / 2) if value < 1 else value * factor
            out.append((name, factor, changed))
    return out


class _Writes:
    """The writes axis of every pair (clean run), per write floor and rank tolerance, computed once each:
    a head writes to a completion where its contribution exceeds `floor` times its largest on that input."""

    def __init__(self, heads_dla, players, pairs, answer, outs, source):
        self.ok = not isinstance(heads_dla, str)
        self.players, self.pairs, self.answer, self.outs, self.source = players, pairs, answer, outs, source
        self.dla = None if not self.ok else [heads_dla[:, lay, h][:, outs] for lay, h in players]
        self._at, self._ranks = {}, {}

    def at(self, floor: float) -> list[tuple[float, float, Tensor]]:
        """Per pair: (multi share of inputs, only-answer share of those, only-answer-and-multi [batch], multi
        [batch])."""
        if floor not in self._at:
            n = len(self.answer)
            if not self.ok:
                self._at[floor] = [(0.0, 0.0, torch.zeros(n, dtype=torch.bool), torch.zeros(n, dtype=torch.bool))] \
                    * len(self.pairs)  # fmt: skip
                return self._at[floor]
            position = torch.full((int(max(self.outs.max(), self.answer.max())) + 1,), -1, dtype=torch.long)
            position[self.outs] = torch.arange(len(self.outs))
            col = position[self.answer]
            sets = [d > floor * d.max(-1, keepdim=True).values.clamp(min=0) for d in self.dla]
            cons = self._consistent()
            out = []
            for i, j in self.pairs:
                multi, only = superposed(sets[i], sets[j], cons[i], cons[j], col)
                out.append((float(multi.double().mean()), float((only & multi).sum()) / max(int(multi.sum()), 1),
                            only & multi, multi))  # fmt: skip
            self._at[floor] = out
        return self._at[floor]

    def _consistent(self) -> list[Tensor]:
        """Per head [batch, output]: the completions consistent with its attended source (floor-independent)."""
        if not hasattr(self, "_cons"):
            self._cons = [consistent_outputs(self.source[:, i], self.answer, self.outs) for i in range(len(self.players))]
        return self._cons

    def ranks(self, m: int, tol: float) -> tuple[int, int]:
        if not self.ok:
            return 0, 0
        i, j = self.pairs[m]
        for h in (i, j):
            if (h, tol) not in self._ranks:
                self._ranks[(h, tol)] = conditional_rank(self.dla[h], self.source[:, h], tol)
        return self._ranks[(i, tol)], self._ranks[(j, tol)]


class _Evidence:
    """The per-input evidence of one ablation reading (one draw): metric values of every coalition, and
    the heads' effects."""

    def __init__(self, v: Tensor, s: Tensor, ld: Tensor, k: int, pairs: list, binary: bool):
        self.v, self.s, self.ld, self.k, self.pairs, self.binary = v, s, ld, k, pairs, binary
        idx_without = torch.tensor([2 + 2 * i for i in range(k)])
        idx_alone = idx_without + 1
        self.total = s[0][None] - s[idx_without]  # [k, batch]
        self.isolated = s[idx_alone] - s[1][None]
        self.total_ci = effect_interval(self.total)
        self.isolated_ci = effect_interval(self.isolated)
        scale_s = torch.maximum(self.total_ci[0].abs(), self.isolated_ci[0].abs()).sum()
        self.scale_s = float(scale_s)
        self.total_v = v[0][None] - v[idx_without]
        self.total_v_ci = effect_interval(self.total_v)
        self.isolated_v_ci = effect_interval(v[idx_alone] - v[1][None])
        if not binary:  # a continuous metric is its own continuous reading
            self.total_v_ci, self.isolated_v_ci = self.total_ci, self.isolated_ci
        scale_v = torch.maximum(self.total_v_ci[0].abs(), self.isolated_v_ci[0].abs()).sum()
        self.scale_v = max(float(scale_v), 1e-12)
        at = torch.tensor([2 + 2 * k + 2 * m for m in range(len(pairs))], dtype=torch.long)
        ii = torch.tensor([i for i, _ in pairs], dtype=torch.long)
        jj = torch.tensor([j for _, j in pairs], dtype=torch.long)
        w, a = 2 + 2 * jj, 3 + 2 * ii
        self.full = (v[0][None].expand(len(pairs), -1), v[w], v[2 + 2 * ii], v[at])
        self.isol = (v[at + 1], v[a], v[3 + 2 * jj], v[1][None].expand(len(pairs), -1))
        self.full_ld = (ld[0][None].expand(len(pairs), -1), ld[w], ld[2 + 2 * ii], ld[at])
        self.isol_ld = (ld[at + 1], ld[a], ld[3 + 2 * jj], ld[1][None].expand(len(pairs), -1))

    def roles(self, role: float, held: dict | None = None) -> tuple[list[str], list[str]]:
        """(role per head, which reading decided it: "v" the metric, "s" its continuous reading). The total
        effect, else the isolated one, on the metric; for accuracy, where neither moves it, the margin's. A
        head with a backup (`held`: {head: (total on the metric, total on the continuous reading) [batch]
        with its backup held at its unablated output}) is read before the compensation."""
        tau_v, tau_s = role * self.scale_v / self.k, role * self.scale_s / self.k
        readings = [("v", self.total_v_ci, tau_v), ("v", self.isolated_v_ci, tau_v)]
        if self.binary:
            readings += [("s", self.total_ci, tau_s), ("s", self.isolated_ci, tau_s)]
        held = held or {}
        out, kinds = [], []
        for i in range(self.k):
            found, kind = "inactive", ""
            mine = readings
            if i in held:  # the head's own interval, put at its index
                tv, ts = (tuple(torch.full((self.k,), float(x)) for x in effect_interval(h)) for h in held[i])
                mine = [("v", tv, tau_v), readings[1]] + ([("s", ts, tau_s), readings[3]] if self.binary else [])
            for which, (mean, lo, hi), tau in mine:
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
        """Shares per pair [pair] in the chosen context, and the chosen context's codes [pair, batch]."""
        tau = th["role"] * self.scale_v * 2 / self.k
        result = {}
        for context, f, l in (("full", self.full, self.full_ld), ("isolated", self.isol, self.isol_ld)):
            matters, classes = necessity_classes(*f, self.binary, tau, th["cutoff"])
            count = matters.sum(-1).clamp(min=1).double()
            share = {c: (classes[c] & matters).sum(-1).double() / count for c in CLASSES}
            needed = (classes["and"] | classes["shared"]) & matters
            l11, l10, l01, l00 = l
            additive = ((l11 - l10 - l01 + l00).abs() <= th["cutoff"] * (l11 - l00).abs().clamp(min=1e-9)) & needed
            result[context] = dict(matters=matters.double().mean(-1), additive=additive.sum(-1).double()
                                   / needed.sum(-1).clamp(min=1).double(), classes=classes, mask=matters, **share)  # fmt: skip
        use_full = (result["full"]["matters"] >= th["min_share"]) | (result["isolated"]["matters"] < th["min_share"])
        return dict(use_full=use_full, **result)


def _pair_word(a, b, ra, rb, th, nec, m, static, writes, comp) -> tuple[str, str]:
    """(word, reason) of pair m under one reading (module docstring, rules 1-6)."""
    if "inactive" in (ra, rb):
        return "inactive", f"{a if ra == 'inactive' else b} has no effect on the metric"
    if {ra, rb} == {"supports", "competes"}:
        return "competition", f"{a if ra == 'competes' else b} pushes against the answer"
    if ra == rb == "competes":
        return "undetermined", "both heads push against the answer"
    if comp is not None and comp >= th["composition"]:
        return "composition", f"{comp:.0%} of the earlier head's effect runs through the later head's inputs"
    st = static[m]
    multi, only = writes.at(th["floor"])[m][:2]
    rank_a, rank_b = writes.ranks(m, th["rank_tol"])
    if (rank_a >= 2 and rank_b >= 2 and multi >= th["min_share"] and only >= th["majority"]
            and st["distributed"] >= th["majority"]):
        return "superposition", (f"both write several consistent completions on {multi:.0%}, only the answer "
                                 f"together on {only:.0%} of those, sources distributed on {st['distributed']:.0%}")  # fmt: skip
    e = nec["full"] if bool(nec["use_full"][m]) else nec["isolated"]
    matters = float(e["matters"][m])
    if matters < th["min_share"]:
        return "undetermined", f"the pair matters on {matters:.0%} of inputs"
    s = {c: float(e[c][m]) for c in CLASSES}
    if s["or"] >= th["majority"]:
        return "redundant", f"either alone answers {s['or']:.0%}"
    if s["i_only"] >= th["division"] and s["j_only"] >= th["division"] and s["i_only"] + s["j_only"] >= th["majority"]:
        return "division", f"{a} alone on {s['i_only']:.0%}, {b} alone on {s['j_only']:.0%}"
    needed = s["and"] + s["shared"]
    if needed >= th["majority"]:
        if st["by_construction"]:
            return "not testable", "the logit difference is additive over these heads by construction"
        if float(e["additive"][m]) >= th["majority"]:
            return "independent", f"both needed on {needed:.0%}, logit effects add on {float(e['additive'][m]):.0%}"
        return "undetermined", f"both needed on {needed:.0%}, neither superposed nor additive"
    shown = ", ".join(f"{c} {v:.0%}" for c, v in s.items() if v > 0)
    return "undetermined", f"the evidence conflicts ({shown or 'no class'})"


def _by_ablation(words: list[str], readings: list[Reading]) -> str:
    """Per ablation, its most common word and that word's share of the ablation's readings."""
    parts = []
    for how in dict.fromkeys(r.how for r in readings):
        mine = [w for w, r in zip(words, readings) if r.how == how]
        word, count = Counter(mine).most_common(1)[0]
        parts.append(f"{how}: {word}" + ("" if count == len(mine) else f" {count / len(mine):.0%}"))
    return "; ".join(parts)


def _model_word(words: list[str]) -> str:
    active = [w for w in words if w != "inactive"]
    if not active:
        return "undetermined"
    word, count = Counter(active).most_common(1)[0]
    return word if count > len(active) / 2 else "undetermined"


def _stand(words: list[str], readings: list[Reading], agree: float) -> tuple[str, float, str]:
    """(the word that stands, the share of readings giving the most common word, what flips it). What flips
    it: the candidate (the most common word other than "undetermined") and the group of readings (an
    ablation, or a threshold at a factor) where it holds least often, e.g. "redundant: 0% under resample"."""
    counts = Counter(words)
    word, count = counts.most_common(1)[0]
    share = count / len(words)
    candidates = [w for w, _ in counts.most_common() if w != "undetermined"]
    if share == 1.0 or not candidates:
        return word, share, ""
    cand = candidates[0]
    groups: dict[str, list[bool]] = {}
    for r, w in zip(readings, words):
        groups.setdefault(r.how, []).append(w == cand)
        if r.threshold is not None:
            groups.setdefault(f"{r.threshold} x{r.factor:g}", []).append(w == cand)
    held = {g: sum(v) / len(v) for g, v in groups.items()}
    ablations = {r.how for r in readings}
    worst = min(held, key=lambda g: (held[g], g not in ablations, list(held).index(g)))  # ablations named first
    flip = f"{cand} in {counts[cand] / len(words):.0%} of readings, {held[worst]:.0%} under {worst}"
    return (word if share >= agree else "undetermined"), share, flip


@with_progress("hc.cooperation", cheaper="fewer heads=, draws=1 or how='mean' is cheaper")
@torch.no_grad()
def cooperation(
    model: HookedTransformer,
    task=None,
    heads=None,
    how: ReadingHow | tuple | list | str = "family",
    metric: MetricName = "accuracy",
    inputs=None,
    reference=None,
    seed: int = 0,
    threshold: float | None = None,
    min_share: float | None = None,
    n: int = 512,
    max_exact: int = MAX_EXACT,
    top_pairs: int | None = None,
    screen_budget: int | None = None,
    draws: int = 4,
    thresholds: dict | None = None,
    band: tuple[float, float] = (0.5, 2.0),
    agree: float = 0.9,
    outputs=None,
    progress: bool | None = None,
) -> Cooperation:
    """The word of every pair of heads and the role of every head over a family of readings (module
    docstring).

    task:      the task whose inputs are used (default the model's); inputs: a Batch (answers known),
               default task.sample(n, seed).
    heads:     the players, in any form `hc.ablate` takes; default every head.
    how:       "family" (zero, mean, resample and mean-aligned), one of them, or a list of them.
    metric:    "accuracy" (default; a tie is no answer), "logit_diff", "prob", "loss".
    reference: the ablation reference (default task samples of 512); draws: reference draws per ablation.
    thresholds: overrides of `THRESHOLDS` (threshold= and min_share= set "role" and "min_share"); band: the
               factors each threshold is read at besides 1; agree: the share of readings a word needs.
    outputs:   the completions the writes are read over (token ids; default every answer of the inputs).
    progress:  a tqdm bar over the call's runs, shown after 2 s (default: `hc.set_progress`, on unless turned off).
    max_exact: the Shapley interaction index of each pair (`interaction`, no rule uses it) is computed
               exactly up to this many heads (mean ablation, first draw); above, NaN, or shapiq's ranking
               with top_pairs / screen_budget as `hc.interactions`.
    Long: nine jobs in one function, to be split into the mechanisms package (axes, evidence, words) by issue 48.
    """
    require_model(model, "cooperation")
    check_choice("metric", metric, METRIC_NAMES)
    hows = _parse_hows(how)
    check_int("n", n, 1)
    check_int("max_exact", max_exact, 2, 24)
    check_int("draws", draws, 1, 64)
    check_float("agree", agree, 0.5, 1.0)
    if top_pairs is not None:
        check_int("top_pairs", top_pairs, 1)
    if screen_budget is not None:
        check_int("screen_budget", screen_budget, 2)
    check_seed(seed)
    th = dict(THRESHOLDS)
    if thresholds is not None and not isinstance(thresholds, dict):
        raise TypeError(f"thresholds must be a dict of threshold name -> value (names {list(THRESHOLDS)}), got {thresholds!r}")
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
    band = tuple(check_float(f"band[{i}]", f, 0, low_open=True) for i, f in enumerate(band))
    if outputs is not None:  # checked before any run: the completions the writes are read over
        outputs = _check_outputs(outputs, model.cfg.d_vocab_out)
    ablating = [h for h in hows if h != "zero"]
    if task is None and (inputs is None or (reference is None and ablating)):
        task = require_task(model, "hc.cooperation's inputs" if inputs is None else "the ablation reference")
    batch = inputs if inputs is not None else task.mechanism_inputs(n, seed=seed)
    if not isinstance(batch, Batch):
        raise TypeError(f"inputs= must be a Batch (answers known, e.g. task.sample(n) or Batch.from_answers), "
                        f"got {type(batch).__name__}")  # fmt: skip
    if "mean-aligned" in hows and reference is not None and not isinstance(reference, Batch):
        hows = tuple(h for h in hows if h != "mean-aligned")  # plain ids carry no answer positions
    players = [(lay, h) for lay in range(model.cfg.n_layers) for h in range(model.cfg.n_heads)] if heads is None \
        else parse_heads(model, heads)  # fmt: skip
    k = len(players)
    if k < 2:
        raise ValueError(f"cooperation needs at least 2 heads, got {k}")
    if k > ALL_PAIRS_UP_TO and top_pairs is None:
        raise ValueError(f"cooperation reads every pair of up to {ALL_PAIRS_UP_TO} heads; {k} given: pass heads= "
                         f"(the heads to compare) or top_pairs= (the strongest pairs by interaction)")  # fmt: skip
    names = tuple(head_name(*p) for p in players)
    device = batch.tokens.device
    pos = batch.answer_pos.to(device)
    answer = batch.answer.cpu()
    binary = metric == "accuracy"

    # the pairs with per-input evidence
    pairs = list(itertools.combinations(range(k), 2))
    inter = torch.full((k, k), float("nan"))
    pairs_note = ""
    primary_how = "mean" if "mean" in hows else hows[0]
    primary_refs = None
    if primary_how != "zero":
        primary_refs = _draw_references(task, reference, primary_how if primary_how != "mean-aligned" else "mean", 1, seed)
    if k <= max_exact:
        inter = interactions(model, tokens=batch, heads=list(names), metric=metric,
                             how="zero" if primary_how == "zero" else ("resample" if primary_how == "resample" else "mean"),
                             reference=None if primary_how == "zero" else primary_refs[0], seed=seed,
                             method="exact").interaction  # fmt: skip
    elif top_pairs is not None:
        screen = screen_budget if screen_budget is not None else max(2000, 20 * k)
        ranking = CoalitionGame(model, players, tokens=batch, metric=metric, how="zero" if primary_how == "zero" else "mean",
                                seed=seed, reference=None if primary_how == "zero" else primary_refs[0])  # fmt: skip
        inter, _, pairs = top_interactions(HeadGame(ranking), top_pairs, screen, 64, seed)
        pairs = sorted(pairs)
        pairs_note = (f"; per-input evidence for the top {len(pairs)} of {k * (k - 1) // 2:,} pairs by |interaction| "
                      f"only (shapiq SVARM-IQ at {screen:,} coalitions, then 64 draws per pair)")  # fmt: skip
    else:
        pairs_note = f"; Shapley interaction index not computed ({k} heads > max_exact={max_exact})"

    # --- the clean run: writes, attention, direct effects (the same under every reading)
    logits_clean = model(batch.tokens)[torch.arange(len(batch)), pos].double().cpu()
    wrong = batch.wrong.cpu() if batch.wrong is not None else None
    fixed_wrong = wrong if wrong is not None else logits_clean.scatter(-1, answer[:, None], float("-inf")).argmax(-1)
    heads_dla = _head_dla(model, batch.tokens, pos)
    no_dla = heads_dla if isinstance(heads_dla, str) else None
    rows = torch.arange(len(batch))
    best_other = logits_clean.scatter(-1, answer[:, None], float("-inf")).argmax(-1)
    sign_wrong = best_other if metric == "accuracy" or wrong is None else wrong
    direct = torch.full((k,), float("nan"), dtype=torch.float64)
    if no_dla is None:
        direct = torch.stack([(heads_dla[rows, lay, h, answer] - heads_dla[rows, lay, h, sign_wrong]).mean()
                              for lay, h in players])  # fmt: skip
    patterns = _patterns(model, batch.tokens, pos, sorted({lay for lay, _ in players}))
    source = torch.stack([attended_sources(patterns[lay][:, h:h + 1], batch.tokens.cpu())[1][:, 0]
                          for lay, h in players], 1)  # [batch, player]: the token each head attends most  # fmt: skip
    declared = None if task is None or outputs is not None else task.completions()
    outs = torch.as_tensor(outputs if outputs is not None else declared if declared is not None else answer.unique(),
                           dtype=torch.long).cpu()  # fmt: skip
    vocab = model.cfg.d_vocab_out
    if outs.ndim != 1 or bool(((outs < 0) | (outs >= vocab)).any()):
        raise ValueError(f"outputs= must be a list of token ids in 0..{vocab - 1}, got {outs.tolist()[:10]}")
    outs = torch.cat([outs, answer.unique()]).unique()  # every answer is a completion
    static = [dict(by_construction=_additive_by_construction(model, players[i], players[j]),
                   distributed=float(distributed(source[:, i], source[:, j]).double().mean())) for i, j in pairs]
    writes = _Writes(heads_dla, players, pairs, answer, outs, source)
    input_superposed = [writes.at(th["floor"])[m][2] for m in range(len(pairs))]
    input_multi = [writes.at(th["floor"])[m][3] for m in range(len(pairs))]

    # --- the coalitions: all, none, all but i, i alone, all but i and j, i and j alone
    full, empty = torch.ones(k, dtype=torch.bool), torch.zeros(k, dtype=torch.bool)
    masks = [full, empty]
    for i in range(k):
        masks += [full.clone().index_fill_(0, torch.tensor([i]), False), empty.clone().index_fill_(0, torch.tensor([i]), True)]
    for i, j in pairs:
        both = torch.tensor([i, j])
        masks += [full.clone().index_fill_(0, both, False), empty.clone().index_fill_(0, both, True)]
    masks = torch.stack(masks)
    cross = [(m, i, j) for m, (i, j) in enumerate(pairs) if players[i][0] != players[j][0]]

    evidence: dict[tuple[str, int], _Evidence] = {}
    held_totals: dict[str, dict] = {h: {} for h in hows}  # per ablation: {head: its total effect, backup held}
    composition: dict[str, dict[int, float]] = {}
    backup_rows, compensation = [], torch.zeros(k, k, dtype=torch.float64)
    methods = []
    for h in hows:
        refs = [None] if h == "zero" else _draw_references(task, reference, h, draws, seed)
        repl = _replacements(model, players, batch, h, refs, seed)
        stacked = Batch.cat([batch] * len(refs)) if len(refs) > 1 else batch
        game = CoalitionGame(model, players, tokens=stacked, metric="logit_diff", how="zero" if h == "zero" else "mean",
                             reference=None if h == "zero" else refs[0], seed=seed, replacements=repl)  # fmt: skip
        logits = game.row_logits(masks).cpu().reshape(len(masks), len(refs), len(batch), -1)
        methods.append(f"{h}: {game.method}")
        for d in range(len(refs)):
            lg = logits[:, d]
            evidence[(h, d)] = _Evidence(_per_input(metric, lg, answer, wrong), _signed(metric, lg, answer, wrong),
                                         per_input_metric("logit_diff", lg, answer, fixed_wrong), k, pairs, binary)  # fmt: skip
        first = {p: v[: len(batch)] for p, v in repl.items()}
        composition[h] = _composition(model, batch.tokens, pos, players, cross, first, evidence[(h, 0)], metric,
                                      answer, wrong)  # fmt: skip
        if no_dla is None and cross:
            tau = th["role"] * evidence[(h, 0)].scale_s / k  # the role threshold on the continuous reading
            rows_h, comp_h, held_h = _backup(model, batch.tokens, pos, players, names, cross, first, h, answer, sign_wrong,
                                             direct, metric, wrong, logits_clean, th, tau)  # fmt: skip
            backup_rows += rows_h
            ev_first = evidence[(h, 0)]
            for row in sorted(rows_h, key=lambda r: -r["own_compensation"]):  # the strongest backup of each head
                e, l_ = names.index(row["of"]), names.index(row["backup"])
                if row["backs_up"] and e not in held_totals[h]:
                    v_held, s_held = held_h[(e, l_)]
                    held_totals[h][e] = (ev_first.v[0] - v_held, ev_first.s[0] - s_held)
            if h == primary_how:
                compensation = comp_h

    # --- words under every reading
    threshold_readings = _band(th, band)
    readings = [Reading(h, d, name, f) for (h, d) in evidence for name, f, _ in threshold_readings]
    all_words, all_reasons, all_roles, model_words = [], [], [], []
    for (h, d), ev in evidence.items():
        for name, f, thr in threshold_readings:
            roles, kinds = ev.roles(thr["role"], held_totals[h])
            nec = ev.necessity(thr)
            words, reasons = [], []
            for m, (i, j) in enumerate(pairs):
                comp = _composition_share(composition[h].get(m), ev, roles, kinds, thr["role"])
                word, reason = _pair_word(names[i], names[j], roles[i], roles[j], thr, nec, m, static, writes, comp)
                words.append(word)
                reasons.append(reason)
            all_words.append(words)
            all_reasons.append(reasons)
            all_roles.append(roles)
            model_words.append(_model_word(words))
    labels = [r.label for r in readings]
    primary = next(idx for idx, r in enumerate(readings) if r.how == primary_how and r.draw == 0 and r.threshold is None)

    # --- what stands
    ev0 = evidence[(primary_how, 0)]
    nec0 = ev0.necessity(th)
    table, input_class = [], []
    for m, (i, j) in enumerate(pairs):
        words = [w[m] for w in all_words]
        word, share, flip = _stand(words, readings, agree)
        reason = all_reasons[primary][m] if word == all_words[primary][m] else \
            f"readings disagree: {share:.0%} give {Counter(words).most_common(1)[0][0]}"  # fmt: skip
        use_full = bool(nec0["use_full"][m])
        e = nec0["full"] if use_full else nec0["isolated"]
        code = torch.full((len(batch),), INPUT_CLASSES.index("other"), dtype=torch.int8)
        for c, label in zip(CLASSES, ("or", "and", "a_only", "b_only", "shared")):
            code[e["classes"][c][m]] = INPUT_CLASSES.index(label)
        input_class.append(code.masked_fill_(~e["mask"][m], 0))
        st = static[m]
        multi, only = writes.at(th["floor"])[m][:2]
        rank_a, rank_b = writes.ranks(m, th["rank_tol"])
        f = ev0.full
        table.append(dict(head_a=names[i], head_b=names[j], mechanism=word, agreement=share, flips_under=flip,
                          reason=reason, primary_word=all_words[primary][m], by_ablation=_by_ablation(words, readings), context="full" if use_full else "isolated",
                          matters=float(e["matters"][m]), **{c: float(e[c][m]) for c in CLASSES},
                          additive_ld=float(e["additive"][m]), multi=multi, only_answer=only,
                          distributed=st["distributed"], rank_a=rank_a, rank_b=rank_b, composition=_share_or_nan(composition[primary_how].get(m), ev0, th, held_totals[primary_how]),
                          interaction=float(inter[i, j]),
                          interaction_full=float((f[0][m] - f[1][m] - f[2][m] + f[3][m]).mean()),
                          isolated_matters=float(nec0["isolated"]["matters"][m])))  # fmt: skip
    frame = pd.DataFrame(table).rename(columns={"i_only": "a_only", "j_only": "b_only"})
    role_table, roles_final = [], {}
    for i, name in enumerate(names):
        rs = [r[i] for r in all_roles]
        role, share, flip = _stand(rs, readings, agree)
        roles_final[name] = role
        tot, tlo, thi = (float(x[i]) for x in ev0.total_ci)
        iso = float(ev0.isolated_ci[0][i])
        dir_i = float(direct[i])
        later = [c for c in frame.itertuples() if name in (c.head_a, c.head_b) and c.composition == c.composition
                 and c.composition >= th["composition"] and players[names.index(c.head_b if c.head_a == name else c.head_a)][0]
                 > players[i][0]]  # fmt: skip
        via = "later heads" if later and role == "supports" else \
            ("direct" if role == "supports" and no_dla is None and dir_i >= 0.5 * tot else "")  # fmt: skip
        role_table.append(dict(head=name, role=role, role_agreement=share, role_flips_under=flip, total_effect=tot,
                               total_low=tlo, total_high=thi, isolated_effect=iso, direct_effect=dir_i, via=via,
                               self_repair=dir_i - tot if no_dla is None else float("nan")))  # fmt: skip
    head_table = pd.DataFrame(role_table).set_index("head")
    backers = {name: [] for name in names}
    for row in backup_rows:
        if row["backs_up"] and row["how"] == primary_how:
            backers[row["backup"]].append(row["of"])
    head_table["backs_up"] = [", ".join(backers[name]) for name in names]
    overall, overall_share, overall_flip = _stand(model_words, readings, agree)
    overall_by = _by_ablation(model_words, readings)
    counts = frame["mechanism"].value_counts()
    shares = {m: float(counts.get(m, 0)) / len(frame) for m in MECHANISMS}
    words_frame = pd.DataFrame([w for w in all_words], index=labels,
                               columns=[f"{names[i]}&{names[j]}" for i, j in pairs]).T  # fmt: skip
    reading_rows = [dict(reading=r.label, how=r.how, draw=r.draw, threshold=r.threshold or "", factor=r.factor,
                         model_word=mw, **{w: ws.count(w) for w in MECHANISMS})
                    for r, mw, ws in zip(readings, model_words, all_words)]  # fmt: skip
    method = (f"{len(masks)} coalitions per input and reading; {len(readings)} readings ({len(evidence)} ablation "
              f"readings x {len(threshold_readings)} threshold readings); a word stands at {agree:.0%} agreement; "
              + "; ".join(methods) + pairs_note + ("" if no_dla is None else f"; no direct effects ({no_dla}): writes "
              "not measured, superposition cannot be said"))  # fmt: skip
    return Cooperation(heads=names, pairs=frame, head_table=head_table, backup=pd.DataFrame(backup_rows, columns=BACKUP_COLUMNS),
                       readings=pd.DataFrame(reading_rows), words=words_frame, compensation=compensation.float(),
                       roles=roles_final, mechanism=overall, agreement=overall_share,
                       flips=overall_flip, by_ablation=overall_by, shares=shares, metric=metric, how=primary_how,
                       hows=tuple(hows), method=method, thresholds=th, agree=agree,
                       v_full=float(ev0.v[0].mean()), v_empty=float(ev0.v[1].mean()),
                       input_class=torch.stack(input_class), input_superposed=torch.stack(input_superposed),
                       input_multi=torch.stack(input_multi))  # fmt: skip


ALL_PAIRS_UP_TO = 32
BACKUP_COLUMNS = ["backup", "of", "how", "own_compensation", "norm_compensation", "logit_share", "answers_lost",
                  "answers_restored", "backs_up"]  # fmt: skip


def _share_or_nan(comp, ev: _Evidence, th: dict, held: dict | None = None) -> float:
    roles, kinds = ev.roles(th["role"], held)
    share = _composition_share(comp, ev, roles, kinds, th["role"])
    return float("nan") if share is None else share


def _check_outputs(outputs, d_vocab: int) -> Tensor:
    """The completions the writes are read over, as token ids [output]; ValueError naming a bad one."""
    values = outputs.tolist() if isinstance(outputs, Tensor) else list(outputs) if isinstance(outputs, (list, tuple)) else None
    if not values:
        raise ValueError(f"outputs must be a non-empty list of token ids, got {outputs!r}")
    ids = [check_int(f"outputs[{i}]", v, 0, d_vocab - 1) for i, v in enumerate(values)]
    return torch.tensor(ids, dtype=torch.long)


def _parse_hows(how) -> tuple[str, ...]:
    if not isinstance(how, (str, list, tuple)):
        raise TypeError(f'how must be "family", one of {list(READING_HOWS)} or a list of them, got {how!r}')
    if isinstance(how, str):
        check_choice("how", how, READING_HOWS + ("family",))
        return READING_HOWS if how == "family" else (how,)
    hows = tuple(how)
    if not hows:
        raise ValueError(f"how= needs at least one ablation of {list(READING_HOWS)}")
    for h in hows:
        check_choice("how", h, READING_HOWS)
    return hows


def _composition(model, tokens, pos, players, cross, repl_first, ev: _Evidence, metric, answer, wrong) -> dict:
    """{pair index: (earlier head, later head, through on the metric, through on its continuous reading)}:
    the drop of the metric when only the later head's z takes the value it has with the earlier head
    ablated (every path from the earlier head into the later one's q, k and v; the rest of the run as it
    is). Plain hooks on hook_z: HookedTransformers and TransformerBridges alike."""
    out = {}
    by_earlier: dict[int, list] = {}
    for m, i, j in cross:
        e, l = (i, j) if players[i][0] < players[j][0] else (j, i)
        by_earlier.setdefault(e, []).append((m, l))
    for e, items in by_earlier.items():
        names = sorted({get_act_name("z", players[l][0]) for _, l in items})
        _, ablated = _run_with(model, tokens, pos, {players[e]: repl_first[players[e]]}, names)
        for m, l in items:
            lay, head = players[l]
            logits, _ = _run_with(model, tokens, pos, {players[l]: ablated[get_act_name("z", lay)][:, :, head]})
            through_v = float((ev.v[0] - _per_input(metric, logits, answer, wrong)).mean())
            through_s = float((ev.s[0] - _signed(metric, logits, answer, wrong)).mean())
            out[m] = (e, l, through_v, through_s)
    return out


def _composition_share(comp, ev: _Evidence, roles: list[str], kinds: list[str], role: float) -> float | None:
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


def _backup(model, tokens, pos, players, names, cross, repl_first, how, answer, sign_wrong, direct, metric, wrong,
            logits_clean, th, tau: float) -> tuple[list, Tensor, dict]:  # fmt: skip
    """Backup rows (module docstring) for every (earlier head i, later head j), compensation [i, j], and the
    metric and its continuous reading per input [batch] with i ablated and j held at its unablated output
    ({(i, j): (values, continuous)})."""
    k = len(players)
    rows = torch.arange(len(tokens))
    comp = torch.zeros(k, k, dtype=torch.float64)
    out = []
    has_norm = getattr(model, "ln_final", None) is not None and model.cfg.normalization_type is not None
    scale_name = "ln_final.hook_scale"
    zl = sorted({get_act_name("z", lay) for lay, _ in players})
    _, clean = _run_with(model, tokens, pos, {}, zl + ([scale_name] if has_norm else []))
    scale0 = clean[scale_name][rows, pos].cpu() if has_norm else None  # [batch, 1]
    pairs = {}
    for _, i, j in cross:
        e, l = (i, j) if players[i][0] < players[j][0] else (j, i)
        pairs.setdefault(e, []).append(l)
    ok_clean = _per_input("accuracy", logits_clean, answer, None) > 0.5
    held_values = {}
    for e, laters in pairs.items():
        value = {players[e]: repl_first[players[e]]}
        ablated_logits, abl = _run_with(model, tokens, pos, value, zl + ([scale_name] if has_norm else []))
        scale1 = abl[scale_name][rows, pos].cpu() if has_norm else None
        ok_free = _per_input("accuracy", ablated_logits, answer, None) > 0.5
        for l in laters:
            lay, head = players[l]
            zname = get_act_name("z", lay)
            before = _head_direct(model, clean[zname][:, :, head], players[l], rows, pos, scale0)
            frozen = _head_direct(model, abl[zname][:, :, head], players[l], rows, pos, scale0)
            free = _head_direct(model, abl[zname][:, :, head], players[l], rows, pos, scale1)
            ld = lambda d: d[rows, answer] - d[rows, sign_wrong]  # noqa: E731
            own = float((ld(frozen) - ld(before)).mean())
            norm = float((ld(free) - ld(frozen)).mean())
            held = dict(value)
            held[players[l]] = clean[zname][:, :, head]
            held_logits, _ = _run_with(model, tokens, pos, held)
            ok_held = _per_input("accuracy", held_logits, answer, None) > 0.5
            held_values[(e, l)] = (_per_input(metric, held_logits, answer, wrong), _signed(metric, held_logits, answer, wrong))
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


__all__ = ["cooperation", "Cooperation", "MECHANISMS", "ROLES", "INPUT_CLASSES", "THRESHOLDS", "WORD_SOURCES",
           "READING_HOWS", "superposed_writes"]  # fmt: skip
