"""Train every setup variant at two training lengths over seeds and measure, per model, what the claims
need (tables count01_grid, count01_band, count01_ensemble, count01_table1 and skip_pair_grid). Verdicts
are drawn from them in page.py."""

from __future__ import annotations

import contextlib

import pandas as pd
import torch

import headcoop as hc
from experiments.count01.exp_models import isolation_heads
from experiments.count01.exp_shipped import intervention_rows, logit_orders
from experiments.count01.exp_training import ensemble_measures
from experiments.robustness.common import (
    COUNT01_VARIANTS,
    MINIMAL,
    PRIMARY,
    SKIP_PAIR_SHAPES,
    SKIP_PAIR_VARIANTS,
    Settings,
)
from experiments.shared import write_table
from experiments.skip_pair.exp_dynamics import LEARNT, SPLIT, interference  # the thresholds of skip_pair.md
from experiments.skip_pair.exp_runs import (
    correct_up_both,
    covered_pairs,
    least_favourite_alone,
    specificity,
    value_cos_max,
)
from headcoop.studies.skip_pair import (
    compare_orderings,
    conditional_contributions,
    pair_contributions,
    preferences,
    split_attention,
)
from headcoop.tasks.count01 import EOS, FIVE, FOUR
from headcoop.training.loop import loss_drop


def _train(task, shapes: list[dict], seeds: list[int], steps: int, s: Settings):
    return hc.train_many(task, shapes, seeds=seeds, steps=steps, warmup=s.warmup(steps), progress=False,
                         **s.recipe)  # fmt: skip


def _tip(model, task: hc.Count01, n: int) -> dict:
    """The [EOS] claim per model, from `logit_orders` on n fresh strings: for both true answers, is the most
    frequent ordering of '4', '5', [EOS] led by the answer at '=' and by [EOS] at the answer position, is
    [EOS] the runner-up at '=' in that ordering (so only [EOS] and the answer swap), and the smallest share of strings that keep their 4/5 order from '=' to the answer."""
    _, orders, kept = logit_orders(model, task.sample(n, seed=2))
    top = orders.sort_values("share", ascending=False).groupby(["position", "true answer"], as_index=False).first()
    eq, ans = top[top.position == "'='"], top[top.position == "answer"]
    return dict(eq_answer_top=bool(all(r.order.startswith(r["true answer"]) for _, r in eq.iterrows())),
                ans_eos_top=bool(all(r.order.startswith("[EOS]") for _, r in ans.iterrows())),
                eq_eos_second=bool(all(r.order.startswith(f"{r['true answer']} > [EOS]") for _, r in eq.iterrows())),
                kept_45_min=float(kept["share keeping the 4/5 order"].min()))  # fmt: skip


def _mean_order(model, task: hc.Count01, n: int) -> dict:
    """'About fixed' read on the mean logits: for both true answers, the order of the mean '4' and '5' logits
    is the same at '=' and at the answer position."""
    means, _, _ = logit_orders(model, task.sample(n, seed=2))
    kept = []
    for answer in ("4", "5"):
        at = means[means["true answer"] == answer].set_index("position")
        kept.append(
            (at.loc["'='", "mean logit 5"] > at.loc["'='", "mean logit 4"])
            == (at.loc["answer", "mean logit 5"] > at.loc["answer", "mean logit 4"])
        )
    return dict(mean_order_kept=bool(all(kept)))


@torch.no_grad()
def _syntax(model, task: hc.Count01, n: int, reference) -> dict:
    """The syntax claim per primary model: answer and [EOS] accuracy with every head zero- and mean-ablated
    (what the heads carry), and with each head's z rescaled so that every head's readout has the same norm,
    (a) on logit(5) - logit(4) only and (b) on its whole readout: the '4', '5' and [EOS] logits."""
    batch = task.sample(n, seed=4)
    heads = list(range(model.cfg.n_heads))

    def score(prefix: str) -> dict:
        correct = task.correct(model(batch.tokens), batch)
        return {
            f"{prefix}_answer_acc": correct[:, 0].float().mean().item(),
            f"{prefix}_eos_acc": correct[:, 1].float().mean().item(),
        }

    def scaled(norms: torch.Tensor, prefix: str) -> dict:
        factors = (norms.mean() / norms.clamp(min=1e-12)).tolist()
        with contextlib.ExitStack() as stack:
            for h, f in zip(heads, factors):
                stack.enter_context(hc.ablate(model, heads=h, how="scale", factor=float(f)))
            return score(prefix)

    out = score("model")
    with hc.ablate(model, heads=heads, how="zero"):
        out.update(score("zeroed"))
    with hc.ablate(model, heads=heads, how="mean", reference=reference):
        out.update(score("mean_ablated"))
    readout = model.W_O[0] @ model.W_U  # [head, d_head, vocab]
    out.update(scaled((readout[..., FIVE] - readout[..., FOUR]).norm(dim=-1), "uniform_45"))
    out.update(scaled(readout[..., [FOUR, FIVE, EOS]].flatten(1).norm(dim=-1), "uniform_whole"))
    return out


# every primary head's metrics (count01_heads), so that the registry reads any threshold of a head rule (its band)
HEAD_COLUMNS = ["head", "s_acc", "l_acc", "l_acc_head", "w01", "w02", "bias_45", "signal_45"]


def count01_grid(s: Settings, variant: str, part: int | str | None = None) -> dict[str, pd.DataFrame]:
    """One Count01 variant at every training length: primary and minimal models (count01_grid: accuracy, head
    metrics, the [EOS] ordering), the attention intervention on the primary models (count01_band: s_acc per
    head and imposed w01, with [BOS] and '=' keeping the model's attention), and the ensemble correlation's
    measures of every model, with short primary runs added (count01_ensemble). The band is measured twice:
    [BOS] and '=' keeping the model's attention (others "model") and set to 0 (others "0.0").

    part: None for all of it; i for the models of training length s.count01_steps[i] only; "early" for the
    short primary runs only (run_all sends the parts to workers as separate jobs)."""
    rows, band, ensemble, head_rows = [], [], [], []
    task = hc.Count01(**COUNT01_VARIANTS[variant])
    lengths = list(s.count01_steps) if part is None else [] if part == "early" else [s.count01_steps[part]]
    for steps in lengths:
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
                head_rows.append(heads[HEAD_COLUMNS].assign(variant=variant, steps=steps, seed=seed))
                good = heads[heads.s_acc >= 0.95]
                row.update(heads=len(heads), successful=len(good),
                           successful_w01_in_0_1_10=int(((good.w01 > 0.1) & (good.w01 < 10)).sum()),
                           successful_w02_gt_10=int((good.w02 > 10).sum()),
                           biased=int((heads.bias_45.abs() > heads.signal_45.abs() / 5).sum()),
                           biased_successful=int((good.bias_45.abs() > good.signal_45.abs() / 5).sum()),
                           # the noise claim: heads giving '2' significant attention (w02 < 3) against those
                           # that largely ignore it (w02 > 10), their count and summed s_acc
                           noisy_heads=int((heads.w02 < 3).sum()), noisy_s_acc=float(heads.s_acc[heads.w02 < 3].sum()),
                           quiet_heads=int((heads.w02 > 10).sum()), quiet_s_acc=float(heads.s_acc[heads.w02 > 10].sum()),
                           **_tip(model, task, s.n_eval), **_mean_order(model, task, s.n_eval),
                           **_syntax(model, task, s.n_eval, task.sample(512, seed=0)))  # fmt: skip
                probe_batch = task.sample(s.n_metrics, seed=1)
                curve = intervention_rows(model, probe_batch, s.w01s, modes=("model",))
                # [BOS] and '=' set to 0 as well: only inside the band the claim names (0.1..10)
                inside = tuple(w for w in s.w01s if 0.1 - 1e-9 <= w <= 10 + 1e-9)
                zeroed = intervention_rows(model, probe_batch, inside, modes=(0.0,))
                band.append(pd.concat([curve, zeroed]).assign(variant=variant, steps=steps, seed=seed))
            rows.append(row)
            ensemble.append(dict(variant=variant, steps=steps, kind=kind, seed=seed,
                                 **ensemble_measures(task, model, s.n_metrics, s.n_eval)))  # fmt: skip
        print(f"  count01 {variant}, {steps} steps: done", flush=True)
    for steps in s.early_steps if part in (None, "early") else ():
        for model, seed in zip(
            _train(task, [PRIMARY] * len(s.early_seeds), list(s.early_seeds), steps, s), s.early_seeds
        ):
            ensemble.append(dict(variant=variant, steps=steps, kind="primary-short", seed=seed,
                                 **ensemble_measures(task, model, s.n_metrics, s.n_eval)))  # fmt: skip
    out = {"count01_ensemble": pd.DataFrame(ensemble)}
    if rows:
        out["count01_grid"] = pd.DataFrame(rows)
        out["count01_heads"] = pd.concat(head_rows, ignore_index=True)[["variant", "steps", "seed", *HEAD_COLUMNS]]
        out["count01_band"] = pd.concat(band, ignore_index=True)[["variant", "steps", "seed", "others", "w01", "head",
                                                                 "s_acc", "roc_auc"]]  # fmt: skip
    return out


def count01_table1(s: Settings, variant: str) -> dict[str, pd.DataFrame]:
    """Table 1 for one Count01 variant at every training length: each head of a primary-shape model trained
    jointly and alone from the same initial weights (`isolation_heads`), one row per head (count01_table1)."""
    frames = []
    task = hc.Count01(**COUNT01_VARIANTS[variant])
    for steps in s.table1_steps:
        recipe = dict(s.recipe, steps=steps, warmup=s.warmup(steps), progress=False)
        for seed in s.table1_seeds:
            frames.append(
                isolation_heads(task, seed, recipe, s.n_metrics, s.n_eval).assign(variant=variant, steps=steps)
            )
        print(f"  count01 Table 1 {variant}, {steps} steps: done", flush=True)
    return {"count01_table1": pd.concat(frames, ignore_index=True)}


def skip_pair_grid(s: Settings, variant: str) -> dict[str, pd.DataFrame]:
    """One SkipPair variant at every training length, every shape and seed: accuracy, orderings, splits (also
    at training checkpoints) and, for 2-head models, conditional OV specificity and interference
    (skip_pair_grid)."""
    rows = []
    task = hc.SkipPair(**SKIP_PAIR_VARIANTS[variant])
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
            if shape["n_heads"] == 2:
                # OV and interference: conditional contributions need no contexts; the pair contributions
                # are sampled (n_pair contexts per pair type), since long contexts cannot be enumerated
                contrib = pair_contributions(model, n=s.n_pair, seed=30_000)
                hits, total = specificity(model, list(prefs.orderings))
                covered, fully = covered_pairs(list(prefs.orderings), split)
                row.update(specific_rows=hits, specific_total=total, correct_up_both=correct_up_both(contrib),
                           pairs_covered=covered, pairs_covered_fully=fully,
                           least_favourite_alone=least_favourite_alone(list(prefs.orderings), conditional_contributions(model)),
                           **interference(contrib))  # fmt: skip
            row["value_cos_max"] = value_cos_max(model)
            rows.append(row)
        print(f"  skip-pair {variant}, {steps} steps: done", flush=True)
    return {"skip_pair_grid": pd.DataFrame(rows)}


def jobs(s: Settings) -> list[tuple]:
    """Every job of the grid: (function name, variant, part); run_all sends each to a worker and joins the
    tables. count01_grid is one job per training length plus one for the short runs, so that no single job
    (strings up to 100 at the longest length took 30 minutes alone) sets the run's length. Longest first,
    so the last jobs to start are short ones and the workers finish together."""
    out = [("count01_grid", v, i) for v in COUNT01_VARIANTS for i in range(len(s.count01_steps))]
    out += [("count01_grid", v, "early") for v in COUNT01_VARIANTS]
    out += [("count01_table1", v, None) for v in COUNT01_VARIANTS] + [
        ("skip_pair_grid", v, None) for v in SKIP_PAIR_VARIANTS
    ]

    def expected(job) -> tuple:  # a rough cost order: long strings, then longer training, then the rest
        name, variant, part = job
        rank = {"count01_table1": 1, "count01_grid": 2, "skip_pair_grid": 3}[name] if part != "early" else 4
        length = part if isinstance(part, int) else 0
        return (variant != "strings up to 100", -length, rank)

    return sorted(out, key=expected)


ORDER = {"count01": list(COUNT01_VARIANTS), "skip_pair": list(SKIP_PAIR_VARIANTS)}


def run_job(job: tuple, s: Settings) -> dict[str, pd.DataFrame]:
    """Run one job of `jobs(s)` ((name, variant) or (name, variant, part)): its tables, keyed by name."""
    step, variant, part = (*job, None)[:3]
    if step == "count01_grid":
        return count01_grid(s, variant, part)
    return {"count01_table1": count01_table1, "skip_pair_grid": skip_pair_grid}[step](s, variant)


def write_tables(parts: list[dict[str, pd.DataFrame]], s: Settings) -> list[str]:
    """Join the jobs' tables (rows in variant order, whatever order the jobs finished in) and write each as
    s.out/<name>.csv and .md; the names written."""
    joined: dict[str, list[pd.DataFrame]] = {}
    for part in parts:
        for name, frame in part.items():
            joined.setdefault(name, []).append(frame)
    for name, frames in joined.items():
        order = ORDER["count01" if name.startswith("count01") else "skip_pair"]
        # variant order, then (count01_grid's parts) longer training after shorter, the short runs last
        frames.sort(key=lambda f: (order.index(f.variant.iloc[0]),
                                   bool("kind" in f and (f.kind == "primary-short").all()),
                                   int(f.steps.min()) if "steps" in f else 0))  # fmt: skip
        write_table(pd.concat(frames, ignore_index=True), s.out, name)
    return sorted(joined)
