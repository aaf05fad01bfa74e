"""The Tracr section of docs/results/circuits.md (section 7, a sanity check) from the tables
experiments/tracr/run_all.py wrote. The whole page is `experiments.groundtruth.page`'s, which imports this
section (one direction: this module imports no other page):

    python -m experiments.groundtruth.page [--out FOLDER]
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from experiments.shared import figure_lines
from headcoop.display.pages import Table

DEFAULT_OUT = Path(__file__).resolve().parents[2] / "docs" / "results"


def _faithfulness_text(edges: pd.DataFrame) -> str:
    """Where the methods' recovered circuits of one size differ in faithfulness, say so with the numbers."""
    parts = []
    for program, rows in edges.groupby("program", sort=False):
        spread = rows.recovered_faithfulness.max() - rows.recovered_faithfulness.min()
        if spread > 0.5:
            shown = ", ".join(
                f"{r.method} {r.recovered_faithfulness:.3f} ({r.recovered_true} true edges)" for _, r in rows.iterrows()
            )
            parts.append(f"{program}: {shown}")
    if not parts:
        return "Every method's recovered circuit is about as faithful as the others' on every program."
    return (
        "Faithfulness is not additive over edges: circuits of one size picked by different scores can differ "
        "sharply although the scores rank the true edges alike. " + "; ".join(parts) + ". An edge's score "
        "patches it alone, every other edge at the corrupt run's values; an edge that matters only together "
        "with others scores low alone."
    )


def _reference_section(folder: Path) -> list:
    """Section 5: auto-circuit's reference circuits, when the bench had auto-circuit installed."""
    head = ["## 5. auto-circuit's reference circuits", ""]
    path = folder / "auto_circuit.csv"
    if not path.exists():
        return head + [
            "Not scored: auto-circuit was not installed when `run_all` ran (`pip install --no-deps "
            "auto-circuit==1.0.1`; `experiments/tracr/autocircuit.py` reads its circuits from the installed "
            "package).",
            "",
        ]
    table = pd.read_csv(path)
    return head + [
        f"Read at bench time from the installed auto-circuit {table.auto_circuit.iloc[0]} "
        "(`experiments/tracr/autocircuit.py` parses its `official_circuits` source; nothing is copied here). Its "
        "*official* / *true* circuits are meant for resample ablation, its ACDC circuits for zero ablation; each is "
        "run under its own ablation (`faithfulness`, beside our truth's under the same ablation), and each method's "
        "edge scores are ranked against it (ROC AUC). `edges`: its edges in `hc.edges`' graph, where auto-circuit's "
        "one *Resid Start* writer becomes both of ours (`embed` and `pos_embed`), so an edge from Resid Start counts "
        "twice; `in_our_truth`: how many of those edges our truth holds (the rest read an embedding or a "
        "component our truth leaves out).",
        "",
        Table(table.drop(columns=["auto_circuit"])).markdown(),
        "",
    ]


def _wide(frame: pd.DataFrame, value: str, order: tuple) -> pd.DataFrame:
    wide = frame.pivot_table(index="program", columns="method", values=value, sort=False)
    return wide[[c for c in order if c in wide.columns]].reset_index().rename_axis(None, axis=1)


def sanity_lines(folder: Path) -> list[str]:
    """Section 6 of circuits.md: the Tracr programs, kept as the sanity check they are (issue 50: a data-free
    score passes this bench, so its AUCs and faithfulness cannot rank methods)."""
    edges, nodes = pd.read_csv(folder / "edges.csv"), pd.read_csv(folder / "nodes.csv")
    programs = pd.read_csv(folder / "programs.csv")
    timing = json.loads((folder / "timing.json").read_text())
    methods = ("exact", "eap", "eap-ig", "weight product", "random")
    wp = edges[edges.method == "weight product"]
    wn = nodes[nodes.method == "weight norm"].dropna(subset=["auc_nodes"])
    runs = edges[edges.method.isin(("exact", "eap", "eap-ig"))]
    return [
        "## 6. Tracr's compiled programs: a sanity check, not a bench",
        "",
        "**Withdrawn.** This page used to score the methods on Tracr-compiled programs alone and reported node AUC "
        "1.000 on the shown nodes and faithfulness 1.000 for the true circuits. Those numbers say nothing about the "
        f"methods: the weight product, reading no input, scores edge AUC {wp.auc_edges.min():.3f}-{wp.auc_edges.max():.3f} "
        f"here and the weight norm node AUC {wn.auc_nodes.min():.3f}-{wn.auc_nodes.max():.3f}, because every false "
        "edge has a zero weight product and every component outside the truth is all-zero padding; the true "
        "circuit's faithfulness of 1.000 follows by construction. What the programs still check: the code runs on "
        "hand-built weights, and every method gives an empty component exactly 0 (`empty_max`).",
        "",
        f"Generated by `python -m experiments.tracr.run_all` ({timing['total_s']:.0f} s on {timing['cores']} cores, "
        f"{timing['inputs']} clean and corrupt inputs per program, one length) from `experiments/tracr/checkpoints/` "
        "(compiled by `python -m experiments.tracr.build`, the `[bench]` extra: tracr-pypi 1.0.0 and jax, converted "
        "to HookedTransformers and checked against Tracr's own outputs; the truth read from the compiled model's "
        "labelled residual space).",
        "",
        Table(programs).markdown(),
        "",
        "Edge AUC against all true edges, beside the data-free scores:",
        "",
        Table(_wide(edges, "auc_edges", methods)).markdown(),
        "",
        "Against the true edges these same-length inputs show:",
        "",
        Table(_wide(edges, "auc_shown_edges", methods)).markdown(),
        "",
        "Node AUC (NaN: nothing to rank):",
        "",
        Table(
            _wide(
                nodes,
                "auc_nodes",
                ("exact edges", "eap", "eap-ig", "exact node patching", "atp", "atp*", "weight norm", "random"),
            )
        ).markdown(),  # fmt: skip
        "",
        "Faithfulness of each method's top edges (as many as the true edges; corrupt ablation) and MIB's CPR / CMD:",
        "",
        Table(
            runs[
                [
                    "program",
                    "method",
                    "true_edges",
                    "recovered_true",
                    "recovered_faithfulness",
                    "cpr",
                    "cmd",
                    "random_cpr",
                ]
            ]
        ).markdown(),
        "",
        _faithfulness_text(runs),
        "",
        *figure_lines(
            folder, "roc_edges", "Each method's ROC curve against the true edges, per program (`curves.csv`)"
        ),
        *figure_lines(
            folder,
            "faithfulness_curves",
            "Faithfulness of each method's top-scored edges against the share "
            "of edges kept, with three random circuits' mean (`curves.csv`)",
        ),
        *[line.replace("## 5. ", "### ") for line in _reference_section(folder)],
    ]
