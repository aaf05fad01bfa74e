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
  the norm makes their logit effects far from additive (one head alone gives 84% of the pair's logit),
  so no word of the list fits: "undetermined".
- "unequal": L0H0 copies a with +1.0, L0H1 with +0.7 (floor 0.6): redundant with unequal strengths.
- "uneven": L0H0 copies a for a in a0..a2, L0H1 for a3: an uneven division (75% / 25%).
- "cancel": L0H0 copies a (+1.2), L0H1 adds +0.5 and L0H2 -0.5 to out_a, L0H3 writes nothing (weight
  noise in tests makes it a small distractor): L0H2 competes, L0H3 is inactive.
- "four": the "post" pair plus two empty heads: the mechanism sits on one pair of four.
- "mlp": one layer with an MLP: L0H0 writes a flag f_a that the MLP turns into +1 on out_a, L0H1 copies a
  onto out_a (+1) directly (floor 0.6): either route alone answers. Truth: redundant.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

import torch
from torch import Tensor

from headcoop.checks import check_float, check_seed
from headcoop.tasks.base import Batch, check_sample_size, generator
from headcoop.tasks.planted import HandWeightedTask
from headcoop.tl import HookedTransformer, HookedTransformerConfig

Bench = Literal["post", "rank1", "and-junk", "and-suppress", "feeder", "induction", "partial-backup", "ln-2l",
                "unequal", "uneven", "cancel", "four", "mlp"]  # fmt: skip
BENCH: tuple[str, ...] = get_args(Bench)
SHARPNESS = 30.0
K = 4
SIGNALS = [f"s{i}" for i in range(1, 5)]
PAIRS = [(x, y) for x in range(4) for y in range(x, 4)]  # unordered pairs of signal indices
TRUTH = {
    "post": ({("L0H0", "L0H1"): "superposition"}, {"L0H0": "supports", "L0H1": "supports"}),
    "rank1": ({("L0H0", "L0H1"): "not testable"}, {"L0H0": "supports", "L0H1": "supports"}),
    "and-junk": ({("L0H0", "L0H1"): "not testable"}, {"L0H0": "supports", "L0H1": "supports"}),
    "and-suppress": ({("L0H0", "L0H1"): "not testable"}, {"L0H0": "supports", "L0H1": "supports"}),
    "feeder": ({("L0H0", "L1H0"): "composition"}, {"L0H0": "supports", "L1H0": "supports"}),
    "induction": ({("L0H0", "L1H0"): "composition"}, {"L0H0": "supports", "L1H0": "supports"}),
    "partial-backup": ({("L0H0", "L1H0"): "redundant"}, {"L0H0": "supports", "L1H0": "supports"}),
    "ln-2l": ({("L0H0", "L1H0"): "undetermined"}, {"L0H0": "supports", "L1H0": "supports"}),
    "unequal": ({("L0H0", "L0H1"): "redundant"}, {"L0H0": "supports", "L0H1": "supports"}),
    "uneven": ({("L0H0", "L0H1"): "division"}, {"L0H0": "supports", "L0H1": "supports"}),
    "cancel": ({("L0H1", "L0H2"): "competition", ("L0H0", "L0H2"): "competition"},
               {"L0H0": "supports", "L0H1": "supports", "L0H2": "competes", "L0H3": "inactive"}),
    "four": ({("L0H0", "L0H1"): "superposition", ("L0H2", "L0H3"): "inactive"},
             {"L0H0": "supports", "L0H1": "supports", "L0H2": "inactive", "L0H3": "inactive"}),
    "mlp": ({("L0H0", "L0H1"): "redundant"}, {"L0H0": "supports", "L0H1": "supports"}),
}
MODEL_WORD = {"post": "superposition", "four": "superposition", "feeder": "composition", "induction": "composition",
              "partial-backup": "redundant", "ln-2l": "undetermined", "unequal": "redundant", "uneven": "division",
              "rank1": "not testable", "and-junk": "not testable", "and-suppress": "not testable",
              "cancel": "competition", "mlp": "redundant"}  # fmt: skip


class BenchTask(HandWeightedTask):
    """The task of one bench model (module docstring): its vocabulary, inputs and answers."""

    name = "bench"

    def __init__(self, which: Bench = "post"):
        if which not in BENCH:
            raise ValueError(f"unknown bench model {which!r}; valid values are {list(BENCH)}")
        self.which = which
        if which == "induction":
            self.vocab = [f"t{i}" for i in range(8)] + ["none"]
        else:
            self.vocab = ([f"a{i}" for i in range(K)] + [f"b{i}" for i in range(K)] + SIGNALS + ["="]
                          + [f"o{i}" for i in range(K)] + [f"c{x + 1}{y + 1}" for x, y in PAIRS] + ["none"])  # fmt: skip
        self.index = {s: i for i, s in enumerate(self.vocab)}

    @property
    def n_ctx(self) -> int:
        return 6 if self.which == "induction" else 3

    def completions(self) -> Tensor | None:
        if self.which in ("post", "four"):
            return torch.tensor([self.index[f"c{x + 1}{y + 1}"] for x, y in PAIRS])
        if self.which == "induction":
            return None
        return torch.tensor([self.index[f"o{i}"] for i in range(K)])

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
        else:
            x, y = torch.randint(0, K, (n,), generator=gen), torch.randint(0, K, (n,), generator=gen)
            if self.which in ("post", "four"):
                first, second = self.index["s1"] + x, self.index["s1"] + y
                lo, hi = torch.minimum(x, y), torch.maximum(x, y)
                pair_index = {p: k for k, p in enumerate(PAIRS)}
                answer = torch.tensor([self.index["c11"] + pair_index[(int(a), int(b))] for a, b in zip(lo, hi)])
            else:
                first, second = x, K + y
                answer = self.index["o0"] + self._answer_of(x, y)
            tokens = torch.stack([first, second, torch.full((n,), self.index["="])], 1)
            pos = torch.full((n,), 2)
        return Batch(tokens=tokens, loss_pos=pos[:, None], targets=answer[:, None], answer_pos=pos, answer=answer,
                     wrong=torch.full((n,), none), labels=answer.clone(), vocab=tuple(self.vocab))  # fmt: skip

    def _answer_of(self, a: Tensor, b: Tensor) -> Tensor:
        if self.which == "rank1":
            return 2 * (a >= 2).long() + (b % 2)
        return a

    def corrupt(self, batch: Batch) -> Batch:
        """The next input of a fresh sample: a different input (the bench is not meant for patching)."""
        other = self.sample(len(batch), seed=12_345)
        return batch.replace(tokens=other.tokens, targets=other.targets, answer=other.answer, labels=other.labels)

    def config(self) -> HookedTransformerConfig:
        layers = 2 if self.which in ("feeder", "induction", "partial-backup", "ln-2l") else 1
        heads = {"cancel": 4, "four": 4}.get(self.which, 1 if layers == 2 else 2)
        extra = 8 if self.which in ("feeder", "induction", "mlp") else 0
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
            model.pos_embed.W_pos[:, self.V: self.V + task.n_ctx] = torch.eye(task.n_ctx)
            first_out = task.index["o0"] if "o0" in task.index else 0  # input tokens are not read out
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


def _post(w: _W) -> None:
    """L0H0 prefers s1 > s2 > s3 > s4, L0H1 the reverse; OV writes the completions consistent with the order."""
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
            allowed = prefs[rank:]  # tokens not preferred to t: what the other position may hold
            outs = [pair_word[tuple(sorted((t, u)))] for u in allowed]
            weight = 2.0 if len(outs) == 1 else 1.0
            table[SIGNALS[t]] = {o: weight for o in outs}
        w.ov(0, h, table)
    w.bias("none", 1.5)


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


__all__ = ["bench", "BenchTask", "BENCH", "Bench", "TRUTH"]
