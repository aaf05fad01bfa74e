"""Score hc.edges' methods and the node attributions against the Tracr programs' ground truth, and the
faithfulness of the true and of the recovered circuits: docs/results/circuits.md and its tables.

    python -m experiments.tracr.run_all [--out FOLDER] [--n 64]

Reads the committed checkpoints (experiments/tracr/checkpoints, written by `build.py`); needs no jax.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "docs" / "results"
EDGE_METHODS = ("exact", "eap", "eap-ig")
NODE_METHODS = ("exact edges", "eap", "eap-ig", "exact node patching", "atp", "atp*", "weight norm")


def auc(truth: list[bool], score) -> float:
    """ROC AUC of |score| against the truth (scikit-learn); NaN where one class is empty."""
    from sklearn.metrics import roc_auc_score

    truth = np.asarray(truth, bool)
    if truth.all() or not truth.any():
        return float("nan")
    return float(roc_auc_score(truth, np.abs(np.asarray(score, float))))


def exercised(model, info: dict, clean, corrupt) -> tuple[set, set]:
    """The true edges and nodes these inputs can show: an edge whose writer's output differs between clean and
    corrupt in a direction its reader reads; a component node (the embeddings left out, as the true nodes
    are counted) whose output differs at all. The rest cannot move any
    patch of these inputs (a length computed from inputs of one length, the positional embedding)."""
    from headcoop.analysis.edges.exact import writer_outputs
    from headcoop.analysis.edges.graph import graph, writer_name

    truth, labels = info["truth"], info["truth"]["labels"]
    writers, _, _ = graph(model)
    with torch.no_grad():
        _, c = model.run_with_cache(clean)
        _, k = model.run_with_cache(corrupt)
    delta = {writer_name(w): (a - b).abs().amax((0, 1)) for (w, a), b in
             zip(writer_outputs(model, c, writers).items(), writer_outputs(model, k, writers).values())}  # fmt: skip
    edges = set()
    for w, r, via in truth["edges"]:
        dims = [labels.index(x) for x in set(truth["writes"][w]) & set(truth["reads"][f"{r}.{via}"])]
        if float(delta[w][dims].max()) > 1e-6:
            edges.add((w, r, via))
    nodes = {n for n in truth["nodes"] if n not in ("embed", "pos_embed") and float(delta[n].max()) > 1e-6}
    return edges, nodes


def node_scores(model, frame: pd.DataFrame) -> pd.Series:
    """A node's score from edge scores: the sum of |score| over the edges it writes."""
    s = frame.assign(a=frame.score.abs()).groupby("writer").a.sum()
    return s.drop([n for n in ("embed", "pos_embed") if n in s.index])


def patch_nodes(model, clean, corrupt, metric, how: str) -> pd.Series:
    """|change of the metric| per head and MLP: exact node patching (hc.patch) or AtP / AtP* (hc.attribute)."""
    import headcoop as hc

    out = {}
    for component in ("z", "mlp_out"):
        if how == "exact node patching":
            r = hc.patch(model, clean=clean, corrupt=corrupt, metric=metric, component=component, positions="all")
            values, base = r.values, r.corrupt_value
        else:
            r = hc.attribute(model, clean=clean, corrupt=corrupt, metric=metric, component=component,
                             positions="all", estimator=how)  # fmt: skip
            values, base = r.values, r.target_value
        values = (values - base).abs()
        for lay in range(model.cfg.n_layers):
            if component == "z":
                for h in range(model.cfg.n_heads):
                    out[f"L{lay}H{h}"] = float(values[lay, h])
            else:
                out[f"MLP{lay}"] = float(values[lay])
    return pd.Series(out)


def baseline_rows(model, base: dict, true_edges: set, shown_edges: set) -> list[dict]:
    """The data-free scores' rows (`experiments.groundtruth.baselines`): the weight product's edge AUC and a
    random score's (mean over 200 seeded draws), against all true edges and the shown ones."""
    from experiments.groundtruth.baselines import random_auc, weight_product

    wp = weight_product(model)
    keys = list(wp)
    is_true = np.array([k in true_edges for k in keys])
    keep = np.array([k in shown_edges or k not in true_edges for k in keys])
    s = np.array([wp[k] for k in keys])
    return [
        dict(base, method="weight product", auc_edges=auc(is_true, s), auc_shown_edges=auc(is_true[keep], s[keep])),
        dict(base, method="random", auc_edges=random_auc(is_true)[0], auc_shown_edges=random_auc(is_true[keep])[0]),
    ]


def run_program(name: str, n: int) -> tuple[list[dict], list[dict], dict, list[dict]]:
    from sklearn.metrics import roc_curve

    import headcoop as hc
    from experiments.tracr.common import inputs, load, metric_for

    model, info = load(name)
    truth = info["truth"]
    clean, corrupt = inputs(info, n=n)
    metric = metric_for(model, info, clean)
    shown_edges, shown_nodes = exercised(model, info, clean, corrupt)
    true_edges = {tuple(e) for e in truth["edges"]}
    true_nodes = set(truth["nodes"]) - {"embed", "pos_embed"}  # the components; the embeddings are always read
    rows, nodes_rows, curves = [], [], []
    node_table = {}
    results = {}
    for method in EDGE_METHODS:
        started = time.perf_counter()
        result = hc.edges(model, clean=clean, corrupt=corrupt, metric=metric, estimator=method)
        seconds = time.perf_counter() - started
        frame = result.to_dataframe()
        key = list(zip(frame.writer, frame.reader, frame.via))
        is_true = [e in true_edges for e in key]
        keep = [e in shown_edges or e not in true_edges for e in key]  # drop true edges these inputs cannot show
        recovered = hc.circuit(result, k=len(true_edges))
        faith = hc.faithfulness(model, recovered, clean=clean, corrupt=corrupt, metric=metric).frame.faithfulness.iloc[
            0
        ]
        curve = hc.faithfulness(model, result, clean=clean, corrupt=corrupt, metric=metric, random=3)
        rows.append(dict(program=name, method=method, edges=len(frame), true_edges=len(true_edges),
                         shown_true_edges=len(shown_edges), auc_edges=auc(is_true, frame.score),
                         auc_shown_edges=auc(np.asarray(is_true)[keep], frame.score[keep]),
                         recovered_faithfulness=float(faith), recovered_true=len(recovered.edges & true_edges),
                         cpr=curve.cpr, cmd=curve.cmd, random_cpr=curve.random_cpr, seconds=seconds))  # fmt: skip
        if 0 < sum(is_true) < len(is_true):
            fpr, tpr, _ = roc_curve(is_true, np.abs(frame.score.to_numpy(float)))
            curves += [dict(program=name, method=method, kind="roc", x=float(a), y=float(b)) for a, b in zip(fpr, tpr)]
        curves += [dict(program=name, method=method, kind="faithfulness", x=float(r.fraction), y=float(r.faithfulness),
                        random=float(r.random_mean)) for r in curve.frame.itertuples()]  # fmt: skip
        node_table["exact edges" if method == "exact" else method] = node_scores(model, frame)
        results[method] = result
    rows += baseline_rows(model, dict(program=name, edges=len(key), true_edges=len(true_edges),
                                      shown_true_edges=len(shown_edges)), true_edges, shown_edges)  # fmt: skip
    for how in ("exact node patching", "atp", "atp*"):
        node_table[how] = patch_nodes(model, clean, corrupt, metric, how)
    from experiments.groundtruth.baselines import weight_norm

    node_table["weight norm"] = pd.Series(weight_norm(model))
    components = [f"L{lay}H{h}" for lay in range(model.cfg.n_layers) for h in range(model.cfg.n_heads)]
    components += [f"MLP{lay}" for lay in range(model.cfg.n_layers)]
    for how, scores in node_table.items():
        scores = scores.reindex(components).fillna(0.0)
        keep = [c in shown_nodes or c not in true_nodes for c in components]
        nodes_rows.append(dict(program=name, method=how, nodes=len(components), true_nodes=len(true_nodes),
                               shown_true_nodes=len(shown_nodes), auc_nodes=auc([c in true_nodes for c in components], scores),
                               auc_shown_nodes=auc([c in true_nodes for c, k in zip(components, keep) if k],
                                                   scores[keep]),
                               empty_max=float(scores.reindex(truth["empty"]).abs().max()) if truth["empty"] else 0.0))  # fmt: skip
    from experiments.groundtruth.baselines import random_auc

    keep = [c in shown_nodes or c not in true_nodes for c in components]
    nodes_rows.append(dict(program=name, method="random", nodes=len(components), true_nodes=len(true_nodes),
                           shown_true_nodes=len(shown_nodes), auc_nodes=random_auc([c in true_nodes for c in components])[0],
                           auc_shown_nodes=random_auc([c in true_nodes for c, k in zip(components, keep) if k])[0],
                           empty_max=float("nan")))  # fmt: skip
    true_faith = hc.faithfulness(model, hc.circuit(sorted(true_edges)), clean=clean, corrupt=corrupt, metric=metric)
    summary = dict(program=name, what=info["what"], layers=model.cfg.n_layers, heads=model.cfg.n_heads,
                   d_model=model.cfg.d_model, numerical=info["numerical"], inputs=n,
                   empty=len(truth["empty"]), true_nodes=len(true_nodes), true_edges=len(true_edges),
                   true_circuit_faithfulness=float(true_faith.frame.faithfulness.iloc[0]),
                   tracr_agreement=f"{model.checkpoint_meta['metrics']['agree']}/{model.checkpoint_meta['metrics']['inputs']}")  # fmt: skip
    return rows, nodes_rows, summary, curves


def draw_curves(curves: pd.DataFrame, out: Path) -> list[str]:
    """roc_edges (each method's ROC curve of |edge score| against the true edges, per program) and
    faithfulness_curves (faithfulness of the top-k edges against the share of edges kept, with the random
    circuits' mean), HTML and PNG where kaleido can export."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from headcoop.display.plot import TEMPLATE, save_figure

    written = []
    programs = list(dict.fromkeys(curves.program))
    colours = dict(zip(EDGE_METHODS, ("#1f77b4", "#d62728", "#2ca02c")))
    for kind, name, xt, yt in (("roc", "roc_edges", "false positive rate", "true positive rate"),
                               ("faithfulness", "faithfulness_curves", "share of edges kept", "faithfulness")):  # fmt: skip
        fig = make_subplots(rows=1, cols=len(programs), subplot_titles=programs, shared_yaxes=True)
        for j, program in enumerate(programs):
            part = curves[(curves.program == program) & (curves.kind == kind)]
            for method in EDGE_METHODS:
                m = part[part.method == method]
                fig.add_trace(go.Scatter(x=m.x, y=m.y, mode="lines", name=method, legendgroup=method,
                                         line=dict(color=colours[method], shape="hv" if kind == "roc" else "linear"),
                                         showlegend=j == 0), 1, j + 1)  # fmt: skip
            if kind == "faithfulness" and len(part):
                m = part[part.method == EDGE_METHODS[0]]
                fig.add_trace(go.Scatter(x=m.x, y=m.random, mode="lines", name="random circuits (mean)",
                                         line=dict(color="grey", dash="dot"), legendgroup="random", showlegend=j == 0), 1, j + 1)  # fmt: skip
            fig.update_xaxes(title_text=xt, row=1, col=j + 1)
        fig.update_yaxes(title_text=yt, row=1, col=1)
        title = (
            "ROC of |edge score| against the true edges (Tracr programs)"
            if kind == "roc"
            else "Faithfulness of the top-scored edges against the share kept (Tracr programs)"
        )
        fig.update_layout(template=TEMPLATE, title=title, height=380)
        written += save_figure(fig, out, name, width=1500, height=380)
    return written


def score_reference_circuits(n: int) -> pd.DataFrame | None:
    """auto-circuit's reference circuits (read from the installed package at bench time) scored like the truth:
    each method's edge ROC AUC against them, how many of their edges our truth holds, and their faithfulness
    under the ablation they are meant for (resample for the official circuits, zero for ACDC's)."""
    import headcoop as hc
    from experiments.tracr import autocircuit
    from experiments.tracr.common import inputs, load, metric_for

    circuits = autocircuit.reference_circuits()
    if circuits is None:
        return None
    rows = []
    for program, named in circuits.items():
        model, info = load(program)
        clean, corrupt = inputs(info, n=n)
        metric = metric_for(model, info, clean)
        truth = {tuple(e) for e in info["truth"]["edges"]}
        scores = {
            m: hc.edges(model, clean=clean, corrupt=corrupt, metric=metric, estimator=m).to_dataframe()
            for m in EDGE_METHODS
        }
        for function, edges in named.items():
            ref = set(edges)
            how = "zero" if "acdc" in function else "resample"
            faith = hc.faithfulness(
                model, hc.circuit(sorted(ref)), clean=clean, corrupt=corrupt, metric=metric, how=how
            )
            ours = hc.faithfulness(
                model, hc.circuit(sorted(truth)), clean=clean, corrupt=corrupt, metric=metric, how=how
            )
            row = dict(program=program, circuit=function, auto_circuit=autocircuit.version(), edges=len(ref),
                       in_our_truth=len(ref & truth), ablation=how, faithfulness=float(faith.frame.faithfulness.iloc[0]),
                       our_truth_faithfulness=float(ours.frame.faithfulness.iloc[0]))  # fmt: skip
            for method, frame in scores.items():
                key = list(zip(frame.writer, frame.reader, frame.via))
                row[f"auc {method}"] = auc([e in ref for e in key], frame.score)
            rows.append(row)
    return pd.DataFrame(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--n", type=int, default=64, help="clean and corrupt inputs per program (default 64)")
    args = parser.parse_args(argv)
    import warnings

    from experiments.groundtruth import page  # circuits.md: the dense bench's page, with the Tracr section
    from experiments.shared import setup
    from experiments.tracr.common import NAMES

    setup()
    warnings.filterwarnings("ignore")
    from experiments.consistency import record
    from experiments.consistency import started as code_at

    start_at = code_at("circuits")  # the code this run imported
    out = args.out / "circuits"
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    edges, nodes, programs, curves = [], [], [], []
    for name in NAMES:
        e, nd, s, c = run_program(name, args.n)
        edges += e
        nodes += nd
        curves += c
        programs.append(s)
        print(f"[circuits] {name} done", flush=True)
    tables = dict(edges=pd.DataFrame(edges), nodes=pd.DataFrame(nodes), programs=pd.DataFrame(programs))
    reference = score_reference_circuits(args.n)
    if reference is not None:
        tables["auto_circuit"] = reference
    elif (out / "auto_circuit.csv").exists():
        (out / "auto_circuit.csv").unlink()  # our own table of an earlier run: not measured this time
    for name, frame in tables.items():
        frame.to_csv(out / f"{name}.csv", index=False)
    pd.DataFrame(curves).to_csv(out / "curves.csv", index=False)
    draw_curves(pd.DataFrame(curves), out)
    (out / "timing.json").write_text(
        json.dumps(dict(total_s=round(time.perf_counter() - started, 1), cores=os.cpu_count(), inputs=args.n), indent=1)
        + "\n"
    )
    if args.out == DEFAULT_OUT:
        record(out, start_at)
    print(f"[circuits] doc: {page.build(args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
