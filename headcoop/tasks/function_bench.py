"""Near-misses of "the same function on the counts" (issue 71): hand-weighted counting models whose truth is
fixed by their weights, each lacking one property of a pseudo-ensemble on the Count01 paper's semantics.
`tests/analysis/mechanisms/test_function_bench.py` checks each truth with plain hooks on `hook_z` and
hand-made edits, independently of the instrument; `hc.cooperation(model).function_word` is scored on them.

    model = function_bench("count-noise")      # model.task (its features), model.function (the truth)

Inputs are digits 0 / 1 / 2 of a length from 3 to 8, then "=" (the read row), padded with "none"; the answer
is "5" with more 1s than 0s, "4" with more 0s (ties redrawn). A counter attends evenly to every position up to
"=" (no query or key weights) and writes +3 on "4" per 0 and +3 on "5" per 1 it attends to; "none" sits at -5.

- "count-noise": two counters; L0H1 also writes +3 on "4" per '2' it attends to: the same on the counts, and the
  noise token weighed differently. Truth: same function on the counts.
- "count-position": L0H0 counts; L0H1 counts with attention growing with the position (its attention to a
  position grows by a factor e^0.6 per position): its response to a flip grows with where the digit is. Truth: different functions.
- "count-last3": L0H0 counts; L0H1 attends only to the last 3 digits before "=" (wherever "=" is) and counts
  them. Truth: different functions.
- "count-2l-read": two layer-0 counters write the counts only into two flag directions (no direct write), read
  by L1H0 at "=" onto "4" / "5" (L1H1 writes nothing): an ensemble seen only through a later layer. Truth: same
  function on the counts (the layer-0 heads by their total effect).
- "count-floor": three counters writing +3, +3 and +0.36 (12% of the largest: just above the default activity
  floor of 10%). Truth: same function on the counts.
- "count-specialists": L0H0 counts 0s only, L0H1 1s only, on inputs of varying length (insertions move one
  count alone). Truth: different functions (specialised). The one-length pair is the bench's "count-subtasks".
"""

from __future__ import annotations

from typing import Any, Literal, get_args

import torch

from headcoop.checks import check_seed
from headcoop.models.tl import HookedTransformer, HookedTransformerConfig
from headcoop.tasks.base import Batch, check_sample_size, generator
from headcoop.tasks.features import Features, counting_features
from headcoop.tasks.planted import HandWeightedTask

FunctionBench = Literal["count-noise", "count-position", "count-last3", "count-2l-read", "count-floor",
                        "count-specialists"]  # fmt: skip
FUNCTION_BENCH: tuple[str, ...] = get_args(FunctionBench)
LENGTHS = (3, 8)
SHARP = 30.0
# the model-level word of each (`hc.cooperation(...).function_word`)
FUNCTION_TRUTH = {
    "count-noise": "same function on the counts (pseudo-ensemble)",
    "count-position": "different functions on the counts",
    "count-last3": "different functions on the counts",
    "count-2l-read": "same function on the counts (pseudo-ensemble)",
    "count-floor": "same function on the counts (pseudo-ensemble)",
    "count-specialists": "different functions on the counts",
}
# what sets each apart, as the result reports it: the other features' reading, or how the heads split the counts
FUNCTION_DETAIL = {"count-noise": "weigh the count of 2s (the noise token) differently",
                   "count-specialists": "L0H0 counts 0s alone; L0H1 counts 1s alone"}  # fmt: skip


class CountingTask(HandWeightedTask):
    """Digits of a varying length, then "=" (module docstring); its features: the counts of 1s and 0s (the
    semantics) and of 2s, with insertions and deletions within `LENGTHS`."""

    name = "function-bench"
    vocab = ["0", "1", "2", "=", "4", "5", "none"]

    def __init__(self, which: FunctionBench = "count-noise"):
        if which not in FUNCTION_BENCH:
            raise ValueError(f"unknown function-bench model {which!r}; valid values are {list(FUNCTION_BENCH)}")
        self.which = which
        self.index = {s: i for i, s in enumerate(self.vocab)}

    @property
    def n_ctx(self) -> int:
        return LENGTHS[1] + 2  # the longest string, "=", and room for one insertion's shift

    def completions(self) -> torch.Tensor:
        return torch.tensor([self.index["4"], self.index["5"]])

    def features(self) -> Features:
        return counting_features(self.index["0"], self.index["1"], self.index["2"], start=0, lengths=LENGTHS)

    def sample(self, n: int, seed: int = 0) -> Batch:
        n = check_sample_size(n, self.n_ctx)
        gen = generator(seed)
        rows: list[torch.Tensor] = []
        lengths: list[int] = []
        while len(rows) < n:
            length = int(torch.randint(LENGTHS[0], LENGTHS[1] + 1, (1,), generator=gen))
            digits = torch.randint(0, 3, (length,), generator=gen)
            if int((digits == 0).sum()) == int((digits == 1).sum()):
                continue
            row = torch.full((self.n_ctx,), self.index["none"], dtype=torch.long)
            row[:length] = digits
            row[length] = self.index["="]
            rows.append(row)
            lengths.append(length)
        tokens, pos = torch.stack(rows), torch.tensor(lengths)
        ones, zeros = ((tokens == 1) & (torch.arange(self.n_ctx) < pos[:, None])).sum(1), \
            ((tokens == 0) & (torch.arange(self.n_ctx) < pos[:, None])).sum(1)  # fmt: skip
        answer = torch.where(ones > zeros, self.index["5"], self.index["4"])
        return Batch(tokens=tokens, loss_pos=pos[:, None], targets=answer[:, None], answer_pos=pos, answer=answer,
                     wrong=torch.full((n,), self.index["none"]), labels=answer.clone(), vocab=tuple(self.vocab))  # fmt: skip

    def corrupt(self, batch: Batch) -> Batch:
        """Every 0 and 1 swapped: the answer flips."""
        tokens = batch.tokens.clone()
        tokens[batch.tokens == 0], tokens[batch.tokens == 1] = 1, 0
        answer = self.index["4"] + self.index["5"] - batch.answer
        return batch.replace(tokens=tokens, targets=answer[:, None], answer=answer, labels=answer.clone())

    def config(self) -> HookedTransformerConfig:
        layers = 2 if self.which == "count-2l-read" else 1
        heads = 3 if self.which == "count-floor" else 2
        d_model = len(self.vocab) + self.n_ctx + 2
        return HookedTransformerConfig(n_layers=layers, n_heads=heads, d_model=d_model, d_head=self.n_ctx,
                                       n_ctx=self.n_ctx, d_vocab=len(self.vocab), attn_only=True,
                                       normalization_type=None, positional_embedding_type="standard", seed=0)  # fmt: skip

    def params(self) -> dict[str, Any]:
        return {"which": self.which}


def function_bench(which: FunctionBench = "count-noise", seed: int = 0) -> HookedTransformer:
    """A near-miss counting model (module docstring), `model.task` its task and `model.function` its truth
    (the model-level word of the function axis)."""
    check_seed(seed)
    task = CountingTask(which)
    model = HookedTransformer(task.config()).eval()
    V, n_ctx = len(task.vocab), task.n_ctx
    flag = V + n_ctx  # two extra residual directions: the counts' flags of "count-2l-read"
    tok = task.index
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.embed.W_E[:, :V] = torch.eye(V)
        model.pos_embed.W_pos[:, V : V + n_ctx] = torch.eye(n_ctx)
        model.unembed.W_U[[tok["4"], tok["5"], tok["none"]], [tok["4"], tok["5"], tok["none"]]] = 1.0
        model.unembed.b_U[tok["none"]] = -5.0
        attn = [block.attn for block in model.blocks]

        def ov(layer: int, head: int, writes: dict) -> None:
            for slot, (src, outs) in enumerate(writes.items()):
                attn[layer].W_V[head, src, slot] = 1.0
                for out, weight in outs.items():
                    attn[layer].W_O[head, slot, out] = weight

        count = lambda w: {tok["0"]: {tok["4"]: w}, tok["1"]: {tok["5"]: w}}  # noqa: E731
        if which == "count-noise":
            ov(0, 0, count(3.0))
            ov(0, 1, {**count(3.0), tok["2"]: {tok["4"]: 3.0}})
        elif which == "count-position":
            ov(0, 0, count(3.0))
            ov(0, 1, count(3.0))
            attn[0].W_Q[1, tok["="], 0] = 1.0
            scale = model.cfg.d_head**0.5  # TransformerLens divides the scores by it
            attn[0].W_K[1, V : V + n_ctx, 0] = 0.6 * scale * torch.arange(n_ctx, dtype=torch.float)
        elif which == "count-last3":
            ov(0, 0, count(3.0))
            ov(0, 1, count(3.0))
            for q in range(n_ctx):  # the query at position q matches the keys at q - 3 .. q - 1
                attn[0].W_Q[1, V + q, q] = SHARP
                for p in range(max(0, q - 3), q):
                    attn[0].W_K[1, V + p, q] = 1.0
        elif which == "count-2l-read":
            for h in (0, 1):
                ov(0, h, {tok["0"]: {flag: 1.0}, tok["1"]: {flag + 1: 1.0}})
            attn[1].W_Q[0, tok["="], 0] = SHARP  # L1H0 attends to "=" itself, which holds the layer-0 counts
            attn[1].W_K[0, tok["="], 0] = 1.0
            ov(1, 0, {flag: {tok["4"]: 6.0}, flag + 1: {tok["5"]: 6.0}})
        elif which == "count-floor":
            for h, w in enumerate((3.0, 3.0, 0.36)):
                ov(0, h, count(w))
        elif which == "count-specialists":
            ov(0, 0, {tok["0"]: {tok["4"]: 3.0}})
            ov(0, 1, {tok["1"]: {tok["5"]: 3.0}})
    model.task = task
    model.function = FUNCTION_TRUTH[which]
    return model


__all__ = ["function_bench", "CountingTask", "FUNCTION_BENCH", "FUNCTION_TRUTH", "FUNCTION_DETAIL", "FunctionBench"]
