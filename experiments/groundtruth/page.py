"""Write docs/results/circuits.md: the dense ground-truth bench first (tables from `experiments.groundtruth.run_all`),
then the Tracr programs as the sanity check they are (tables from `experiments.tracr.run_all`).

    python -m experiments.groundtruth.page [--out FOLDER]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from experiments.shared import figure_lines
from headcoop.pages import Table

DEFAULT_OUT = Path(__file__).resolve().parents[2] / "docs" / "results"
METHODS = ("exact", "eap", "eap-ig")
BASELINES = ("weight product", "random")


def _wide(frame: pd.DataFrame, index: str, value: str, columns: tuple) -> pd.DataFrame:
    wide = frame.pivot_table(index=index, columns="method", values=value, sort=False)
    return wide[[c for c in columns if c in wide.columns]].reset_index().rename_axis(None, axis=1)


def draw_bands(bands: pd.DataFrame, out: Path) -> list[str]:
    """dense_stability: per model, each method's faithfulness curve (median over readings) with its min-max band."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from headcoop.plot import TEMPLATE, save_figure

    models = list(dict.fromkeys(bands.model))
    colours = dict(zip(METHODS, ("31,119,180", "214,39,40", "44,160,44")))
    fig = make_subplots(rows=2, cols=(len(models) + 1) // 2, subplot_titles=models, shared_yaxes=True)
    for j, model in enumerate(models):
        row, col = j // ((len(models) + 1) // 2) + 1, j % ((len(models) + 1) // 2) + 1
        for method in dict.fromkeys(bands[bands.model == model].method):
            b = bands[(bands.model == model) & (bands.method == method)]
            c = colours.get(method, "100,100,100")
            fig.add_trace(go.Scatter(x=list(b.fraction) + list(b.fraction[::-1]), y=list(b["max"]) + list(b["min"][::-1]),
                                     fill="toself", fillcolor=f"rgba({c},0.15)", line=dict(width=0), showlegend=False,
                                     legendgroup=method, hoverinfo="skip"), row, col)  # fmt: skip
            fig.add_trace(go.Scatter(x=b.fraction, y=b["median"], mode="lines", name=method, legendgroup=method,
                                     line=dict(color=f"rgb({c})"), showlegend=j == 0), row, col)  # fmt: skip
        fig.update_xaxes(title_text="share of edges kept", row=row, col=col)
    fig.update_layout(template=TEMPLATE, height=640, title="Faithfulness of each method's top edges: median over the "
                      "readings (4 ablations x 3 input draws) with its min-max band")  # fmt: skip
    return save_figure(fig, out, "dense_stability", width=1500, height=640)


# Training runs beyond the committed recipe (issue 50's leads), on sort_unique at 1,500 steps like the committed
# model, seed 0, each an option of experiments/groundtruth/siit.py; the checks are its own (2,048 pairs).
TRIED = [
    ("committed: 2 aligned nodes interchanged per batch, interchange weight 1, LayerNorm, lr 2e-3", "0.347 / 0.858 / 0.252", "1.000"),
    ("every aligned node interchanged every batch (`--iit-nodes 0`)", "0.270 / 0.866 / 0.253", "0.994"),
    ("every node, interchange loss weighted 4x (`--iit-nodes 0 --iit-weight 4`)", "0.336 / 0.825 / 0.259", "0.974"),
    ("every node, no norm, lr 1e-3 (`--iit-nodes 0 --norm none --lr 1e-3`)", "diverged: task loss 139 at step 1,000 (stopped)", "-"),
]


def diagnosis_lines(diagnosis: pd.DataFrame | None) -> list[str]:
    """Section 1's diagnosis: where each SIIT model's interchange accuracy falls short, and what more training tried."""
    if diagnosis is None:
        return []
    tried = pd.DataFrame(TRIED, columns=["sort_unique run", "interchange accuracy L0H0 / L1H0 / MLP0", "task accuracy"])
    return [
        "**Where the interchange accuracy falls short** (`python -m experiments.groundtruth.diagnose`, the same "
        "2,048 pairs): per aligned node, the accuracy on sources of the base's own length and of another, on the "
        "pairs where the interchange changes the program's output and where it does not (`changed_share`: the share "
        "that changes), and the share whose program output is decided (its top logit ahead of the next by a tenth). "
        "An accuracy near 1 where the output does not change and near 0 where it does says the node does not compute "
        "the program's value; an accuracy well below 1 where the output does not change says the dense model reads "
        "the node for something the program does not.",
        "",
        Table(diagnosis).markdown(),
        "",
        "Read this way: the overall interchange accuracy of shuffle_dyck (0.95 and more at every node) comes from "
        "the 97% of pairs where the interchange leaves the program's output as it is; where it changes it, its nodes "
        "score 0.00-0.60, so its truth is not implemented either, and section 1's 0.9 bar on the overall accuracy "
        "overstated it. Reverse's L0H0 scores 0.33 on sources of the base's own length, where the program's output "
        "changes on 11% of pairs only: the dense model carries tokens through L0H0. Sort_unique's L0H0 and MLP0 "
        "score 0.17 and 0.03 where the output changes: the dense model does not compute the rank there. Only hist's truth holds on "
        "both kinds of pair. More training did not change this on sort_unique (each run 1,500 steps, seed 0):",
        "",
        Table(tried).markdown(),
        "",
    ]


def dense_lines(folder: Path) -> list[str]:
    checks = pd.read_csv(folder / "dense_checks.csv")
    edges = pd.read_csv(folder / "dense_edges.csv")
    nodes = pd.read_csv(folder / "dense_nodes.csv")
    unshown = pd.read_csv(folder / "dense_unshown.csv")
    stability = pd.read_csv(folder / "dense_stability.csv")
    timing = json.loads((folder / "dense_timing.json").read_text())
    siit = checks[checks.kind == "siit"]
    designed = edges[edges.contrast == "designed"]
    exact = designed[designed.method == "exact"].set_index("model")
    wp = designed[designed.method == "weight product"].set_index("model")
    met = [m for m in exact.index if wp.auc_edges[m] < 0.7 and exact.auc_shown_edges[m] > 0.9]
    missed = [m for m in exact.index if m not in met]
    short = "; ".join(f"{m}: weight product {wp.auc_edges[m]:.3f}, exact {exact.auc_shown_edges[m]:.3f}" for m in missed)
    counts = designed.drop_duplicates("model").set_index("model")
    same = edges[edges.contrast == "same length"].drop_duplicates("model").set_index("model")
    constant = unshown[(unshown.contrast == "designed") & unshown.why.str.startswith("it carries only")]
    blamed = unshown[(unshown.contrast == "designed") & ~unshown.why.str.startswith("it carries only")]
    shown_line = ", ".join(f"{m} {same.shown_true_edges[m]} -> {counts.shown_true_edges[m]} of {counts.true_edges[m]}"
                           for m in counts.index)  # fmt: skip
    failed = checks[checks.get("not_implemented_at", pd.Series("-", index=checks.index)).fillna("-") != "-"]
    failed_line = ("" if failed.empty else " The truth itself fails its check on " + "; ".join(
        f"{r.model} ({r.not_implemented_at})" for r in failed.itertuples()) + " (section 1: interchange accuracy below "
        "0.9 at a node, or for the induction model the literature's scores below 0.5): there the truth is the "
        "program's or the literature's, not the model's, and a method's AUC on it does not judge the method.")  # fmt: skip
    diagnosis = pd.read_csv(folder / "dense_diagnosis.csv") if (folder / "dense_diagnosis.csv").exists() else None
    strict_line = ""
    if diagnosis is not None:
        worst = diagnosis.groupby("program", sort=False).where_output_changes.min()
        holds = [p for p in worst.index if worst[p] >= 0.9]
        strict_line = (" Read strictly, on the interchanges that change the program's output (section 1's diagnosis), "
                       f"the truth holds on {len(holds)} of {len(worst)} SIIT models ({', '.join(holds) or 'none'}); the "
                       "lowest accuracy there: " + ", ".join(f"{p} {worst[p]:.3f}" for p in worst.index) + ".")  # fmt: skip
    gaps = designed.groupby("model", sort=False)[["metric_clean", "metric_corrupt"]].first()
    rel = ((gaps.metric_clean - gaps.metric_corrupt).abs() / gaps.metric_clean.abs()).dropna()
    small = rel[rel < 0.1]
    gap_line = ("Faithfulness divides by the gap between the clean and the corrupt metric (seed 0 of the designed "
                "contrast: " + ", ".join(f"{m} {gaps.metric_clean[m]:.3g} vs {gaps.metric_corrupt[m]:.3g}" for m in rel.index)
                + "). " + ("Where that gap is under 10% of the clean metric (" + ", ".join(small.index) + ") the "
                "corrupt inputs mostly ask for the same answers, and a faithfulness near 0 or above 1 is read on a "
                "small difference: the contrast, not the circuit, is what fails there." if len(small) else ""))  # fmt: skip
    lines = [
        "# Circuits scored against ground truth",
        "",
        f"**The answer first.** On {len(checks)} dense models trained here whose truth is known ({len(siit)} trained "
        f"with SIIT to implement a Tracr program at known heads and MLPs, {len(checks) - len(siit)} induction model), "
        "the data-free weight-product "
        f"score reaches edge AUC {wp.auc_edges.min():.3f}-{wp.auc_edges.max():.3f} (random: about 0.5), where on "
        "Tracr's compiled models it scored 1.000 on all five programs. Exact edge patching scores "
        f"{exact.auc_shown_edges.min():.3f}-{exact.auc_shown_edges.max():.3f} against the true edges the inputs can "
        f"show and {exact.auc_edges.min():.3f}-{exact.auc_edges.max():.3f} against all of them. The bench's bar (issue 50: "
        f"weight product below 0.7 while exact patching is above 0.9 on the shown edges) is met on {len(met)} of "
        f"{len(exact)} models" + (f"; not on {short}." if missed else ".") + failed_line + strict_line + " A method's circuit moves with the "
        "reading: section 5 gives each circuit's faithfulness over 4 ablations x 3 input draws, not one number.",
        "",
        f"Generated by `python -m experiments.groundtruth.run_all` ({timing['total_s']:.0f} s on {timing['cores']} "
        f"cores, {timing['inputs']} clean and corrupt inputs per model, {timing['draws']} input draws per reading) "
        "and `python -m experiments.tracr.run_all` (section 6) from committed checkpoints; tables in "
        "`docs/results/circuits/` (`dense_*.csv` for the dense bench). Training: `python -m "
        "experiments.groundtruth.siit` and `python -m experiments.groundtruth.induction` (fixed seeds, no jax: the "
        "high-level models are the committed Tracr checkpoints).",
        "",
        "## 1. The dense models and how their truth is checked",
        "",
        "**SIIT** (Strict Interchange Intervention Training, Gupta et al. 2024, the method behind InterpBench and "
        "MIB's circuit-localization track): the high-level model is the compiled Tracr program; each of its "
        "non-empty heads and MLPs is aligned with the head or MLP at the same place of a dense model (d_model 64, "
        "d_head 16, LayerNorm, random initialisation). Each batch trains three losses: the task loss (outputs match "
        "the program's), the interchange loss (one aligned node's output taken from a source input in both models; "
        "outputs match the program's under that intervention), and the strictness loss (a random half of the "
        "non-aligned nodes, every head and MLP the program leaves empty, taken from the source; outputs still match "
        "the program's on the base). We add a fourth, the edge strictness loss: every edge the program lacks "
        "carries the writer's output on the source input (the true circuit alone; `hc.faithfulness`'s ablated run, "
        "with autograd), and the outputs still match the program's. Node-level SIIT alone left the false edges "
        "between aligned nodes free: our first reverse model routed its tokens through L0H0 -> L3H0 (v) beside the "
        "true embed -> L3H0 (v), and its true circuit recovered 0.004 of the metric under corrupt ablation (exact "
        "patching's AUC on the shown edges 0.72); resampling a random half of the false edges let it read them "
        "redundantly (its L0H0 interchange accuracy fell to 0.33). Half the interchange sources have their own "
        "length, so the node computing reverse's length is trained too. Targets are the program's outputs as soft labels "
        "(softmax of 5 x its logits), which pin the logits' margins and not only their argmax. Inputs are padded to the full length and half of them are shorter (the "
        "program masks pads as Tracr does; the dense model has no mask and learns to ignore them), so operations of "
        "the length are trained and can be shown. The truth: the program's true edges and nodes at the aligned "
        "places. **Induction**: a two-layer attention-only model (2 heads per layer) trained on repeated random "
        "tokens; its truth is read off by the literature's tests: the layer-0 head with the largest "
        "previous-token score, the layer-1 head with the largest prefix-matching score, whose OV circuit is "
        "checked to copy.",
        "",
        Table(checks).markdown(),
        "",
        f"`check`: for SIIT, the lowest interchange accuracy over the aligned nodes (2,048 held-out base/source "
        "pairs, half of them of one length, read where both hold tokens; `not_implemented_at`: the nodes below "
        "0.9) and the accuracy with every non-aligned node resampled at once (the strictness the "
        "truth rests on: near 1 means the non-aligned nodes do not matter), with the mean |change| of the output "
        f"beside the mean |output|. Every head and MLP of the dense models has non-zero weights. Training took "
        f"{siit.train_s.sum():.0f} s for the five SIIT models on one core each.",
        "",
        *diagnosis_lines(diagnosis),
        "## 2. Edges: AUC against the truth, beside scores that read no input",
        "",
        "`hc.edges` scores every edge by exact edge patching, EAP or EAP-IG; `auc_edges` is the area under the ROC "
        "curve of |score| against all true edges, `auc_shown_edges` against the true edges these inputs can show "
        "(section 3) with the others left out. Beside them, the data-free baselines (`experiments/groundtruth/"
        "baselines.py`): the weight product of each edge (|W_writer W_reader|, the reader's norm weight folded in) "
        "and a random score (mean of 200 seeded draws). Contrast `designed`: half the pairs share a random length, "
        "half have independent lengths (section 3).",
        "",
        "Against all true edges (`designed` contrast):",
        "",
        Table(_wide(designed, "model", "auc_edges", METHODS + BASELINES)).markdown(),
        "",
        "Against the shown true edges (`designed` contrast):",
        "",
        Table(_wide(designed, "model", "auc_shown_edges", METHODS + BASELINES)).markdown(),
        "",
        "The same at one length (clean and corrupt inputs both at the full length, the Tracr bench's contrast), "
        "against the shown true edges:",
        "",
        Table(_wide(edges[edges.contrast == "same length"], "model", "auc_shown_edges", METHODS + BASELINES)).markdown(),
        "",
        "Every row, with the counts, the random score's 5-95% range and each method's time (`dense_edges.csv`):",
        "",
        Table(edges.drop(columns=["random_shown_range"], errors="ignore")).markdown(),
        "",
        "## 3. Which true edges the inputs show",
        "",
        "A true edge is shown when its writer's output differs between the clean and corrupt input in a direction "
        "its reader reads, measured in the truth's own model (the compiled program, pads masked; for the "
        "induction model, any change of the writer's output). Shown true edges, one length -> designed contrast: "
        f"{shown_line}. `shown_by_zero` counts the true edges zero ablation moves (the writer's clean output is "
        "non-zero in a direction its reader reads).",
        "",
        f"The {len(constant)} true edges the designed contrast leaves unshown carry only directions that every "
        "input of one shape writes alike: Tracr's constant `one` direction, the BOS marker at position 0, or a "
        "position (`indices:*`, the positional embedding). A patch needs clean and corrupt inputs of one shape, so "
        "no contrast can move them; zero ablation does (section 5 runs every circuit under it too). "
        + (f"{len(blamed)} more are unshown for no such reason: {', '.join(f'{r.model} {r.writer}->{r.reader} ({r.via})' for r in blamed.itertuples())}."
           if len(blamed) else "None is unshown for any other reason."),
        "",
        Table(unshown[unshown.contrast == "designed"].drop(columns=["contrast"])).markdown(),
        "",
        "## 4. Nodes: AUC against the true nodes",
        "",
        "Node scores: the sum of |edge score| over the edges a node writes (exact, EAP, EAP-IG), exact node patching "
        "(`hc.patch`), AtP and AtP* (`hc.attribute`), and the data-free weight norm (a head's |W_V W_O|, an MLP's "
        "|W_in| |W_out|) and random score. NaN: every component is true (hist has no non-aligned node).",
        "",
        Table(_wide(nodes, "model", "auc_nodes", ("exact edges", "eap", "eap-ig", "exact node patching", "atp", "atp*",
                                                  "weight norm", "random"))).markdown(),  # fmt: skip
        "",
        "## 5. Faithfulness and stability over readings",
        "",
        "A circuit's faithfulness depends on what an edge outside the circuit carries. Each reading is one ablation "
        "(corrupt, mean, zero, resample) and one input draw (3 draws of the designed contrast, seeds 0-2); "
        "`hc.circuit_stability` recomputes a method's edge scores under the reading (`hc.edges(direction=\"noise\", "
        "how=...)`), takes the top k (k = the true edges) and runs `hc.faithfulness` under the same reading. "
        "`circuit = true`: the true circuit over the same readings. Ranges per ablation are over the draws; "
        "`always_selected`: edges in every reading's circuit (`always_true` of them true); `true_mean_share`: the "
        "mean share of readings selecting a true edge.",
        "",
        Table(stability).markdown(),
        "",
        gap_line,
        "",
        *figure_lines(folder, "dense_stability", "Faithfulness of each method's top edges over the readings: median and "
                 "min-max band (`dense_bands.csv`)"),
    ]
    return lines


def build(out: Path = DEFAULT_OUT, draw: bool = True) -> Path:
    """circuits.md in `out` from the tables in `out/circuits` (draw=False: keep the figures already there)."""
    from experiments.tracr import page as tracr_page

    folder = out / "circuits"
    lines = []
    if (folder / "dense_checks.csv").exists():
        if draw:
            draw_bands(pd.read_csv(folder / "dense_bands.csv"), folder)
        lines += dense_lines(folder)
    if (folder / "edges.csv").exists():  # the Tracr tables (`experiments.tracr.run_all`)
        lines += tracr_page.sanity_lines(folder)
    lines += [
        "## 7. What these numbers do not say, and the definitions left open",
        "",
        "- The truth is trained, not built: a node implements its operation as far as its interchange accuracy "
        "says (section 1), and a false edge carries nothing only as far as the edge strictness loss went down. "
        "Where a dense model still routes part of a path through a false edge, exact patching scores that edge "
        "above zero and the AUC falls for the model, not the method (`strongest_false` in `dense_edges.csv` names "
        "the strongest false edges).",
        "- Which edges are shown is measured in the truth's own model (the compiled program); the dense model implements it "
        "only as far as its interchange accuracy (section 1) says.",
        "- The weight product reads weights alone and so cannot see which paths the task uses; near 0.5 it says the "
        "bench does not give the truth away, not that weights are useless.",
        "- Stability counts readings of one method; it is not a confidence interval (the readings are chosen, not "
        "sampled), and its draws are of the designed contrast only.",
        "",
    ]
    target = out / "circuits.md"
    target.write_text("\n".join(lines), encoding="utf-8")
    return target


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    print(build(parser.parse_args().out))
