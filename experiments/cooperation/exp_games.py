"""The measurements: coalition games of the Count01 and SkipPair models, path patching and composition of
the two-layer Count01 model. Every model is trained here with the recipe of its reproduction."""

from __future__ import annotations

import pandas as pd
import torch

import headcoop as hc
from experiments.cooperation.common import Settings
from experiments.shared import write_table

PRIMARY = dict(n_heads=16, d_model=32, d_head=2)


def game_row(result, **labels) -> dict:
    """One table row of an Interactions result."""
    counts = {k: sum(v == k for v in result.verdicts.values()) for k in ("redundant", "synergistic", "independent")}
    upper = result.interaction[torch.triu(torch.ones_like(result.interaction, dtype=torch.bool), 1)]
    scale = abs(result.v_full - result.v_empty) or float("nan")
    return dict(**labels, v_full=result.v_full, v_empty=result.v_empty, verdict=result.model_verdict, **counts,
                negative_sum=float(upper.clamp(max=0).sum()) / scale, positive_sum=float(upper.clamp(min=0).sum()) / scale,
                max_abs_interaction=float(upper.abs().max()) / scale if len(upper) else 0.0,
                shapley_min=float(result.shapley.min()), shapley_max=float(result.shapley.max()))  # fmt: skip


def count01_games(s: Settings) -> pd.DataFrame:
    """The shipped model and the primary configuration over seeds: accuracy and logit difference, mean and
    zero ablation."""
    task = hc.Count01()
    models = [("shipped", hc.load("count01"))]
    trained = hc.train_many(task, [PRIMARY] * len(s.count01_seeds), seeds=list(s.count01_seeds),
                            steps=s.count01_steps, warmup=max(1, s.count01_steps // 10), progress=False,
                            **s.recipe)  # fmt: skip
    models += [(f"seed {seed}", m) for seed, m in zip(s.count01_seeds, trained)]
    batch = task.sample(s.n_inputs, seed=3)
    reference = task.sample(512, seed=0)
    rows = []
    for name, model in models:
        answer_acc = task.evaluate(model, n=2048)["answer_acc"]
        for metric in ("accuracy", "logit_diff"):
            for how in ("mean", "zero"):
                result = hc.interactions(model, batch, metric=metric, how=how,
                                         reference=reference if how == "mean" else None)  # fmt: skip
                rows.append(game_row(result, model=name, answer_acc=answer_acc, metric=metric, how=how))
    return write_table(pd.DataFrame(rows), s.out, "count01_games")


def skip_pair_games(s: Settings) -> pd.DataFrame:
    """Two-head SkipPair models, d_head 5 and d_head 1, over seeds (and the shipped checkpoints): is the
    pair synergistic? Inputs: the task's signal contexts; mean ablation over the task's own sample."""
    task = hc.SkipPair()
    shapes = [(5, "skip-pair"), (1, "skip-pair-dhead1")]
    items = [dict(n_heads=2, d_head=d) for d, _ in shapes for _ in s.skip_pair_seeds]
    seeds = [seed for _ in shapes for seed in s.skip_pair_seeds]
    trained = hc.train_many(task, items, seeds=seeds, steps=s.skip_pair_steps, warmup=100 if not s.quick else 2,
                            progress=False, **s.recipe)  # fmt: skip
    batch = task.patching_inputs(n=s.n_inputs, seed=3)[0]
    reference = task.sample(512, seed=0)
    rows = []
    models = [(f"{name} (shipped)", d, None, hc.load(name)) for d, name in shapes]
    models += [(f"d_head {item['d_head']}", item["d_head"], seed, m) for item, seed, m in zip(items, seeds, trained)]
    for name, d_head, seed, model in models:
        signal_acc = task.evaluate(model, n=2048)["signal_acc"]
        for metric in ("accuracy", "logit_diff"):
            result = hc.interactions(model, batch, metric=metric, how="mean", reference=reference)
            row = game_row(result, model=name, d_head=d_head, seed=seed, signal_acc=signal_acc, metric=metric)
            row["interaction_01"] = float(result.interaction[0, 1])
            rows.append(row)
    return write_table(pd.DataFrame(rows), s.out, "skip_pair_games")


def two_layer_paths(s: Settings) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Two-layer Count01 models (16 heads per layer): every layer-0 -> layer-1 path through q, k and v, and
    the composition scores, side by side."""
    task = hc.Count01()
    models = hc.train_many(task, [dict(PRIMARY, n_layers=2)] * len(s.two_layer_seeds), seeds=list(s.two_layer_seeds),
                           steps=s.count01_steps, warmup=max(1, s.count01_steps // 10), progress=False, **s.recipe)  # fmt: skip
    paths, comps = [], []
    for seed, model in zip(s.two_layer_seeds, models):
        clean, corrupt = task.patching_inputs(n=min(256, s.n_inputs), seed=3)
        result = hc.path_patch(model, clean=clean, corrupt=corrupt)
        frame = result.to_dataframe()
        frame.insert(0, "seed", seed)
        paths.append(frame)
        comp = hc.composition(model).to_dataframe()
        comp.insert(0, "seed", seed)
        comps.append(comp)
    path_table = write_table(pd.concat(paths, ignore_index=True), s.out, "two_layer_paths")
    comp_table = write_table(pd.concat(comps, ignore_index=True), s.out, "two_layer_composition")
    return path_table, comp_table
