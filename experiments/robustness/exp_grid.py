"""Train every setup variant at two training lengths over seeds and measure, per model, what the claims
need (tables count01_grid.csv and skip_pair_grid.csv). Verdicts are drawn from them in page.py."""

from __future__ import annotations

import pandas as pd

import headcoop as hc
from experiments.robustness.common import (
    COUNT01_VARIANTS, MINIMAL, PRIMARY, SKIP_PAIR_SHAPES, SKIP_PAIR_VARIANTS, Settings, write_table,
)
from experiments.skip_pair.exp_dynamics import LEARNT, SPLIT  # the split and learnt thresholds of skip_pair.md
from headcoop.studies.skip_pair import compare_orderings, preferences, split_attention
from headcoop.training import loss_drop


def _train(task, shapes: list[dict], seeds: list[int], steps: int, s: Settings):
    return hc.train_many(task, shapes, seeds=seeds, steps=steps, warmup=s.warmup(steps), progress=False,
                         **s.recipe)  # fmt: skip


def count01_grid(s: Settings) -> pd.DataFrame:
    rows = []
    for variant, options in COUNT01_VARIANTS.items():
        task = hc.Count01(**options)
        for steps in s.count01_steps:
            seeds, minimal_seeds = list(s.seeds), list(s.minimal_seeds)
            models = _train(task, [PRIMARY] * len(seeds) + [MINIMAL] * len(minimal_seeds), seeds + minimal_seeds,
                            steps, s)  # fmt: skip
            kinds = ["primary"] * len(seeds) + ["minimal"] * len(minimal_seeds)
            for model, seed, kind in zip(models, seeds + minimal_seeds, kinds):
                ev = task.evaluate(model, n=s.n_eval)
                row = dict(variant=variant, steps=steps, kind=kind, seed=seed, answer_acc=ev["answer_acc"],
                           eos_acc=ev["eos_acc"], both_acc=ev["both_acc"], loss=ev["loss"],
                           plateau=loss_drop(model.history))  # fmt: skip
                if kind == "primary":
                    heads = hc.head_metrics(model, n=s.n_metrics, seed=1).to_dataframe()
                    good = heads[heads.s_acc >= 0.95]
                    row.update(heads=len(heads), successful=len(good),
                               successful_w01_in_0_1_10=int(((good.w01 > 0.1) & (good.w01 < 10)).sum()),
                               successful_w02_gt_10=int((good.w02 > 10).sum()))  # fmt: skip
                rows.append(row)
            print(f"  count01 {variant}, {steps} steps: done", flush=True)
    return write_table(pd.DataFrame(rows), s.out, "count01_grid")


def skip_pair_grid(s: Settings) -> pd.DataFrame:
    rows = []
    for variant, options in SKIP_PAIR_VARIANTS.items():
        task = hc.SkipPair(**options)
        for steps in s.skip_pair_steps:
            items = [(name, shape, seed) for name, shape in SKIP_PAIR_SHAPES.items() for seed in s.skip_pair_seeds]
            # split attention during training: at 12 checkpoints, is a pair split by both heads of a 2-head model
            # that has learnt the task there (sampled signal accuracy >= LEARNT)?
            during = {i: [0, 0] for i in range(len(items))}  # item -> [learnt checkpoints, of them split]

            def measure(step: int, models, items=items, task=task, during=during) -> None:
                for i, ((_, shape, _), model) in enumerate(zip(items, models)):
                    if shape["n_heads"] != 2:
                        continue
                    if task.evaluate(model, n=s.n_checkpoint, seed=20_000)["signal_acc"] >= LEARNT:
                        during[i][0] += 1
                        during[i][1] += int((split_attention(model) > SPLIT).all(0).any())

            models = hc.train_many(task, [shape for _, shape, _ in items], seeds=[seed for _, _, seed in items],
                                   steps=steps, warmup=s.warmup(steps, "skip_pair"), progress=False, on_checkpoint=measure,
                                   checkpoint_every=max(1, steps // 12), **s.recipe)  # fmt: skip
            for i, ((name, shape, seed), model) in enumerate(zip(items, models)):
                ev = task.evaluate(model, n=s.n_pair)
                prefs = preferences(model)
                split = split_attention(model)  # [head, 6]
                row = dict(variant=variant, steps=steps, shape=name, seed=seed, signal_acc=ev["signal_acc"],
                           signal_all=bool(ev["signal_acc"] == 1.0), noise_loss=ev["noise_loss"],
                           plateau=loss_drop(model.history), strict_heads=int((split.max(1).values <= SPLIT).sum()),
                           heads=shape["n_heads"], orderings=" | ".join(">".join(map(str, o)) for o in prefs.orderings),
                           relation=compare_orderings(*prefs.orderings) if shape["n_heads"] == 2 else "",
                           learnt_checkpoints=during[i][0], split_while_learnt=during[i][1])  # fmt: skip
                rows.append(row)
            print(f"  skip-pair {variant}, {steps} steps: done", flush=True)
    return write_table(pd.DataFrame(rows), s.out, "skip_pair_grid")

