"""Attribution accuracy (issue 25): hc.attribute's "atp", "atp*" and "ig" against full exact sweeps (hc.patch),
per model and component: Pearson and Spearman correlation of estimated and exact effects, recall@10, and the
exact top-10 cells each method's ranking misses (the ones AtP misses and AtP* recovers, listed). Writes
docs/results/attribution/accuracy.csv, misses.csv and docs/results/attribution.md.

    python -m experiments.attribution.run_all [--out FOLDER] [--n 256] [--quick]

Models: the three shipped toy checkpoints and a two-layer Count01 model (16 heads per layer, trained here
with the Count01 recipe), on their tasks' patching inputs with the task's logit difference; and three
any-model shapes with random weights (gelu-2l-like: 2 layers, d_model 64, LayerNorm, MLPs; rotary + RMSNorm;
grouped-query attention + rotary + MLPs), on random tokens with a logit difference at the last position.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pandas as pd
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

import headcoop as hc
from experiments.shared import setup, write_table
from headcoop.analysis.vocabulary import head_name, layer_name

DEFAULT_OUT = Path(__file__).resolve().parents[2] / "docs" / "results"
# label -> hc.attribute arguments
METHODS = {
    "atp": dict(estimator="atp"),
    "atp*": dict(estimator="atp*"),
    "atp* (QK fix only)": dict(estimator="atp*", graddrop=False),
    "ig": dict(estimator="ig"),
}
SHAPES = {
    "gelu-2l-like (LN, MLPs)": dict(n_layers=2, d_model=64, d_head=16, n_heads=4, d_mlp=256, attn_only=False,
                                    normalization_type="LN"),
    "rotary, RMSNorm": dict(n_layers=2, d_model=64, d_head=16, n_heads=4, attn_only=True, normalization_type="RMS",
                            positional_embedding_type="rotary", rotary_dim=8),
    "grouped-query, rotary, MLPs": dict(n_layers=2, d_model=64, d_head=16, n_heads=4, n_key_value_heads=2, d_mlp=256,
                                        attn_only=False, normalization_type="RMS", positional_embedding_type="rotary",
                                        rotary_dim=8),
}  # fmt: skip
VOCAB, N_POS = 50, 12


def random_model(seed: int, **shape) -> HookedTransformer:
    cfg = HookedTransformerConfig(n_ctx=N_POS, d_vocab=VOCAB, act_fn="gelu", seed=seed, **shape)
    model = HookedTransformer(cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "b_" in name or name.endswith((".b", ".w")):
                param.add_(0.3 * torch.randn(param.shape, generator=gen))
            if name.endswith(("W_Q", "W_K")):
                param.mul_(3)  # sharper attention than the default initialisation: saturation can occur
    return model.eval()


def models(n: int, quick: bool):
    """name -> (model, clean, corrupt, metric or None for the task's)."""
    out = {}
    for name in ("count01", "skip-pair", "skip-pair-dhead1"):
        model = hc.load(name)
        clean, corrupt = model.task.patching_inputs(n=n, seed=1)
        out[f"{name} (shipped)"] = (model, clean, corrupt, None)
    task = hc.Count01()
    steps = 100 if quick else 1000
    two = hc.train_many(task, [dict(n_heads=16, d_model=32, d_head=2, n_layers=2)], seeds=[0], steps=steps,
                        warmup=steps // 10, batch_size=256, lr=1e-2, weight_decay=0.0, progress=False)[0]  # fmt: skip
    clean, corrupt = task.patching_inputs(n=n, seed=1)
    two.task = task
    out[f"count01, two layers ({steps} steps)"] = (two, clean, corrupt, None)
    gen = torch.Generator().manual_seed(0)
    for name, shape in SHAPES.items():
        model = random_model(0, **shape)
        clean = torch.randint(0, VOCAB, (n, N_POS), generator=gen)
        corrupt = clean.clone()
        corrupt[:, N_POS // 2 :] = torch.randint(0, VOCAB, (n, N_POS - N_POS // 2), generator=gen)
        answer = torch.randint(0, VOCAB, (n,), generator=gen)

        def metric(logits, answer=answer):
            last, rows = logits[:, -1], torch.arange(len(answer))
            return (last[rows, answer] - last[rows, (answer + 1) % VOCAB]).mean()

        out[f"{name} (random weights)"] = (model, clean, corrupt, metric)
    return out


def cell_name(result, flat: int) -> str:
    index = torch.unravel_index(torch.tensor(flat), tuple(result.values.shape))
    at = {d: result.coords[d][int(i)] for d, i in zip(result.dims, index)}
    name = head_name(at["layer"], at["head"]) if "head" in at else layer_name(at["layer"])
    pos = at.get("pos", at.get("dest_pos"))
    return name + (f" pos {pos}" if pos is not None else "")


SCATTERED = ("z", "resid_pre")  # the components whose every cell the scatter figure shows


def draw_scatter(points: pd.DataFrame, folder: Path) -> list[str]:
    """estimate_vs_exact: each estimator's estimate of every cell's effect against exact patching's, one panel
    per (model, component), with the line y = x (HTML, and PNG where kaleido can export)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from headcoop.display.plot import TEMPLATE, save_figure

    panels = list(dict.fromkeys(zip(points.model, points.component)))
    cols = 4
    rows = -(-len(panels) // cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[f"{m}: {c}" for m, c in panels], vertical_spacing=0.08,
                        horizontal_spacing=0.06)  # fmt: skip
    colours = {"atp": "#d62728", "atp*": "#1f77b4", "ig": "#2ca02c"}
    for j, (model, component) in enumerate(panels):
        at = dict(row=j // cols + 1, col=j % cols + 1)
        part = points[(points.model == model) & (points.component == component)]
        low, high = float(min(part.exact.min(), part.estimate.min())), float(max(part.exact.max(), part.estimate.max()))
        fig.add_trace(go.Scatter(x=[low, high], y=[low, high], mode="lines", line=dict(color="grey", dash="dot"),
                                 name="y = x", showlegend=j == 0, legendgroup="y=x"), **at)  # fmt: skip
        for method, colour in colours.items():
            m = part[part.method == method]
            fig.add_trace(go.Scatter(x=m.exact, y=m.estimate, mode="markers", name=method, legendgroup=method,
                                     marker=dict(size=4, color=colour, opacity=0.6), showlegend=j == 0), **at)  # fmt: skip
    fig.update_xaxes(title_text="exact effect (hc.patch)", row=rows)
    fig.update_yaxes(title_text="estimated effect", col=1)
    fig.update_annotations(font_size=11)
    fig.update_layout(template=TEMPLATE, height=300 * rows + 120, title="Attribution estimates against exact patching, every cell "
                      "(position x head or layer)<br><sup>gradient estimates, no verification pass (verify=0)</sup>")  # fmt: skip
    return save_figure(fig, folder, "estimate_vs_exact", width=1400, height=300 * rows + 120)


def main(out: Path, n: int, quick: bool) -> dict:
    from experiments.consistency import record, started

    start_at = started("attribution")  # the code this run imported
    setup(threads=torch.get_num_threads())
    start = time.time()
    rows, misses, points = [], [], []
    for name, (model, clean, corrupt, metric) in models(n, quick).items():
        components = ["z", "q", "k", "v", "pattern", "resid_pre", "attn_out"] + (
            [] if model.cfg.attn_only else ["mlp_out"]
        )
        for component in components:
            exact = hc.patch(model, clean=clean, corrupt=corrupt, metric=metric, component=component, positions="each")
            spread = float((exact.values - exact.corrupt_value).abs().max())
            results = {}
            for method, how in METHODS.items():
                t0 = time.time()
                result = hc.attribute(model, clean=clean, corrupt=corrupt, metric=metric, component=component,
                                      verify=0, sample=0, **how)  # fmt: skip
                seconds = time.time() - t0
                results[method] = result
                c = result.compare(exact, k=10)
                rows.append(dict(model=name, component=component, method=method, cells=exact.values.numel(),
                                 largest_exact_effect=spread, pearson=c["pearson"], spearman=c["spearman"],
                                 recall_at_10=c["recall@10"], missed=len(c["missed"]), seconds=seconds,
                                 forward_equivalents=result.cost["estimate"]))  # fmt: skip
            plain, star, fix = (results[m].compare(exact) for m in ("atp", "atp*", "atp* (QK fix only)"))
            effect = (exact.values - results["atp"].target_value).reshape(-1)
            if component in SCATTERED:  # every cell's estimate beside its exact effect, for the scatter figure
                for method in ("atp", "atp*", "ig"):
                    estimate = results[method].effect.reshape(-1)
                    points += [dict(model=name, component=component, method=method, exact=float(x), estimate=float(y))
                               for x, y in zip(effect.tolist(), estimate.tolist())]  # fmt: skip
            for flat in plain["missed"]:
                misses.append(dict(model=name, component=component, cell=cell_name(exact, flat),
                                   exact_effect=float(effect[flat]),
                                   atp_estimate=float(results["atp"].effect.reshape(-1)[flat]),
                                   atp_star_estimate=float(results["atp*"].effect.reshape(-1)[flat]),
                                   recovered_by_atp_star=flat not in star["missed"],
                                   recovered_by_qk_fix_only=flat not in fix["missed"]))  # fmt: skip
        print(f"  {name}: done ({time.time() - start:.0f} s)", flush=True)
    folder = out / "attribution"
    write_table(pd.DataFrame(rows), folder, "accuracy")
    write_table(pd.DataFrame(misses, columns=["model", "component", "cell", "exact_effect", "atp_estimate",
                                              "atp_star_estimate", "recovered_by_atp_star", "recovered_by_qk_fix_only"]),
                folder, "misses")  # fmt: skip
    write_table(pd.DataFrame(points), folder, "estimates")
    draw_scatter(pd.DataFrame(points), folder)
    timing = {"seconds": round(time.time() - start, 1), "inputs": n, "quick": quick, "threads": torch.get_num_threads()}
    (folder / "timing.json").write_text(json.dumps(timing, indent=1))
    if not quick:
        record(folder, start_at)
    from experiments.attribution.page import build

    print(build(out))
    return timing


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--n", type=int, default=256, help="inputs per model")
    parser.add_argument("--quick", action="store_true", help="a smoke test: 16 inputs, a short two-layer run")
    args = parser.parse_args()
    if args.quick and args.out == DEFAULT_OUT:
        raise SystemExit("--quick needs --out (it must not overwrite docs/results)")
    main(args.out, 16 if args.quick else args.n, args.quick)
