"""Write docs/results/cooperation.md from the tables in docs/results/cooperation/ (every number is read
from a table run_all wrote; Count01's Table 1 from docs/results/count01/table1.csv). Sections return data
(`headcoop.display.pages.Section`), verdicts are `Claim` records computed by the rules below, the page is rendered
from `page.md.j2`.

    python -m experiments.cooperation.page [--out FOLDER]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import pandas as pd

from experiments.cooperation import answers
from experiments.cooperation.measures import WRITES_TO, active_pairs
from experiments.cooperation.quotes import (
    DISTRIBUTE,
    FINDING,
    INTERFERE,
    LEAST_FAVOURITE,
    ONE_HEAD,
    ONLY_CORRECT,
    QUESTION,
    SUPERPOSE,
    TABLE1,
    TITLE,
)
from experiments.robustness.page import REGISTRY_SAYS, default_verdicts, short_verdicts, with_registry
from headcoop.analysis.mechanisms.cooperation import MECHANISMS
from headcoop.analysis.mechanisms.definitions import definitions
from headcoop.display.pages import Claim, FigureFile, Section, Table, Text, render

HERE = Path(__file__).resolve().parent
MECHS = list(MECHANISMS)
# the words before issue 48 (no "conjunction"; "independent"): tables written then are rendered with them
LEGACY_MECHS = ["superposition", "redundant", "division", "composition", "competition", "independent", "not testable",
                "inactive", "undetermined"]  # fmt: skip
HOWS = ("zero", "mean", "family")
READINGS = list(WRITES_TO)


def _share(n: float, d: float) -> str:
    return f"{int(n)}/{int(d)}"


def _counts(series: pd.Series) -> str:
    counts = series.value_counts()
    return ", ".join(f"{int(counts[m])} {m}" for m in MECHS if m in counts) or "none"


def _readings(acc: pd.DataFrame, active: pd.DataFrame, how: str) -> dict:
    """The paper's question read four ways under one ablation: how many models satisfy each reading."""
    s, a = acc[acc.how == how], active[active.how == how]
    return dict(n=len(s), r1=int((s.mechanism == "redundant").sum()), r2=int((a.redundant_share > 0.5).sum()),
                r3=int((a.redundant == a.active_pairs).sum()), r4=int((s.net_sum_verdict == "redundant").sum()),
                alt=int((a.in_conjunction > 0).sum()), conj=int(a.in_conjunction.sum()),
                median=float(a.redundant_share.median()), independent=int(s["independent"].sum()) if "independent" in s else 0,
                undetermined=int(s.undetermined.sum()), pairs=int(s.pairs.sum()))  # fmt: skip


def _count01_signature(acc: pd.DataFrame, ensemble: pd.DataFrame | None) -> tuple:
    """The paper's own measures of count01.md (per-head separability s_acc of the primary models,
    `count01/ensemble_models.csv`) beside hc.cooperation's word for the same seed (the family)."""
    if ensemble is None:
        return ()
    primary = ensemble[ensemble.group == "primary"][["seed", "answer_acc", "mean_s_acc", "max_s_acc", "weighted_s_acc"]]
    fam = acc[(acc.how == "family") & acc.model.str.startswith("seed ")].copy()
    fam["seed"] = fam.model.str.removeprefix("seed ").astype(int)
    joined = fam[["seed", "mechanism", "agreement", "flips", "redundant", "inactive"]].merge(
        primary.rename(columns={"answer_acc": "count01_answer_acc"}), on="seed", how="left"
    )
    return (
        Text(
            "Beside it, the paper's own measure (count01.md, `count01/ensemble_models.csv`, the primary models of "
            "the same seeds trained by the Count01 reproduction: each head's separability s_acc, mean, largest "
            'and weighted): a high s_acc for every head is what "all solving the same subtask" predicts.'
        ),
        Table(joined, digits=3),
    )


def answer_blocks(answer: pd.DataFrame | None) -> tuple:
    """The numbers the page's Count01 answer quotes (`count01_answer.csv`), with what each column is: the
    answer sentence itself is `answers.count01`'s, one text for one claim."""
    if answer is None:
        return ()
    two = answer[answer.layers == 2] if "layers" in answer else answer.iloc[:0]
    answer = answer[answer.layers == 1] if "layers" in answer else answer
    shipped = answer[answer.model == "shipped"].iloc[0]
    text = ("**The answer's numbers** (`count01_answer.csv`: the default `hc.cooperation` call per model; the answer "
            "at the top of the page is built from this table: the same function on the counts by counterfactual "
            "edits first, the other features and the correlation on the task's inputs beside it). `function_word`, "
            "`deciding_heads`, `decided_on` (each head's total push where later layers read it, else its direct "
            "push), `edit_cos_min` and `edit_one_direction` (proportional string by string over the edits that move "
            "a count, the noise token's fitted part taken out), `pooled_cos_min` (pooled over strings), "
            "`semantic_edits`, `edit_inputs`: the same function on the counts; `noise_cos_min`: how alike the "
            "deciding heads respond to the edits that move the noise token '2' (reported apart; `noise_separable`: "
            "the share of strings where its part could be taken out); `position_max`: the largest share of a "
            "deciding head's response that changes with where an edit is made; `specialised`: how heads split the "
            "counts, where they do; `same_word`, `r_min`, `one_direction`: the correlation on the task's inputs; "
            "`pairs_matter_full_<kind>`: pairs that change the answer on "
            f"`min_share` ({float(answer.min_share.iloc[0]) if 'min_share' in answer else 0.1:.0%}) or more of the "
            "inputs in the full model, `largest_matters_full_<kind>` the largest share any pair reaches; "
            "`heads_alone_<kind>`: heads that alone answer 90% of the strings on the kind's first draw. The paper's "
            "models have one layer: its answer is the one-layer rows; the two-layer rows (zero ablation alone, for "
            "time) go past the paper. "
            + ("The tables after this one were computed before issue 48 (the old words); `python -m "
               "experiments.cooperation.run_all` recomputes them. " if MECHS == LEGACY_MECHS else "")
            + "The shipped model's summary: " + str(shipped.summary))  # fmt: skip
    cols = ["model", "answer_acc", "function_word", "deciding_heads", "decided_on", "edit_cos_min",
            "edit_one_direction", "pooled_cos_min", "semantic_edits", "edit_inputs", "noise_cos_min",
            "noise_separable", "position_max", "specialised", "same_word", "active_heads", "r_min", "r_median",
            "one_direction", "weighs_0_against_1", "weight_ratio_max",
            *[c for c in answer.columns if c.startswith(("pairs_matter", "largest_matters", "heads_alone"))],
            "mechanism", "agreement"]  # fmt: skip
    shown = pd.concat([answer, two])
    return (Text(text), Table(shown[[c for c in cols if c in shown]], digits=3))


def section_count01(summary: pd.DataFrame, pairs: pd.DataFrame, heads: pd.DataFrame,
                    ensemble: pd.DataFrame | None = None, answer: pd.DataFrame | None = None,
                    draws: pd.DataFrame | None = None) -> Section:  # fmt: skip
    acc = summary[summary.metric == "accuracy"]
    mean = acc[acc.how == "mean"]
    active = active_pairs(heads, pairs)
    ld = summary[summary.metric == "logit_diff"]
    n = len(mean)
    r = {how: _readings(acc, active, how) for how in HOWS}
    fam = acc[acc.how == "family"]
    reading = pd.DataFrame([
        dict(reading="R1: most of all 120 pairs are redundant (hc.cooperation's model verdict)", form="typical", key="r1"),
        dict(reading="R2: most pairs of active heads are redundant", form="typical", key="r2"),
        dict(reading="R3: every pair of active heads is redundant (\"all solving the same subtask\")", form="universal", key="r3"),
        dict(reading="R4: the interactions' net sum is negative (hc.interactions' rule, which one pair can tip)",
             form="net sum", key="r4"),
        dict(reading="The alternative: pairs of active heads that \"can only solve the original task in conjunction\" "
                     "(division or superposition)", form="existence", key="alt"),
    ])  # fmt: skip
    for how in HOWS:
        reading[f"models, {how}" + ("" if how == "family" else " ablation")] = [
            _share(r[how][k], n) for k in reading.key
        ]
    reading = reading.drop(columns="key")

    claim = Claim("1", FINDING,
                  "accuracy, " + "; ".join(
                      f"{how}{'' if how == 'family' else ' ablation'}, {n} models: median {r[how]['median']:.0%} of the "
                      f"pairs of active heads redundant, {_share(r[how]['r3'], n)} with every such pair redundant, "
                      f"{r[how]['conj']} pairs in conjunction" for how in HOWS)
                  + f"; the model's word over the family: {_counts(fam.mechanism)}",
                  REGISTRY_SAYS)  # fmt: skip
    zero_holds, mean_holds = r["zero"]["r2"] > n / 2, r["mean"]["r2"] > n / 2
    text = (
        f"Under zero ablation most pairs of active heads are redundant in {_share(r['zero']['r2'], n)} models (median "
        f"{r['zero']['median']:.0%}) and {r['zero']['conj']} pairs need each other; under mean ablation in "
        f"{_share(r['mean']['r2'], n)} (median {r['mean']['median']:.0%}), with {r['mean']['conj']} pairs read as a "
        f"division of labour and {r['mean']['independent']} as independent (both heads needed, their logit "
        "differences adding up). "
        + ("The two ablations disagree. With every other head set to its mean, the model's output sits at the "
           "mean-ablated baseline, and one head's deviation from its own mean is often too small to carry the "
           "decision across it while two heads' deviations together are: both are needed (AND), yet they add up "
           "on the logits, a threshold effect rather than superposition. With the others zeroed, one head alone "
           "already carries the decision. So the pseudo-ensemble reading holds when a missing head is read as "
           "absent (zero) and not when it is read as average (mean); neither source fixes which. "
           if zero_holds != mean_holds else "")
        + _empty_note(acc, draws)
        + f"Over the reading family (the four ablations, {int(fam.readings.iloc[0])} readings per model) the model's "
        f"word is {_counts(fam.mechanism)}; the median share of readings giving the most common word is "
        f"{fam.agreement.median():.0%}, and what flips it, per model: "
        + "; ".join(f"{m}: {f or 'none, every reading agrees'}" for m, f in zip(fam.model, fam.flips.fillna(""))) + ". "
        f"A pair with an inactive head is named *inactive* (nothing can be said of a head that does nothing) and "
        f"the model's word is that of more than half of its *active* pairs. On the logit difference (the family) "
        f"the pairs are {', '.join(f'{int(ld[m].sum())} {m}' for m in MECHS if m in ld and ld[m].sum() > 0)}: "
        "in a one-layer attention-only model the logit difference is a sum of per-head terms, so where both heads "
        "are needed their effects add by construction (*not testable*); the redundancy lives in the "
        "thresholded decision (accuracy)."
    )  # fmt: skip
    cols = [
        "model",
        "answer_acc",
        "how",
        "mechanism",
        "agreement",
        "flips",
        *MECHS,
        "heads_inactive",
        "heads_undetermined",
        "inputs_or",
        "inputs_and",
        "inputs_a_only",
        "inputs_b_only",
        "net_sum_verdict",
    ]
    shipped = pairs[(pairs.model == "shipped") & (pairs.how == "family")]
    example = pd.concat([shipped[shipped.mechanism != "undetermined"].head(3),
                         shipped[shipped.mechanism == "undetermined"].drop_duplicates("flips_under").head(3)])[
        ["head_a", "head_b", "mechanism", "agreement", "primary_word", "by_ablation", "flips_under", "matters", "or",
         "and", "a_only", "b_only", "interaction"]]  # fmt: skip
    return Section(
        answers.EVIDENCE["count01"],
        (
            Text(f'**Paper** (abstract): "{QUESTION}"; its answer: "{FINDING}".'),
            *answer_blocks(answer),
            Text(
                "**Here**: the shipped model and the primary configuration (16 heads) trained over seeds with the "
                f"Count01 reproduction's recipe; `hc.cooperation` on {int(mean.pairs.iloc[0])} pairs per model, 512 fresh "
                "strings (fixed), accuracy per input, under zero ablation alone, mean ablation alone (4 reference "
                "draws) and the default reading family (zero, mean, resample and answer-aligned mean ablation, 4 "
                "reference draws each, every threshold at half and twice its default) (`count01_mechanisms.csv`, "
                "every pair in `count01_pairs.csv`, every head in `count01_heads.csv`). A word stands where 90% of "
                "the readings agree; `agreement` is the share giving the most common word, `flips` the most common "
                "other word and the readings where it holds least. `inputs_*`: over the pairs and inputs where a pair "
                "matters (both heads on answer right, both off answer wrong), the share where either head alone "
                "answers (or), only both do (and), only one does (a_only, b_only), in the first draw of mean "
                "ablation."
            ),
            Table(acc[cols], digits=3),
            Text(
                "The pair words of pairs of active heads (a head is *inactive* when neither its total nor its "
                "isolated effect on the accuracy, nor on its margin, exceeds a tenth of its fair share of the heads' "
                "absolute effects with a 95% interval that excludes 0):"
            ),
            Table(active, digits=3),
            Text("The paper's question read four ways, side by side (accuracy; zero, mean, the family):"),
            Table(reading),
            *_count01_signature(acc, ensemble),
            Text("Examples from the shipped model (the family), with each ablation's word and what flips it:"),
            Table(example, digits=3),
            Text("**Reading**: " + text),
        ),
        claims=(claim,),
    )


def _one_class(draws: pd.DataFrame) -> int:
    """Draws whose head-free accuracy under the aligned mean equals the batch's share of '5' or of '4' (within
    half a string of 512), as answering one class for every string would give."""
    share = draws.batch_says_5
    return int(
        (
            ((draws.aligned_answer_acc - share).abs() < 1e-3) | ((draws.aligned_answer_acc - (1 - share)).abs() < 1e-3)
        ).sum()
    )


def _empty_note(acc: pd.DataFrame, draws: pd.DataFrame | None = None) -> str:
    """What the model answers with every head ablated, per ablation (a pair can matter only where that is wrong)."""
    shipped = acc[acc.model == "shipped"].set_index("how")
    if "v_empty" not in shipped or not len(shipped):
        return ""
    parts = ", ".join(
        f"{shipped.loc[h, 'v_empty']:.0%} under {h}" + ("" if h == "family" else " ablation")
        for h in ("zero", "mean")
        if h in shipped.index
    )
    spread = (
        f"; over {len(draws)} reference draws of `hc.ablate`'s mean the head-free model is right on "
        f"{draws.answer_acc.min():.0%}-{draws.answer_acc.max():.0%} and answers '4' on {draws.says_4.min():.0%}-"
        f"{draws.says_4.max():.0%}, so one draw can test mostly one class, as zero ablation does"
        + (
            f"; under hc.cooperation's aligned mean it is right on {draws.aligned_answer_acc.min():.1%}-"
            f"{draws.aligned_answer_acc.max():.1%}, exactly the batch's share of '5' ({draws.batch_says_5.iloc[0]:.1%}) "
            f"or of '4' in {_one_class(draws)} of {len(draws)} draws, as one answer for every string gives"
            if "aligned_answer_acc" in draws
            else ""
        )
        + " (`count01/ablation_all_draws.csv`)"
        if draws is not None
        else ""
    )
    return (
        f"With every head ablated the shipped model is still right on {parts} (the first draw of the reference "
        f"for mean{spread}): a pair can matter, and *either alone answers* be tested, only on the other inputs; under zero "
        "ablation those are the strings the head-free model gets wrong. "
    )


def _context_shares(part: pd.DataFrame) -> dict:
    """Shares of the contexts in `part` (rows of skip_pair_contexts): each 2 x 2 class, both heads pushing
    the answer up, and per reading of *writes to* the contexts where both write to several outputs and, of
    those, the ones where the answer is the only output both write to."""
    total = part.contexts.sum()
    row = dict(contexts=int(total), **{k: part[f"class_{k}"].sum() / total for k in ("or", "and", "a_only", "b_only")},
               answer_up_both=part.answer_up_both.sum() / total)  # fmt: skip
    for r in READINGS:
        several = part[f"several | {r}"].sum()
        row[f"several | {r}"] = several / total
        row[f"only correct | {r}"] = part[f"only_correct | {r}"].sum() / max(several, 1)
    return row


def _skip_pair_signature(mech: pd.DataFrame, shipped_measures: pd.DataFrame | None) -> tuple:
    """The post's own signature measures of the shipped models (skip_pair.md's `shipped.csv`) beside
    hc.cooperation's word for them (the family)."""
    if shipped_measures is None:
        return ()
    words = mech[mech.seed.isna() & (mech.how == "family")][["d_head", "mechanism", "agreement", "by_ablation"]]
    cols = [
        "d_head",
        "order_h0",
        "order_h1",
        "relation",
        "top_differ",
        "correct_up_both",
        "specific_rows",
        "specific_total",
        "split_max",
        "signal_acc",
    ]
    joined = shipped_measures[shipped_measures.n_heads == 2][cols].merge(words, on="d_head", how="left")
    return (
        Text(
            "The post's own signature measures of the shipped models (skip_pair.md, `skip_pair/shipped.csv`: "
            "the heads' preference orderings and whether they are reversed, whether their first choices "
            "differ, the pair types whose answer both heads push above their mean (of 10), the (head, token) "
            "OV rows that put exactly the completions consistent with the ordering on top, the largest split "
            "of attention) beside hc.cooperation's word:"
        ),
        Table(joined, digits=3),
    )


def _verbs(seeds: pd.DataFrame) -> pd.DataFrame:
    """Per d_head and ablation: how many seeds' pairs got each word, and the medians of the axes it was read from."""
    rows = []
    for (d_head, how), part in seeds.groupby(["d_head", "how"], sort=False):
        solved = part[part.signal_acc >= 0.999]
        rows.append(dict(d_head=d_head, how=how, seeds=len(part), **{m: int((part.mechanism == m).sum()) for m in MECHS},
                         solved_seeds=len(solved), among_solved=_counts(solved.mechanism),
                         median_agreement=part.agreement.median(), median_or=part["or"].median(),
                         median_and=part["and"].median(), median_a_only=part.a_only.median(),
                         median_b_only=part.b_only.median(), median_multi=part.multi.median(),
                         median_only_answer=part.only_answer.median(), median_distributed=part.distributed.median(),
                         rank_1_heads=int((part.rank_a <= 1).sum() + (part.rank_b <= 1).sum())))  # fmt: skip
    return pd.DataFrame(rows)


def _context_tables(c: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(per pair type, per d_head, per d_head with short column names): the shares of contexts of each kind."""
    per_type = pd.DataFrame(
        [
            dict(d_head=d_head, pair_type=str(pair_type), **_context_shares(part))
            for (d_head, pair_type), part in c.groupby(["d_head", "pair_type"])
        ]
    )
    by_d = pd.DataFrame([dict(d_head=d_head, **_context_shares(part)) for d_head, part in c.groupby("d_head")])
    by_d = by_d.set_index("d_head")
    short = {col: col.replace(" | ", " (").split(",")[0] + ")" for col in by_d.columns if " | " in col}
    return per_type.rename(columns=short), by_d, by_d.rename(columns=short).reset_index()


def section_skip_pair(mech: pd.DataFrame, ctx: pd.DataFrame, shipped_measures: pd.DataFrame | None = None,
                      answer: pd.DataFrame | None = None) -> Section:  # fmt: skip
    d1 = answer[answer.d_head == 1].iloc[0] if answer is not None and (answer.d_head == 1).any() else None
    seeds = mech[mech.seed.notna()]
    verbs = _verbs(seeds)
    shipped = mech[mech.seed.isna()][["model", "how", "signal_acc", "mechanism", "agreement", "by_ablation", "flips",
                                      "or", "and", "a_only", "b_only", "multi", "only_answer", "distributed", "rank_a",
                                      "rank_b"]]  # fmt: skip
    c = ctx[ctx.seed.notna()]
    per_type, by_d, by_d_shown = _context_tables(c)
    mean = verbs[verbs.how == "family"].set_index("d_head")
    five, one = mean.loc[5], mean.loc[1]
    fam = seeds[seeds.how == "family"]
    top = lambda r: max(MECHS, key=lambda m: r[m])  # noqa: E731
    c5 = c[c.d_head == 5]
    claims = (
        Claim("2", INTERFERE,
              f"contexts where both heads push the answer above their mean over the completions: d_head 5 "
              f"{by_d.loc[5, 'answer_up_both']:.0%}, d_head 1 {by_d.loc[1, 'answer_up_both']:.0%} (all seeds, every pair "
              f"type); pair types where that holds in every context at d_head 5: "
              f"{int((per_type[per_type.d_head == 5].answer_up_both >= 1).sum())}/10; every context at d_head 5: "
              f"{int(c5.answer_up_both.sum())}/{int(c5.contexts.sum())}", REGISTRY_SAYS),
        Claim("2", ONLY_CORRECT,
              "of the contexts where both heads write to several completions, the share where the answer is the only "
              "one both write to, by reading of *writes to*: "
              + "; ".join(f"{r}: d_head 5 {by_d.loc[5, f'only correct | {r}']:.0%}, d_head 1 {by_d.loc[1, f'only correct | {r}']:.0%}"
                          for r in READINGS), REGISTRY_SAYS),  # fmt: skip
        Claim("2", SUPERPOSE,
              f"hc.cooperation's word for the pair, accuracy, the reading family: d_head 5 {_counts(fam[fam.d_head == 5].mechanism)}; "
              f"d_head 1 {_counts(fam[fam.d_head == 1].mechanism)}; the shipped d_head 5 model: "
              f"{_shipped_word(mech, 5)}, the shipped d_head 1 model: {_shipped_word(mech, 1)}", REGISTRY_SAYS),
    )  # fmt: skip
    reading = (
        f"Over the reading family, the d_head 5 pair is mostly **{top(five)}** ({_counts(fam[fam.d_head == 5].mechanism)}), "
        f"the d_head 1 pair mostly **{top(one)}** ({_counts(fam[fam.d_head == 1].mechanism)}). Superposition is read "
        "from the writes and the attention, as the post describes it, not from which heads the answer needs: at "
        f"d_head 5 both heads write to several completions consistent with the token they attend to in a median "
        f"{five.median_multi:.0%} of the contexts, the answer is the only completion both push up in "
        f"{five.median_only_answer:.0%} of those, and the heads attend to different signal tokens in "
        f"{five.median_distributed:.0%} of the contexts (at most 75% can differ: a quarter of the contexts repeat "
        f"one token). At d_head 1 {int(one.rank_1_heads)} of {2 * int(one.seeds)} heads write one fixed vector "
        "scaled by a signed number set by the attended token (rank 1: W_O W_U of a one-dimensional head): such a "
        "head writes to the vector's positive part or, when the sign flips, to its negative part, so it can write "
        "two different sets of completions for different sources and never more" + (
        f" (the shipped d_head 1 heads' writes depend on tokens they do not attend to on {d1.conditional_a:.0%} and "
        f"{d1.conditional_b:.0%} of the inputs, `skip_pair_answer.csv`)" if d1 is not None else "") + "; the post's "
        "\"bottleneck superposition\" is a different thing from the hierarchical mechanism it describes at d_head "
        "5. Necessity, for contrast: at "
        f"d_head 5 each head alone answers a median {five.median_a_only:.0%} and {five.median_b_only:.0%} of the "
        f"contexts where the pair matters and both are needed on {five.median_and:.0%}; the post's own \"{LEAST_FAVOURITE}\" "
        "says one head alone answers some contexts, so necessity is not part of the word. The readings of *writes "
        "to* side by side (all seeds): of the contexts where both heads write to several outputs, the answer is the "
        "only one both push up in "
        + "; ".join(f"{by_d.loc[5, f'only correct | {r}']:.0%} at d_head 5 and {by_d.loc[1, f'only correct | {r}']:.0%} "
                    f"at d_head 1 reading *{r}*" for r in READINGS) + "."
    )  # fmt: skip
    return Section(
        answers.EVIDENCE["skip_pair"],
        (
            Text(
                f'**Post**: "{INTERFERE}"; "{ONLY_CORRECT}"; "{DISTRIBUTE}"; "{SUPERPOSE}"; "{LEAST_FAVOURITE}"; '
                f'"{ONE_HEAD}"'
            ),
            *_answer_numbers(answer),
            Text(
                "**Here**: two-head models with d_head 5 and d_head 1, trained over seeds with the SkipPair "
                "reproduction's recipe, and the shipped checkpoints; `hc.cooperation` on 512 signal contexts (the "
                "default call's inputs; the post's claims are about them), accuracy per context, under the reading family (zero and mean ablation "
                "alone beside) (`skip_pair_mechanisms.csv`). `median_or` .. `median_b_only`: medians over seeds of the "
                "shares of the contexts where the pair matters; `median_multi`: of all contexts, both heads write to at "
                "least 2 completions consistent with their source; `median_only_answer`: of those, the answer is the "
                "only completion both push up; `median_distributed`: the heads attend to different tokens; "
                "`rank_1_heads`: heads whose map from attended token to writes has rank 1."
            ),
            Table(verbs, digits=3),
            Table(shipped, digits=3),
            *(
                (
                    Text(
                        "The shipped checkpoints were trained with the seeds' recipe at seeds "
                        + " and ".join(
                            f"{int(r.train_seed)} (d_head {int(r.d_head)})"
                            for r in shipped_measures.itertuples()
                            if r.n_heads == 2
                        )
                        + " (`skip_pair/shipped.csv`, `train_seed`): their rows repeat those seeds' models and are not further "
                        "evidence; the counts over seeds above include them once."
                    ),
                )
                if shipped_measures is not None and "train_seed" in shipped_measures
                else ()
            ),
            *_skip_pair_signature(mech, shipped_measures),
            Text(
                "**Superposition evidence per context**, all seeds pooled (`skip_pair_contexts.csv`). A head *writes "
                "to* an output, by reading: hc.cooperation's (its DLA above a tenth of its largest on the context, "
                "counting only completions consistent with the token it attends to), *positive* (its raw DLA over the "
                "10 completions is above 0, as the post's figure shows contributions), *centered* (above its mean over "
                "the completions) or *half_answer* (the earlier instrument's: its DLA minus its mean over the "
                "vocabulary is at least half of that on the answer). "
                "`several`: share of the contexts where both heads write to at least 2 outputs; `only correct`: of "
                "those, the share where the answer is the only output both write to. `answer_up_both`: both heads' "
                "centered DLA on the answer is above 0. By width:"
            ),
            Table(by_d_shown, digits=3),
            Text("Per pair type (shares of that type's contexts):"),
            Table(per_type, digits=2),
            Text("**Reading**: " + reading),
        ),
        claims=claims,
    )


ANSWER_COLUMNS = ["model", "mechanism", "agreement", "favoured", "favoured_share", "vote_zero", "vote_mean",
                  "vote_resample", "knife_edge", "conditional_a", "conditional_b", "shown_a", "shown_b", "distributed",
                  "multi", "only_answer", "matters", "or", "and"]  # fmt: skip


def _answer_numbers(answer: pd.DataFrame | None) -> tuple:
    """The numbers the page's SkipPair answer quotes, as a table (`skip_pair_answer.csv`, the default call)."""
    if answer is None:
        return ()
    return (
        Text(
            "**The answer's numbers** (`skip_pair_answer.csv`: the default `hc.cooperation` call on the shipped "
            "checkpoints; the answer at the top of the page is built from this table). `agreement`: the share of "
            "votes of the most common word; `favoured`: the most common word other than *undetermined* and "
            "`favoured_share` its votes; `vote_<kind>`: its share of that kind's seeing readings (the family's "
            "vote is the mean over the kinds that see the pair); `knife_edge`: a group of readings whose removal "
            "alone changes the word; `conditional_a/b`: the post's defining property, among the inputs that can "
            "show it, `shown_a/b` their share of the inputs where the pair matters; `only_answer`: the "
            "interference sentence, among the inputs where both write several (`multi`)."
        ),
        Table(answer[[c for c in ANSWER_COLUMNS if c in answer]], digits=4),
    )


def _shipped_word(mech: pd.DataFrame, d_head: int) -> str:
    row = mech[mech.seed.isna() & (mech.d_head == d_head) & (mech.how == "family")]
    if not len(row):
        return "not measured"
    row = row.iloc[0]
    if "favoured" not in row or pd.isna(row.favoured):
        return f"{row.mechanism} ({row.agreement:.0%} of votes; {row.by_ablation})"
    word = row.mechanism if row.mechanism != "undetermined" or row.favoured == "undetermined" else \
        f"undetermined, {row.favoured} favoured"  # fmt: skip
    return f"{word} ({row.favoured_share:.0%} of votes; a word needs 90%)"


def _single_readings(heads: pd.DataFrame) -> tuple:
    """(a) under a single ablation: the heads zero or mean ablation alone calls competing, with their total effect
    and its 95% interval (the family vote is the answer's reading; these are its exceptions)."""
    found = heads[(heads.how != "family") & (heads.role == "competes")]
    if not len(found):
        return (Text("(a) under a single ablation: no head is called competing by zero or mean ablation alone."),)
    shown = found[["model", "how", "head", "role", "role_agreement", "total_effect", "total_low", "total_high",
                   "direct_effect"]]  # fmt: skip
    return (Text("(a) under a single ablation, the exceptions to the family vote: the heads zero or mean ablation "
                 "alone calls competing, with the total effect and its 95% interval."), Table(shown, digits=2))  # fmt: skip


def section_compete(
    summary: pd.DataFrame, heads: pd.DataFrame, two_layer: pd.DataFrame, table1: pd.DataFrame | None
) -> Section:
    acc = summary[(summary.metric == "accuracy")]
    rows = []
    for how, part in acc.groupby("how", sort=False):
        rows.append(dict(models="Count01, one layer", how=how, undetermined_heads=int(part.heads_undetermined.sum()), models_n=len(part),
                         competing_heads=int(part.heads_competes.sum()), heads=int((part.heads_supports + part.heads_competes + part.heads_inactive + part.heads_undetermined).sum()),
                         competition_pairs=int(part.competition.sum()), pairs=int(part.pairs.sum())))  # fmt: skip
    for _, r in two_layer.iterrows():
        rows.append(dict(models=r.model, how="family", undetermined_heads=int(r.heads_undetermined), models_n=1,
                         competing_heads=int(r.heads_competes),
                         heads=int(r.heads_supports + r.heads_competes + r.heads_inactive + r.heads_undetermined),
                         competition_pairs=int(r.competition), pairs=int(r.pairs)))  # fmt: skip
    counts = pd.DataFrame(rows)
    h = heads[heads.how == "family"]
    negative_direct = int((h.direct_effect < 0).sum())
    blocks = [
        Text(f'**Paper** (title): "{TITLE}".'),
        Text(f'A summary of arXiv 2502.06923 this project works from (its words, not the paper\'s): "{TABLE1}".'),
        Text(
            "Neither source defines *compete*. Three readings, side by side: (a) at inference a head's total "
            'effect on the metric opposes the answer (hc.cooperation\'s role "competes": its total effect on the '
            "accuracy, else its isolated effect, else the same on the margin, is below minus a tenth of its fair "
            "share of the heads' absolute effects, with a 95% interval below 0; a word only where 90% of the "
            'reading family agrees), and a pair with one such head is "competition"; (b) a head\'s direct effect '
            "is negative at all (any size; a head can feed a later head while its direct effect is negative); (c) "
            "in training, heads trained together end worse than the same heads trained alone (the paper's Table "
            "1)."
        ),
        Table(counts),
        *_single_readings(heads),
        Text(
            f"(b): {negative_direct} of {len(h)} heads of the one-layer Count01 models have a negative mean direct "
            f"effect, the most negative {h.direct_effect.min():.3f} against the largest positive "
            f"{h.direct_effect.max():.3f}."
        ),
    ]
    one = counts[counts.models == "Count01, one layer"]
    fam_one = one[one.how == "family"]
    measured = (f"(a) one layer: {int(fam_one.competing_heads.iloc[0])} of {int(fam_one.heads.iloc[0])} heads compete "
                f"over the reading family ({int(fam_one.undetermined_heads.iloc[0])} undetermined); "
                f"two layers: " + ", ".join(f"{int(r.competing_heads)}/{int(r.heads)}" for _, r in counts[counts.models != "Count01, one layer"].iterrows()))  # fmt: skip
    if table1 is not None:
        t = table1.set_index("metric")
        s_d, l_d = float(t.loc["s_acc", "isolated_minus_joint"]), float(t.loc["l_acc_head", "isolated_minus_joint"])
        blocks.append(Text(f"(c) from `count01/table1.csv` (the Count01 reproduction, section 6): isolated - joint "
                           f"s_acc {s_d:+.3f}, l_acc (the head's own push) {l_d:+.3f}. The two metrics disagree in "
                           "sign: by separability the jointly trained heads are better, by the head's own push the "
                           "isolated ones are."))  # fmt: skip
        measured += f"; (c) Table 1, isolated - joint: s_acc {s_d:+.3f}, l_acc {l_d:+.3f}"
    blocks.append(
        Text(
            "**Reading**: over the reading family, no head of the one-layer Count01 models pushes against the answer "
            "beyond a tenth of its fair share"
            if int(fam_one.competing_heads.iloc[0]) == 0
            else f"**Reading**: over the reading family, {int(fam_one.competing_heads.iloc[0])} heads of the one-layer models "
            "push against the answer"
        )
    )
    listed = "; ".join(
        f"{r.model}: {r.competing}" for _, r in two_layer.iterrows() if isinstance(r.competing, str) and r.competing
    )
    blocks[-1] = Text(blocks[-1].text + (f"; in the two-layer models these heads do ({listed}), and a pair with one "
                      "of them is named competition where the family agrees" if listed else "; nor in the two-layer models") +
                      ". Whether heads *compete in training* (reading c) depends on the metric: the two of Table 1 "
                      "point opposite ways.")  # fmt: skip
    one_n = int(fam_one.competing_heads.iloc[0])
    verdict = "a question, so no verdict; the answer here: " + (
        "(a) no competition at inference in one layer" if one_n == 0 else f"(a) {one_n} competing heads in one layer") + \
        "; (c) mixed (the Table 1 metrics disagree in sign)"  # fmt: skip
    return Section(answers.EVIDENCE["compete"], tuple(blocks), claims=(Claim("3", TITLE, measured, verdict),))


def _matters_little(mech: pd.DataFrame) -> int:
    """Pairs undetermined because they matter on too few inputs, read from the `reasons` column."""
    import re

    return sum(int(n) for text in mech.reasons for n in re.findall(r"(\d+) x the pair matters on", text))


def section_two_layer(
    mech: pd.DataFrame, heads: pd.DataFrame, paths: pd.DataFrame, comp: pd.DataFrame, backup: pd.DataFrame | None = None
) -> Section:
    edges = paths[paths.via != "direct"].copy()
    mode = {"q": "Q", "k": "K", "v": "V"}
    edges["mode"] = edges.via.map(mode)
    joined = edges.merge(comp, on=["seed", "sender", "receiver", "mode"])
    joined["effect"] = joined.normalized.abs()
    corr = joined.groupby("via")[["effect", "score"]].corr(method="spearman").xs("effect", level=1)["score"]
    top = (
        joined.sort_values("effect", ascending=False)
        .groupby("seed")
        .head(5)[["seed", "sender", "receiver", "via", "normalized", "score"]]
    )
    direct = paths[paths.via == "direct"].sort_values("normalized", key=abs, ascending=False).groupby("seed").head(3)
    direct = direct.sort_values(["seed", "normalized"], ascending=[True, False])[["seed", "sender", "normalized"]]
    cols = ["model", "answer_acc", "mechanism", "agreement", "flips"] + MECHS + [
        "heads_supports", "heads_competes", "heads_inactive", "heads_undetermined", "competing", "L0-L0", "L0-L1",
        "L1-L1", "reasons"]  # fmt: skip
    backs = heads[heads.backs_up.fillna("") != ""][
        ["seed", "head", "role", "direct_effect", "total_effect", "self_repair", "backs_up"]
    ]
    if backup is not None and len(backup):
        norm_heavy = backup[(backup.norm_compensation.abs() > backup.own_compensation.abs())]
        backup_text = (f" Of the {len(backup)} (earlier head, later head, ablation) rows, "
                       f"{int(backup.backs_up.sum())} are a backup; in {len(norm_heavy)} the final norm's rescaling "
                       "moves the later head's direct effect more than its own output does (`two_layer_backup.csv`).")  # fmt: skip
    else:
        backup_text = ""
    return Section(
        "4. Two layers: mechanisms, backup and paths",
        (
            Text(
                "**Here**: two-layer Count01 models (16 heads per layer, the primary width) trained over seeds; "
                "`hc.cooperation` over all 32 heads (496 pairs; accuracy, the reading family with 2 reference draws "
                "per ablation, for time; the Shapley interaction index is not computed above 16 heads) "
                "(`two_layer_mechanisms.csv`, heads in `two_layer_heads.csv`). `L0-L1`: the words of pairs with one "
                "head in each layer (composition is possible only there)."
            ),
            Table(mech[[c for c in cols if c in mech.columns]], digits=3),
            Text(
                f"**Reading**: {int(mech.undetermined.sum())} of {int(mech.pairs.sum())} pairs are undetermined, "
                f"{_matters_little(mech)} of them because the pair matters on fewer than 10% of the inputs both with the other 30 heads present (removing "
                "two of 32 heads rarely flips the answer) and with them ablated (two heads alone rarely give it); "
                f"{int(mech.competition.sum())} are competition, {int(mech.composition.sum())} composition, "
                f"{int(mech.redundant.sum())} redundant, {int(mech.division.sum())} a division, "
                f"{int(mech.superposition.sum())} superposition, {int(mech.inactive.sum())} hold an inactive head. "
                "Pairs of two heads cannot describe a 32-head model that answers only with many heads at once; a "
                "word on larger groups is beyond this instrument."
            ),
            Text(
                "Heads that back another up (when the other is ablated, this head's own output change, the final "
                "norm's rescaling split off, restores at least half of the other's direct effect or half of the "
                "answers it loses; McGrath et al. 2023, Rushing & Nanda 2024) and their self-repair (direct minus "
                "total effect):" + backup_text
                if len(backs)
                else "No head backs up another (no head's own output "
                "change restores half of an ablated head's direct effect or of its lost answers)." + backup_text
            ),
            *((Table(backs, digits=3),) if len(backs) else ()),
            Text(
                "`hc.path_patch` of every layer-0 -> layer-1 edge through q, k and v (share of the clean-corrupt gap "
                "restored, `normalized`), beside the weights-only composition score of the same pair "
                "(`two_layer_paths.csv`, `two_layer_composition.csv`). The five strongest edges per seed:"
            ),
            Table(top, digits=3),
            Text(
                "Spearman correlation, over all edges, between |path-patching effect| and the composition score: "
                + ", ".join(f"via {v}: {c:.2f}" for v, c in corr.items())
                + ". The three strongest direct paths "
                "(a head of either layer straight to the logits) per seed:"
            ),
            Table(direct, digits=3),
        ),
    )


def build(out: Path = Path(__file__).resolve().parents[2] / "docs" / "results") -> Path:
    tables = out / "cooperation"
    read = lambda name: pd.read_csv(tables / f"{name}.csv")  # noqa: E731
    table1_path = out / "count01" / "table1.csv"
    table1 = pd.read_csv(table1_path) if table1_path.exists() else None
    summary, pairs, heads = read("count01_mechanisms"), read("count01_pairs"), read("count01_heads")
    MECHS[:] = LEGACY_MECHS if "independent" in summary.columns else list(MECHANISMS)
    two_layer = read("two_layer_mechanisms")
    optional = lambda path: pd.read_csv(path) if path.exists() else None  # noqa: E731
    sections = [section_count01(summary, pairs, heads, optional(out / "count01" / "ensemble_models.csv"),
                                optional(tables / "count01_answer.csv"), optional(out / "count01" / "ablation_all_draws.csv")),
                section_skip_pair(read("skip_pair_mechanisms"), read("skip_pair_contexts"),
                                  optional(out / "skip_pair" / "shipped.csv"), optional(tables / "skip_pair_answer.csv")),
                section_compete(summary, heads, two_layer, table1),
                section_two_layer(two_layer, read("two_layer_heads"), read("two_layer_paths"), read("two_layer_composition"),
                                  read("two_layer_backup") if (tables / "two_layer_backup.csv").exists() else None)]  # fmt: skip
    figures = [
        (
            0,
            "count01_same",
            "The same-computation evidence (shipped Count01): every head's direct push on "
            "logit('5') - logit('4') against the string's evidence, and the active heads' pairwise r",
        ),
        (
            0,
            "count01_pairs",
            "The word of every pair of the shipped Count01 model's heads, with the share of "
            "votes of its most common reading (the default call)",
        ),
        (1, "skip_pair_words", "The SkipPair checkpoints' pair word under every reading, per ablation kind"),
    ]
    for i, name, caption in reversed(figures):  # each inserted after the section's first two blocks, in order
        if (tables / f"{name}.html").exists():  # drawn by `python -m experiments.cooperation.figures`
            figure = FigureFile(name, caption, folder="cooperation", png=(tables / f"{name}.png").exists())
            sections[i] = dataclasses.replace(
                sections[i], blocks=(*sections[i].blocks[:2], figure, *sections[i].blocks[2:])
            )
    verdicts = {**default_verdicts(out / "robustness", "count01"), **default_verdicts(out / "robustness", "skip_pair")}
    short = {**short_verdicts(out / "robustness", "count01"), **short_verdicts(out / "robustness", "skip_pair")}
    claims = with_registry([c for part in sections for c in part.claims], verdicts, short)
    timing_path = tables / "timing.json"
    timing = json.loads(timing_path.read_text()) if timing_path.exists() else None
    shown = answers.from_tables(out, ("count01", "compete", "skip_pair"))
    page = render(
        "page.md.j2", HERE, timing=timing, answers=shown, title="Cooperate, compete or superpose? The mechanism of every pair of heads in the toy models",
        source_name="source", claims=claims,
        claims_note="Every verdict is the claim registry's (`experiments/claims.py`), the same on every page: the "
                    "claim's logical form, then in one sentence its favoured reading's verdict in the default setup, what flips "
                    "it, and what the other readings say; below the table, every reading in full, each with what flips "
                    "its verdict (another setup, with its count, or another threshold of the rule's band) or what was "
                    "tried without flipping it. The readings that read this page's tables are marked *default setup "
                    "only* on `robustness.md`. The title is a question: it gets this page's answer, not a verdict.",
        sections=sections, definitions=definitions(), legacy=MECHS == LEGACY_MECHS,
    )  # fmt: skip
    target = out / "cooperation.md"
    target.write_text(page, encoding="utf-8")
    return target


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[2] / "docs" / "results")
    print(build(parser.parse_args().out))
