"""The features of a task's inputs that a question is about (issue 71): each task declares which of them are
its semantics and which are the others, so that "the same function" is read in the source's own sense.

The Count01 paper's claim is scoped: "on the semantics of the counting task, attention heads behave as a
pseudo-ensemble". Its semantic features are the count of 1s and the count of 0s; the noise token '2' and
the position of a digit are the others, reported apart. SkipPair's are its signal tokens; the tokens between
them and the positions are the others.

    features = hc.Count01().features()
    features.values(batch.tokens, batch.answer_pos)        # [batch, feature] counts before the read row

Every feature here counts tokens of a set in the editable span (from `start` up to the read row): what an
edit (a substitution, an insertion, a deletion) changes is the difference of two such counts. Positions
are not a feature column: a response that changes with where an edit is made, all else equal, is measured
as its own share (`edits.py`).
"""

from __future__ import annotations

import dataclasses

import torch
from jaxtyping import Int
from torch import Tensor


@dataclasses.dataclass(frozen=True)
class Features:
    """The declared features of a task's inputs.

    names:    one phrase per feature ("the count of 1s").
    short:    what a head reading it alone is said to count ("1s").
    tokens:   per feature, the token ids it counts.
    semantic: per feature, whether it is the task's semantics (the question is about it) or another feature
              (reported apart).
    scope:    the semantic features together, as a sentence reads them ("the counts").
    start:    the first position an edit may change (Count01: 1, after [BOS]).
    lengths:  (shortest, longest) editable span where the task varies its lengths: insertions and deletions
              are edits then; None where every input has one length.
    """

    names: tuple[str, ...]
    short: tuple[str, ...]
    tokens: tuple[tuple[int, ...], ...]
    semantic: tuple[bool, ...]
    scope: str
    start: int = 0
    lengths: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        n = len(self.names)
        if not (len(self.short) == len(self.tokens) == len(self.semantic) == n) or n == 0:
            raise ValueError(f"Features needs one short name, token set and semantic flag per feature, got {n} "
                             f"names, {len(self.short)} short, {len(self.tokens)} token sets, "
                             f"{len(self.semantic)} flags")  # fmt: skip
        if not any(self.semantic):
            raise ValueError("Features needs at least one semantic feature")
        if self.lengths is not None and not 1 <= self.lengths[0] <= self.lengths[1]:
            raise ValueError(f"lengths must be (shortest, longest) with 1 <= shortest <= longest, got {self.lengths}")

    @property
    def alphabet(self) -> tuple[int, ...]:
        """Every token some feature counts: what an insertion may put in."""
        return tuple(sorted({t for ts in self.tokens for t in ts}))

    def values(self, tokens: Int[Tensor, "batch pos"], read: Int[Tensor, " batch"]) -> Int[Tensor, "batch feature"]:
        """[batch, feature] each feature's count over the positions start .. read - 1 of each input."""
        at = torch.arange(tokens.shape[1])
        inside = (at[None, :] >= self.start) & (at[None, :] < read.cpu()[:, None])
        tokens = tokens.cpu()
        cols = [((torch.isin(tokens, torch.tensor(ts)) & inside).sum(1)) for ts in self.tokens]
        return torch.stack(cols, 1)


def counting_features(zero: int, one: int, two: int, start: int, lengths: tuple[int, int] | None) -> Features:
    """Count01's features (and its bench models'): the count of 1s and of 0s are the semantics, the noise token
    '2' the other."""
    return Features(names=("the count of 1s", "the count of 0s", "the count of 2s (the noise token)"),
                    short=("1s", "0s", "2s"), tokens=((one,), (zero,), (two,)), semantic=(True, True, False),
                    scope="the counts", start=start, lengths=lengths)  # fmt: skip


def signal_features(signals: tuple[int, ...], noise: tuple[int, ...], labels: tuple[str, ...]) -> Features:
    """SkipPair's features (and its bench models'): the count of each signal token is the semantics, each noise
    token (the tokens between them) another feature."""
    return Features(names=tuple(f"signal token {x}" for x in labels[: len(signals)])
                    + tuple(f"noise token {x}" for x in labels[len(signals):]),
                    short=labels, tokens=tuple((t,) for t in signals + noise),
                    semantic=(True,) * len(signals) + (False,) * len(noise), scope="the signal tokens")  # fmt: skip


__all__ = ["Features", "counting_features", "signal_features"]
