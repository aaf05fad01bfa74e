"""The writes and attention axes of `hc.cooperation`, read from the clean run once (they do not depend on
any ablation): per input and head, which completions it writes to, whether what it writes from its
attended token is conditional on the tokens it does not attend to, and which important token it attends.
"""

from __future__ import annotations

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from headcoop.analysis.engine.inputs import check_choice
from headcoop.analysis.mechanisms.axes import (
    conditional_rank,
    conditional_writes,
    consistent_outputs,
    containing_outputs,
    superposed,
    write_sets,
)  # fmt: skip
from headcoop.analysis.vocabulary import WRITE_READINGS, WriteReading
from headcoop.checks import check_int


def check_outputs(outputs, d_vocab: int) -> Tensor:
    """The completions the writes are read over, as token ids [output]; ValueError naming a bad one."""
    values = (
        outputs.tolist()
        if isinstance(outputs, Tensor)
        else list(outputs)
        if isinstance(outputs, (list, tuple))
        else None
    )
    if not values:
        raise ValueError(f"outputs must be a non-empty list of token ids, got {outputs!r}")
    ids = [check_int(f"outputs[{i}]", v, 0, d_vocab - 1) for i, v in enumerate(values)]
    return torch.tensor(ids, dtype=torch.long)


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
    outputs = answer.unique() if outputs is None else check_outputs(outputs, vocab)
    if len(set(outputs.tolist())) != len(outputs):
        dup = sorted({o for o in outputs.tolist() if outputs.tolist().count(o) > 1})
        raise ValueError(f"superposed_writes: outputs repeat {dup}; name each output once")
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


class Writes:
    """The writes and attention axes of every pair (clean run), per write reading and floor, computed once
    each. heads_dla: [batch, player, vocab] or why there is none; source: [batch, player] the token each
    head attends most; tokens [batch, key] and upto [batch] (the read row) give the completions containing
    a token; outs [output] the completions."""

    def __init__(self, heads_dla, players, pairs, answer, outs, source, tokens, upto):
        self.ok = not isinstance(heads_dla, str)
        self.players, self.pairs, self.answer, self.outs, self.source = players, pairs, answer, outs, source
        self.dla = None if not self.ok else [heads_dla[:, i][:, outs] for i in range(len(players))]
        position = torch.full((int(max(outs.max(), answer.max())) + 1,), -1, dtype=torch.long)
        position[outs] = torch.arange(len(outs))
        self.col = position[answer]
        n = len(answer)
        self.consistent = [consistent_outputs(source[:, i], answer, outs) for i in range(len(players))]
        present = torch.arange(tokens.shape[1])[None, :] <= upto[:, None]
        ids = tokens[present].unique()  # every token a head can attend to (sorted)
        contain = containing_outputs(ids, tokens, answer, outs, upto)  # [token, output], computed once
        self.containing = [contain[torch.searchsorted(ids, source[:, i].contiguous())] for i in range(len(players))]
        # an important token: the completions of the inputs that contain it are not every completion seen
        seen = torch.zeros(len(outs), dtype=torch.bool)
        seen[self.col[self.col >= 0].unique()] = True
        important_ids = ids[~(contain | ~seen[None, :]).all(-1)]
        marks = torch.isin(tokens, important_ids) & present
        kinds = [len(set(row[m].tolist())) for row, m in zip(tokens, marks)]
        self.two = torch.tensor(kinds) >= 2  # [batch] the prompt holds two different important tokens
        self.important = [torch.isin(source[:, i], important_ids) for i in range(len(players))]
        self.distributed = [self.important[i] & self.important[j] & (source[:, i] != source[:, j]) for i, j in pairs]
        self._at: dict = {}
        self._ranks: dict = {}
        self.n = n

    def at(self, floor: float, reading: str = "floor") -> list[dict]:
        """Per pair, per input [batch]: multi (both write several consistent completions), only (and the
        answer is the only completion both write to), shown_a / shown_b (the input shows whether the head's
        writes are conditional), cond_a / cond_b (they are)."""
        key = (floor, reading)
        if key not in self._at:
            none = torch.zeros(self.n, dtype=torch.bool)
            if not self.ok:
                self._at[key] = [dict(multi=none, only=none, shown_a=none, shown_b=none, cond_a=none, cond_b=none)
                                 for _ in self.pairs]  # fmt: skip
                return self._at[key]
            if reading == "floor":
                sets = [d > floor * d.max(-1, keepdim=True).values.clamp(min=0) for d in self.dla]
            elif reading == "positive":  # above float noise (1e-6 of the largest |write|): a 1e-8 leak is no write
                sets = [d > 1e-6 * d.abs().max(-1, keepdim=True).values for d in self.dla]
            else:
                sets = [write_sets(d, reading) for d in self.dla]
            cond = [conditional_writes(d, c, k, floor) for d, c, k in zip(self.dla, self.consistent, self.containing)]
            out = []
            for i, j in self.pairs:
                multi, only = superposed(sets[i], sets[j], self.consistent[i], self.consistent[j], self.col)
                out.append(dict(multi=multi, only=only & multi, shown_a=cond[i][0], shown_b=cond[j][0],
                                cond_a=cond[i][1], cond_b=cond[j][1]))  # fmt: skip
            self._at[key] = out
        return self._at[key]

    def shares(self, floor: float, reading: str, mask: Tensor) -> list[dict]:
        """Per pair, its write and attention shares among the inputs of `mask` [pair, batch] (where the pair
        matters); distributed among those whose prompt holds two different important tokens (one token
        cannot be distributed). Computed for every pair at once."""
        at = self.at(floor, reading)
        stack = {name: torch.stack([x[name] for x in at]) for name in at[0]} if at else {}
        if not at:
            return []
        dist = torch.stack(self.distributed)

        def among(x, within=None):
            base = mask if within is None else mask & within
            return ((x & base).sum(-1).double() / base.sum(-1).clamp(min=1).double()).tolist()

        columns = dict(multi=among(stack["multi"]), only=among(stack["only"], stack["multi"]),
                       shown_a=among(stack["shown_a"]), shown_b=among(stack["shown_b"]),
                       cond_a=among(stack["cond_a"], stack["shown_a"]), cond_b=among(stack["cond_b"], stack["shown_b"]),
                       distributed=among(dist, self.two[None, :].expand_as(dist)))  # fmt: skip
        return [{name: values[m] for name, values in columns.items()} for m in range(len(self.pairs))]

    def ranks(self, m: int, tol: float = 0.1) -> tuple[int, int]:
        """The rank of each head's map from attended sources to writes (`conditional_rank`)."""
        if not self.ok:
            return 0, 0
        i, j = self.pairs[m]
        for h in (i, j):
            if (h, tol) not in self._ranks:
                self._ranks[(h, tol)] = conditional_rank(self.dla[h], self.source[:, h], tol)
        return self._ranks[(i, tol)], self._ranks[(j, tol)]


__all__ = ["superposed_writes", "check_outputs", "Writes"]
