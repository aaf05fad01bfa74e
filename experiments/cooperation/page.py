"""Write docs/results/cooperation.md from the tables in docs/results/cooperation/ (every number is read
from a table run_all wrote). Sections return data (`headcoop.pages.Section`), verdicts are `Claim`
records, the page is rendered from `page.md.j2`.

    python -m experiments.cooperation.page [--out FOLDER]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from headcoop.pages import Claim, Section, Table, Text, render

HERE = Path(__file__).resolve().parent
ENSEMBLE = "attention heads behave as a pseudo-ensemble, all solving the same subtask"
INTERFERE = "for any given pair of inputs they will constructively interfere on the correct answer"


def _share(n: int, d: int) -> str:
    return f"{n}/{d}"


def section_count01(t: pd.DataFrame) -> Section:
    acc = t[(t.metric == "accuracy") & (t.how == "mean")]
    trained = acc[acc.model != "shipped"]
    redundant = int((acc.verdict == "redundant").sum())
    ld = t[t.metric == "logit_diff"]
    cols = ["model", "answer_acc", "metric", "how", "verdict", "redundant", "synergistic", "independent",
            "negative_sum", "positive_sum", "max_abs_interaction"]  # fmt: skip
    agrees = redundant > len(acc) / 2
    claim = Claim("1", ENSEMBLE,
                  f"accuracy, mean ablation: {_share(redundant, len(acc))} models redundant (the shipped model and "
                  f"{_share(int((trained.verdict == 'redundant').sum()), len(trained))} trained seeds); logit difference: "
                  f"largest interaction {ld.max_abs_interaction.max():.1e} of |v(all) - v(none)|",
                  "consistent: redundant on accuracy" if agrees else "not seen on accuracy")  # fmt: skip
    text = (
        f"On accuracy with mean ablation, {_share(redundant, len(acc))} models are redundant overall"
        + (": pairs of heads substitute for each other (removing one costs little while the other is there), as "
           "a pseudo-ensemble whose members each solve the task would. " if agrees else
           ", so most models do not show the substitution between heads that a pseudo-ensemble would. ")
        + "On the logit difference every interaction is 0 up to rounding "
        f"(largest {ld.max_abs_interaction.max():.1e} of |v(all) - v(none)|): in a one-layer attention-only model the "
        "logit difference is a sum of per-head terms, so no interaction can show there; the redundancy lives in the "
        "thresholded decision (accuracy), not in the logits. Zero ablation gives the same picture "
        f"({_share(int(((t.metric == 'accuracy') & (t.how == 'zero') & (t.verdict == 'redundant')).sum()), len(acc))} "
        "redundant)."
    )
    return Section("1. Count01: a pseudo-ensemble?", (
        Text(f"**Paper** (abstract): \"{ENSEMBLE}\"."),
        Text("**Here**: the shipped model and the primary configuration (16 heads) trained over seeds with the "
             "Count01 reproduction's recipe; `hc.interactions` exact over all 65,536 coalitions on "
             "512 fresh strings (`count01_games.csv`). Sums are relative to |v(all) - v(none)|."),
        Table(t[cols], digits=4),
        Text("**Reading**: " + text),
    ), claims=(claim,))


def section_skip_pair(t: pd.DataFrame) -> Section:
    acc = t[(t.metric == "accuracy") & t.seed.notna()]
    lines = []
    rows = []
    for d_head in (5, 1):
        part = acc[acc.d_head == d_head]
        counts = part.verdict.value_counts().to_dict()
        solved = part[part.signal_acc >= 0.999]
        rows.append(dict(d_head=d_head, seeds=len(part), synergistic=counts.get("synergistic", 0),
                         redundant=counts.get("redundant", 0), independent=counts.get("independent", 0),
                         median_interaction=float((part.interaction_01 / (part.v_full - part.v_empty).abs()).median()),
                         solved_seeds=len(solved),
                         synergistic_among_solved=int((solved.verdict == "synergistic").sum())))  # fmt: skip
    summary = pd.DataFrame(rows)
    five = summary.iloc[0]
    shipped = t[t.seed.isna() & (t.metric == "accuracy")][["model", "signal_acc", "v_full", "v_empty", "interaction_01", "verdict"]]
    agrees = five.synergistic > five.seeds / 2
    claim = Claim("2", INTERFERE,
                  f"d_head 5: {_share(int(five.synergistic), int(five.seeds))} seeds synergistic on accuracy (median "
                  f"interaction {five.median_interaction:.2f} of |v(all) - v(none)|)",
                  "consistent: the two heads are synergistic" if agrees else "not seen as synergy on accuracy")  # fmt: skip
    one = summary.iloc[1]
    lines.append(
        f"With d_head 5, {_share(int(five.synergistic), int(five.seeds))} seeds are synergistic on accuracy"
        + (": each head alone answers few signal inputs and both together answer them, which is what two heads "
           "that split the signal tokens between them and interfere constructively on the answer would show."
           if agrees else ": most seeds do not show the synergy constructive interference would give.")
        + f" With d_head 1, {_share(int(one.synergistic), int(one.seeds))} seeds are synergistic. Both shipped "
        "checkpoints: " + "; ".join(f"{r.model}: {r.verdict} (interaction {r.interaction_01:.3f})"
                                     for _, r in shipped.iterrows()) + "."
    )
    return Section("2. SkipPair: superposition across two heads?", (
        Text(f"**Post**: \"{INTERFERE}\"."),
        Text("**Here**: two-head models with d_head 5 and d_head 1, trained over seeds with the SkipPair "
             "reproduction's recipe, and the shipped checkpoints; inputs are the task's signal contexts, a head "
             "outside the coalition is mean-ablated over the task's own sample (`skip_pair_games.csv`). "
             "`median_interaction` is the pair's interaction index over |v(all) - v(none)|."),
        Table(summary, digits=3),
        Table(shipped, digits=4),
        Text("**Reading**: " + " ".join(lines)),
    ), claims=(claim,))


def section_two_layer(paths: pd.DataFrame, comp: pd.DataFrame) -> Section:
    edges = paths[paths.via != "direct"].copy()
    mode = {"q": "Q", "k": "K", "v": "V"}
    edges["mode"] = edges.via.map(mode)
    joined = edges.merge(comp, on=["seed", "sender", "receiver", "mode"])
    joined["effect"] = joined.normalized.abs()
    corr = joined.groupby("via")[["effect", "score"]].corr(method="spearman").xs("effect", level=1)["score"]
    top = joined.sort_values("effect", ascending=False).groupby("seed").head(5)[
        ["seed", "sender", "receiver", "via", "normalized", "score"]]
    direct = paths[paths.via == "direct"].sort_values("normalized", key=abs, ascending=False).groupby("seed").head(3)
    direct = direct.sort_values(["seed", "normalized"], ascending=[True, False])[["seed", "sender", "normalized"]]
    return Section("3. Two layers: which layer-1 heads read which layer-0 heads?", (
        Text("**Here**: two-layer Count01 models (16 heads per layer, the primary width) trained over seeds; "
             "`hc.path_patch` of every layer-0 -> layer-1 edge through q, k and v (share of the clean-corrupt gap "
             "restored, `normalized`), beside the weights-only composition score of the same pair "
             "(`two_layer_paths.csv`, `two_layer_composition.csv`). The five strongest edges per seed:"),
        Table(top, digits=3),
        Text("Spearman correlation, over all edges, between |path-patching effect| and the composition score: "
             + ", ".join(f"via {v}: {c:.2f}" for v, c in corr.items()) + ". The three strongest direct paths "
             "(a head of either layer straight to the logits) per seed:"),
        Table(direct, digits=3),
    ))


def build(out: Path = Path(__file__).resolve().parents[2] / "docs" / "results") -> Path:
    tables = out / "cooperation"
    read = lambda name: pd.read_csv(tables / f"{name}.csv")  # noqa: E731
    sections = [section_count01(read("count01_games")), section_skip_pair(read("skip_pair_games")),
                section_two_layer(read("two_layer_paths"), read("two_layer_composition"))]  # fmt: skip
    page = render(
        "page.md.j2", HERE, title="Cooperate, compete or superpose? Shapley values and interactions of the toy models",
        source_name="source", claims=[c for s in sections for c in s.claims],
        claims_note="Each verdict is computed from the tables by the rules in `experiments/cooperation/page.py`.",
        sections=sections,
    )  # fmt: skip
    target = out / "cooperation.md"
    target.write_text(page, encoding="utf-8")
    return target


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[2] / "docs" / "results")
    print(build(parser.parse_args().out))
