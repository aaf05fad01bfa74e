"""A validation bench for mechanism words (issue 37): hand-weighted models whose truth is fixed by their
weights and written down here, not derived from `hc.cooperation`'s rules (tests check each truth with
plain hooks on `hook_z`, independently of the instrument).

    model = hc.bench("post")                     # model.task, model.truth
    hc.cooperation(model).mechanism              # should be model.truth["model"] or "undetermined"

Every model reads a short sequence and answers at its last position, with one-hot token and position
directions in the residual stream, W_U reading output tokens off their own directions, and hard attention
(query x key = SHARPNESS at the attended key). `wrong` is the "none" token, whose bias is the floor the
answer must beat. The models (`BENCH`; truth: the word of each named pair and each head's role):

- "post": the SkipPair post's mechanism in miniature. Inputs [x, y, =] with x, y in s1..s4 drawn
  independently; the answer is the completion c(x, y) of the unordered pair (10 completions). L0H0
  attends to the present token it prefers most (order s1 > s2 > s3 > s4), L0H1 in the reversed order
  (s4 > ... > s1); attending to t, a head writes +1 on every completion c(t, u) consistent with its order
  (u not preferred to t), +2 where that is one completion ("least favourite token repeated": one head
  alone answers). Only c(x, y) gets both heads' writes. Truth: superposition.
- "rank1": two heads each write one fixed vector scaled by +1 or -1 (rank-1 OV maps): L0H0 reads a and
  pushes {o0, o1} or {o2, o3}, L0H1 reads b and pushes {o0, o2} or {o1, o3}; the answer is the one output
  both push. The writes meet only at the answer, but neither head writes different sets for different
  sources beyond a sign: truth not superposition (both needed: "not testable" in one layer).
- "and-junk": both heads read a; each adds +0.4 to out_a (the floor is 0.6) and +0.3 to a constant junk
  completion (o0): an AND gate, not superposition.
- "and-suppress": L0H0 adds +1.0 to out_a and +1.2 to a decoy out_{a+1}; L0H1 reads a and lowers the
  decoy by 0.5: both needed; L0H1 writes no completion up and supports by suppression. Not
  superposition, L0H1 "supports".
- "feeder": L0H0 reads a and writes a flag f_a (and -0.25 on out_a directly); L1H0 attends to "=" and
  copies the flag into +2 on out_a: L0H0 supports through L1H0. Truth: composition.
- "induction": a previous-token head (L0H0) feeds an induction head (L1H0) by K-composition on sequences
  [t0 .. t4] of distinct tokens with t5 = t_i (i < 3): the answer is t_{i+1}. Truth: composition.
- "partial-backup": L0H0 copies a with +1 (floor 0.3); L1H0 attends to a and writes +0.4 only while out_a
  is missing: it restores every answer but 40% of the logit. Truth: redundant, L1H0 backs up L0H0.
- "ln-2l": L0H0 and L1H0 each add to out_a (both needed) in a model with LayerNorms: ablating L0H0
  moves the final norm's scale (and L1H0's input norm), which raises L1H0's direct effect by more than
  half of L0H0's, yet L1H0 restores no answer. Truth: no backup; both needed but
  the norm makes their logit effects far from additive (one head alone gives 84% of the pair's logit).
  Truth: conjunction (both needed on accuracy).
- "unequal": L0H0 copies a with +1.0, L0H1 with +0.7 (floor 0.6): redundant with unequal strengths.
- "uneven": L0H0 copies a for a in a0..a2, L0H1 for a3: an uneven division (75% / 25%).
- "cancel": L0H0 copies a (+1.2), L0H1 adds +0.5 and L0H2 -0.5 to out_a, L0H3 writes nothing (weight
  noise in tests makes it a small distractor): L0H2 competes, L0H3 is inactive.
- "four": the "post" pair plus two empty heads: the mechanism sits on one pair of four.
- "mlp": one layer with an MLP: L0H0 writes a flag f_a that the MLP turns into +1 on out_a, L0H1 copies a
  onto out_a (+1) directly (floor 0.6): either route alone answers. Truth: redundant.

Near-misses (issue 48), each lacking one property of a word:
- "unconditional": the "post" attention, but each head attending t writes +1 on every completion
  containing t and +0.5 more on c(t, t): what it copies does not depend on the token it does not attend
  to. Still 100% accurate; both needed. Truth: conjunction, not superposition.
- "mix80" / "mix50": the "post" model plus plain copy inputs [a_i, b_i, =] -> o_i (80% / 50% of inputs),
  where L0H0 reads a_i and L0H1 reads b_i and either alone answers (redundancy with heads reading different
  tokens). Truth: redundant (mix50: OR on half the inputs: a mixture), not superposition.
- "split-helper": L0H0 copies a (+1, floor 0.6) and answers every input alone; L0H1 splits its attention
  evenly over a and b and writes +0.2 on each one's output: it never changes an answer in any coalition.
  Truth: not superposition ("undetermined": one head does everything).
- "feeders": L0H0 and L0H1 both write a_i's flag; L1H0's query needs a flag to attend to a_i and copy it:
  either feeder alone suffices (each one's total effect is 0, its effect alone too, since L1H0 is ablated
  with it). Truth: the feeders are redundant, neither is inactive.
- "flat": L0H0 copies a (+2); L0H1 attends to "=" and writes +0.5 on "none" on every input: it competes,
  and its push does not depend on the input, so mean and resample ablation leave it as it is (they cannot
  see it). Truth: competition.
- "hurt": L0H0 copies a (+1, floor 0.6); L0H1 reads b and writes +1.5 on o_b for b in b0, b1: on 37.5% of inputs
  (b in b0, b1 and b != a) it turns the answer wrong. Its resampled replacement (another input's b) hurts as much,
  so resample ablation measures the replacement and cannot see it; zero and mean can. Truth: competition.
- "tie": L0H0 writes +0.75 on out_a, L0H1 +0.25, against the floor of 0.75 on "none": L0H0 alone ties the floor
  exactly (a tie is no answer), so both are needed. Truth: conjunction.
- "mix57": both heads read a; for a0 / a1 (57% of inputs) each writes +1 (either alone answers), for a2 / a3 (43%)
  +0.4 (both needed, floor 0.6). Truth: a mixture (redundant on 57%, both needed on 43%).
- "dominant": the "post" model on inputs that are neighbours (s_a, s_a+1) 86% of the time, where L0H0 also writes
  +0.8 on c(a, a+1) from s_a: it alone answers the neighbours (86%), L0H1 alone answers nothing, both answer all.
  Every part of the post's definition holds, but one head does the work: each head's own removal changes the
  answer on only 14% (L0H1) of the inputs. Truth: not superposition ("undetermined").
- "count-subtasks" / "count-ensemble": six digits 0/1/2 then "=", the answer "5" with more 1s than 0s, "4"
  with more 0s; both heads attend evenly. Subtasks: L0H0 counts 0s onto "4", L0H1 counts 1s onto "5"
  (different subtasks; each alone answers its own class: division). Ensemble: both count both (the same
  function: redundant). `SAME` holds the same-computation truth of each.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

import torch
from torch import Tensor

from headcoop.checks import check_float, check_seed
from headcoop.models.tl import HookedTransformer, HookedTransformerConfig
from headcoop.tasks.base import Batch, check_sample_size, generator
from headcoop.tasks.features import Features, counting_features, signal_features
from headcoop.tasks.planted import HandWeightedTask

Bench = Literal["post", "rank1", "and-junk", "and-suppress", "feeder", "induction", "partial-backup", "ln-2l",
                "unequal", "uneven", "cancel", "four", "mlp", "unconditional", "mix80", "mix50", "split-helper",
                "feeders", "flat", "count-subtasks", "count-ensemble", "count-unequal", "count-firstdigit",
                "count-2l", "hurt", "tie", "mix57", "dominant"]  # fmt: skip
COUNTING = ("count-subtasks", "count-ensemble", "count-unequal", "count-firstdigit", "count-2l")
MIXED = ("mix80", "mix50")
NEAR_MISSES = ("hurt", "tie", "dominant", "mix57")  # issue 59's, set by `_near_miss`
POST_LIKE = ("post", "four", "unconditional", "dominant", "mix80", "mix50")  # the post's inputs and completions
BENCH: tuple[str, ...] = get_args(Bench)
SHARPNESS = 30.0
K = 4
SIGNALS = [f"s{i}" for i in range(1, 5)]
PAIRS = [(x, y) for x in range(4) for y in range(x, 4)]  # unordered pairs of signal indices
TRUTH = {
    "post": ({("L0H0", "L0H1"): "superposition"}, {"L0H0": "supports", "L0H1": "supports"}),
    "rank1": ({("L0H0", "L0H1"): "conjunction"}, {"L0H0": "supports", "L0H1": "supports"}),
    "and-junk": ({("L0H0", "L0H1"): "conjunction"}, {"L0H0": "supports", "L0H1": "supports"}),
    "and-suppress": ({("L0H0", "L0H1"): "conjunction"}, {"L0H0": "supports", "L0H1": "supports"}),
    "feeder": ({("L0H0", "L1H0"): "composition"}, {"L0H0": "supports", "L1H0": "supports"}),
    "induction": ({("L0H0", "L1H0"): "composition"}, {"L0H0": "supports", "L1H0": "supports"}),
    "partial-backup": ({("L0H0", "L1H0"): "redundant"}, {"L0H0": "supports", "L1H0": "supports"}),
    "ln-2l": ({("L0H0", "L1H0"): "conjunction"}, {"L0H0": "supports", "L1H0": "supports"}),
    "unequal": ({("L0H0", "L0H1"): "redundant"}, {"L0H0": "supports", "L0H1": "supports"}),
    "uneven": ({("L0H0", "L0H1"): "division"}, {"L0H0": "supports", "L0H1": "supports"}),
    "cancel": (
        {("L0H1", "L0H2"): "competition", ("L0H0", "L0H2"): "competition"},
        {"L0H0": "supports", "L0H1": "supports", "L0H2": "competes", "L0H3": "inactive"},
    ),
    "four": (
        {("L0H0", "L0H1"): "superposition", ("L0H2", "L0H3"): "inactive"},
        {"L0H0": "supports", "L0H1": "supports", "L0H2": "inactive", "L0H3": "inactive"},
    ),
    "mlp": ({("L0H0", "L0H1"): "redundant"}, {"L0H0": "supports", "L0H1": "supports"}),
    "unconditional": ({("L0H0", "L0H1"): "conjunction"}, {"L0H0": "supports", "L0H1": "supports"}),
    "mix80": ({("L0H0", "L0H1"): "redundant"}, {"L0H0": "supports", "L0H1": "supports"}),
    "mix50": ({("L0H0", "L0H1"): "mixture"}, {"L0H0": "supports", "L0H1": "supports"}),
    "split-helper": ({("L0H0", "L0H1"): "undetermined"}, {"L0H0": "supports", "L0H1": "supports"}),
    "feeders": (
        {("L0H0", "L0H1"): "redundant"},
        {"L0H0": "supports", "L0H1": "supports", "L1H0": "supports", "L1H1": "inactive"},
    ),
    "flat": ({("L0H0", "L0H1"): "competition"}, {"L0H0": "supports", "L0H1": "competes"}),
    "count-subtasks": ({("L0H0", "L0H1"): "division"}, {"L0H0": "supports", "L0H1": "supports"}),
    "count-ensemble": ({("L0H0", "L0H1"): "redundant"}, {"L0H0": "supports", "L0H1": "supports"}),
    "count-unequal": ({("L0H0", "L0H1"): "redundant"}, {"L0H0": "supports", "L0H1": "supports"}),
    "hurt": ({("L0H0", "L0H1"): "competition"}, {"L0H0": "supports", "L0H1": "competes"}),
    "tie": ({("L0H0", "L0H1"): "conjunction"}, {"L0H0": "supports", "L0H1": "supports"}),
    "mix57": ({("L0H0", "L0H1"): "mixture"}, {"L0H0": "supports", "L0H1": "supports"}),
    "dominant": ({("L0H0", "L0H1"): "undetermined"}, {"L0H0": "supports", "L0H1": "supports"}),
    "count-firstdigit": ({("L0H0", "L0H1"): "redundant"}, {"L0H0": "supports", "L0H1": "supports"}),
    "count-2l": (
        {("L0H0", "L0H1"): "redundant", ("L0H0", "L1H0"): "composition"},
        {"L0H0": "supports", "L0H1": "supports", "L1H0": "supports", "L1H1": "inactive"},
    ),
}
# where the logit difference reads a model differently from accuracy: a continuous metric sees the two
# heads' logit effects add (0.59 and 0.41 of the pair's), which no 0/1 reading of redundancy shows; in one
# attention-only layer the logit difference is additive over the heads by construction ("not testable")
LOGIT_DIFF_TRUTH = {"unequal": {("L0H0", "L0H1"): "not testable"}, "mlp": {("L0H0", "L0H1"): "conjunction"},
                    "and-suppress": {("L0H0", "L0H1"): "inactive"}, "ln-2l": {("L0H0", "L1H0"): "redundant"},
                    **{w: {("L0H0", "L0H1"): "not testable"} for w in ("rank1", "and-junk", "unconditional", "mix80",
                                                                      "mix50", "count-ensemble", "split-helper",
                                                                      "count-unequal", "count-firstdigit", "tie",
                                                                      "mix57", "hurt")},
                    # the layer-0 counters' pushes through L1H0 are linear too: each carries half the logit difference
                    "count-2l": {("L0H0", "L1H0"): "composition", ("L0H0", "L0H1"): "conjunction"},
                    # on the logit difference both heads of "dominant" move every input (L0H1 adds +1 to the answer):
                    # the post's definition holds in full there; only accuracy has one head doing the work
                    "dominant": {("L0H0", "L0H1"): "superposition"},
                    # one head carries the logit difference on each input: a division the additive metric shows
                    "uneven": {("L0H0", "L0H1"): "division"}, "count-subtasks": {("L0H0", "L0H1"): "division"}}  # fmt: skip
# the roles on the logit difference where they differ from accuracy's: and-suppress's L0H1 lowers only the
# decoy, and the logit difference reads the answer against "none"
LOGIT_DIFF_ROLES = {"and-suppress": {"L0H1": "inactive"},
                    # hurt's L0H1 writes o_b, which the logit difference (answer against "none") reads only where
                    # b = a, and there it adds to the answer
                    "hurt": {"L0H1": "supports"}}  # fmt: skip
# the same-computation axis (the Count01 paper's "all solving the same subtask"), where the truth is known
SAME = {
    "count-subtasks": "different subtasks",
    "count-ensemble": "same computation (pseudo-ensemble)",
    "count-unequal": "same computation (pseudo-ensemble)",
    # the near-miss: on its inputs the first digit is the majority digit, so the pushes co-vary as one
    "count-firstdigit": "same computation (pseudo-ensemble)",
}
# the same function by counterfactual edits (`hc.cooperation(...).function_word`), checked in the tests by
# editing each input token with plain hooks
FUNCTION = {
    "count-subtasks": "different functions on the counts",  # the two specialists, on strings of one length
    "count-ensemble": "same function on the counts (pseudo-ensemble)",
    "count-unequal": "same function on the counts (pseudo-ensemble)",
    "count-firstdigit": "different functions on the counts that agree on the task's inputs",
    "count-2l": "same function on the counts (pseudo-ensemble)",
}
MODEL_WORD = {"post": "superposition", "four": "superposition", "feeder": "composition", "induction": "composition",
              "partial-backup": "redundant", "ln-2l": "conjunction", "unequal": "redundant", "uneven": "division",
              "rank1": "conjunction", "and-junk": "conjunction", "and-suppress": "conjunction",
              "cancel": "competition", "mlp": "redundant", "unconditional": "conjunction", "mix80": "redundant",
              "mix50": "mixture", "split-helper": "undetermined", "feeders": "redundant", "flat": "competition",
              "count-subtasks": "division", "count-ensemble": "redundant", "count-unequal": "redundant",
              "count-firstdigit": "redundant", "count-2l": "composition", "hurt": "competition", "tie": "conjunction",
              "mix57": "mixture", "dominant": "undetermined"}  # fmt: skip


class BenchTask(HandWeightedTask):
    """The task of one bench model (module docstring): its vocabulary, inputs and answers."""

    name = "bench"

    def __init__(self, which: Bench = "post"):
        if which not in BENCH:
            raise ValueError(f"unknown bench model {which!r}; valid values are {list(BENCH)}")
        self.which = which
        if which == "induction":
            self.vocab = [f"t{i}" for i in range(8)] + ["none"]
        elif which in COUNTING:
            self.vocab = ["0", "1", "2", "=", "4", "5", "none"]
        else:
            self.vocab = ([f"a{i}" for i in range(K)] + [f"b{i}" for i in range(K)] + SIGNALS + ["="]
                          + [f"o{i}" for i in range(K)] + [f"c{x + 1}{y + 1}" for x, y in PAIRS] + ["none"])  # fmt: skip
        self.index = {s: i for i, s in enumerate(self.vocab)}

    @property
    def n_ctx(self) -> int:
        return 6 if self.which == "induction" else 7 if self.which in COUNTING else 3

    def completions(self) -> Tensor | None:
        if self.which in COUNTING:
            return torch.tensor([self.index["4"], self.index["5"]])
        if self.which in POST_LIKE:  # the mixtures' plain inputs answer o_i: their completions too
            plain = [self.index[f"o{i}"] for i in range(K)] if self.which in MIXED else []
            return torch.tensor([self.index[f"c{x + 1}{y + 1}"] for x, y in PAIRS] + plain)
        if self.which == "induction":
            return None
        return torch.tensor([self.index[f"o{i}"] for i in range(K)])

    def features(self) -> Features | None:
        """The counting models': the counts of 1s and 0s (the semantics) and of 2s (one length: no insertions);
        the post-like models': their signal tokens; the others declare none."""
        if self.which in COUNTING:
            return counting_features(self.index["0"], self.index["1"], self.index["2"], start=0, lengths=None)
        if self.which in POST_LIKE and self.which not in MIXED:
            return signal_features(tuple(self.index[s] for s in SIGNALS), (), tuple(SIGNALS))
        return None

    def sample(self, n: int, seed: int = 0) -> Batch:
        n = check_sample_size(n, self.n_ctx)
        gen = generator(seed)
        none = self.index["none"]
        if self.which == "induction":
            tokens = torch.stack([torch.randperm(8, generator=gen)[:5] for _ in range(n)])
            i = torch.randint(0, 3, (n,), generator=gen)
            rows = torch.arange(n)
            tokens = torch.cat([tokens, tokens[rows, i][:, None]], 1)
            answer = tokens[rows, i + 1]
            pos = torch.full((n,), 5)
        elif self.which in COUNTING:
            return self._count_sample(n, gen)
        else:
            x, y = torch.randint(0, K, (n,), generator=gen), torch.randint(0, K, (n,), generator=gen)
            if self.which == "dominant":  # 86%: neighbours (s_a, s_a+1) in either order; else any pair
                a = torch.randint(0, K - 1, (n,), generator=gen)
                near, flip = torch.rand(n, generator=gen) < 0.86, torch.rand(n, generator=gen) < 0.5
                x = torch.where(near, torch.where(flip, a + 1, a), x)
                y = torch.where(near, torch.where(flip, a, a + 1), y)
            if self.which in POST_LIKE:
                first, second = self.index["s1"] + x, self.index["s1"] + y
                lo, hi = torch.minimum(x, y), torch.maximum(x, y)
                pair_index = {p: k for k, p in enumerate(PAIRS)}
                answer = torch.tensor([self.index["c11"] + pair_index[(int(a), int(b))] for a, b in zip(lo, hi)])
            else:
                if self.which == "mix57":  # a0 / a1 (either head alone) on 57% of inputs, a2 / a3 (both needed) on 43%
                    x = torch.multinomial(
                        torch.tensor([0.285, 0.285, 0.215, 0.215]), n, replacement=True, generator=gen
                    )
                first, second = x, K + y
                answer = self.index["o0"] + self._answer_of(x, y)
            if self.which in MIXED:  # a share of plain copy inputs [a_i, b_i, =] -> o_i
                plain = torch.rand(n, generator=gen) < (0.8 if self.which == "mix80" else 0.5)
                first = torch.where(plain, x, first)
                second = torch.where(plain, K + x, second)
                answer = torch.where(plain, self.index["o0"] + x, answer)
            tokens = torch.stack([first, second, torch.full((n,), self.index["="])], 1)
            pos = torch.full((n,), 2)
        return Batch(tokens=tokens, loss_pos=pos[:, None], targets=answer[:, None], answer_pos=pos, answer=answer,
                     wrong=torch.full((n,), none), labels=answer.clone(), vocab=tuple(self.vocab))  # fmt: skip

    def _count_sample(self, n: int, gen) -> Batch:
        """Six digits of 0 / 1 / 2 (uniform) then "=": the answer is "5" with more 1s than 0s, "4" with more 0s
        (strings with as many of each are redrawn). count-firstdigit keeps only strings whose counts differ by
        one and whose first digit is the majority digit: there counting and reading the first digit agree."""
        rows: list[Tensor] = []
        while len(rows) < n:
            digits = torch.randint(0, 3, (6,), generator=gen)
            zeros, ones = int((digits == 0).sum()), int((digits == 1).sum())
            if self.which == "count-firstdigit" and (abs(zeros - ones) != 1 or int(digits[0]) != int(ones > zeros)):
                continue
            if zeros != ones:
                rows.append(digits)
        digits = torch.stack(rows)
        answer = torch.where((digits == 1).sum(1) > (digits == 0).sum(1), self.index["5"], self.index["4"])
        tokens = torch.cat([digits, torch.full((n, 1), self.index["="])], 1)
        pos = torch.full((n,), 6)
        return Batch(tokens=tokens, loss_pos=pos[:, None], targets=answer[:, None], answer_pos=pos, answer=answer,
                     wrong=torch.full((n,), self.index["none"]), labels=answer.clone(), vocab=tuple(self.vocab))  # fmt: skip

    def _answer_of(self, a: Tensor, b: Tensor) -> Tensor:
        if self.which == "rank1":
            return 2 * (a >= 2).long() + (b % 2)
        return a

    def corrupt(self, batch: Batch) -> Batch:
        """The next input of a fresh sample: a different input (the bench is not meant for patching)."""
        other = self.sample(len(batch), seed=12_345)
        return batch.replace(tokens=other.tokens, targets=other.targets, answer=other.answer, labels=other.labels)

    def config(self) -> HookedTransformerConfig:
        layers = 2 if self.which in ("feeder", "induction", "partial-backup", "ln-2l", "feeders", "count-2l") else 1
        heads = {"cancel": 4, "four": 4, "feeders": 2, "count-2l": 2}.get(self.which, 1 if layers == 2 else 2)
        extra = 8 if self.which in ("feeder", "induction", "mlp", "feeders", "count-2l") else 0
        d_model = len(self.vocab) + self.n_ctx + extra
        return HookedTransformerConfig(n_layers=layers, n_heads=heads, d_model=d_model, d_head=max(K, 8) + 2,
                                       n_ctx=self.n_ctx, d_vocab=len(self.vocab), attn_only=self.which != "mlp",
                                       d_mlp=8 if self.which == "mlp" else None, act_fn="relu",
                                       normalization_type="LN" if self.which == "ln-2l" else None,
                                       positional_embedding_type="standard", seed=0)  # fmt: skip

    def params(self) -> dict[str, Any]:
        return {"which": self.which}


class _W:
    """Weight setters: token t -> direction t, position p -> V + p, extra directions after them."""

    def __init__(self, model: HookedTransformer, task: BenchTask):
        self.m, self.t = model, task
        self.V = len(task.vocab)
        self.extra = self.V + task.n_ctx
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
            model.embed.W_E[:, : self.V] = torch.eye(self.V)
            model.pos_embed.W_pos[:, self.V : self.V + task.n_ctx] = torch.eye(task.n_ctx)
            first_out = task.index["o0"] if "o0" in task.index else task.index["4"] if "4" in task.index else 0
            out = torch.arange(first_out, self.V)
            model.unembed.W_U[out, out] = 1.0
            for name, p in model.named_parameters():
                if name.endswith("ln_final.w") or name.endswith(".w") and "ln" in name:
                    p.fill_(1.0)

    def tok(self, w: str) -> int:
        return self.t.index[w]

    def bias(self, word: str, value: float) -> None:
        with torch.no_grad():
            self.m.unembed.b_U[self.tok(word)] = value

    def attn(self, layer: int, head: int):
        return self.m.blocks[layer].attn

    def attend_pos(self, layer: int, head: int, query_pos: int, key_pos: int, slot: int = 0, sharp: float = SHARPNESS):
        a = self.attn(layer, head)
        with torch.no_grad():
            a.W_Q[head, self.V + query_pos, slot] = sharp
            a.W_K[head, self.V + key_pos, slot] = 1.0

    def ov(self, layer: int, head: int, table: dict, slot0: int = 1):
        """OV: source direction (a token word or an int direction) -> {output word or direction: weight}."""
        a = self.attn(layer, head)
        with torch.no_grad():
            for slot, (src, writes) in enumerate(table.items(), start=slot0):
                a.W_V[head, src if isinstance(src, int) else self.tok(src), slot] = 1.0
                for out, w in writes.items():
                    a.W_O[head, slot, out if isinstance(out, int) else self.tok(out)] += w


def bench(which: Bench = "post", weight_noise: float = 0.0, seed: int = 0) -> HookedTransformer:
    """A bench model (module docstring) with `model.task` and `model.truth` ({"pairs", "roles", "model",
    "backup"}); `weight_noise`: the std of seeded Gaussian noise added to every weight.
    Long: one hand-set weight layout per bench model, each a few lines, in one place so they can be compared.
    """
    weight_noise, seed = check_float("weight_noise", weight_noise, 0), check_seed(seed)
    task = BenchTask(which)
    model = HookedTransformer(task.config()).eval()
    w = _W(model, task)
    a = [f"a{i}" for i in range(K)]
    if which in ("post", "four"):
        _post(w)
    elif which == "rank1":
        w.bias("none", 0.5)
        for h, (src, groups) in enumerate(((a, lambda i: i < 2), ([f"b{i}" for i in range(K)], lambda i: i % 2 == 0))):
            w.attend_pos(0, h, 2, h)
            sign = {f"o{o}": (1.0 if groups(o) else -1.0) for o in range(K)}
            at = w.attn(0, h)
            with torch.no_grad():  # one value dimension: z = +1 or -1, W_O = one fixed vector (rank 1)
                for i, word in enumerate(src):
                    at.W_V[h, w.tok(word), 1] = 1.0 if groups(i) else -1.0
                for out, s in sign.items():
                    at.W_O[h, 1, w.tok(out)] = s
    elif which in ("and-junk", "and-suppress"):
        w.bias("none", 0.6)
        for h in (0, 1):
            w.attend_pos(0, h, 2, 0)
        if which == "and-junk":
            for h in (0, 1):
                w.ov(0, h, {a[i]: {f"o{i}": 0.4, **({"o0": 0.3} if i else {})} for i in range(K)})
        else:
            w.ov(0, 0, {a[i]: {f"o{i}": 1.0, f"o{(i + 1) % K}": 1.2} for i in range(K)})
            w.ov(0, 1, {a[i]: {f"o{(i + 1) % K}": -0.5} for i in range(K)})
    elif which == "feeder":
        w.bias("none", 0.6)
        w.attend_pos(0, 0, 2, 0)
        w.ov(0, 0, {a[i]: {w.extra + i: 1.0, f"o{i}": -0.25} for i in range(K)})
        w.attend_pos(1, 0, 2, 2)
        w.ov(1, 0, {w.extra + i: {f"o{i}": 2.0} for i in range(K)})
    elif which == "induction":
        _induction(w)
    elif which == "partial-backup":
        w.bias("none", 0.3)
        w.attend_pos(0, 0, 2, 0)
        w.ov(0, 0, {a[i]: {f"o{i}": 1.0} for i in range(K)})
        _backup_head(w, 0.4)
    elif which == "ln-2l":
        w.bias("none", 4.75)  # out_a minus none's norm term: both heads 4.96, one head (the other zero or mean) <= 4.55
        for layer in (0, 1):
            w.attend_pos(layer, 0, 2, 0, sharp=300.0)
            w.ov(layer, 0, {a[i]: {f"o{i}": 0.4} for i in range(K)})
    elif which in ("unequal", "uneven"):
        w.bias("none", 0.6)
        for h in (0, 1):
            w.attend_pos(0, h, 2, 0)
        if which == "unequal":
            w.ov(0, 0, {a[i]: {f"o{i}": 1.0} for i in range(K)})
            w.ov(0, 1, {a[i]: {f"o{i}": 0.7} for i in range(K)})
        else:
            w.ov(0, 0, {a[i]: {f"o{i}": 1.0} for i in range(3)})
            w.ov(0, 1, {a[3]: {"o3": 1.0}})
    elif which == "cancel":
        w.bias("none", 0.6)
        for h in range(4):
            w.attend_pos(0, h, 2, 0)
        w.ov(0, 0, {a[i]: {f"o{i}": 1.2} for i in range(K)})
        w.ov(0, 1, {a[i]: {f"o{i}": 0.5} for i in range(K)})
        w.ov(0, 2, {a[i]: {f"o{i}": -0.5} for i in range(K)})
    elif which == "mlp":
        w.bias("none", 0.6)
        for h in (0, 1):
            w.attend_pos(0, h, 2, 0)
        w.ov(0, 0, {a[i]: {w.extra + i: 1.0} for i in range(K)})
        w.ov(0, 1, {a[i]: {f"o{i}": 1.0} for i in range(K)})
        mlp = model.blocks[0].mlp
        with torch.no_grad():
            for i in range(K):  # ReLU(flag_i) -> +1 on out_i
                mlp.W_in[w.extra + i, i] = 1.0
                mlp.W_out[i, w.tok(f"o{i}")] = 1.0
    elif which in ("unconditional",) + MIXED:
        _post(w, conditional=which != "unconditional")
        if which in MIXED:
            _plain_copies(w)
    elif which == "split-helper":
        w.bias("none", 0.6)
        w.attend_pos(0, 0, 2, 0)
        w.ov(0, 0, {a[i]: {f"o{i}": 1.0} for i in range(K)})
        at = w.attn(0, 1)
        with torch.no_grad():  # attention split evenly between positions 0 and 1 (no query weight at all)
            at.W_K[1, w.V + 0, 0] = 1.0
            at.W_K[1, w.V + 1, 0] = 1.0
            at.W_Q[1, w.V + 2, 0] = SHARPNESS
        w.ov(0, 1, {**{a[i]: {f"o{i}": 0.2} for i in range(K)}, **{f"b{i}": {f"o{i}": 0.2} for i in range(K)}})
    elif which == "feeders":
        _feeders(w)
    elif which == "flat":
        w.bias("none", 0.6)
        w.attend_pos(0, 0, 2, 0)
        w.ov(0, 0, {a[i]: {f"o{i}": 2.0} for i in range(K)})
        w.attend_pos(0, 1, 2, 2)
        w.ov(0, 1, {"=": {"none": 0.5}})
    elif which in COUNTING:
        _counting(w, which)
    elif which in NEAR_MISSES:
        _near_miss(w, which)
    if weight_noise:
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(weight_noise * torch.randn(p.shape, generator=gen))
    pairs, roles = TRUTH[which]
    model.task = task
    model.truth = {"pairs": dict(pairs), "roles": dict(roles), "model": MODEL_WORD[which],
                   "backup": {"L1H0": "L0H0"} if which == "partial-backup" else {}}  # fmt: skip
    return model


def _near_miss(w: _W, which: str) -> None:
    """Issue 59's near-misses (module docstring): hurt, tie, dominant, mix57."""
    a = [f"a{i}" for i in range(K)]
    if which == "hurt":
        w.bias("none", 0.6)
        w.attend_pos(0, 0, 2, 0)
        w.ov(0, 0, {a[i]: {f"o{i}": 1.0} for i in range(K)})
        w.attend_pos(0, 1, 2, 1)
        w.ov(0, 1, {f"b{i}": {f"o{i}": 1.5} for i in range(2)})
    elif which == "tie":
        w.bias("none", 0.75)
        for h, weight in ((0, 0.75), (1, 0.25)):
            w.attend_pos(0, h, 2, 0, sharp=300.0)
            w.ov(0, h, {a[i]: {f"o{i}": weight} for i in range(K)})
    elif which == "dominant":
        _post(w)
        for t in range(K - 1):  # L0H0 also favours c(t, t+1), the likely completion from s_t: alone it answers most
            w.ov(0, 0, {SIGNALS[t]: {f"c{t + 1}{t + 2}": 0.8}}, slot0=5 + t)
    elif which == "mix57":
        w.bias("none", 0.6)
        for h in (0, 1):
            w.attend_pos(0, h, 2, 0)
            w.ov(0, h, {a[i]: {f"o{i}": 1.0 if i < 2 else 0.4} for i in range(K)})


def _post(w: _W, conditional: bool = True) -> None:
    """L0H0 prefers s1 > s2 > s3 > s4, L0H1 the reverse; OV writes the completions consistent with the order
    (conditional), or, not conditional, +1 on every completion containing the attended token and +0.5 more
    on c(t, t), whatever the order implies (the floor is then 1.6: one head alone answers nothing)."""
    order = {0: [0, 1, 2, 3], 1: [3, 2, 1, 0]}
    pair_word = {p: f"c{p[0] + 1}{p[1] + 1}" for p in PAIRS}
    for h, prefs in order.items():
        at = w.attn(0, h)
        with torch.no_grad():
            at.W_Q[h, w.V + 2, 0] = SHARPNESS
            for rank, t in enumerate(prefs):
                at.W_K[h, w.tok(SIGNALS[t]), 0] = float(len(prefs) - rank)  # the preferred token scores highest
        table = {}
        for rank, t in enumerate(prefs):
            if not conditional:
                table[SIGNALS[t]] = {pair_word[(min(t, u), max(t, u))]: 1.0 + 0.5 * (u == t) for u in range(4)}
                continue
            allowed = prefs[rank:]  # tokens not preferred to t: what the other position may hold
            outs = [pair_word[(min(t, u), max(t, u))] for u in allowed]
            weight = 2.0 if len(outs) == 1 else 1.0
            table[SIGNALS[t]] = {o: weight for o in outs}
        w.ov(0, h, table)
    w.bias("none", 1.5 if conditional else 1.6)


def _plain_copies(w: _W) -> None:
    """The mixtures' plain inputs [a_i, b_i, =]: L0H0's key also prefers a-tokens, L0H1's b-tokens (above
    every signal token), and each copies its token onto o_i with +2: either alone answers (OR)."""
    for h, prefix in ((0, "a"), (1, "b")):
        at = w.attn(0, h)
        with torch.no_grad():
            for i in range(K):
                at.W_K[h, w.tok(f"{prefix}{i}"), 0] = 6.0
        w.ov(0, h, {f"{prefix}{i}": {f"o{i}": 2.0} for i in range(K)}, slot0=1 + K)


def _feeders(w: _W) -> None:
    """L0H0 and L0H1 both read a_i (position 0) and write the flag e_i at "="; L1H0's query reads e_i and
    attends to a_i only where the flag is at least 3/4 (a mean flag of 1/4 per feeder does not open it), and
    copies a_i onto o_i with +3 against the floor of 1.5 (elsewhere it attends to b and "=", which it does not copy). Either feeder alone
    opens the gate: redundant feeders of a later head's query. L1H1 writes nothing."""
    w.bias("none", 1.5)
    at1 = w.attn(1, 0)
    for h in (0, 1):
        w.attend_pos(0, h, 2, 0)
        w.ov(0, h, {f"a{i}": {w.extra + i: 1.0} for i in range(K)})
    with torch.no_grad():
        for i in range(K):
            at1.W_Q[0, w.extra + i, i] = 2 * SHARPNESS
            at1.W_Q[0, w.V + 2, i] = -1.5 * SHARPNESS  # "=" at position 2: the gate needs a flag above 3/4
            at1.W_K[0, w.tok(f"a{i}"), i] = 1.0
            at1.W_V[0, w.tok(f"a{i}"), i] = 1.0
            at1.W_O[0, i, w.tok(f"o{i}")] = 3.0


def _counting(w: _W, which: str) -> None:
    """Both heads attend evenly to the 7 positions (no QK weights). count-subtasks: L0H0 writes +3 on "4" per
    0, L0H1 +3 on "5" per 1 (each counts one class: different subtasks; each alone answers its own class);
    count-ensemble: both write +3 on "4" per 0 and +3 on "5" per 1 (the same function twice); count-unequal:
    the same with +3 and +1.5 (a pseudo-ensemble of unequal weights); count-firstdigit: L0H0 counts as in
    count-ensemble, L0H1 attends to the first digit only and writes +3 on "4" for a 0, on "5" for a 1 (a
    different function that agrees with counting on the task's inputs); count-2l: both layer-0 heads count
    with +1 directly and write the counts into two flag directions, which L1H0 (attending to "=" itself)
    copies with +3 onto "4" / "5" (the layer-0 heads are read mostly through layer 1; L1H1 writes nothing).
    "none" sits at -5, below every answer."""
    w.bias("none", -5.0)
    both = lambda weight: {"0": {"4": weight}, "1": {"5": weight}}  # noqa: E731
    if which == "count-2l":
        for h in (0, 1):
            w.ov(0, h, {"0": {"4": 1.0, w.extra: 1.0}, "1": {"5": 1.0, w.extra + 1: 1.0}})
        w.attend_pos(1, 0, 6, 6)
        w.ov(1, 0, {w.extra: {"4": 3.0}, w.extra + 1: {"5": 3.0}})
        return
    if which == "count-firstdigit":
        w.ov(0, 0, both(3.0))
        w.attend_pos(0, 1, 6, 0)
        w.ov(0, 1, both(3.0))
        return
    for h in (0, 1):
        if which in ("count-ensemble", "count-unequal"):
            w.ov(0, h, both(3.0 if h == 0 or which == "count-ensemble" else 1.5))
        else:
            w.ov(0, h, {"0": {"4": 3.0}} if h == 0 else {"1": {"5": 3.0}})


def _induction(w: _W) -> None:
    """L0H0: each position attends to the previous one and writes its token into extra directions;
    L1H0: the last position's token (query) matches a position whose previous token it is (key: the
    extra directions), and copies that position's token (+3 on it)."""
    V, e = w.V, w.extra
    at0, at1 = w.attn(0, 0), w.attn(1, 0)
    with torch.no_grad():
        for p in range(1, w.t.n_ctx):
            at0.W_Q[0, V + p, p - 1] = SHARPNESS  # query slot p - 1 at position p
            at0.W_K[0, V + p - 1, p - 1] = 1.0  # matched by position p - 1's key
        at0.W_Q[0, V + 0, w.t.n_ctx - 1] = SHARPNESS  # position 0 attends to itself
        at0.W_K[0, V + 0, w.t.n_ctx - 1] = 1.0
        for t in range(8):  # value: token t -> extra direction e + t
            at0.W_V[0, t, t] = 1.0
            at0.W_O[0, t, e + t] = 1.0
            at1.W_Q[0, t, t] = SHARPNESS  # the current token
            at1.W_K[0, e + t, t] = 1.0  # a position whose previous token is t
            at1.W_K[0, V + 0, t] = -1.0  # but not position 0 (its "previous token" is itself)
            at1.W_V[0, t, t] = 1.0
            at1.W_O[0, t, t] = 3.0
    w.bias("none", 1.5)


def _backup_head(w: _W, weight: float) -> None:
    """L1H0 attends to a (position 0) only while out_a is missing from the stream, and writes `weight`."""
    at = w.attn(1, 0)
    with torch.no_grad():
        at.W_Q[0, w.V + 2, K] = SHARPNESS
        at.W_K[0, w.V + 0, K] = 1.0
        for i in range(K):
            at.W_Q[0, w.tok(f"o{i}"), i] = -2 * SHARPNESS
            at.W_K[0, w.tok(f"a{i}"), i] = 1.0
            at.W_V[0, w.tok(f"a{i}"), i] = 1.0
            at.W_O[0, i, w.tok(f"o{i}")] = weight


__all__ = ["bench", "BenchTask", "BENCH", "Bench", "TRUTH", "SAME", "FUNCTION", "LOGIT_DIFF_TRUTH"]
