"""Planted models: hand-weighted HookedTransformers whose heads cooperate in a known way, with their task,
to test `hc.cooperation` against a known answer.

    model = hc.planted("redundant")              # model.task, model.planted: the truth
    hc.cooperation(model).mechanism              # "redundant" (the "superposition" model's truth is
                                                 # "conjunction": its writes are not conditional)

Every model reads a sequence [a, b, =]: a in a0..a{K-1} (position 0), b in b0..b{K-1} (position 1), and
answers at "=" (position 2) with one output token. The residual stream holds one-hot token and position
directions and one direction per output token, read by W_U; attention is hard (query x key = 30 at the
attended position, 0 elsewhere), so each head copies what its OV table says about the token it attends
to. With every head ablated the logits are b_U: the "none" output leads with 0.6, so no input is
answered without the heads. `wrong` (the logit-difference alternative) is "none".

Mechanisms (`PLANTED`; `planted_truth` gives each pair's planted verdict and each head's role):

- "redundant": L0H0 and L0H1 both copy a onto out_a (+1 each): either alone answers (OR).
- "division": L0H0 copies a when a < K/2, L0H1 when a >= K/2: each answers its own half of the inputs.
- "superposition": L0H0 reads a and writes +1 on the K grid outputs (a, *) and +1.5 on its decoy d_a;
  L0H1 reads b and writes +1 on (*, b) and +1.5 on e_b. Alone, a decoy wins; together only (a, b) gets
  +2: both write to several outputs and add up only on the answer. Named for the old reading: what each
  head writes from its token does not depend on the token it does not attend to (it writes every
  completion containing its token), so by the post's definition it is not superposition: the truth is
  "conjunction" (both needed on every input).
- "competition": L0H0 copies a with +2, L0H1 writes -1 on out_a: it pushes against the answer.
- "independent": L0H0 and L0H1 each add +0.4 to out_a against none's 0.6: both are needed, each
  writes one output, and their effects add: both needed on accuracy, "conjunction". On the logit
  difference, in one attention-only layer without norms, the logits are linear in the heads whatever the
  weights, so the truth there is "not testable".
- "independent-2l": the same with L0H0 and L1H0 in two layers (L1H0's attention reads positions only), so
  additivity is a property of these weights, not of the architecture.
- "backup": L0H0 copies a (+1) and L1H0 is its backup: its query reads out_a's direction, so it attends to
  a (and writes +1.5 on out_a) only when L0H0's output is missing (McGrath et al. 2023's self-repair).
- "mixed": L0H0 and L0H1 copy a (+1 each, redundant), L0H2 writes -0.3 on out_a (competes with both).

`weight_noise` adds seeded Gaussian noise of that standard deviation to every weight (tests use 0.01).
"""

from __future__ import annotations

from typing import Any, Literal, get_args

import torch
from jaxtyping import Int
from torch import Tensor

from headcoop.models.tl import HookedTransformer, HookedTransformerConfig
from headcoop.tasks.base import Batch, Task, check_sample_size, generator

Planted = Literal["redundant", "division", "superposition", "competition", "independent", "independent-2l",
                  "backup", "mixed"]  # fmt: skip
PLANTED: tuple[str, ...] = get_args(Planted)
K = 4  # values of a and of b
SHARPNESS = 30.0  # query x key at the attended position


class HandWeightedTask(Task):
    """What the tasks of hand-weighted models share (planted models, the mechanism bench): a vocabulary of
    words (`vocab`, `index`), space-separated text, accuracy as the evaluation, the model's task set on it."""

    vocab: list[str]
    index: dict[str, int]

    def encode(self, text: str) -> Int[Tensor, " pos"]:
        words = self.check_text(text).split()
        for pos, word in enumerate(words):
            if word not in self.index:
                raise ValueError(f"unknown symbol {word!r} at position {pos}; the vocabulary is {self.vocab}")
        return torch.tensor([self.index[w] for w in words])

    def decode(self, ids) -> str | list[str]:
        return self.decode_with(ids, " ")

    def evaluate(self, model: HookedTransformer, n: int = 4096, seed: int = 10_000) -> dict[str, float]:
        self.check_ready(model, f"{self.name} evaluate")
        batch = self.sample(n, seed)
        with torch.no_grad():
            logits = model(batch.tokens)
        return {"accuracy": float(self.correct(logits, batch).float().mean())}

    def prepare(self, model: HookedTransformer) -> HookedTransformer:
        model.task = self
        return model


class PlantedTask(HandWeightedTask):
    """The [a, b, =] task of the planted models (module docstring): answer out_a, or grid (a, b) for
    "superposition"; the alternative is "none"."""

    name = "planted"

    def __init__(self, mechanism: Planted = "redundant"):
        if mechanism not in PLANTED:
            raise ValueError(f"unknown planted mechanism {mechanism!r}; valid values are {list(PLANTED)}")
        self.mechanism = mechanism
        self.vocab = ([f"a{i}" for i in range(K)] + [f"b{i}" for i in range(K)] + ["="]
                      + [f"out{i}" for i in range(K)] + [f"g{i}{j}" for i in range(K) for j in range(K)]
                      + [f"d{i}" for i in range(K)] + [f"e{i}" for i in range(K)] + ["none"])  # fmt: skip
        self.index = {s: i for i, s in enumerate(self.vocab)}

    @property
    def n_ctx(self) -> int:
        return 3

    def answer_of(self, a: Tensor, b: Tensor) -> Tensor:
        if self.mechanism == "superposition":
            return self.index["g00"] + a * K + b
        return self.index["out0"] + a

    def sample(self, n: int, seed: int = 0) -> Batch:
        n = check_sample_size(n, self.n_ctx)
        gen = generator(seed)
        a, b = torch.randint(0, K, (n,), generator=gen), torch.randint(0, K, (n,), generator=gen)
        tokens = torch.stack([a, K + b, torch.full((n,), 2 * K)], 1)
        answer = self.answer_of(a, b)
        return Batch(tokens=tokens, loss_pos=torch.full((n, 1), 2), targets=answer[:, None],
                     answer_pos=torch.full((n,), 2), answer=answer, wrong=torch.full((n,), self.index["none"]),
                     labels=a, vocab=tuple(self.vocab))  # fmt: skip

    def corrupt(self, batch: Batch) -> Batch:
        """a (and b) shifted by one: a different answer for every input; `wrong` stays "none"."""
        a, b = batch.tokens[:, 0], batch.tokens[:, 1] - K
        a2, b2 = (a + 1) % K, (b + 1) % K
        tokens = torch.stack([a2, K + b2, batch.tokens[:, 2]], 1)
        answer = self.answer_of(a2, b2)
        return batch.replace(tokens=tokens, targets=answer[:, None], answer=answer, labels=a2)

    def config(self, n_layers: int = 1, n_heads: int = 2, **kwargs) -> HookedTransformerConfig:
        d_model = len(self.vocab) + self.n_ctx
        return HookedTransformerConfig(n_layers=n_layers, n_heads=n_heads, d_model=d_model, d_head=K + 1,
                                       n_ctx=self.n_ctx, d_vocab=len(self.vocab), attn_only=True,
                                       normalization_type=None, positional_embedding_type="standard",
                                       seed=0, **kwargs)  # fmt: skip

    def params(self) -> dict[str, Any]:
        return {"mechanism": self.mechanism}


# --- the weights ----------------------------------------------------------------------------------------
class _Writer:
    """Sets one model's weights: residual directions token t -> t, position p -> V + p; W_U reads output
    token o from direction o (the same one-hot as its embedding; output tokens never appear as inputs)."""

    def __init__(self, model: HookedTransformer, task: PlantedTask):
        self.model, self.task = model, task
        self.V = len(task.vocab)
        with torch.no_grad():
            for param in model.parameters():
                param.zero_()
            model.embed.W_E[:, : self.V] = torch.eye(self.V)
            model.pos_embed.W_pos[:, self.V :] = torch.eye(task.n_ctx)
            outputs = torch.arange(task.index["out0"], self.V)  # input tokens are never read out
            model.unembed.W_U[outputs, outputs] = 1.0

    def tok(self, word: str) -> int:
        return self.task.index[word]

    def floor(self, value: float) -> None:
        with torch.no_grad():
            self.model.unembed.b_U[self.tok("none")] = value

    def attend(self, layer: int, head: int, pos: int) -> None:
        """The head's query at "=" (position 2) matches position `pos`'s key: hard attention to it."""
        attn = self.model.blocks[layer].attn
        with torch.no_grad():
            attn.W_Q[head, self.V + 2, K] = SHARPNESS
            attn.W_K[head, self.V + pos, K] = 1.0

    def copy(self, layer: int, head: int, table: dict[str, dict[str, float]]) -> None:
        """OV: input token table key (an a or b token) -> write {output token: weight}."""
        attn = self.model.blocks[layer].attn
        with torch.no_grad():
            for slot, (word, writes) in enumerate(table.items()):
                attn.W_V[head, self.tok(word), slot] = 1.0
                for out, weight in writes.items():
                    attn.W_O[head, slot, self.tok(out)] = weight


def planted(mechanism: Planted = "redundant", weight_noise: float = 0.0, seed: int = 0) -> HookedTransformer:
    """A hand-weighted model with the planted `mechanism` (module docstring), `model.task` its task and
    `model.planted` the truth (`planted_truth`); `weight_noise` the std of seeded noise on every weight."""
    task = PlantedTask(mechanism)
    layers = 2 if mechanism in ("independent-2l", "backup") else 1
    heads = 3 if mechanism == "mixed" else 2 if layers == 1 else 1
    model = HookedTransformer(task.config(n_layers=layers, n_heads=heads)).eval()
    w = _Writer(model, task)
    a = [f"a{i}" for i in range(K)]
    copy = lambda weight, which=range(K): {a[i]: {f"out{i}": weight} for i in which}  # noqa: E731
    w.floor(0.6)
    if mechanism in ("redundant", "mixed"):
        for h in (0, 1):
            w.attend(0, h, 0)
            w.copy(0, h, copy(1.0))
        if mechanism == "mixed":
            w.attend(0, 2, 0)
            w.copy(0, 2, copy(-0.3))
    elif mechanism == "division":
        for h, half in ((0, range(K // 2)), (1, range(K // 2, K))):
            w.attend(0, h, 0)
            w.copy(0, h, copy(1.0, half))
    elif mechanism == "superposition":
        w.attend(0, 0, 0)
        w.copy(0, 0, {a[i]: {**{f"g{i}{j}": 1.0 for j in range(K)}, f"d{i}": 1.5} for i in range(K)})
        w.attend(0, 1, 1)
        w.copy(0, 1, {f"b{j}": {**{f"g{i}{j}": 1.0 for i in range(K)}, f"e{j}": 1.5} for j in range(K)})
    elif mechanism == "competition":
        w.attend(0, 0, 0)
        w.copy(0, 0, copy(2.0))
        w.attend(0, 1, 0)
        w.copy(0, 1, copy(-1.0))
    elif mechanism in ("independent", "independent-2l"):
        second = (0, 1) if mechanism == "independent" else (1, 0)
        for layer, head in ((0, 0), second):
            w.attend(layer, head, 0)
            w.copy(layer, head, copy(0.4))
    elif mechanism == "backup":
        w.attend(0, 0, 0)
        w.copy(0, 0, copy(1.0))
        _backup_head(w)
    if weight_noise:
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for param in model.parameters():
                param.add_(weight_noise * torch.randn(param.shape, generator=gen))
    model.task = task
    model.planted = planted_truth(mechanism)
    return model


def _backup_head(w: _Writer) -> None:
    """L1H0: score(a's position) = SHARPNESS * (1 - 2 * out_a in the stream), 0 elsewhere, so it attends to
    a only while out_a is missing; it then writes +1.5 on out_a. Its value reads a tokens only."""
    attn = w.model.blocks[1].attn
    with torch.no_grad():
        attn.W_Q[0, w.V + 2, K] = SHARPNESS  # a constant at "="
        attn.W_K[0, w.V + 0, K] = 1.0  # matched by position 0's key
        for i in range(K):  # minus twice the stream's out_i, matched by a_i's key
            attn.W_Q[0, w.tok(f"out{i}"), i] = -2 * SHARPNESS
            attn.W_K[0, w.tok(f"a{i}"), i] = 1.0
            attn.W_V[0, w.tok(f"a{i}"), i] = 1.0
            attn.W_O[0, i, w.tok(f"out{i}")] = 1.5


def planted_truth(mechanism: Planted) -> dict:
    """{"pairs": {(head_a, head_b): mechanism}, "roles": {head: role}, "backup": {head: the head it backs
    up}} of a planted model."""
    two = ("L0H0", "L1H0") if mechanism in ("independent-2l", "backup") else ("L0H0", "L0H1")
    if mechanism == "mixed":
        pairs = {("L0H0", "L0H1"): "redundant", ("L0H0", "L0H2"): "competition", ("L0H1", "L0H2"): "competition"}
        roles = {"L0H0": "supports", "L0H1": "supports", "L0H2": "competes"}
    else:
        # issue 48: "superposition" is named for the old reading; by the SkipPair post's definition its heads
        # are not superposed (each writes every completion containing its token, whatever the other token),
        # and both are needed: conjunction; "independent" heads (both needed) are a conjunction on accuracy
        verdict = {"independent-2l": "conjunction", "backup": "redundant", "independent": "conjunction",
                   "superposition": "conjunction"}.get(mechanism, mechanism)  # fmt: skip
        pairs = {two: verdict}
        roles = {two[0]: "supports", two[1]: "competes" if mechanism == "competition" else "supports"}
    return {"pairs": pairs, "roles": roles, "backup": {"L1H0": "L0H0"} if mechanism == "backup" else {}}


__all__ = ["planted", "planted_truth", "PlantedTask", "HandWeightedTask", "PLANTED", "Planted"]
