"""Per-head quantities of the Count01 paper (arXiv 2502.06923), one row per head.

    hc.head_metrics(model)  ->  HeadMetrics; .to_dataframe(): name, layer, head, s_acc, l_acc, roc_auc, w01, ...

All quantities are read at the '=' position (the query that predicts the answer) on `n` fresh strings
`task.sample(n, seed)`. Definitions (docs/results/count01.md repeats them next to every result):

s_acc, roc_auc, train_acc
    A logistic-regression separator (`hc.probe`, site "z": the head's z, its d_head-dimensional output
    before W_O) fit on a train split (1 - test_fraction of the strings) with label "more 1s than 0s";
    s_acc is its held-out accuracy, roc_auc the ROC AUC of its held-out scores. z @ W_O[h] is a linear
    image of z, and an injective one when W_O[h] has rank d_head, so the two are equally separable.
l_acc
    The model's own output layer reading the head alone: logits = z @ W_O[h] @ W_U + const, with const
    the terms every forward pass has at '=' whatever the heads do: the embedding of '=' (and its
    positional embedding, when the model has one), every layer's b_O, all through W_U, plus b_U. The
    prediction is '5' when logit('5') > logit('4'); l_acc is its accuracy over all n strings (nothing
    is fitted). l_acc_head is the same without const: the sign of the head's own push.
w01, w02
    Per-token attention weights at '=': a_t = (attention on keys holding token t) / (number of such
    keys). Per string, w01 = a_0 / a_1 and w02 = ((a_0 + a_1) / 2) / a_2 (the average per-token weight
    on '0' and '1' over the per-token weight on '2'); the reported value is the geometric mean over
    the strings that contain the tokens involved. Computed in log space from the attention scores,
    so extreme ratios do not underflow. In a one-layer model without positional embedding a key's
    score depends on its token only, so every string gives the same ratio, exp(s_0 - s_1) for w01,
    which is also read from the QK table (columns w01_qk, w02_qk; NaN for layers > 0, where QK
    tables are direct-path only).
bias_45, signal_45, push_std_45
    The head's direct push on logit('5') - logit('4') at '=' (its `hc.dla` component): bias_45 is the
    average of its mean over strings labelled '5' and its mean over strings labelled '4' (so the class
    balance of the sample does not enter); signal_45 is the difference of the two means; push_std_45
    its standard deviation over all strings.
readout_45
    || W_O[h] @ (W_U['5'] - W_U['4']) ||: how strongly the output layer reads the head on the answer
    decision (the weight used for the ensemble average in experiments/count01).
successful
    s_acc >= success_threshold (default 0.95).
"""

from __future__ import annotations

import dataclasses
import math
from typing import cast

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens.utilities import get_act_name

from headcoop.analysis.engine.inputs import model_device, require_task
from headcoop.analysis.nodes.dla import dla
from headcoop.analysis.nodes.probes import probe
from headcoop.analysis.weights.qkov import qk
from headcoop.checks import check_float, check_int
from headcoop.models.tl import HookedTransformer
from headcoop.storage.results import Result
from headcoop.studies.base import Study, StudySection
from headcoop.tasks.base import Task
from headcoop.tasks.count01 import EQ, FIVE, FOUR, ONE, TWO, ZERO, Count01

COLUMNS = [
    "name", "layer", "head", "s_acc", "l_acc", "roc_auc", "w01", "w02", "bias_45",
    "train_acc", "l_acc_head", "signal_45", "push_std_45", "readout_45", "w01_qk", "w02_qk", "successful",
]  # fmt: skip


def per_token_log_weights(
    scores: Float[Tensor, "batch head key"], key_tokens: Int[Tensor, "batch key"], tokens=(ZERO, ONE, TWO)
) -> Float[Tensor, "batch head token"]:
    """log a_t for each token t: log of (attention on keys holding t) / (number of such keys), up to a
    per-(string, head) constant (the log of the softmax normaliser, which cancels in every ratio).

    scores: the query's pre-softmax attention scores over the visible keys (-inf where hidden).
    Returns [batch, head, len(tokens)], -inf (nan-free) where a string holds no such key.
    """
    out = []
    for t in tokens:
        on_t = (key_tokens == t)[:, None, :]
        masked = torch.where(on_t & torch.isfinite(scores), scores, float("-inf"))
        count = on_t.sum(-1).to(scores.dtype)
        out.append(torch.logsumexp(masked, -1) - count.clamp(min=1).log())
    return torch.stack(out, -1)


def ratio_logs(log_w: Float[Tensor, "batch head 3"]) -> tuple[Float[Tensor, "batch head"], Float[Tensor, "batch head"]]:
    """log w01 = log a_0 - log a_1 and log w02 = log((a_0 + a_1) / 2) - log a_2 per string and head
    (NaN where a token involved is absent from the string)."""
    l0, l1, l2 = log_w.unbind(-1)
    absent = ~torch.isfinite(log_w)
    log_w01 = torch.where(absent[..., 0] | absent[..., 1], float("nan"), l0 - l1)
    log_w02 = torch.where(absent.any(-1), float("nan"), torch.logaddexp(l0, l1) - math.log(2.0) - l2)
    return log_w01, log_w02


def _geometric_mean(log_values: Float[Tensor, "batch head"]) -> np.ndarray:
    return torch.nanmean(log_values.double(), 0).exp().cpu().numpy()


def qk_ratios(model: HookedTransformer, layer: int, head: int) -> tuple[float, float]:
    """(w01, w02) from the QK table of a layer-0 head without positional scores: exp(s_0 - s_1) and
    (exp(s_0 - s_2) + exp(s_1 - s_2)) / 2 for the query '='."""
    table = qk(model, head=head, layer=layer, positional=False).scores[EQ].double()
    s0, s1, s2 = table[ZERO], table[ONE], table[TWO]
    return math.exp(s0 - s1), float((torch.exp(s0 - s2) + torch.exp(s1 - s2)) / 2)


@dataclasses.dataclass(frozen=True, repr=False)
class HeadMetrics(Result):
    """The Count01 per-head quantities of one model (module docstring: definitions), built whole.

    table: one row per (layer, head), columns COLUMNS (a copy leaves through `to_dataframe()`).
    n, seed, success_threshold: the strings measured (`task.sample(n, seed)`) and the s_acc bar.
    """

    table: pd.DataFrame
    n: int
    seed: int
    success_threshold: float

    def to_dataframe(self) -> pd.DataFrame:
        """One row per head: name, layer, head, s_acc, l_acc, roc_auc, w01, w02, bias_45, ... (COLUMNS)."""
        return self.table.copy()

    def plot(self, title: str | None = None):
        """The paper's head map: every head at (w01, w02) on log axes, coloured by s_acc."""
        fig = head_map_figure(self.table.set_index("name"))
        if title is not None:
            fig.update_layout(title=title)
        return fig

    def __len__(self) -> int:
        return len(self.table)

    def __repr__(self) -> str:
        ok = int(self.table.successful.sum())
        return (
            f"HeadMetrics({len(self.table)} heads, {ok} successful (s_acc >= {self.success_threshold:g}), "
            f"n={self.n} strings at '=', seed={self.seed})"
        )


@torch.no_grad()
def head_metrics(
    model: HookedTransformer,
    task: Task | None = None,
    n: int = 4096,
    seed: int = 0,
    test_fraction: float = 0.25,
    l2: float = 1e-3,
    success_threshold: float = 0.95,
) -> HeadMetrics:
    """The paper's per-head quantities at '=' on `n` fresh Count01 strings (module docstring: definitions).

    task: a Count01 task (default: the model's own). seed: seeds the sample and the probes' train /
    held-out split. Returns a HeadMetrics: `.to_dataframe()` has one row per (layer, head), columns
    COLUMNS; `.plot()` the (w01, w02) head map.
    """
    task = task if task is not None else require_task(model, "the task of head_metrics")
    if not isinstance(task, Count01):
        raise ValueError(f"head_metrics computes Count01 quantities; got a {type(task).__name__} task")
    task.check_ready(model, "head_metrics")
    check_int("n", n, 8)
    check_float("success_threshold", success_threshold, 0.0, 1.0)
    batch = task.sample(n, seed=seed).to(model_device(model))
    n_layers = model.cfg.n_layers

    # separability of z: one batched probe fit for every head of every layer
    fit = probe(model, batch, site="z", layer=None, seed=seed, test_fraction=test_fraction, l2=l2)

    # direct pushes and the output layer reading each head alone
    attr = dla(model, batch)
    heads = attr.heads().flatten(1, 2)  # [batch, layer*head, vocab]
    const = attr.total() - heads.sum(1)  # embed (+ pos_embed) + every b_O + b_U
    push = heads[..., FIVE] - heads[..., FOUR]  # [batch, layer*head]
    alone = push + (const[:, FIVE] - const[:, FOUR])[:, None]
    label = (batch.labels == 1).to(push.device)[:, None]
    l_acc = ((alone > 0) == label).double().mean(0)
    l_acc_head = ((push > 0) == label).double().mean(0)
    mean5 = torch.where(label, push, 0.0).sum(0) / label.sum()
    mean4 = torch.where(~label, push, 0.0).sum(0) / (~label).sum()

    # attention ratios from the scores of the '=' query
    names = [get_act_name("attn_scores", layer) for layer in range(n_layers)]
    _, cache = model.run_with_cache(batch.tokens, names_filter=lambda name: name in names)
    rows = torch.arange(n, device=batch.tokens.device)
    eq_pos = batch.answer_pos.to(batch.tokens.device)
    visible = torch.arange(batch.tokens.shape[1], device=batch.tokens.device) <= eq_pos[:, None]
    w01, w02 = [], []
    for name in names:
        scores = cache[name][rows, :, eq_pos].double()  # [batch, head, key]
        scores = torch.where(visible[:, None], scores, float("-inf"))
        log_w01, log_w02 = ratio_logs(per_token_log_weights(scores, batch.tokens))
        w01.append(_geometric_mean(log_w01))
        w02.append(_geometric_mean(log_w02))

    readout_dir = model.W_U[:, FIVE] - model.W_U[:, FOUR]
    records = []
    for i, name in enumerate(fit.names):
        layer, head = fit.layers[i], fit.heads[i]
        W_O = model.blocks[layer].attn.W_O[head]
        if layer == 0 and not _positional_scores(model):
            w01_qk, w02_qk = qk_ratios(model, layer, cast(int, head))  # a head's probe: its head is set
        else:
            w01_qk = w02_qk = float("nan")
        records.append(
            dict(
                name=name,
                layer=layer,
                head=head,
                s_acc=fit.acc[i].item(),
                l_acc=l_acc[i].item(),
                roc_auc=fit.roc_auc[i].item(),
                w01=float(w01[layer][head]),
                w02=float(w02[layer][head]),
                bias_45=((mean5[i] + mean4[i]) / 2).item(),
                train_acc=fit.train_acc[i].item(),
                l_acc_head=l_acc_head[i].item(),
                signal_45=(mean5[i] - mean4[i]).item(),
                push_std_45=push[:, i].std(unbiased=False).item(),
                readout_45=(W_O @ readout_dir).norm().item(),
                w01_qk=w01_qk,
                w02_qk=w02_qk,
                successful=bool(fit.acc[i].item() >= success_threshold),
            )  # fmt: skip
        )
    table = pd.DataFrame.from_records(records, columns=COLUMNS)
    return HeadMetrics(table=table, n=n, seed=seed, success_threshold=success_threshold)


def _positional_scores(model: HookedTransformer) -> bool:
    """Whether a non-zero standard positional embedding enters layer 0's attention scores."""
    return model.cfg.positional_embedding_type == "standard" and bool(model.W_pos.abs().max() > 0)


# --- what Count01 adds to the report ----------------------------------------------------------------

REPORT_COLUMNS = ["s_acc", "l_acc", "roc_auc", "w01", "w02", "bias_45", "successful"]


def report_head_metrics(model: HookedTransformer, task: Task) -> pd.DataFrame:
    """`head_metrics(model, task)` indexed by head name ("L0H3"), the columns the report shows."""
    return head_metrics(model, task).to_dataframe().set_index("name")[REPORT_COLUMNS]


def _label_positions(x: np.ndarray, y: np.ndarray) -> list[str]:
    """Where to put each head's label: heads that sit close together (on the log axes) take turns
    above, below, right and left, so a cluster's labels do not print over each other."""
    lx, ly = np.log10(np.clip(x, 1e-12, None)), np.log10(np.clip(y, 1e-12, None))
    spots = ["top center", "bottom center", "middle right", "middle left"]
    out: list[str] = []
    for i in range(len(x)):
        near = [j for j in range(i) if abs(lx[j] - lx[i]) < 0.08 and abs(ly[j] - ly[i]) < 0.08]
        taken = {out[j] for j in near}
        out.append(next((s for s in spots if s not in taken), spots[len(near) % len(spots)]))
    return out


def head_map_figure(table: pd.DataFrame):
    """The paper's picture: each head at (w01, w02) on log axes, coloured by s_acc, reference lines at
    w01 = 1 and w02 = 10."""
    import plotly.graph_objects as go

    from headcoop.display.plot import TEMPLATE

    w01, w02 = table["w01"].to_numpy(float), table["w02"].to_numpy(float)
    s_acc = table["s_acc"].to_numpy(float)
    fig = go.Figure(
        go.Scatter(
            x=w01, y=w02, mode="markers+text", text=list(table.index), textposition=_label_positions(w01, w02),
            marker=dict(size=13, color=s_acc, colorscale="Viridis", cmin=0.5, cmax=1.0,
                        colorbar=dict(title="s_acc"), line=dict(width=1, color="#333")),
            hovertemplate="%{text}<br>w01 %{x:.3g}<br>w02 %{y:.3g}<br>s_acc %{marker.color:.3f}<extra></extra>",
        )
    )  # fmt: skip
    fig.add_vline(x=1.0, line_dash="dot", line_color="gray")
    fig.add_hline(y=10.0, line_dash="dot", line_color="gray")
    fig.update_layout(
        title="Count01 heads: attention ratios w01 and w02, coloured by s_acc", template=TEMPLATE,
        xaxis=dict(type="log", title="w01 (attention per '0' / per '1')"),
        yaxis=dict(type="log", title="w02 (attention per '0' or '1' / per '2')"),
    )  # fmt: skip
    return fig


class Count01Study(Study):
    """Count01's per-head metrics (they replace the generic probes) and the (w01, w02) head map."""

    sections = (("count01-map", "Count01 head map (w01, w02)"),)
    generic_probes = False

    def head_columns(self, model, task):
        notes = [
            "From <code>hc.head_metrics</code> (at '=', 4,096 fresh strings): <b>s_acc</b> held-out accuracy "
            "of a linear separator on the head's <code>z</code>, <b>l_acc</b> accuracy of the model's own "
            "unembedding reading that head alone, <b>roc_auc</b> of the separator, <b>w01</b> attention per "
            "'0' over per '1', <b>w02</b> per '0'/'1' over per '2', <b>bias_45</b> the head's push on "
            "logit('5') &minus; logit('4'), <b>successful</b>: s_acc &ge; 0.95. The paper's successful heads "
            "sit at w01 &asymp; 1 and w02 &gt; 10."
        ]
        return report_head_metrics(model, task), notes

    def section(self, anchor, model, task, head_table):
        if anchor != "count01-map":
            return super().section(anchor, model, task, head_table)
        table = head_table if "w01" in head_table else report_head_metrics(model, task)
        note = (
            "The paper's picture: heads that solve the task attend to '0' and '1' alike (w01 &asymp; 1, dotted "
            "vertical line) and ignore '2' (w02 &gt; 10, above the dotted horizontal line). " + map_agreement(table)
        )
        return StudySection(notes=(note,), figure=head_map_figure(table), figure_height=520)


def map_agreement(table: pd.DataFrame) -> str:
    """What this model's head map shows beside the paper's picture, counted: how many successful heads
    (s_acc >= 0.95) sit at w01 within a factor 2 of 1, and how many at w02 > 10 (HTML)."""
    good = table[table["s_acc"] >= 0.95]
    if not len(good):
        return "<b>This model:</b> no head reaches s_acc &ge; 0.95, so the picture cannot be checked here."
    near = int(((good["w01"] >= 0.5) & (good["w01"] <= 2.0)).sum())
    above = int((good["w02"] > 10).sum())
    verdict = ("matches the picture" if near == above == len(good) else
               "<b>does not match the picture</b> for the heads counted short of it")  # fmt: skip
    return (
        f"<b>This model</b> {verdict}: of its {len(good)} successful heads (s_acc &ge; 0.95), {near} have "
        f"w01 within a factor 2 of 1 and {above} have w02 &gt; 10 (median w02 {float(good['w02'].median()):.3g})."
    )
