"""SkipPair-specific measurements: exact accuracy over every context, preference orderings,
split attention and conditional logit contributions.

Without a positional embedding (SkipPair's W_pos is frozen at zero) the read-off position sees its
context as a multiset: the order of the tokens before it changes nothing at the last position. So
every signal input is one of 10 pairs x C(13, 6) = 1,716 noise multisets (seq_len 10), and every noise
input one of 7 query tokens x C(15, 6) = 5,005 multisets; `contexts` enumerates them with their
exact probabilities, and `exact_evaluate` scores a model on all of them instead of on samples.

Preference ordering of a head: the signal tokens 1..4 sorted by the head's pre-softmax QK score from
the read-off token 0 (`hc.qk`), most preferred first. Two orderings compare as
  "equal"            the same permutation;
  "reversed"         one is the exact reverse of the other (Kendall tau = -1);
  "partly reversed"  neither, with Kendall tau < 0 (they disagree on more pairs than they agree);
  "partly equal"     neither, with Kendall tau >= 0.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from headcoop.analysis.engine.inputs import (
    check_choice,
    check_head,
    check_layer,
    head_names,
    model_device,
    require_task,
)
from headcoop.analysis.nodes.dla import dla
from headcoop.analysis.weights.qkov import ov, qk
from headcoop.checks import check_int, installed_hooks
from headcoop.models.fused import check_supported, fused_logits, stack_parameters
from headcoop.models.tl import HookedTransformer
from headcoop.storage.results import Result
from headcoop.studies.base import Study, StudySection
from headcoop.tasks.skip_pair import NOISE, PAIRS, READ_OFF, SIGNAL, SkipPair

ORDERING_KINDS = ("equal", "reversed", "partly reversed", "partly equal")
KINDS = ("signal", "noise")


def skip_pair_task(model: HookedTransformer) -> SkipPair:
    """The model's SkipPair task; ValueError if it has none or another one."""
    task = require_task(model, "this SkipPair measurement")
    if not isinstance(task, SkipPair):
        raise ValueError(f"this measurement is defined for SkipPair models, got a {type(task).__name__} model")
    return task


def _check_enumerable(model: HookedTransformer) -> None:
    """ValueError unless the read-off output depends on the context's multiset only: one layer, zero W_pos."""
    if model.cfg.n_layers != 1:
        raise ValueError(
            f"exact enumeration treats contexts as multisets, which holds for one-layer models only; this model "
            f"has {model.cfg.n_layers} layers (earlier layers see the order of the tokens)"
        )
    if bool(model.W_pos.abs().max() > 0):
        raise ValueError(
            "exact enumeration treats contexts as multisets, which needs a zero positional embedding "
            "(SkipPair freezes W_pos at 0); this model's W_pos is not zero"
        )


@dataclasses.dataclass(frozen=True)
class Contexts:
    """Every distinct input of one kind, one representative sequence per multiset of context tokens.

    tokens: [n, seq_len] (signal: a, b, noise..., 0; noise: noise..., query)
    weight: [n]  probability of the multiset within its group (a pair type; a whole noise set sums to 1)
    pair:   [n]  index into `SkipPair.pairs` (-1 for noise)
    answer: [n]  the completion of the pair (-1 for noise, whose target is uniform over 5..11)
    """

    tokens: Int[Tensor, "n pos"]
    weight: Float[Tensor, " n"]
    pair: Int[Tensor, " n"]
    answer: Int[Tensor, " n"]


def _multisets(k: int) -> tuple[Int[Tensor, "m k"], Float[Tensor, " m"]]:
    """All multisets of k noise tokens (sorted) and their probability under k independent uniform draws."""
    rows = list(itertools.combinations_with_replacement(NOISE, k))
    probs = []
    for row in rows:
        counts = [row.count(t) for t in set(row)]
        ways = math.factorial(k) // math.prod(math.factorial(c) for c in counts)
        probs.append(ways / len(NOISE) ** k)
    shape = (len(rows), k)
    return torch.tensor(rows, dtype=torch.long).reshape(shape), torch.tensor(probs, dtype=torch.float64)


def contexts(task: SkipPair, kind: str = "signal", pair: tuple[int, int] | None = None) -> Contexts:
    """Every distinct `kind` input of `task` ("signal": all pairs, or only `pair`; "noise") with its
    exact probability within its group. Returns Contexts with tokens [n, task.seq_len]."""
    check_choice("kind", kind, KINDS)
    L = task.seq_len
    if kind == "noise":
        if pair is not None:
            raise ValueError("pair applies to signal contexts only")
        noise, prob = _multisets(L - 1)
        query = torch.tensor(NOISE).repeat_interleave(len(noise))
        tokens = torch.cat([noise.repeat(len(NOISE), 1), query[:, None]], 1)
        weight = prob.repeat(len(NOISE)) / len(NOISE)
        minus = torch.full((len(tokens),), -1, dtype=torch.long)
        return Contexts(tokens, weight, minus, minus.clone())
    pairs: list[Any] = PAIRS if pair is None else [tuple(sorted(pair))]
    if pairs[0] not in PAIRS:
        raise ValueError(f"pair {pair!r} is not a pair of signal tokens 1..4; valid pairs are {PAIRS}")
    noise, prob = _multisets(L - 3)
    m = len(noise)
    blocks = []
    for a, b in pairs:
        head = torch.tensor([a, b]).expand(m, 2)
        blocks.append(torch.cat([head, noise, torch.full((m, 1), READ_OFF)], 1))
    index = torch.tensor([PAIRS.index(p) for p in pairs]).repeat_interleave(m)
    answer = torch.tensor([task.mapping[p] for p in pairs]).repeat_interleave(m)
    return Contexts(torch.cat(blocks), prob.repeat(len(pairs)), index, answer)


@torch.no_grad()
def last_logits(model: HookedTransformer, tokens: Int[Tensor, "n pos"], chunk: int = 8192) -> Float[Tensor, "n vocab"]:
    """The model's logits at the last position, [n, vocab] (float64 on the CPU). For a supported model
    (train_many's fused forward) only that row is computed, over token counts; else the full forward."""
    device = model_device(model)
    try:
        check_supported(model)
        params = stack_parameters([model])
        fast = model.cfg.n_layers == 1 and not installed_hooks(model)  # hooks: the plain forward honours them
    except ValueError:
        fast = False
    parts = []
    for i in range(0, len(tokens), chunk):
        part = tokens[i : i + chunk].to(device)
        if fast:
            last = torch.full((1, len(part), 1), part.shape[1] - 1, device=device)
            logits = fused_logits(params, model.cfg, part[None], last, positional=False)[0, :, 0]
        else:
            logits = model(part)[:, -1]
        parts.append(logits.double().cpu())
    return torch.cat(parts)


@dataclasses.dataclass(frozen=True, repr=False)
class ExactEvaluation(Result):
    """A SkipPair model scored on every input (no sampling), built whole by `exact_evaluate`.

    pair_acc:   per pair type (PAIRS order), the probability that the argmax at the read-off is its
                completion, over all contexts of that type with their exact probabilities
    pair_all:   per pair type, whether every such context is answered right
    completions: per pair type, the completion (task.mapping)
    signal_acc: mean of pair_acc over the 10 pair types (as `SkipPair.evaluate`); signal_all: every
                signal input right. noise_loss: expected cross-entropy on noise inputs (target uniform
                over 5..11), beside noise_loss_optimum = ln 7.
    """

    pair_acc: tuple[float, ...]
    pair_all: tuple[bool, ...]
    completions: tuple[int, ...]
    signal_acc: float
    signal_all: bool
    noise_loss: float
    noise_loss_optimum: float

    def as_dict(self) -> dict[str, float]:
        """Flat numbers for a table row: acc_ab and all_ab per pair {a, b}, signal_acc, signal_all (1.0 / 0.0),
        noise_loss, noise_loss_optimum."""
        out: dict[str, float] = {}
        for (a, b), acc, every in zip(PAIRS, self.pair_acc, self.pair_all):
            out[f"acc_{a}{b}"], out[f"all_{a}{b}"] = acc, float(every)
        out.update(signal_acc=self.signal_acc, signal_all=float(self.signal_all), noise_loss=self.noise_loss,
                   noise_loss_optimum=self.noise_loss_optimum)  # fmt: skip
        return out

    def to_dataframe(self) -> pd.DataFrame:
        """One row per signal pair type: pair, completion, accuracy, right on every context."""
        return pd.DataFrame({
            "pair": [f"{{{a},{b}}}" for a, b in PAIRS], "completion": list(self.completions),
            "accuracy": list(self.pair_acc), "right on every context": list(self.pair_all),
        })  # fmt: skip

    def plot(self, title: str | None = None):
        """Accuracy per signal pair type (exact), the noise loss in the title."""
        from headcoop.display.plot import bar

        labels = [f"{{{a},{b}}}->{c}" for (a, b), c in zip(PAIRS, self.completions)]
        title = title or (
            f"Exact accuracy per pair type (signal {self.signal_acc:.4f}); noise loss {self.noise_loss:.4f}, "
            f"optimum ln 7 = {self.noise_loss_optimum:.4f}"
        )
        return bar(self.pair_acc, labels, title=title, ylabel="accuracy", xlabel="pair -> completion")

    def __repr__(self) -> str:
        return (
            f"ExactEvaluation(signal accuracy {self.signal_acc:.4f}, every signal input right: "
            f"{'yes' if self.signal_all else 'no'}; noise loss {self.noise_loss:.4f} (optimum "
            f"{self.noise_loss_optimum:.4f}); exact over every context)"
        )


@torch.no_grad()
def exact_evaluate(model: HookedTransformer, task: SkipPair | None = None) -> ExactEvaluation:
    """Accuracy on every signal input and the exact noise-case loss (no sampling): an ExactEvaluation
    (`.as_dict()` for a table row, `.to_dataframe()` per pair type, `.plot()`)."""
    task = task or skip_pair_task(model)
    task.check_ready(model, "exact_evaluate")
    _check_enumerable(model)
    sig = contexts(task, "signal")
    right = (last_logits(model, sig.tokens).argmax(-1) == sig.answer).double()
    accs, alls = [], []
    for i in range(len(PAIRS)):
        rows = sig.pair == i
        accs.append(float((right[rows] * sig.weight[rows]).sum()))
        alls.append(bool(right[rows].min() == 1.0))
    noise = contexts(task, "noise")
    logp = last_logits(model, noise.tokens).log_softmax(-1)[:, list(NOISE)]
    return ExactEvaluation(
        pair_acc=tuple(accs), pair_all=tuple(alls), completions=tuple(task.mapping[p] for p in PAIRS),
        signal_acc=sum(accs) / len(accs), signal_all=all(alls),
        noise_loss=float((-logp.mean(-1) * noise.weight).sum()), noise_loss_optimum=math.log(len(NOISE)),
    )  # fmt: skip


# --- QK: preference orderings and split attention -------------------------------------------


@torch.no_grad()
def read_off_scores(model: HookedTransformer, layer: int = 0) -> Float[Tensor, "head 4"]:
    """Pre-softmax QK score of every head from the read-off token 0 to the signal keys 1..4 (via `hc.qk`)."""
    layer = check_layer(model, layer)
    return torch.stack(
        [qk(model, head=h, layer=layer).scores[READ_OFF, list(SIGNAL)].float().cpu() for h in range(model.cfg.n_heads)]
    )


def preference_order(model: HookedTransformer, head: int, layer: int = 0) -> tuple[int, ...]:
    """The head's ordering of the signal tokens 1..4 by QK score from the read-off, most preferred first."""
    head = check_head(model, head)
    scores = read_off_scores(model, layer)[head]
    return tuple(SIGNAL[i] for i in scores.argsort(descending=True).tolist())


def kendall_tau(first: tuple[int, ...], second: tuple[int, ...]) -> float:
    """Kendall rank correlation of two orderings of the same tokens: 1 equal, -1 reversed."""
    if sorted(first) != sorted(second) or len(set(first)) != len(first):
        raise ValueError(f"orderings must be permutations of the same tokens, got {first} and {second}")
    rank1 = {t: i for i, t in enumerate(first)}
    rank2 = {t: i for i, t in enumerate(second)}
    pairs = list(itertools.combinations(first, 2))
    if not pairs:
        return 1.0
    agree = sum(1 if (rank1[a] - rank1[b]) * (rank2[a] - rank2[b]) > 0 else -1 for a, b in pairs)
    return agree / len(pairs)


def compare_orderings(first: tuple[int, ...], second: tuple[int, ...]) -> str:
    """'equal', 'reversed', 'partly reversed' (Kendall tau < 0) or 'partly equal' (tau >= 0); see the module doc."""
    tau = kendall_tau(first, second)
    if tuple(first) == tuple(second):
        return "equal"
    if tuple(first) == tuple(reversed(second)):
        return "reversed"
    return "partly reversed" if tau < 0 else "partly equal"


DISTINCT_PAIRS = [p for p in PAIRS if p[0] != p[1]]


@torch.no_grad()
def split_attention(model: HookedTransformer, layer: int = 0) -> Float[Tensor, "head 6"]:
    """For each head and each pair of distinct signal tokens (a, b) (`DISTINCT_PAIRS`), how evenly the
    head splits its attention between them at the read-off: min(p_a, p_b) / (p_a + p_b), from 0 (all on
    one) to 0.5 (even). With one a and one b in the context p_a / p_b = exp(s_a - s_b), whatever the noise,
    so the value is sigmoid(-|s_a - s_b|) of the QK scores from the read-off."""
    s = read_off_scores(model, layer).double()
    cols = [(SIGNAL.index(a), SIGNAL.index(b)) for a, b in DISTINCT_PAIRS]
    gap = torch.stack([s[:, i] - s[:, j] for i, j in cols], 1)
    return torch.sigmoid(-gap.abs()).float()


# --- OV: conditional logit contributions -----------------------------------------------------


def completions(task: SkipPair) -> list[int]:
    """The completion token of each pair, in `SkipPair.pairs` order."""
    return [task.mapping[p] for p in PAIRS]


@torch.no_grad()
def conditional_contributions(model: HookedTransformer, layer: int = 0) -> Float[Tensor, "head 4 10"]:
    """Each head's direct logit effect, when it attends fully to signal token 1..4 (rows), on the
    completion of each of the 10 pairs (columns, `SkipPair.pairs` order): `hc.ov` restricted."""
    task = skip_pair_task(model)
    cols = completions(task)
    return torch.stack(
        [ov(model, head=h, layer=layer).effects[list(SIGNAL)][:, cols].float().cpu() for h in range(model.cfg.n_heads)]
    )


def consistent_completions(order: tuple[int, ...], token: int) -> list[int]:
    """Indices (into `SkipPair.pairs`) of the pairs a head with `order` can face when it attends to
    `token`: {token, x} with x = token or x ranked below token (a higher-ranked x would draw the attention)."""
    rank = {t: i for i, t in enumerate(order)}
    return [i for i, (a, b) in enumerate(PAIRS) if token in (a, b) and rank[b if a == token else a] >= rank[token]]


@torch.no_grad()
def pair_contributions(
    model: HookedTransformer, layer: int = 0, n: int | None = None, seed: int = 0
) -> Float[Tensor, "pair head 10"]:
    """Each head's direct contribution (`hc.dla`) to every completion, averaged over the contexts of each
    signal pair type (rows, `SkipPair.pairs` order).

    n=None: exactly, over every context with its probability (one-layer models with zero W_pos only).
    n=k: a Monte Carlo estimate from k sampled contexts per pair type (`task.sample(k, seed=seed + i,
    pair=...)`), for any model and context length; the caller states that it is sampled."""
    task = skip_pair_task(model)
    layer = check_layer(model, layer)
    cols = completions(task)
    if n is not None:
        n = check_int("n", n, 1)
        out = torch.zeros(len(PAIRS), model.cfg.n_heads, len(PAIRS), dtype=torch.float64)
        for i, pair in enumerate(PAIRS):
            batch = task.sample(n, seed=seed + i, pair=pair)
            values = dla(model, batch.tokens, pos=batch.answer_pos).heads()[:, layer][..., cols]  # [n, head, 10]
            out[i] = values.double().cpu().mean(0)
        return out.float()
    _check_enumerable(model)
    ctx = contexts(task, "signal")
    values = dla(model, ctx.tokens, pos=-1).heads()[:, layer][..., cols].double().cpu()  # [n, head, 10]
    out = torch.zeros(len(PAIRS), model.cfg.n_heads, len(PAIRS), dtype=torch.float64)
    out.index_add_(0, ctx.pair, values * ctx.weight[:, None, None])
    return out.float()


def pushed_up(contrib: Float[Tensor, "pair head 10"], centered: bool = True) -> Bool[Tensor, "pair head 10"]:
    """Whether a head pushes a completion up for a pair type: its mean contribution exceeds its mean over
    the 10 completions (centered=True; softmax ignores a common shift), or exceeds zero (centered=False)."""
    base = contrib.mean(-1, keepdim=True) if centered else torch.zeros_like(contrib[..., :1])
    return contrib > base


def constructive_pairs(contrib: Float[Tensor, "pair head 10"], centered: bool = True) -> Bool[Tensor, " pair"]:
    """For each pair type: is its own completion the only one pushed up by every head?"""
    up = pushed_up(contrib, centered).all(1)  # [pair, 10]
    own = torch.eye(len(PAIRS), dtype=torch.bool)
    return (up == own).all(-1)


# --- what SkipPair adds to the report ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True, repr=False)
class Preferences(Result):
    """Every head's preference ordering over the signal tokens, built whole by `preferences`.

    scores:    [layer * head, 4] QK score from the read-off token 0 (query) to signal keys 1..4
               (pre-softmax, as `hook_attn_scores`; layers > 0: direct path)
    names:     head names "L0H0", ... in (layer, head) order
    orderings: per head, the signal tokens by descending score, e.g. (3, 1, 4, 2)
    """

    scores: Float[Tensor, "head 4"]
    names: tuple[str, ...]
    orderings: tuple[tuple[int, ...], ...]

    def relation(self, first: str, second: str) -> str:
        """How two heads' orderings compare ("equal", "reversed", "partly reversed", "partly equal")."""
        index = {n: i for i, n in enumerate(self.names)}
        return compare_orderings(self.orderings[index[first]], self.orderings[index[second]])

    def to_dataframe(self) -> pd.DataFrame:
        """One row per head (index "L0H3"): `score <t>` per signal token and `ordering` ("3 > 1 > 4 > 2")."""
        frame = pd.DataFrame(self.scores.double().numpy(), index=list(self.names),
                             columns=[f"score {t}" for t in SIGNAL])  # fmt: skip
        frame["ordering"] = [" > ".join(map(str, o)) for o in self.orderings]
        return frame

    def plot(self, title: str | None = None):
        """Heatmap of the QK scores, head x signal token."""
        from headcoop.display.plot import heatmap

        return heatmap(
            self.scores, [str(t) for t in SIGNAL], list(self.names),
            title or "QK score from the read-off token 0 to each signal token",
            xlabel="signal token (key)", ylabel="head", zmid=None, colorscale="Viridis",
        )  # fmt: skip

    def __repr__(self) -> str:
        shown = "; ".join(f"{n} {' > '.join(map(str, o))}" for n, o in zip(self.names[:4], self.orderings))
        more = f"; ... {len(self.names) - 4} more" if len(self.names) > 4 else ""
        return f"Preferences({shown}{more})"


@torch.no_grad()
def preferences(model: HookedTransformer) -> Preferences:
    """Each head's QK score from the read-off token 0 (query) to each signal token 1..4 (key), and its
    preference ordering: the signal tokens by descending score. Scores are `hc.qk`'s (pre-softmax, as
    `hook_attn_scores`; layers > 0: direct path)."""
    scores = torch.cat([read_off_scores(model, layer) for layer in range(model.cfg.n_layers)])  # [layer*head, 4]
    orderings = tuple(tuple(SIGNAL[i] for i in row.argsort(descending=True).tolist()) for row in scores)
    names = tuple(head_names(model))
    return Preferences(scores=scores, names=names, orderings=orderings)


class SkipPairStudy(Study):
    """SkipPair's preference orderings: a per-head column and a section comparing the heads' orderings."""

    sections = (("preferences", "SkipPair preference orderings"),)

    def head_columns(self, model, task):
        column = preferences(model).to_dataframe()[["ordering"]].rename(columns={"ordering": "preference (QK from 0)"})
        return column, [
            "<b>preference</b>: signal tokens 1..4 ordered by the head's QK score from the read-off token 0."
        ]

    def section(self, anchor, model, task, head_table):
        if anchor != "preferences":
            return super().section(anchor, model, task, head_table)
        result = preferences(model)
        prefs, fig = result.to_dataframe(), result.plot()
        pairs = list(itertools.combinations(result.names, 2))[:6]
        notes = [
            "Each head's preference ordering over the signal tokens 1..4: their QK scores as keys, with the "
            "read-off token 0 as the query (the post: strict, and reversed between the two heads). "
            "Orderings compare as equal, reversed, partly reversed (Kendall tau &lt; 0) or partly equal."
        ]
        if pairs:
            notes.append("; ".join(f"{a} vs {b}: <b>{result.relation(a, b)}</b>" for a, b in pairs))
        return StudySection(notes=tuple(notes), table=prefs, figure=fig, figure_height=max(300, 160 + 40 * len(prefs)))
