"""Score the circuit methods on the dense ground-truth bench (SIIT models of five Tracr programs and an induction
model): edge and node AUC against every true edge and against the shown ones, beside the data-free baselines;
the faithfulness of the true and the recovered circuits under every ablation with their spread over readings;
the stability of each method's circuit. Tables in docs/results/circuits/dense_*.csv; the page is
`experiments.groundtruth.page`.

    python -m experiments.groundtruth.run_all [--out FOLDER] [--n 64] [--models reverse ...]

Reads the committed models (experiments/groundtruth/gated: NAME passed its gate, NAME.unpassed did not); needs
no jax.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "docs" / "results"
EDGE_METHODS = ("exact", "eap", "eap-ig")
DRAWS = 3  # input draws per reading (seeds 0, 1, 2), each under every ablation


def edge_rows(name, model, spec, contrast, n, results=None) -> list[dict]:
    """One row per method and baseline: edge AUC against all true edges and against the shown ones."""
    import headcoop as hc
    from experiments.groundtruth import baselines
    from experiments.groundtruth.common import inputs, metric_for, read_labels, shown, why_unshown
    from experiments.tracr.run_all import auc

    clean, corrupt = inputs(spec, n=n, seed=0, contrast=contrast)
    metric = metric_for(model, spec, clean)
    truth = {tuple(e) for e in spec["truth"]["edges"]}
    seen = shown(spec, clean, corrupt)
    wp = baselines.weight_product(model)
    keys = list(wp)
    is_true = np.array([k in truth for k in keys])
    keep = np.array([k in seen or k not in truth for k in keys])
    base = dict(
        model=name,
        contrast=contrast,
        edges=len(keys),
        true_edges=len(truth),
        shown_true_edges=len(seen),
        shown_by_zero=len(shown(spec, clean, None, how="zero")),
    )
    unshown = [dict(model=name, contrast=contrast, writer=e[0], reader=e[1], via=e[2],
                    carries=", ".join(read_labels(spec, e)), why=why_unshown(spec, e) or "not shown by these inputs")
               for e in sorted(truth - seen)]  # fmt: skip
    rows = []
    for method in EDGE_METHODS:
        started = time.perf_counter()
        result = hc.edges(model, clean=clean, corrupt=corrupt, metric=metric, estimator=method, progress=False)
        seconds = time.perf_counter() - started
        f = result.to_dataframe()
        score = dict(zip(zip(f.writer, f.reader, f.via), f.score.abs()))
        s = np.array([score[k] for k in keys])
        false = sorted(((v, k) for k, v in score.items() if k not in truth), reverse=True)[:3]
        shown_true = [score[k] for k in seen]
        rows.append(dict(base, method=method, auc_edges=auc(is_true, s), auc_shown_edges=auc(is_true[keep], s[keep]),
                         seconds=seconds, weakest_shown_true=min(shown_true) if shown_true else float("nan"),
                         strongest_false="; ".join(f"{w}->{r} ({v}) {x:.3g}" for x, (w, r, v) in false)))  # fmt: skip
        if results is not None:
            results[method] = result
        base.update(metric_clean=result.clean_value, metric_corrupt=result.corrupt_value)
    s = np.array([wp[k] for k in keys])
    embedded = np.array([k[0] in ("embed", "pos_embed") for k in keys])
    split = {f"auc_shown_{part}_writers": auc(is_true[keep & where], s[keep & where])
             if 0 < is_true[keep & where].sum() < (keep & where).sum() else float("nan")
             for part, where in (("embedding", embedded), ("component", ~embedded))}  # fmt: skip
    rows.append(dict(base, method="weight product", auc_edges=auc(is_true, s), auc_shown_edges=auc(is_true[keep], s[keep]),
                     seconds=0.0, **split))  # fmt: skip
    mean, lo, hi = baselines.random_auc(is_true)
    mean_s, lo_s, hi_s = baselines.random_auc(is_true[keep])
    rows.append(dict(base, method="random", auc_edges=mean, auc_shown_edges=mean_s, seconds=0.0,
                     random_range=f"{lo:.2f}-{hi:.2f}", random_shown_range=f"{lo_s:.2f}-{hi_s:.2f}"))  # fmt: skip
    return rows, (clean, corrupt, metric), unshown


def node_rows(name, model, spec, results, contrast_inputs) -> list[dict]:
    """Node AUC of every method and baseline against the true nodes (the aligned components)."""
    from experiments.groundtruth import baselines
    from experiments.tracr.run_all import auc, node_scores, patch_nodes

    clean, corrupt, metric = contrast_inputs
    truth = set(spec["truth"]["nodes"]) - {"embed", "pos_embed"}
    components = [f"L{lay}H{h}" for lay in range(model.cfg.n_layers) for h in range(model.cfg.n_heads)]
    if not model.cfg.attn_only:
        components += [f"MLP{lay}" for lay in range(model.cfg.n_layers)]
    table = {("exact edges" if m == "exact" else m): node_scores(model, r.to_dataframe()) for m, r in results.items()}
    for how in ("exact node patching", "atp", "atp*"):
        if model.cfg.attn_only:
            import headcoop as hc

            kw = dict(clean=clean, corrupt=corrupt, metric=metric, component="z", positions="all")
            r = hc.patch(model, **kw) if how == "exact node patching" else hc.attribute(model, estimator=how, **kw)
            values = (r.values - (r.corrupt_value if how == "exact node patching" else r.target_value)).abs()
            table[how] = pd.Series({f"L{lay}H{h}": float(values[lay, h]) for lay in range(model.cfg.n_layers)
                                    for h in range(model.cfg.n_heads)})  # fmt: skip
        else:
            table[how] = patch_nodes(model, clean, corrupt, metric, how)
    table["weight norm"] = pd.Series(baselines.weight_norm(model))
    is_true = [c in truth for c in components]
    rows = [dict(model=name, method=how, nodes=len(components), true_nodes=len(truth),
                 auc_nodes=auc(is_true, scores.reindex(components).fillna(0.0))) for how, scores in table.items()]  # fmt: skip
    rows.append(dict(model=name, method="random", nodes=len(components), true_nodes=len(truth),
                     auc_nodes=baselines.random_auc(is_true)[0]))  # fmt: skip
    return rows


def stability_rows(name, model, spec, n) -> tuple[list[dict], list[dict], list[dict]]:
    """Per method: its top-k circuit (k = the true edges) over every reading (ablation x draw), and the true
    circuit's faithfulness over the same readings."""
    import headcoop as hc
    from experiments.groundtruth.common import inputs, metric_for
    from headcoop.analysis.vocabulary import ABLATIONS

    truth = {tuple(e) for e in spec["truth"]["edges"]}
    draws = []
    for seed in range(DRAWS):
        clean, corrupt = inputs(spec, n=n, seed=seed, contrast="designed")
        draws.append((clean, corrupt, metric_for(model, spec, clean)))
    rows, bands, shares = [], [], []
    true_circuit = hc.circuit(sorted(truth))
    faith = [float(hc.faithfulness(model, true_circuit, c, x, m, how=how, progress=False).frame.faithfulness.iloc[0])
             for how in ABLATIONS for c, x, m in draws]  # fmt: skip
    rows.append(dict(model=name, circuit="true", k=len(truth), readings=len(faith), faithfulness_min=min(faith),
                     faithfulness_median=float(np.median(faith)), faithfulness_max=max(faith),
                     worst=f"{ABLATIONS[int(np.argmin(faith)) // DRAWS]}, draw {int(np.argmin(faith)) % DRAWS}"))  # fmt: skip
    for how_i, how in enumerate(ABLATIONS):
        part = faith[how_i * DRAWS : (how_i + 1) * DRAWS]
        rows[-1][f"true_{how}"] = f"{min(part):.3f}-{max(part):.3f}"
    for method in EDGE_METHODS:
        s = hc.circuit_stability(model, k=len(truth), estimator=method, draws=draws, progress=False)
        worst = s.readings.loc[s.readings.faithfulness.idxmin()]
        e = s.edges
        always = e[e.share == 1.0]
        key = list(zip(e.writer, e.reader, e.via))
        rows.append(dict(model=name, circuit=method, k=len(truth), readings=len(s.readings),
                         faithfulness_min=s.spread["min"], faithfulness_median=s.spread["median"],
                         faithfulness_max=s.spread["max"], worst=f"{worst.how}, draw {int(worst.draw)}",
                         always_selected=len(always),
                         always_true=sum(k in truth for k in zip(always.writer, always.reader, always.via)),
                         ever_selected=len(e), true_mean_share=float(np.mean([dict(zip(key, e.share)).get(t, 0.0) for t in truth]))))  # fmt: skip
        for how in ABLATIONS:
            part = s.readings[s.readings.how == how].faithfulness
            rows[-1][f"{how}"] = f"{part.min():.3f}-{part.max():.3f}"
        bands += [dict(model=name, method=method, **r) for r in s.band.to_dict("records")]
        shares += [dict(model=name, method=method, writer=r.writer, reader=r.reader, via=r.via, share=r.share,
                        true=(r.writer, r.reader, r.via) in truth) for r in e.itertuples()]  # fmt: skip
    return rows, bands, shares


def toy_stability(n: int) -> tuple[list[dict], list[dict]]:
    """The shipped toy models' EAP circuits (k = 10) over every reading, draws from their own tasks."""
    import headcoop as hc

    rows, bands = [], []
    for name in ("count01", "skip-pair"):
        model = hc.load(name)
        s = hc.circuit_stability(model, k=10, estimator="eap", draws=DRAWS, progress=False)
        worst = s.readings.loc[s.readings.faithfulness.idxmin()]
        rows.append(dict(model=name, circuit="eap", k=10, readings=len(s.readings), faithfulness_min=s.spread["min"],
                         faithfulness_median=s.spread["median"], faithfulness_max=s.spread["max"],
                         worst=f"{worst.how}, draw {int(worst.draw)}", always_selected=int((s.edges.share == 1).sum()),
                         ever_selected=len(s.edges)))  # fmt: skip
        for how in dict.fromkeys(s.readings.how):
            part = s.readings[s.readings.how == how].faithfulness
            rows[-1][how] = f"{part.min():.3f}-{part.max():.3f}"
        bands += [dict(model=name, method="eap", **r) for r in s.band.to_dict("records")]
    return rows, bands


def gate_failures(m: dict) -> str:
    """The gate's failed parts on a SIIT model's recorded gate (siit.GATE), "-" where it passed."""
    from experiments.groundtruth.siit import GATE

    failed = [f"{node} {kind} {row[kind]:.3f}" for node, row in m["interchange"].items()
              for kind in ("changed", "unchanged") if row[kind] < GATE[kind]]  # fmt: skip
    for key, bar, what in (("task_accuracy", GATE["task"], "task"), ("circuit_accuracy", GATE["circuit"], "circuit alone"),
                           ("strict_accuracy", GATE["strict"], "non-aligned resampled")):  # fmt: skip
        if key in m and m[key] < bar:
            failed.append(f"{what} {m[key]:.3f}")
    if m["writer_ratio_max"] > GATE["writer_ratio"]:
        failed.append(f"writer {m['writer_max']} {m['writer_ratio_max']:.1f}x")
    return ", ".join(failed) or "-"


def checks_row(name, model, spec) -> dict:
    """The truth's checks: the gate as training recorded it (the checkpoint's metrics) and, for a SIIT model,
    InterpBench's unfiltered interchange accuracy measured here at one length and at the training's lengths."""
    m = model.checkpoint_meta["metrics"]
    t = spec["training"]
    truth = spec["truth"]
    if spec["kind"] == "induction":
        from experiments.groundtruth.induction import failures

        return dict(model=name, kind="induction", passed=spec["passed"], layers=model.cfg.n_layers,
                    heads=model.cfg.n_heads, d_model=model.cfg.d_model, true_nodes=len(truth["nodes"]) - 2,
                    true_edges=len(truth["edges"]), task_accuracy=m["second_half_accuracy"],
                    check=f"{truth['previous_token_head']} previous-token {m[truth['previous_token_head']]['previous_token']:.3f}; "
                          + "; ".join(f"{h} prefix-matching {m[h]['prefix_matching']:.3f}, copying {m['copying_of'][h]:.3f}"
                                      for h in truth["induction_heads"])
                          + "; accuracy with one head mean-ablated: " + ", ".join(
                              f"{h} {a:.3f}" for h, a in m["ablations"].items() if h != "plain"),
                    failed=failures(m, truth), train_s=t["seconds"], steps=t["steps"])  # fmt: skip
    from experiments.groundtruth.siit import unfiltered
    from experiments.tracr.common import load as load_tracr

    high, info = load_tracr(name)
    rows = m["interchange"]
    low_of = lambda kind: min(rows, key=lambda n: rows[n][kind])  # noqa: E731
    one, varied = (unfiltered(model, high, info, list(rows), one_length=flag) for flag in (True, False))
    return dict(model=name, kind="siit", passed=spec["passed"], layers=model.cfg.n_layers, heads=model.cfg.n_heads,
                d_model=model.cfg.d_model, true_nodes=len(set(truth["nodes"]) - {"embed", "pos_embed"}),
                true_edges=len(truth["edges"]), task_accuracy=m["task_accuracy"],
                changed=f"{rows[low_of('changed')]['changed']:.3f} ({low_of('changed')})",
                unchanged=f"{rows[low_of('unchanged')]['unchanged']:.3f} ({low_of('unchanged')})",
                circuit_alone=m.get("circuit_accuracy", float("nan")), non_aligned_resampled=m.get("strict_accuracy", float("nan")),
                writer=f"{m['writer_ratio_max']:.1f}x ({m['writer_max']})",
                interpbench_one_length=min(one.values()), interpbench_lengths=min(varied.values()),
                failed=gate_failures(m), train_s=t["seconds"], steps=t["steps"])  # fmt: skip


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--n", type=int, default=64, help="clean and corrupt inputs per model (default 64)")
    parser.add_argument("--models", nargs="*", default=None)
    args = parser.parse_args(argv)
    import warnings

    from experiments.groundtruth.common import CONTRASTS, NAMES, load
    from experiments.shared import setup

    setup()
    warnings.filterwarnings("ignore")
    from experiments.consistency import record
    from experiments.consistency import started as code_at

    start_at = code_at("circuits")  # the code this run imported
    out = args.out / "circuits"
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    tables = {k: [] for k in ("checks", "edges", "unshown", "nodes", "stability", "bands", "shares")}
    for name in args.models or NAMES:
        model, spec = load(name)
        tables["checks"].append(checks_row(name, model, spec))
        for contrast in CONTRASTS:
            results = {} if contrast == "designed" else None
            rows, used, unshown = edge_rows(name, model, spec, contrast, args.n, results)
            tables["edges"] += rows
            tables["unshown"] += unshown
            if results is not None:
                tables["nodes"] += node_rows(name, model, spec, results, used)
        rows, bands, shares = stability_rows(name, model, spec, args.n)
        tables["stability"] += rows
        tables["bands"] += bands
        tables["shares"] += shares
        print(f"[groundtruth] {name} done ({time.perf_counter() - started:.0f} s)", flush=True)
    rows, bands = toy_stability(args.n)
    tables["stability"] += rows
    tables["bands"] += bands
    for key, rows in tables.items():
        pd.DataFrame(rows).to_csv(out / f"dense_{key}.csv", index=False)
    (out / "dense_timing.json").write_text(json.dumps(dict(total_s=round(time.perf_counter() - started, 1),
                                                           cores=os.cpu_count(), inputs=args.n, draws=DRAWS), indent=1) + "\n")  # fmt: skip
    if args.out == DEFAULT_OUT and not args.models:  # every model's tables: record the commit they come from
        record(out, start_at)
    from experiments.groundtruth import page

    print(f"[groundtruth] doc: {page.build(args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
