"""The confusion tables of hc.cooperation on models whose truth is fixed by their weights (issue 37): the
planted models (`headcoop/tasks/planted.py`) and the mechanism bench (`headcoop/tasks/bench.py`, whose
truths are checked on plain hooks in tests/analysis/mechanisms/test_mechanism_bench.py), every named pair under each ablation
alone and under the default reading family, on accuracy and on the logit difference, without and with
0.01 weight noise (3 seeds). Writes docs/results/planted.md (overwriting only that file, which it wrote).

    python -m experiments.cooperation.planted
"""

from __future__ import annotations

import collections
import os
import time
from pathlib import Path

import headcoop as hc
from experiments.consistency import record
from headcoop.analysis.mechanisms.cooperation import MECHANISMS
from headcoop.analysis.mechanisms.definitions import definitions
from headcoop.display.pages import clip
from headcoop.tasks.bench import BENCH, FUNCTION, LOGIT_DIFF_TRUTH
from headcoop.tasks.function_bench import FUNCTION_BENCH, FUNCTION_TRUTH, function_bench
from headcoop.tasks.planted import PLANTED

OUT = Path(__file__).resolve().parents[2] / "docs" / "results" / "planted.md"
MARK = "<!-- written by experiments/cooperation/planted.py -->"
HOWS = ("zero", "mean", "resample", "family")
METRICS = ("accuracy", "logit_diff")
# the planted models' truth on the logit difference where it differs from accuracy's: in one attention-only
# layer the logit difference is additive over two heads by construction, so either-alone and both-needed
# cannot occur on it ("not testable")
PLANTED_LOGIT_DIFF_TRUTH = {name: {("L0H0", "L0H1"): "not testable"}
                            for name in ("redundant", "mixed", "superposition", "independent")}  # fmt: skip
COLUMNS = MECHANISMS + ("cannot see",)


def _models():
    for name in PLANTED:
        yield "planted", name, lambda noise, seed, name=name: hc.planted(name, weight_noise=noise, seed=seed)
    for name in BENCH:
        yield "bench", name, lambda noise, seed, name=name: hc.bench(name, weight_noise=noise, seed=seed)


def _truth(kind: str, name: str, model, metric: str) -> dict:
    if kind == "planted":
        truth = dict(model.planted["pairs"])
        if metric == "logit_diff":
            truth.update(PLANTED_LOGIT_DIFF_TRUTH.get(name, {}))
        return truth
    truth = dict(model.truth["pairs"])
    if metric == "logit_diff":
        truth.update(LOGIT_DIFF_TRUTH.get(name, {}))
    return truth


def _blind_everywhere(row) -> bool:
    """Whether every ablation of the pair's readings abstained ("zero: cannot see it; ..."): the truth is one
    the instrument cannot measure under these readings, an abstention rather than a word."""
    return all(part.split(": ", 1)[-1].startswith("cannot see") for part in row.by_ablation.split("; "))


def _function_row(label: str, truth: str, result) -> str:
    """One row of the function-axis table: the truth beside what was named, with the numbers that decide it and
    what is reported apart (the noise token, positions, how the heads split the counts)."""
    n = result.function_numbers
    noise = (n.get("other") or {}).get("the count of 2s (the noise token)", {})
    apart = "; ".join(x for x in (
        f"noise token: \\|cos\\| >= {noise['cos_min']:.2f} on its edits" if "cos_min" in noise else "",
        "noise not separable (one length)" if noise.get("separable") == 0.0 else "",
        f"position: up to {n['position_max']:.0%} of a response" if n.get("position_max", 0) >= 0.01 else "",
        f"specialised: {n['specialised']}" if n.get("specialised") else "") if x)  # fmt: skip
    right = "yes" if result.function_word == truth else "undetermined" if result.function_word == "undetermined" \
        else "**no**"  # fmt: skip
    return (f"| {label} | {truth} | {result.function_word} | {right} | {n.get('cos_min', float('nan')):.3f} | "
            f"{n.get('r_min', float('nan')):.3f} | {apart} |")  # fmt: skip


def function_rows() -> list[str]:
    """The function axis on every model whose function truth is known: the bench's counting models (one length)
    and the function bench's near-misses (lengths vary), each by zero ablation on 128 inputs."""
    rows = []
    for name, truth in FUNCTION.items():
        rows.append(_function_row(f"bench: {name}", truth, hc.cooperation(hc.bench(name), how="zero", n=128)))
    for name in FUNCTION_BENCH:
        rows.append(_function_row(f"function bench: {name}", FUNCTION_TRUTH[name],
                                  hc.cooperation(function_bench(name), how="zero", n=128)))  # fmt: skip
    return rows


def confusion_figure(confusion: dict, folder: Path) -> list[str]:
    """confusion.csv (metric, ablation, truth, named, count) and a heatmap per (metric, ablation), truth rows
    against named columns, into `folder` (HTML, and PNG where kaleido can export); the files written."""
    import pandas as pd
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from headcoop.display.plot import TEMPLATE, save_figure

    folder.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([dict(metric=m, ablation=h, truth=t, named=n, count=c) for (m, h), counts in confusion.items()
                  for (t, n), c in sorted(counts.items())]).to_csv(folder / "confusion.csv", index=False)  # fmt: skip
    truths = [c for c in COLUMNS if any(t == c for counts in confusion.values() for t, _ in counts)]
    fig = make_subplots(rows=len(METRICS), cols=len(HOWS), shared_yaxes=True, vertical_spacing=0.2,
                        subplot_titles=[f"{m}, {h}" for m in METRICS for h in HOWS])  # fmt: skip
    for i, metric in enumerate(METRICS):
        for j, how in enumerate(HOWS):
            counts = confusion[(metric, how)]
            z = [[counts[(t, n)] for n in COLUMNS] for t in truths]
            fig.add_trace(go.Heatmap(z=z, x=list(COLUMNS), y=truths, colorscale="Blues", showscale=False,
                                     text=[[str(v) if v else "" for v in row] for row in z], texttemplate="%{text}",
                                     hovertemplate="truth %{y}, named %{x}: %{z}<extra></extra>"), i + 1, j + 1)  # fmt: skip
    fig.update_xaxes(tickangle=45, tickfont=dict(size=9))
    fig.update_yaxes(autorange="reversed", tickfont=dict(size=9))
    fig.update_layout(template=TEMPLATE, height=900, title="hc.cooperation on the planted models and the bench: truth "
                      "(rows) against the word named (columns)<br><sup>counts of (model, pair, weight-noise seed); "
                      "the diagonal is right; undetermined and cannot see are abstentions</sup>")  # fmt: skip
    return save_figure(fig, folder, "confusion", width=1500, height=900)


def intro_lines() -> list[str]:
    """The page's opening paragraph: what was run, on which models, and how a word is read."""
    return [
        "Generated by `python -m experiments.cooperation.planted`. Two sets of hand-weighted HookedTransformers: "
        f"the planted models (`headcoop/tasks/planted.py`, {len(PLANTED)}) and the mechanism bench "
        f"(`headcoop/tasks/bench.py`, {len(BENCH)}: the SkipPair post's mechanism in miniature and its near-misses "
        "(unconditional writes, 80/20 and 50/50 mixtures with plain redundancy, a split helper that never "
        "changes an answer), rank-1 heads, AND gates, a feeder and redundant feeders of a later query, an "
        "induction pair, a partial backup, a LayerNorm model, unequal redundancy, an uneven division, "
        "cancelling heads, a flat competitor whose push does not depend on the input, a mechanism on one pair "
        "of four, a head routed through an MLP, counting heads that share or split the subtask, share it with "
        "unequal weights or through a second layer, and issue 59's near-misses: a first-digit reader that agrees "
        "with a counter on the task's inputs, a resampled competitor that hurts as much as the head (`hurt`), an "
        "exact tie with the floor (`tie`) and a 57/43 mixture (`mix57`)). Each truth "
        "is written down in its module; the bench's are checked with plain hooks on `hook_z` in "
        "`tests/analysis/mechanisms/test_mechanism_bench.py`, not with `hc.cooperation`. The words are issue "
        "48's: each its source's defining property (`WORD_SOURCES`). 256 task inputs; a single ablation is that "
        "ablation with its distinct reference draws and every threshold and write reading; `family` is zero, mean "
        "and resample together, each kind one equal vote. A word stands at 90% of the votes. `undetermined` is "
        "an abstention, counted apart from a miss; *cannot see* is an abstention the instrument can explain: "
        "every reading of the ablation abstains (the head writes the same on every input, so mean and resample "
        "leave it as it is; or, under resample, the answers lost go to the injected input's answer).",
        "",
    ]


def where_readings_part() -> list[str]:
    """The page's section on where the ablation readings part, and why (prose; the numbers are the tables')."""
    return [
        "## Where the readings part, and why",
        "",
        "- **Resample ablation** replaces a copy head's output by the same head's output on another input: it "
        "votes for that input's answer as strongly as the head votes for this one's, so two heads that copy the "
        "same token look both needed. The instrument checks it: where the answers lost go to the injected "
        "input's answer (or to a completion the injected value pushes), resample abstains (*cannot see*).",
        "- **Mean and resample ablation cannot see a head whose output does not depend on the input** (the "
        "`flat` competitor, an empty head): its replacement is what it writes anyway. Those readings abstain; "
        "zero ablation names it.",
        "- **Mean ablation of a counting head** (`count-subtasks`) holds it at the average count: a vote the "
        "other head's count is compared against, so on the inputs where the pair matters the mean replacement "
        "answers as the head does. Those inputs show nothing about the head (zeroing it changes the answer, "
        "replacing it does not) and are left out (`unseen` in the pair table): none remains, and mean says "
        "the pair matters on 0% of inputs; zero ablation names the division and the family abstains.",
        "- **A replacement that does what the head does** (`hurt`, issue 59): L0H1 turns 37.5% of the answers "
        "wrong, and its resampled replacement (another input's token) turns as many wrong, so resample cannot "
        "tell the head from its replacement: every resample reading abstains (*cannot see*, with the effects), "
        "and zero and mean name the competition. The check pools the reference draws and covers every "
        "coalition of the pair's 2 x 2 game; a replacement that does more than the head the same way (a noisy "
        "seed on the logit difference, where L0H1 supports) would read the head reversed, and abstains too.",
        "- **Resample draws that carry the input's own token** (`and-junk`): a quarter of the draws give a "
        "head the value it has anyway, so on those inputs either head *alone* seemed to answer and resample read "
        "a mixture. Per input, where zeroing a head changes the answer in a coalition and its replacement does "
        "not, the input is left out of the pair's reading: resample names the conjunction.",
        "- **A replacement that writes what the head does not** (`and-suppress` on the logit difference): "
        'L0H1 lowers only the decoy, which the logit difference (the answer against "none") does not read; '
        "its mean replacement lowers every completion by about 0.125, the answer included, so a mean ablation "
        "measures the replacement. Where nothing but the logits reads a head (the last layer of an "
        "attention-only model without norms), and the head writes nothing the metric reads while its "
        "replacement does, the reading abstains (*cannot see*).",
        "- **Near-ties on accuracy** (`rank1` under 0.01 weight noise): a lone rank-1 head ties several "
        "completions without noise (no answer) and with noise wins 45% of the inputs by 0.01 to 0.02 logits "
        "(the full model's median margin: 1.6): wins at the level of the noise, which read as a division under "
        "zero ablation (seed 1, 90% of the votes). Accuracy counts them as answers, as the user's metric does; "
        "counting a win by under 2% of the clean median margin as a tie removed that word, but on Count01 it "
        "also turned lone heads' wins by about 1 logit into ties and made a pair of a two-layer model "
        '"matter" without changing any answer, so it was not kept.',
        "- **Logit difference**: in one attention-only layer it is additive over two heads by construction, "
        "so either-alone and both-needed cannot occur on it: the truth there is *not testable* for every "
        "necessity word, while a division (one head carries each input's logit difference) and superposition "
        "(read from the writes) stay measurable.",
        "- **Superposition** is read from the clean run's writes and attention: conditional writes (the post's "
        "defining sentence), multi-output writes that meet only on the answer, important sources distributed, "
        'both heads changing the metric. The rank-1, AND-gate, unconditional and planted "superposition" '
        "models, whose writes do not depend on the token a head does not attend to, are never named "
        "superposition, nor are the mixtures where most inputs are plain copies.",
        "",
    ]


def main() -> None:
    from experiments.consistency import started

    start_at = started("planted")  # the code this run imported
    start = time.perf_counter()
    rows, wrong_rows, records = [], [], []
    confusion = {(m, how): collections.Counter() for m in METRICS for how in HOWS}
    wrong_words = collections.Counter()
    for kind, name, build in _models():
        for metric in METRICS:
            for how in HOWS:
                for noise, seed in [(0.0, 0)] + [(0.01, s) for s in (1, 2, 3)]:
                    model = build(noise, seed)
                    result = hc.cooperation(model, how=how, metric=metric, n=256, seed=seed)
                    truth = _truth(kind, name, model, metric)
                    for row in result.pairs.itertuples():
                        want = truth.get((row.head_a, row.head_b))
                        if want is None:
                            continue
                        named = "cannot see" if _blind_everywhere(row) else row.mechanism
                        confusion[(metric, how)][(want, named)] += 1
                        records.append(dict(model=f"{kind}: {name}", metric=metric, ablation=how, weight_noise=noise,
                                            seed=seed, pair=f"{row.head_a} & {row.head_b}", truth=want,
                                            named=row.mechanism, agreement=row.agreement, reason=row.reason,
                                            by_ablation=row.by_ablation))  # fmt: skip
                        if row.mechanism not in (want, "undetermined"):
                            wrong_words[(metric, how)] += 1
                            wrong_rows.append(f"| {kind}: {name} | {metric} | {how} | {noise:g} (seed {seed}) | "
                                              f"{row.head_a} & {row.head_b} | {want} | {row.mechanism} | "
                                              f"{row.agreement:.0%} | {clip(row.reason)} |")  # fmt: skip
                        if noise == 0.0:
                            ok = "yes" if row.mechanism == want else "cannot see" if named == "cannot see" else \
                                "undetermined" if row.mechanism == "undetermined" else "**no (miss)**"  # fmt: skip
                            rows.append(f"| {kind}: {name} | {metric} | {how} | {row.head_a} & {row.head_b} | {want} | "
                                        f"{row.mechanism} | {row.agreement:.0%} | {ok} | {clip(row.by_ablation if how == 'family' else row.reason, 240)} |")  # fmt: skip
    import pandas as pd

    same_rows = function_rows()
    pd.DataFrame(records).to_csv(OUT.parent / "planted" / "words.csv", index=False)  # every word, reasons in full
    record(OUT.parent / "planted", start_at)  # the commit the tables were generated at (`experiments.consistency`)
    lines = [
        MARK,
        "# hc.cooperation on models whose truth is fixed by their weights",
        "",
        *intro_lines(),
        "## Every named pair, without weight noise",
        "",
        "| model | metric | ablation | pair | truth | named | agreement | right | by ablation (family) or reason |",
        "|---|---|---|---|---|---|---:|---|---|",
        *rows,
        "",
        "## Confusion (truth rows, named columns), without noise and with 0.01 weight noise (3 seeds)",
        "",
        "Confident wrong words (named neither the truth nor undetermined), per metric and ablation: "
        + "; ".join(f"{m}, {h}: {wrong_words[(m, h)]}" for m in METRICS for h in HOWS)
        + ".",
        "",
    ]
    written = confusion_figure(confusion, OUT.parent / "planted")
    if "confusion.png" in written:
        lines += ["![truth against the word named, per metric and ablation](planted/confusion.png)", ""]
    lines += [
        "*Truth against the word named, per metric and ablation* ([interactive: confusion.html]"
        "(planted/confusion.html); counts in `planted/confusion.csv`, every word with its reason in full in `planted/words.csv`)",
        "",
    ]
    for (metric, how), counts in confusion.items():
        truths = sorted({t for t, _ in counts}, key=COLUMNS.index)
        lines += [
            f"### {metric}, {how}",
            "",
            "| truth \\ named | " + " | ".join(COLUMNS) + " |",
            "|---|" + "---:|" * len(COLUMNS),
        ]
        for t in truths:
            lines.append(f"| {t} | " + " | ".join(str(counts[(t, m)]) for m in COLUMNS) + " |")
        lines.append("")
    lines += [
        "## Every confident wrong word, with its weight noise",
        "",
        "| model | metric | ablation | weight noise | pair | truth | named | agreement | reason |",
        "|---|---|---|---|---|---|---|---:|---|",
        *(wrong_rows or ["| none | | | | | | | | |"]),
        "",
    ]
    lines += [
        "## Same function on the counts by counterfactual edits (the Count01 paper's pseudo-ensemble)",
        "",
        "The edits of the first inputs (of 64) whose edits fit 2,048: every substitution before the read row and, "
        "where the lengths vary (the function bench), every insertion and deletion of a digit; the task declares "
        "the counts of 1s and 0s its semantics and the noise token '2' another feature. Two heads compute the same "
        "function on the counts where their responses to the edits of the counts (the fitted part of the noise "
        "token taken out where it can be told apart) are proportional input by input (|cos| >= 0.9 pairwise, 90% "
        "on one direction); the noise token, where an edit is made and how the heads split the counts are "
        "reported apart. Beside it, the correlation of the pushes on the task's own inputs (r), which the "
        "first-digit reader fools. The truths are checked by hand-made edits with plain hooks in "
        "`tests/analysis/mechanisms/test_edits.py` and `tests/analysis/mechanisms/test_function_bench.py` "
        "(the near-misses: `headcoop/tasks/function_bench.py`).",
        "",
        "| model | truth | named | right | min \\|cos\\| over the edits of the counts | min r on the inputs | "
        "reported apart |",
        "|---|---|---|---|---:|---:|---|",
        *same_rows,
        "",
    ]
    lines += [
        "## The words, as the code reads them",
        "",
        "Generated from `headcoop/analysis/mechanisms/definitions.py`, as on `cooperation.md`.",
        "",
        definitions(),
        "",
    ]
    lines += where_readings_part()
    lines += [f"Regenerating this page took {time.perf_counter() - start:.0f} s on {os.cpu_count()} cores.", ""]
    existed = OUT.exists()
    if existed and MARK not in OUT.read_text():
        raise SystemExit(f"{OUT} was not written by this script; not overwriting it")
    OUT.write_text("\n".join(lines))
    print(f"wrote {OUT}" + (" (overwrote the previous version, written by this script)" if existed else ""))


if __name__ == "__main__":
    main()
