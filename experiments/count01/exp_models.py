"""Other models: heads trained jointly vs in isolation (Table 1), the hand-written minimal solution
(d_model 1, d_head 1, one head) and how often training finds one, and a two-layer model."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.express as px
import torch

import headcoop as hc
from experiments.count01.common import PRIMARY, Settings, save_figure, write_table
from headcoop.display.plot import TEMPLATE
from headcoop.tasks.count01 import BOS, EOS, EQ, FIVE, FOUR, ONE, TWO, ZERO
from headcoop.training.loop import loss_drop

HEAD_PARAMS = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V")


def isolated_copy(task: hc.Count01, joint_init, head: int, seed: int):
    """A one-head model holding head `head` of `joint_init` with its embeddings, unembedding and b_O.

    With the heads-only readout (`Count01(readout="heads")`) the one-head model's residual stream has a
    d_head-wide head subspace where the joint model's has n_heads * d_head dimensions, so the copy keeps
    the head's initial function, not its parameters: W_O writes the identity into that subspace and W_U
    reads it through the joint head's W_O[head] @ W_U (its initial logit map)."""
    cfg = joint_init.cfg
    heads_only = task.readout == "heads"
    d_embed = cfg.d_model - cfg.n_heads * cfg.d_head if heads_only else cfg.d_model
    single = task.model(seed=seed, n_heads=1, d_model=d_embed, d_head=cfg.d_head)
    with torch.no_grad():
        a, b = single.blocks[0].attn, joint_init.blocks[0].attn
        if not heads_only:
            for name in ("W_E", "W_pos", "W_U", "b_U"):
                getattr(single, name).copy_(getattr(joint_init, name))
            for p in HEAD_PARAMS:
                getattr(a, p)[0].copy_(getattr(b, p)[head])
            a.b_O.copy_(b.b_O)
            return single
        single.W_E[:, :d_embed].copy_(joint_init.W_E[:, :d_embed])
        single.W_pos[:, :d_embed].copy_(joint_init.W_pos[:, :d_embed])
        for p in ("W_Q", "W_K", "W_V"):  # only the embedding rows are read (the head subspace is 0 at layer 0)
            getattr(a, p)[0].zero_()
            getattr(a, p)[0, :d_embed].copy_(getattr(b, p)[head, :d_embed])
        for p in ("b_Q", "b_K", "b_V"):
            getattr(a, p)[0].copy_(getattr(b, p)[head])
        a.W_O.zero_()
        a.W_O[0, :, d_embed:].copy_(torch.eye(cfg.d_head))
        single.W_U.zero_()
        single.W_U[d_embed:].copy_(b.W_O[head, :, d_embed:] @ joint_init.W_U[d_embed:])
    return single


def isolation_heads(task: hc.Count01, seed: int, recipe: dict, n_metrics: int, n_eval: int) -> pd.DataFrame:
    """Each head of a primary-shape model trained with the others (joint) and alone, from the same initial
    weights (`isolated_copy`), data stream and recipe (keyword arguments of `hc.train_many`): one row per
    head with both versions' metrics (`hc.head_metrics` on n_metrics strings; the one-head model's answer
    accuracy on n_eval)."""
    init = task.model(seed=seed, **PRIMARY)
    singles = [isolated_copy(task, init, h, seed) for h in range(PRIMARY["n_heads"])]
    trained = hc.train_many(task, [task.model(seed=seed, **PRIMARY)] + singles, seeds=[seed] * (1 + len(singles)),
                            **recipe)  # fmt: skip
    joint, singles = trained[0], trained[1:]
    jm = hc.head_metrics(joint, n=n_metrics, seed=1).to_dataframe()
    rows = []
    for h, single in enumerate(singles):
        sm = hc.head_metrics(single, n=n_metrics, seed=1).to_dataframe().iloc[0]
        ev = task.evaluate(single, n=n_eval)
        j = jm.iloc[h]
        rows.append(dict(seed=seed, head=h, joint_s_acc=j.s_acc, isolated_s_acc=sm.s_acc,
                         joint_l_acc_head=j.l_acc_head, isolated_l_acc_head=sm.l_acc_head, joint_l_acc=j.l_acc,
                         isolated_l_acc=sm.l_acc, joint_roc_auc=j.roc_auc, isolated_roc_auc=sm.roc_auc,
                         joint_w01=j.w01, isolated_w01=sm.w01, joint_w02=j.w02, isolated_w02=sm.w02,
                         isolated_model_answer_acc=ev["answer_acc"], joint_plateau=loss_drop(joint.history),
                         isolated_plateau=loss_drop(single.history)))  # fmt: skip
    return pd.DataFrame(rows)


def isolation(s: Settings) -> pd.DataFrame:
    """Table 1: each head of a primary-configuration model, trained with the others (joint) and alone."""
    task = hc.Count01()
    rows = pd.concat(
        [isolation_heads(task, seed, s.recipe(s.isolation_steps), s.n_metrics, s.n_eval) for seed in s.isolation_seeds],
        ignore_index=True,
    )
    heads = write_table(rows, s.out, "table1_heads")
    table = []
    for metric in ("s_acc", "l_acc_head", "l_acc", "roc_auc"):
        j, i = heads[f"joint_{metric}"], heads[f"isolated_{metric}"]
        table.append(dict(metric=metric, joint_mean=j.mean(), joint_std=j.std(ddof=0), isolated_mean=i.mean(),
                          isolated_std=i.std(ddof=0), isolated_minus_joint=float((i - j).mean()),
                          isolated_better=float((i > j).mean()), joint_better=float((j > i).mean())))  # fmt: skip
    table.append(dict(metric="successful share", joint_mean=float((heads.joint_s_acc >= 0.95).mean()), joint_std=np.nan,
                      isolated_mean=float((heads.isolated_s_acc >= 0.95).mean()), isolated_std=np.nan,
                      isolated_minus_joint=float((heads.isolated_s_acc >= 0.95).mean()
                                                 - (heads.joint_s_acc >= 0.95).mean()),
                      isolated_better=np.nan, joint_better=np.nan))  # fmt: skip
    table.append(dict(metric="isolated one-head model answer acc", joint_mean=np.nan, joint_std=np.nan,
                      isolated_mean=heads.isolated_model_answer_acc.mean(),
                      isolated_std=heads.isolated_model_answer_acc.std(ddof=0),
                      isolated_minus_joint=np.nan, isolated_better=np.nan, joint_better=np.nan))  # fmt: skip
    return write_table(pd.DataFrame(table), s.out, "table1")


def minimal_model():
    """A hand-written d_model 1, d_head 1, one-head model that solves Count01 (max_len <= 20).

    Attention is uniform (W_Q = W_K = 0). Values are the 1-d embeddings: '0' -> -1, '1' -> +1, and
    '2', [BOS], '=' -> 0, so at '=' the head outputs z = (n1 - n0) / (n + 2), whose sign is the answer
    and whose size is at least 1 / 22. W_O = 22 makes the residual r = 22 z lie in [1, 20] when the
    answer is '5' and in [-20, -1] when it is '4'. The logits are lines in r: '4' = -r, '5' = r,
    [EOS] = 2r - 21, the rest -100, so '4' wins for r < 0, '5' for 0 < r < 21 and [EOS] above 21.
    '4' and '5' embed to 1000, so at the answer position r >= 1000 and [EOS] wins.
    """
    task = hc.Count01()
    model = task.model(seed=0, n_heads=1, d_model=1, d_head=1)
    embed = {ZERO: -1.0, ONE: 1.0, TWO: 0.0, EQ: 0.0, FOUR: 1000.0, FIVE: 1000.0, EOS: 0.0, BOS: 0.0}
    unembed = {FOUR: (-1.0, 0.0), FIVE: (1.0, 0.0), EOS: (2.0, -21.0)}
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for t, e in embed.items():
            model.W_E[t, 0] = e
        a = model.blocks[0].attn
        a.W_V[0, 0, 0] = 1.0
        a.W_O[0, 0, 0] = 22.0
        model.b_U.fill_(-100.0)
        for t, (slope, intercept) in unembed.items():
            model.W_U[0, t], model.b_U[t] = slope, intercept
    return model


def minimal(s: Settings) -> pd.DataFrame:
    task = hc.Count01()
    model = minimal_model()
    rows = []
    for n, seed in ((5 * s.n_eval, 123), (5 * s.n_eval, 456)):
        ev = task.evaluate(model, n=n, seed=seed)
        rows.append(dict(what="hand-written model", strings=n, sample_seed=seed, answer_acc=ev["answer_acc"],
                         eos_acc=ev["eos_acc"], both_acc=ev["both_acc"]))  # fmt: skip
    # exhaustive check over every string of length 1..7 (3^7 = 2187 strings of the longest length)
    syms = []
    lengths = []
    for length in range(1, 8):
        grid = torch.cartesian_prod(*[torch.arange(3)] * length) if length > 1 else torch.arange(3)[:, None]
        pad = torch.zeros(len(grid), task.max_len, dtype=torch.long)
        pad[:, :length] = grid
        keep = (grid == 0).sum(1) != (grid == 1).sum(1)
        syms.append(pad[keep])
        lengths.append(torch.full((int(keep.sum()),), length))
    batch = task.batch_from_strings(torch.cat(syms), torch.cat(lengths))
    with torch.no_grad():
        correct = task.correct(model(batch.tokens), batch)
    rows.append(dict(what="hand-written model, every string of length 1..7", strings=len(batch), sample_seed=-1,
                     answer_acc=correct[:, 0].float().mean().item(), eos_acc=correct[:, 1].float().mean().item(),
                     both_acc=correct.all(1).float().mean().item()))  # fmt: skip
    write_table(pd.DataFrame(rows), s.out, "minimal_handwritten")
    write_table(hc.head_metrics(model, n=s.n_metrics, seed=1).to_dataframe(), s.out, "minimal_handwritten_heads")

    seeds = list(range(s.minimal_seeds))
    shape = dict(n_heads=1, d_model=1, d_head=1)
    found = []
    for lr in s.minimal_lrs:
        recipe = dict(s.recipe(s.minimal_steps), lr=lr)
        for seed, m in zip(seeds, hc.train_many(task, [shape] * len(seeds), seeds=seeds, **recipe)):
            ev = task.evaluate(m, n=s.n_eval)
            found.append(
                dict(lr=lr, steps=s.minimal_steps, seed=seed, answer_acc=ev["answer_acc"], both_acc=ev["both_acc"])
            )
    found = write_table(pd.DataFrame(found), s.out, "minimal_trained_runs")
    summary = (
        found.groupby(["lr", "steps"], as_index=False)
        .agg(seeds=("seed", "size"), solved_99=("both_acc", lambda x: int((x >= 0.99).sum())),
             answer_99=("answer_acc", lambda x: int((x >= 0.99).sum())), best_both_acc=("both_acc", "max"),
             median_both_acc=("both_acc", "median"), median_answer_acc=("answer_acc", "median"))
    )  # fmt: skip
    return write_table(summary, s.out, "minimal_trained")


def two_layer(s: Settings) -> pd.DataFrame:
    """The paper's analysis on a two-layer attention-only model of the primary width."""
    task = hc.Count01()
    shape = dict(PRIMARY, n_layers=2, n_heads=s.two_layer_heads)
    models = hc.train_many(task, [shape] * len(s.two_layer_seeds), seeds=list(s.two_layer_seeds), **s.recipe())
    reference = task.sample(s.n_reference, seed=0)
    frames = []
    for seed, model in zip(s.two_layer_seeds, models):
        df = hc.head_metrics(model, n=s.n_metrics, seed=1).to_dataframe()
        df.insert(0, "seed", seed)
        df["model_answer_acc"] = task.evaluate(model, n=s.n_eval)["answer_acc"]
        base = task.evaluate(model, n=s.n_two_layer_ablation, seed=11)["answer_acc"]
        drops = []
        for name in df.name:
            with hc.ablate(model, heads=name, how="mean", reference=reference):
                drops.append(base - task.evaluate(model, n=s.n_two_layer_ablation, seed=11)["answer_acc"])
        df["mean_ablation_acc_drop"] = drops
        frames.append(df)
    heads = write_table(pd.concat(frames, ignore_index=True), s.out, "two_layer_heads")
    summary = (
        heads.groupby("layer", as_index=False)
        .agg(heads=("name", "size"), successful_share=("successful", "mean"), median_s_acc=("s_acc", "median"),
             median_l_acc=("l_acc", "median"), median_w01=("w01", "median"), median_w02=("w02", "median"),
             share_w01_in_0_1_10=("w01", lambda x: float(((x > 0.1) & (x < 10)).mean())),
             share_w02_gt_10=("w02", lambda x: float((x > 10).mean())),
             max_ablation_drop=("mean_ablation_acc_drop", "max"),
             mean_ablation_drop=("mean_ablation_acc_drop", "mean"))
    )  # fmt: skip
    summary["model_answer_acc"] = float(heads.groupby("seed").model_answer_acc.first().mean())
    write_table(summary, s.out, "two_layer_summary")
    fig = px.scatter(
        heads.assign(layer=heads.layer.astype(str)), x="w01", y="w02", color="s_acc", symbol="layer", log_x=True,
        log_y=True, range_color=(0.5, 1.0), color_continuous_scale="Viridis", hover_data=["seed", "name"],
        title=f"Two-layer model ({len(models)} seeds x 2 x {s.two_layer_heads} heads): s_acc over (w01, w02)",
    )  # fmt: skip
    fig.update_layout(template=TEMPLATE, legend=dict(orientation="h", y=-0.15))
    save_figure(fig, s.out, "two_layer_sacc_w01_w02")
    return summary
