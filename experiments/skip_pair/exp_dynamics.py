"""Two measures that follow the post's words more closely than the per-model tables of exp_runs:

- split attention *during training*, as a model-level scheme ("the heads would attend to the same tokens to
  varying degree"): 2-head models of every d_head, checkpoints every `every` steps of one run each; a
  signal pair {a, b} is *split by the model* at a checkpoint when both heads give the less-attended of a
  and b more than 10% of the two's attention (`split_attention`, from the QK scores at the read-off);
  a checkpoint counts once the model has learnt the task there (sampled signal accuracy >= 0.9), since
  at initialisation every head attends almost uniformly;
- constructive interference "in contexts where both heads write to multiple outputs": with raw (not
  centred) direct contributions averaged exactly over each pair type's contexts, as the post's figure
  shows, the pair types where each head pushes at least two completions above zero, and of those the ones
  whose correct completion is the only one both heads push above zero.
"""

from __future__ import annotations

import pandas as pd
import torch

import headcoop as hc
from experiments.skip_pair.exp_runs import SPLIT_THRESHOLD as SPLIT
from headcoop.studies.skip_pair import PAIRS, pair_contributions, split_attention

LEARNT = 0.9  # sampled signal accuracy from which a checkpoint counts as having learnt the task


def dynamics(task: hc.SkipPair, d_heads: list[int], seeds: list[int], recipe: dict, every: int,
             n_eval: int = 64) -> tuple[pd.DataFrame, pd.DataFrame]:  # fmt: skip
    """(checkpoints: one row per model and checkpoint, interference: one row per final model)."""
    items = [(d, s) for d in d_heads for s in seeds]
    rows = []

    def measure(step: int, models) -> None:
        for (d, seed), model in zip(items, models):
            split = split_attention(model) > SPLIT  # [head, 6 distinct pairs]
            acc = task.evaluate(model, n=n_eval, seed=20_000)["signal_acc"]
            rows.append(dict(d_head=d, seed=seed, step=step, signal_acc=acc, learnt=acc >= LEARNT,
                             model_split_pairs=int(split.all(0).sum()), head_split_pairs=int(split.sum())))  # fmt: skip

    models = hc.train_many(task, [dict(n_heads=2, d_head=d) for d, _ in items], seeds=[s for _, s in items],
                           progress=False, on_checkpoint=measure, checkpoint_every=every, **recipe)  # fmt: skip
    final = [dict(d_head=d, seed=seed, signal_acc=task.evaluate(model, n=n_eval, seed=20_000)["signal_acc"],
                  **interference(pair_contributions(model)))
             for (d, seed), model in zip(items, models)]  # fmt: skip
    return pd.DataFrame(rows), pd.DataFrame(final)


def interference(contrib: torch.Tensor) -> dict[str, int]:
    """From raw pair contributions [pair, head, 10]: `qualifying`, the pair types where every head pushes at
    least two completions above zero; `only_correct`, those of them whose correct completion is the only one
    every head pushes above zero; `only_correct_all_pairs`, the latter over all 10 pair types."""
    raw = contrib > 0  # [pair, head, completion]: pushed above zero
    qualifying = (raw.sum(-1) >= 2).all(-1)  # [pair]
    only_correct = (raw.all(1) == torch.eye(len(PAIRS), dtype=torch.bool)).all(-1)  # [pair]
    return dict(qualifying=int(qualifying.sum()), only_correct=int((qualifying & only_correct).sum()),
                only_correct_all_pairs=int(only_correct.sum()))  # fmt: skip
