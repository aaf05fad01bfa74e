"""Experiments on the shipped primary-configuration model hc.load("count01"): the head map, the
attention-intervention sweep, the logit analysis, and ablating / amplifying heads."""

from __future__ import annotations

import contextlib

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch

import headcoop as hc
from experiments.count01.common import Settings, save_figure, write_table
from headcoop.display.plot import TEMPLATE, heatmap
from headcoop.tasks.count01 import EOS, FIVE, FOUR

SHOWN = ["s_acc", "l_acc", "roc_auc", "w01", "w02", "bias_45", "signal_45", "readout_45"]


def head_map(s: Settings) -> pd.DataFrame:
    model = hc.load("count01")
    df = hc.head_metrics(model, n=2 * s.n_metrics, seed=0).to_dataframe()
    write_table(df, s.out, "shipped_heads")
    z = np.stack([np.log10(df[c]) if c in ("w01", "w02") else df[c] for c in SHOWN])
    labels = [f"log10 {c}" if c in ("w01", "w02") else c for c in SHOWN]
    # each row on its own scale: rows normalised to [-1, 1] by their largest magnitude, values shown as text
    scale = np.abs(z).max(1, keepdims=True)
    title = "Shipped count01 model: per-head metrics"
    fig = heatmap(z / np.where(scale > 0, scale, 1), x=df.name, y=labels, title=title)
    fig.update_traces(text=np.round(z, 2), texttemplate="%{text}", showscale=False)
    save_figure(fig, s.out, "shipped_head_map")
    return df


@torch.no_grad()
def intervention_rows(model, batch, w01s, modes=("model", 0.0)) -> pd.DataFrame:
    """Every head's held-out s_acc (and ROC AUC) with attention to '2' set to 0 and w01 imposed at every
    query (`hc.set_attention`, all heads at once: heads of one layer do not interact), one row per
    (others, w01, head); `others` is what the keys [BOS] and '=' get ("model": their own attention)."""
    heads = list(range(model.cfg.n_heads))
    rows = []
    for others in modes:
        for w in w01s:
            with hc.set_attention(model, head=heads, tokens={"2": 0.0, "0": float(w), "1": 1.0}, others=others):
                fit = hc.probe(model, batch, site="z")
            rows += [dict(others=str(others), w01=float(w), head=h, s_acc=fit.acc[h].item(),
                          roc_auc=fit.roc_auc[h].item()) for h in heads]  # fmt: skip
    return pd.DataFrame(rows)


@torch.no_grad()
def intervention(s: Settings) -> pd.DataFrame:
    """Attention to '2' set to 0 and w01 imposed on every head at '='-and-everywhere; s_acc per head."""
    model = hc.load("count01")
    batch = hc.Count01().sample(s.n_metrics, seed=1)
    heads = list(range(model.cfg.n_heads))
    df = write_table(intervention_rows(model, batch, np.logspace(-3, 3, s.w01_grid)), s.out, "intervention_heads")
    summary = (
        df.groupby(["others", "w01"], as_index=False)
        .agg(mean_s_acc=("s_acc", "mean"), min_s_acc=("s_acc", "min"),
             share_successful=("s_acc", lambda x: float((x >= 0.95).mean())))
    )  # fmt: skip
    write_table(summary, s.out, "intervention_summary")
    modes = (("model", "[BOS] and '=' keep the model's attention"), ("0.0", "[BOS] and '=' get 0 attention"))
    for others, title in modes:
        part = df[df.others == others]
        fig = go.Figure()
        for h in heads:
            one = part[part["head"] == h]
            fig.add_trace(
                go.Scatter(x=one.w01, y=one.s_acc, mode="lines", line=dict(width=1), opacity=0.5, name=f"L0H{h}")
            )
        mean = summary[summary.others == others]
        fig.add_trace(go.Scatter(x=mean.w01, y=mean.mean_s_acc, mode="lines+markers",
                                 line=dict(width=4, color="black"), name="mean"))  # fmt: skip
        fig.add_vrect(x0=0.1, x1=10, fillcolor="green", opacity=0.08, line_width=0)
        fig.update_layout(
            template=TEMPLATE, xaxis_type="log", yaxis_range=[0.45, 1.02],
            title=f"Intervention: attention to '2' = 0, w01 imposed ({title})",
            xaxis_title="imposed w01 (weight per '0' key / per '1' key)", yaxis_title="held-out s_acc",
        )  # fmt: skip
        save_figure(fig, s.out, f"intervention_{'model' if others == 'model' else 'zero'}")
    return summary


@torch.no_grad()
def logit_orders(model, batch) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The logits of '4', '5' and [EOS] at '=' and at the answer position, per true answer: (mean logits,
    the share of strings with each ordering of the three, and `kept`: per true answer the share with
    '5' > '4' at each position, the share keeping that 4/5 order and the share with [EOS] on top at the
    answer)."""
    out = model(batch.tokens)
    rows = torch.arange(len(batch))
    names = {FOUR: "4", FIVE: "5", EOS: "[EOS]"}
    table, orders = [], []
    for where, pos in (("'='", batch.answer_pos), ("answer", batch.answer_pos + 1)):
        at = out[rows, pos][:, [FOUR, FIVE, EOS]]
        for label, answer in ((0, "4"), (1, "5")):
            sel = at[batch.labels == label]
            table.append({"position": where, "true answer": answer, **{f"mean logit {names[t]}": sel[:, i].mean().item()
                          for i, t in enumerate((FOUR, FIVE, EOS))}})  # fmt: skip
            ranked = sel.argsort(-1, descending=True).tolist()
            order = [" > ".join(["4", "5", "[EOS]"][j] for j in row) for row in ranked]
            counts = pd.Series(order).value_counts(normalize=True)
            for o, share in counts.items():
                orders.append({"position": where, "true answer": answer, "order": o, "share": float(share)})
    at_eq_logits, at_ans_logits = out[rows, batch.answer_pos], out[rows, batch.answer_pos + 1]
    five_over_four_eq = at_eq_logits[:, FIVE] > at_eq_logits[:, FOUR]
    five_over_four_ans = at_ans_logits[:, FIVE] > at_ans_logits[:, FOUR]
    eos_top_ans = at_ans_logits.argmax(-1) == EOS
    kept = [
        {"true answer": answer, "strings": int((batch.labels == label).sum()),
         "share with '5' > '4' at '='": five_over_four_eq[batch.labels == label].float().mean().item(),
         "share with '5' > '4' at the answer": five_over_four_ans[batch.labels == label].float().mean().item(),
         "share keeping the 4/5 order":
             (five_over_four_eq == five_over_four_ans)[batch.labels == label].float().mean().item(),
         "share with [EOS] on top at the answer": eos_top_ans[batch.labels == label].float().mean().item()}
        for label, answer in ((0, "4"), (1, "5"))
    ]  # fmt: skip
    return pd.DataFrame(table), pd.DataFrame(orders), pd.DataFrame(kept)


@torch.no_grad()
def logits(s: Settings) -> pd.DataFrame:
    """Each head's push toward '4' / '5', and the order of the [EOS], '4', '5' logits at '=' and at the answer."""
    model = hc.load("count01")
    batch = hc.Count01().sample(2 * s.n_metrics, seed=2)
    means, orders, kept = logit_orders(model, batch)
    write_table(means, s.out, "logit_means")
    write_table(kept, s.out, "logit_order_kept")
    write_table(orders, s.out, "logit_orders")

    # each head's direct push on logit(5) - logit(4) at '=' and on logit([EOS]) - logit(answer) at the answer
    at_eq = hc.dla(model, batch)
    at_ans = hc.dla(model, batch, pos=batch.answer_pos + 1)
    ans_heads = at_ans.heads()[:, 0]  # [batch, head, vocab]
    answer_index = batch.answer[:, None, None].expand(-1, ans_heads.shape[1], 1)
    eos_push = ans_heads[..., EOS] - ans_heads.gather(2, answer_index)[..., 0]
    push_45 = at_eq.heads()[:, 0, :, FIVE] - at_eq.heads()[:, 0, :, FOUR]  # [batch, head]
    hm = hc.head_metrics(model, n=2 * s.n_metrics, seed=0).to_dataframe()
    heads = pd.DataFrame(
        dict(
            head=hm.name, successful=hm.successful, bias_45=hm.bias_45, signal_45=hm.signal_45,
            push_45_when_4=push_45[batch.labels == 0].mean(0).numpy(),
            push_45_when_5=push_45[batch.labels == 1].mean(0).numpy(),
            eos_push_at_answer=eos_push.mean(0).numpy(),
        )
    )  # fmt: skip
    heads["toward"] = np.where(heads.bias_45 > 0, "5", "4")
    write_table(heads, s.out, "logit_heads")
    fig = go.Figure(
        [
            go.Bar(name="mean push when the answer is '4'", x=heads["head"], y=heads.push_45_when_4),
            go.Bar(name="mean push when the answer is '5'", x=heads["head"], y=heads.push_45_when_5),
            go.Scatter(name="bias_45 (average of the two)", x=heads["head"], y=heads.bias_45, mode="markers",
                       marker=dict(size=10, color="black", symbol="diamond")),
        ]
    )  # fmt: skip
    fig.update_layout(template=TEMPLATE, barmode="group",
                      title="Each head's direct push on logit('5') - logit('4') at '='",
                      yaxis_title="logit('5') - logit('4')")  # fmt: skip
    save_figure(fig, s.out, "logit_heads")
    return heads


@torch.no_grad()
def all_heads_over_draws(s: Settings, draws: int = 8) -> pd.DataFrame:
    """Every head of the shipped model mean-ablated at once, per reference draw (draw 0: `ablation`'s
    reference, task.sample(n_reference, seed=0); draw d: seed d): answer and [EOS] accuracy and the share of
    strings the head-free model answers '4' or '5', so one draw's value is never shown as the value; beside
    it the head-free accuracy under `hc.cooperation`'s aligned mean (its draw d), and the batch's share of '5'
    (an accuracy at that share or one minus it means one answer for every string)."""
    model = hc.load("count01")
    task = hc.Count01()
    batch = task.sample(s.n_ablation, seed=3)
    four, five = (task.vocab.index(t) for t in ("4", "5"))
    draws = 2 if s.quick else draws
    rows = []
    for d in range(draws):
        reference = task.sample(s.n_reference, seed=d)
        # hc.cooperation's mean, aligned by the offset from the answer position, on its own reference draw
        # (task.sample(512, seed=d + 1)): the head-free model's accuracy under the mean the words read
        aligned = hc.cooperation(model, inputs=batch, how="mean", draws=1, seed=d, max_exact=2).v_empty
        with hc.ablate(model, heads=list(range(model.cfg.n_heads)), how="mean", reference=reference):
            out = model(batch.tokens)
        correct = task.correct(out, batch)
        said = out[torch.arange(len(batch.tokens)), batch.answer_pos].argmax(-1)
        rows.append(dict(draw=d, reference_seed=d, answer_acc=correct[:, 0].float().mean().item(),
                         eos_acc=correct[:, 1].float().mean().item(), says_4=(said == four).float().mean().item(),
                         says_5=(said == five).float().mean().item(), aligned_answer_acc=aligned,
                         batch_says_5=(batch.answer == five).float().mean().item()))  # fmt: skip
    return write_table(pd.DataFrame(rows), s.out, "ablation_all_draws")


@torch.no_grad()
def ablation(s: Settings) -> pd.DataFrame:
    """Per head: zero / mean ablation and scaling (x0.5, x2); uniform aggregation; cumulative ablation."""
    model = hc.load("count01")
    task = hc.Count01()
    hm = hc.head_metrics(model, n=2 * s.n_metrics, seed=0).to_dataframe()
    batch = task.sample(s.n_ablation, seed=3)
    reference = task.sample(s.n_reference, seed=0)

    def score() -> dict:
        out = model(batch.tokens)
        correct = task.correct(out, batch)
        return dict(answer_acc=correct[:, 0].float().mean().item(), eos_acc=correct[:, 1].float().mean().item(),
                    logit_diff=task.logit_diff(out, batch).mean().item())  # fmt: skip

    rows = [dict(intervention="none", head="-", **score())]
    for h in range(model.cfg.n_heads):
        for label, kw in (("zero", dict(how="zero")), ("mean", dict(how="mean", reference=reference)),
                          ("scale x2", dict(how="scale", factor=2.0))):  # fmt: skip
            with hc.ablate(model, heads=h, **kw):
                rows.append(dict(intervention=label, head=f"L0H{h}", **score()))
    per_head = write_table(pd.DataFrame(rows), s.out, "ablation_heads")

    # uniform aggregation: every head's readout on logit(5) - logit(4) rescaled to the same norm
    def scaled(factors) -> dict:
        with contextlib.ExitStack() as stack:
            for h, f in enumerate(factors):
                stack.enter_context(hc.ablate(model, heads=h, how="scale", factor=float(f)))
            return score()

    r = hm.readout_45.to_numpy()
    ok = hm.successful.to_numpy()
    agg = [dict(intervention="none (the model's own weighting)", **score())]
    agg.append(dict(intervention="uniform: every head's readout norm set to the mean", **scaled(r.mean() / r)))
    agg.append(dict(intervention="uniform over successful heads, failed heads zeroed",
                    **scaled(np.where(ok, r[ok].mean() / r, 0.0))))  # fmt: skip
    agg.append(dict(intervention="failed heads zeroed, others unchanged", **scaled(np.where(ok, 1.0, 0.0))))
    agg.append(dict(intervention="successful heads zeroed, failed unchanged", **scaled(np.where(ok, 0.0, 1.0))))
    agg.append(dict(intervention="every head x2", **scaled(np.full_like(r, 2.0))))
    aggregation = write_table(pd.DataFrame(agg), s.out, "ablation_aggregation")

    cum = []
    for order_name, order in (("largest readout first", np.argsort(-r)), ("smallest readout first", np.argsort(r))):
        for k in range(len(order) + 1):
            with contextlib.ExitStack() as stack:
                if k:
                    first = [int(h) for h in order[:k]]
                    stack.enter_context(hc.ablate(model, heads=first, how="mean", reference=reference))
                cum.append(dict(order=order_name, ablated=k, **score()))
    cumulative = write_table(pd.DataFrame(cum), s.out, "ablation_cumulative")

    fig = go.Figure()
    for label in ("zero", "mean", "scale x2"):
        part = per_head[per_head.intervention == label]
        fig.add_trace(go.Bar(name=label, x=part["head"], y=part.answer_acc))
    fig.update_layout(
        template=TEMPLATE,
        barmode="group",
        yaxis_range=[0.5, 1.01],
        title="Answer accuracy with one head ablated or scaled (shipped model)",
        yaxis_title="answer accuracy",
    )
    save_figure(fig, s.out, "ablation_heads")
    fig = go.Figure()
    for order_name in cumulative.order.unique():
        part = cumulative[cumulative.order == order_name]
        fig.add_trace(go.Scatter(x=part.ablated, y=part.answer_acc, mode="lines+markers", name=f"answer, {order_name}"))
        fig.add_trace(go.Scatter(x=part.ablated, y=part.eos_acc, mode="lines", line=dict(dash="dot"),
                                 name=f"[EOS], {order_name}"))  # fmt: skip
    fig.update_layout(
        template=TEMPLATE,
        title="Mean-ablating heads one after another (ordered by readout norm)",
        xaxis_title="heads mean-ablated",
        yaxis_title="accuracy",
    )
    save_figure(fig, s.out, "ablation_cumulative")
    return aggregation
