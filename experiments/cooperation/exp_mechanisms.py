"""The measurements of hc.cooperation (issue 23): the mechanism of every pair of heads and the role of every
head, for Count01 (shipped and seeds), SkipPair (d_head 5 and 1, seeds, with the superposition evidence per
pair type and context) and the two-layer Count01 models, whose layer-0 -> layer-1 paths and composition are
measured too. Every model is trained here with the recipe of its reproduction."""

from __future__ import annotations

import pandas as pd
import torch

import headcoop as hc
from experiments.cooperation.common import Settings
from experiments.cooperation.measures import WRITES_TO
from experiments.shared import write_table
from headcoop.analysis.mechanisms.cooperation import MECHANISMS, ROLES
from headcoop.analysis.mechanisms.words import Reading, vote

PRIMARY = dict(n_heads=16, d_model=32, d_head=2)
# which outputs a head "writes to" in one context: (name, reading of hc.superposed_writes, outputs); the
# instrument's own reading (WRITES_TO[0]) comes from hc.cooperation's per-input evidence
WRITE_READINGS = ((WRITES_TO[1], "positive", "completions"), (WRITES_TO[2], "centered", "completions"),
                  (WRITES_TO[3], "half_answer", "vocab"))  # fmt: skip
HOWS = ("zero", "mean", "family")  # single ablations (each with its reference draws and threshold bands), the family


def net_sum_verdict(inter: pd.Series, scale: float, threshold: float = 0.05) -> str:
    """The verdict hc.interactions gives a model (its net-sum rule, kept only for comparison): redundant
    (synergistic) when the negative (positive) interactions outweigh the others by more than 5% of
    |v(all) - v(none)|."""
    negative, positive = float(-inter.clip(upper=0).sum()), float(inter.clip(lower=0).sum())
    tau = threshold * scale
    return "redundant" if negative - positive > tau else "synergistic" if positive - negative > tau else "independent"


def summary_row(result, **labels) -> dict:
    """One table row of a Cooperation result: the verdict, pairs per mechanism, roles, and the per-input
    evidence (share of inputs, over the pairs and the inputs where a pair matters)."""
    pairs = result.pairs
    counts = pairs.mechanism.value_counts()
    roles = pd.Series(result.roles).value_counts()
    weight = pairs.matters.clip(lower=1e-12)
    evidence = {
        f"inputs_{c}": float((pairs[c] * weight).sum() / weight.sum()) for c in ("or", "and", "a_only", "b_only")
    }
    competing = [h for h, r in result.roles.items() if r == "competes"]
    return dict(**labels, mechanism=result.mechanism, agreement=result.agreement, flips=result.flips,
                by_ablation=result.by_ablation, readings=len(result.readings), v_full=result.v_full,
                v_empty=result.v_empty, pairs=len(pairs),
                **{m: int(counts.get(m, 0)) for m in MECHANISMS}, **{f"heads_{r}": int(roles.get(r, 0)) for r in ROLES},
                competing=", ".join(competing), **evidence,
                net_sum_verdict=net_sum_verdict(pairs.interaction, abs(result.v_full - result.v_empty)) if pairs.interaction.notna().all() else "",
                reasons="; ".join(f"{n} x {r}" for r, n in pairs.reason.str.replace(r"\d+%", "N%", regex=True)
                                  .str.replace(r"L\dH\d+", "Lx", regex=True).value_counts().head(3).items()))  # fmt: skip


def count01_models(s: Settings, task) -> list[tuple[str, object]]:
    """[(name, model)]: the shipped Count01 model and the primary configuration trained over `count01_seeds`
    with the reproduction's recipe (the same models on every call: the seeds fix them)."""
    trained = hc.train_many(task, [PRIMARY] * len(s.count01_seeds), seeds=list(s.count01_seeds),
                            steps=s.count01_steps, warmup=max(1, s.count01_steps // 10), progress=False,
                            **s.recipe)  # fmt: skip
    return [("shipped", hc.load("count01"))] + [(f"seed {seed}", m) for seed, m in zip(s.count01_seeds, trained)]


def count01_mechanisms(s: Settings) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The shipped model and the primary configuration over seeds: hc.cooperation with accuracy (zero alone,
    mean alone, the default family) and the logit difference (the family); every pair and every head. The
    references are the task's own draws (seeds 1..draws), the inputs fixed."""
    task = hc.Count01()
    models = count01_models(s, task)
    batch = task.sample(s.n_inputs, seed=3)
    rows, pairs, heads = [], [], []
    for name, model in models:
        answer_acc = task.evaluate(model, n=2048)["answer_acc"]
        for metric, how in [("accuracy", h) for h in HOWS] + [("logit_diff", "family")]:
            result = hc.cooperation(model, inputs=batch, metric=metric, how=how, draws=s.draws)
            rows.append(summary_row(result, model=name, answer_acc=answer_acc, metric=metric, how=how))
            if metric == "accuracy":
                frame = result.to_dataframe()
                frame.insert(0, "model", name)
                frame.insert(1, "how", how)
                pairs.append(frame)
                table = result.head_table.reset_index()
                table.insert(0, "model", name)
                table.insert(1, "how", how)
                heads.append(table)
    return (write_table(pd.DataFrame(rows), s.out, "count01_mechanisms"),
            write_table(pd.concat(pairs, ignore_index=True), s.out, "count01_pairs"),
            write_table(pd.concat(heads, ignore_index=True), s.out, "count01_heads"))  # fmt: skip


def answer_row(result, **labels) -> dict:
    """The Count01 paper's question answered from one default `hc.cooperation` call (issue 48): the same
    computation axis (baseline-free), whether any pair matters in the full model under each ablation, the
    answer's margins, how many heads alone answer 90% of inputs under each ablation, the pair word."""
    same = result.same
    active = same[same.active]
    pairs = result.pairs
    w0, w1 = (active[c] for c in ("weight[0]", "weight[1]")) if "weight[0]" in same else (None, None)
    opposite = bool(((w0 * w1) < 0).all()) if w0 is not None else False
    ratio = (
        float((w0.abs() / w1.abs()).clip(lower=1e-12).apply(lambda x: max(x, 1 / x)).max())
        if w0 is not None
        else float("nan")
    )
    numbers = result.same_numbers
    fn = result.function_numbers or {}
    noise = (fn.get("other") or {}).get("the count of 2s (the noise token)", {})
    row = dict(**labels, function_word=result.function_word, function_kind=fn.get("kind", ""),
               deciding_heads=len(fn.get("deciding", [])), decided_on=" or ".join(fn.get("push", [])),
               edit_cos_min=fn.get("cos_min", float("nan")), edit_cos_median=fn.get("cos_median", float("nan")),
               edit_one_direction=fn.get("share", float("nan")), pooled_cos_min=fn.get("pooled_cos_min", float("nan")),
               edits=fn.get("edits", 0), semantic_edits=fn.get("semantic_edits", 0), edit_inputs=fn.get("inputs", 0),
               position_max=fn.get("position_max", float("nan")), specialised=fn.get("specialised", ""),
               noise_cos_min=noise.get("cos_min", float("nan")), noise_separable=noise.get("separable", float("nan")),
               noise_edits=noise.get("edits", 0),
               same_word=result.same_word, active_heads=numbers["active"], heads=len(same),
               r_min=numbers["r_min"], r_median=numbers["r_median"], one_direction=numbers["share"],
               weighs_0_against_1=opposite, weight_ratio_max=ratio,
               **{f"pairs_matter_full_{h}": int((pairs[f"full_matters_{h}"] >= result.thresholds["min_share"]).sum())
                  for h in result.hows},
               **{f"largest_matters_full_{h}": float(pairs[f"full_matters_{h}"].max()) for h in result.hows},
               min_share=result.thresholds["min_share"],
               **{f"heads_alone_{h}": int((result.head_table[f"alone_{h}"] >= 0.9).sum()) for h in result.hows},
               mechanism=result.mechanism, agreement=result.agreement, summary=result.summary)  # fmt: skip
    return row


def count01_answer(s: Settings) -> pd.DataFrame:
    """The default hc.cooperation call on the shipped model and the primary configuration over seeds (the
    models of `count01_mechanisms`), and zero ablation on the two-layer models (those of
    `two_layer_mechanisms`), 512 fixed strings: the answer to the paper's question (`answer_row`)."""
    task = hc.Count01()
    models = count01_models(s, task)
    batch = task.sample(s.n_inputs, seed=3)
    rows = []
    for name, model in models:
        result = hc.cooperation(model, inputs=batch, draws=s.draws, max_exact=2)
        rows.append(answer_row(result, model=name, layers=1, how="family",
                               answer_acc=task.evaluate(model, n=2048)["answer_acc"]))  # fmt: skip
    # the two-layer models (32 heads, 496 pairs): zero ablation alone, for time (the family took about 16
    # minutes per model on the faster machine); where later heads read a head, its push is its total effect
    two = hc.train_many(task, [dict(PRIMARY, n_layers=2)] * len(s.two_layer_seeds), seeds=list(s.two_layer_seeds),
                        steps=s.count01_steps, warmup=max(1, s.count01_steps // 10), progress=False, **s.recipe)  # fmt: skip
    for seed, model in zip(s.two_layer_seeds, two):
        result = hc.cooperation(model, inputs=batch, how="zero", max_exact=2)
        rows.append(answer_row(result, model=f"two-layer seed {seed}", layers=2, how="zero",
                               answer_acc=task.evaluate(model, n=2048)["answer_acc"]))  # fmt: skip
    return write_table(pd.DataFrame(rows), s.out, "count01_answer")


def skip_pair_answer(s: Settings) -> pd.DataFrame:
    """The post's question ("is this superposition?") answered by the default `hc.cooperation` call (issue 48's
    words, the reading family, the task's mechanism inputs) on the two shipped SkipPair checkpoints: the pair's
    word, its share of the votes, what flips it, each ablation's word, and the four parts of the post's
    definition (conditional writes per head, several completions written, only the answer shared, sources
    distributed)."""
    rows = []
    for name, d_head in (("skip-pair", 5), ("skip-pair-dhead1", 1)):
        result = hc.cooperation(hc.load(name), draws=s.draws)
        rows.append(dict(model=name, d_head=d_head, **skip_pair_row(result)))
    return write_table(pd.DataFrame(rows), s.out, "skip_pair_answer")


def skip_pair_row(result) -> dict:
    """A SkipPair pair's answer row from one `hc.cooperation` call: the word over the family with its vote,
    the favoured word and each kind's vote among its seeing readings (the family's vote is their mean),
    the knife edges, and the post's defining property (conditional writes, among the inputs that can show
    it, and that share) apart from its interference sentence (only the answer shared)."""
    pair = result.pairs.iloc[0]
    words = result.words.iloc[0].tolist()
    readings = [Reading(r.how, int(r.draw), r.threshold or None, float(r.factor)) for r in result.readings.itertuples()]
    shares = vote(words, readings)
    favoured = max(shares, key=lambda w: (shares[w], w != "undetermined")) if shares else "undetermined"
    per_kind = {}
    for how in result.hows:
        mine = [w for w, r in zip(words, readings) if r.how == how and w != "unseen"]
        per_kind[f"vote_{how}"] = (sum(w == favoured for w in mine) / len(mine)) if mine else float("nan")
    return dict(mechanism=pair.mechanism, agreement=pair.agreement, favoured=favoured,
                favoured_share=shares.get(favoured, 0.0), **per_kind, knife_edge=pair.knife_edge,
                default_reading=pair.primary_word, flips=pair.flips_under, by_ablation=pair.by_ablation,
                **{c: pair[c] for c in ("matters", "or", "and", "conditional_a", "conditional_b", "shown_a", "shown_b",
                                        "multi", "only_answer", "distributed", "rank_a", "rank_b")},
                same_word=result.same_word, summary=result.summary)  # fmt: skip


def _skip_pair_models(s: Settings) -> list[tuple[str, int, int | None, object]]:
    task = hc.SkipPair()
    shapes = [(5, "skip-pair"), (1, "skip-pair-dhead1")]
    items = [dict(n_heads=2, d_head=d) for d, _ in shapes for _ in s.skip_pair_seeds]
    seeds = [seed for _ in shapes for seed in s.skip_pair_seeds]
    trained = hc.train_many(task, items, seeds=seeds, steps=s.skip_pair_steps, warmup=100 if not s.quick else 2,
                            progress=False, **s.recipe)  # fmt: skip
    models = [(f"{name} (shipped)", d, None, hc.load(name)) for d, name in shapes]
    return models + [
        (f"d_head {item['d_head']}", item["d_head"], seed, m) for item, seed, m in zip(items, seeds, trained)
    ]


def skip_pair_mechanisms(s: Settings) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Two-head SkipPair models, d_head 5 and 1, over seeds and the shipped checkpoints: hc.cooperation's
    verdict (accuracy; mean and zero ablation) on the task's signal contexts, and per pair type the
    contexts of each 2 x 2 class and the contexts where both heads write to several outputs and add up
    only on the correct one, under three readings of "writes to" (WRITE_READINGS)."""
    task = hc.SkipPair()
    # the default call's inputs (hc.cooperation's n and seed): the shipped models' family rows are then the
    # answer's call (`skip_pair_answer`), one instrument for one claim (a test checks they agree)
    batch = task.mechanism_inputs(s.n_inputs, seed=0)
    completions = task.completions()
    pair_names = [f"{a}{b}" for a, b in task.pairs]
    rows, per_type = [], []
    for name, d_head, seed, model in _skip_pair_models(s):
        signal_acc = task.evaluate(model, n=2048)["signal_acc"]
        labels = dict(model=name, d_head=d_head, seed=seed, signal_acc=signal_acc)
        for how in ("family", "mean", "zero"):
            result = hc.cooperation(model, inputs=batch, metric="accuracy", how=how, draws=s.draws)
            pair = result.pairs.iloc[0]
            answer = skip_pair_row(result)
            rows.append(dict(**labels, how=how, mechanism=pair.mechanism, agreement=pair.agreement,
                             favoured=answer["favoured"], favoured_share=answer["favoured_share"],
                             knife_edge=pair.knife_edge, flips=pair.flips_under, by_ablation=pair.by_ablation,
                             reason=pair.reason, matters=pair.matters,
                             roles=", ".join(f"{h} {r}" for h, r in result.roles.items()),
                             **{c: pair[c] for c in ("or", "and", "a_only", "b_only", "multi", "only_answer",
                                                     "distributed", "rank_a", "rank_b", "interaction")}))  # fmt: skip
            if how != "family":
                continue
            inputs = result.per_input()
            dla = hc.dla(model, batch.tokens, pos=batch.answer_pos).heads()[:, 0]  # [batch, head, vocab]
            writes = {WRITES_TO[0]: (result.input_multi[0], result.input_superposed[0])}
            for reading_name, reading, outputs in WRITE_READINGS:
                writes[reading_name] = hc.superposed_writes(dla[:, 0], dla[:, 1], batch.answer, reading=reading,
                                                            outputs=completions if outputs == "completions" else None)  # fmt: skip
            centered = dla[..., completions] - dla[..., completions].mean(-1, keepdim=True)  # [batch, head, 10]
            at_answer = centered.gather(
                -1, torch.searchsorted(completions, batch.answer)[:, None, None].expand(-1, 2, 1)
            )[..., 0]
            answer_up = (at_answer > 0).all(-1)  # both heads push the answer above their mean over completions
            for t, type_name in enumerate(pair_names):
                here = batch.labels == t
                cls = inputs["class"][here.numpy()]
                row = dict(**labels, pair_type=type_name, contexts=int(here.sum()),
                           **{f"class_{c}": int((cls == c).sum()) for c in ("or", "and", "a_only", "b_only", "not_needed")})  # fmt: skip
                row["answer_up_both"] = int((answer_up & here).sum())
                for reading_name, (several, superposed) in writes.items():
                    row[f"several | {reading_name}"] = int((several & here).sum())
                    row[f"only_correct | {reading_name}"] = int((superposed & here).sum())
                per_type.append(row)
    return (
        write_table(pd.DataFrame(rows), s.out, "skip_pair_mechanisms"),
        write_table(pd.DataFrame(per_type), s.out, "skip_pair_contexts"),
    )


def two_layer_mechanisms(s: Settings) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Two-layer Count01 models (16 heads per layer): hc.cooperation over all 32 heads (accuracy, the default
    reading family with `two_layer_draws` reference draws), every pair, every head, every backup row."""
    task = hc.Count01()
    models = hc.train_many(task, [dict(PRIMARY, n_layers=2)] * len(s.two_layer_seeds), seeds=list(s.two_layer_seeds),
                           steps=s.count01_steps, warmup=max(1, s.count01_steps // 10), progress=False, **s.recipe)  # fmt: skip
    batch = task.sample(s.n_inputs, seed=3)
    rows, heads, backups = [], [], []
    for seed, model in zip(s.two_layer_seeds, models):
        result = hc.cooperation(model, inputs=batch, metric="accuracy", how=s.two_layer_how, draws=s.two_layer_draws)
        backup = result.backup.copy()
        backup.insert(0, "seed", seed)
        backups.append(backup)
        rows.append(
            summary_row(result, model=f"two-layer seed {seed}", answer_acc=task.evaluate(model, n=2048)["answer_acc"])
        )
        pairs = result.pairs
        layer = lambda col: pairs[col].str[1].astype(int)  # noqa: E731
        for (la, lb), part in pairs.groupby([layer("head_a"), layer("head_b")]):
            counts = part.mechanism.value_counts()
            rows[-1][f"L{la}-L{lb}"] = ", ".join(f"{n} {m}" for m, n in counts.items())
        table = result.head_table.reset_index()
        table.insert(0, "seed", seed)
        heads.append(table)
    write_table(pd.concat(backups, ignore_index=True), s.out, "two_layer_backup")
    return (
        write_table(pd.DataFrame(rows), s.out, "two_layer_mechanisms"),
        write_table(pd.concat(heads, ignore_index=True), s.out, "two_layer_heads"),
    )


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
