"""Trained models: the d_model x heads accuracy sweep, the primary configuration over seeds (s_acc
against w01/w02), and the ensemble correlation across models and training lengths."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.express as px
import torch

import headcoop as hc
from experiments.count01.common import PRIMARY, Settings, d_head_for, pearson_ci, save_figure, write_table
from headcoop.display.plot import TEMPLATE, heatmap
from headcoop.tasks.count01 import FIVE, FOUR


def sweep(s: Settings) -> tuple[list, pd.DataFrame]:
    """Accuracy over d_model x n_heads (d_head = max(1, d_model // n_heads)), several seeds each."""
    task = hc.Count01()
    items, seeds = [], []
    for d in s.sweep_d_model:
        for h in s.sweep_heads:
            for seed in s.sweep_seeds:
                items.append(dict(n_heads=h, d_model=d, d_head=d_head_for(d, h)))
                seeds.append(seed)
    models = hc.train_many(task, items, seeds=seeds, **s.recipe())
    rows = []
    for item, seed, model in zip(items, seeds, models):
        ev = task.evaluate(model, n=s.n_eval)
        accs = {k: ev[k] for k in ("answer_acc", "eos_acc", "both_acc")}
        rows.append(dict(**item, seed=seed, **accs))
    runs = write_table(pd.DataFrame(rows), s.out, "sweep_runs")
    summary = (
        runs.groupby(["d_model", "n_heads", "d_head"], as_index=False)
        .agg(seeds=("seed", "size"), answer_acc_mean=("answer_acc", "mean"), answer_acc_min=("answer_acc", "min"),
             both_acc_mean=("both_acc", "mean"), both_acc_std=("both_acc", lambda x: float(np.std(x))),
             solved=("both_acc", lambda x: int((x >= 0.99).sum())))
    )  # fmt: skip
    write_table(summary, s.out, "sweep_accuracy")
    grid = summary.pivot(index="d_model", columns="n_heads", values="both_acc_mean")
    fig = heatmap(
        grid.values, x=[str(c) for c in grid.columns], y=[str(i) for i in grid.index], zmid=None,
        colorscale="Viridis", xlabel="heads", ylabel="d_model",
        title=f"Count01 accuracy (answer and [EOS] both right), mean over {len(s.sweep_seeds)} seeds",
    )  # fmt: skip
    fig.update_traces(text=np.round(grid.values, 3), texttemplate="%{text}", zmin=0.5, zmax=1.0)
    fig.update_yaxes(autorange=True)
    save_figure(fig, s.out, "sweep_accuracy")
    return models, runs


def primary(s: Settings) -> tuple[list, pd.DataFrame]:
    """Every head of the primary configuration over several seeds: s_acc against w01 and w02."""
    task = hc.Count01()
    models = hc.train_many(task, [PRIMARY] * len(s.primary_seeds), seeds=list(s.primary_seeds), **s.recipe())
    frames = []
    for seed, model in zip(s.primary_seeds, models):
        df = hc.head_metrics(model, n=s.n_metrics, seed=1).to_dataframe()
        df.insert(0, "seed", seed)
        df["model_answer_acc"] = task.evaluate(model, n=s.n_eval)["answer_acc"]
        frames.append(df)
    heads = write_table(pd.concat(frames, ignore_index=True), s.out, "primary_heads")
    ok, failed = heads[heads.successful], heads[~heads.successful]

    def share(mask) -> float:
        return float(mask.mean()) if len(mask) else float("nan")

    summary = pd.DataFrame(
        [
            dict(quantity="models", value=len(models)),
            dict(quantity="heads", value=len(heads)),
            dict(quantity="successful share (s_acc >= 0.95)", value=share(heads.successful)),
            dict(quantity="median s_acc", value=float(heads.s_acc.median())),
            dict(quantity="share with s_acc >= 0.99", value=share(heads.s_acc >= 0.99)),
            dict(quantity="share with s_acc < 0.75", value=share(heads.s_acc < 0.75)),
            dict(quantity="successful: share with 0.5 < w01 < 2", value=share((ok.w01 > 0.5) & (ok.w01 < 2))),
            dict(quantity="successful: share with 0.1 < w01 < 10", value=share((ok.w01 > 0.1) & (ok.w01 < 10))),
            dict(quantity="successful: share with w02 > 10", value=share(ok.w02 > 10)),
            dict(quantity="successful: median w01", value=float(ok.w01.median()) if len(ok) else float("nan")),
            dict(quantity="successful: median w02", value=float(ok.w02.median()) if len(ok) else float("nan")),
            dict(quantity="failed: share with 0.1 < w01 < 10", value=share((failed.w01 > 0.1) & (failed.w01 < 10))),
            dict(quantity="failed: share with w02 > 10", value=share(failed.w02 > 10)),
            dict(quantity="failed: median w01", value=float(failed.w01.median()) if len(failed) else float("nan")),
            dict(quantity="all: share with w02 > 10", value=share(heads.w02 > 10)),
            dict(quantity="mean model answer accuracy",
                 value=float(heads.groupby("seed").model_answer_acc.first().mean())),
        ]
    )  # fmt: skip
    write_table(summary, s.out, "primary_summary")

    plot_df = heads.assign(status=np.where(heads.successful, "successful", "failed"))
    fig = px.scatter(
        plot_df, x="w01", y="w02", color="s_acc", symbol="status", log_x=True, log_y=True,
        range_color=(0.5, 1.0), color_continuous_scale="Viridis", hover_data=["seed", "name", "l_acc", "roc_auc"],
        title=f"Primary configuration ({len(models)} seeds x 16 heads): s_acc over (w01, w02)",
    )  # fmt: skip
    fig.add_vline(x=1.0, line_dash="dot", line_color="gray")
    fig.add_hline(y=10.0, line_dash="dot", line_color="gray")
    fig.update_layout(
        template=TEMPLATE, legend=dict(orientation="h", y=-0.15),
        xaxis_title="w01 (per-token attention on '0' / on '1')",
        yaxis_title="w02 (per-token attention on '0','1' / on '2')",
    )  # fmt: skip
    save_figure(fig, s.out, "primary_sacc_w01_w02")
    fig = px.scatter(
        plot_df, x="w01", y="s_acc", color="status", log_x=True, hover_data=["seed", "name", "w02"],
        title="Primary configuration: s_acc against w01",
    )  # fmt: skip
    fig.update_layout(template=TEMPLATE)
    save_figure(fig, s.out, "primary_sacc_w01")
    return models, heads


def ensemble_measures(task: hc.Count01, model, n_metrics: int, n_eval: int) -> dict[str, float]:
    """What the ensemble correlation needs of one model: answer accuracy two ways (`answer_acc`, the argmax
    over all logits at '='; `answer_45_acc`, whether logit(5) > logit(4) matches the answer), both_acc, and
    its heads' s_acc averaged with readout weights ||W_O[h](W_U[5] - W_U[4])|| (weighted_s_acc), with the
    spread of each head's push (effective_s_acc), plainly (mean_s_acc), and the best head's (max_s_acc)."""
    df = hc.head_metrics(model, n=n_metrics, seed=1).to_dataframe()
    ev = task.evaluate(model, n=n_eval)
    batch45 = task.sample(n_eval, seed=10_000)
    with torch.no_grad():
        at_eq = model(batch45.tokens)[torch.arange(len(batch45)), batch45.answer_pos]
    acc45 = ((at_eq[:, FIVE] > at_eq[:, FOUR]) == (batch45.labels == 1)).float().mean().item()
    w, e = df.readout_45.to_numpy(), df.push_std_45.to_numpy()
    return dict(
        answer_acc=ev["answer_acc"], answer_45_acc=acc45, both_acc=ev["both_acc"],
        weighted_s_acc=float((w * df.s_acc).sum() / w.sum()) if w.sum() > 0 else float("nan"),
        effective_s_acc=float((e * df.s_acc).sum() / e.sum()) if e.sum() > 0 else float("nan"),
        mean_s_acc=float(df.s_acc.mean()), max_s_acc=float(df.s_acc.max()),
    )  # fmt: skip


def ensemble(s: Settings, sweep_models: list, primary_models: list) -> pd.DataFrame:
    """Output-layer-weighted mean head s_acc against model accuracy, across models and training lengths."""
    task = hc.Count01()
    early_items = [(steps, seed) for steps in s.early_steps for seed in s.early_seeds]
    early = []
    for steps in s.early_steps:
        early += hc.train_many(task, [PRIMARY] * len(s.early_seeds), seeds=list(s.early_seeds), **s.recipe(steps))
    entries = [("sweep", m, m.train_settings["steps"], m.train_settings["seed"]) for m in sweep_models]
    entries += [("primary", m, m.train_settings["steps"], m.train_settings["seed"]) for m in primary_models]
    entries += [("primary-short", m, steps, seed) for m, (steps, seed) in zip(early, early_items)]
    rows = []
    for group, model, steps, seed in entries:
        cfg = model.cfg
        rows.append(dict(group=group, d_model=cfg.d_model, n_heads=cfg.n_heads, d_head=cfg.d_head, steps=steps,
                         seed=seed, **ensemble_measures(task, model, s.n_ensemble, s.n_eval)))  # fmt: skip
    models_df = write_table(pd.DataFrame(rows), s.out, "ensemble_models")
    corr = []
    for x in ("weighted_s_acc", "effective_s_acc", "mean_s_acc", "max_s_acc"):
        for subset, part in (("all models", models_df), ("primary config only", models_df[models_df.group != "sweep"])):
            part = part.dropna(subset=[x])
            for y in ("answer_acc", "answer_45_acc"):
                if len(part) >= 4 and part[x].std() > 0 and part[y].std() > 0:
                    corr.append(dict(x=x, y=y, models=subset, **pearson_ci(part[x], part[y], s.bootstrap)))
    corr_df = write_table(pd.DataFrame(corr), s.out, "ensemble_correlation")
    fig = px.scatter(
        models_df, x="weighted_s_acc", y="answer_acc", color="group",
        hover_data=["d_model", "n_heads", "steps", "seed"],
        title="Model accuracy against the output-layer-weighted mean head s_acc",
    )  # fmt: skip
    fig.update_layout(
        template=TEMPLATE,
        xaxis_title="sum_h ||W_O[h](W_U[5]-W_U[4])|| s_acc_h / sum_h ||...||",
        yaxis_title="model answer accuracy",
    )
    save_figure(fig, s.out, "ensemble_correlation")
    return corr_df
