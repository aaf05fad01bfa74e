"""Linear probes: L2-regularised logistic (softmax) regression on any hook site, every head at once.

`probe(model, tokens, labels, site="z")` reads one activation vector per example (at `pos`), splits
the examples into train / held-out by a seeded shuffle, standardises the features on the train split
and fits one probe per head (or per layer, on residual sites) in a single batched Newton solve.

The objective of one probe, on standardised features x_i (d of them) and labels y_i in 0..K-1, is

    f(W, b) = (1 / n_train) * sum_i CE(y_i, softmax(logits_i)) + (l2 / 2) * ||W||_F^2

with the bias b not penalised. Binary probes (K = 2) have one weight vector: logits_i = [0, x_i.w + b]
(the usual sigmoid). Probes over K > 2 classes are softmax regressions with one weight row per class.
Multiplying f by C * n_train shows it is scikit-learn's `LogisticRegression` objective
C * sum_i CE_i + ||W||^2 / 2 (its lbfgs/newton solvers leave the intercept unpenalised) with

    C = 1 / (l2 * n_train).
"""

from __future__ import annotations

import dataclasses
import warnings

import pandas as pd
import plotly.graph_objects as go
import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens.utilities import get_act_name

from headcoop.analysis.engine.inputs import as_tokens, check_choice, layers_of, parse_heads, read_positions
from headcoop.analysis.vocabulary import HEAD_SITES, RESID_SITES, SITES, Site, head_name, layer_name
from headcoop.checks import check_finite
from headcoop.models.tl import HookedTransformer
from headcoop.storage.results import Result
from headcoop.tasks.base import Batch, generator


# --------------------------------------------------------------------------------------------
# features
# --------------------------------------------------------------------------------------------
def probe_features(
    model: HookedTransformer, tokens, site: Site = "z", head=None, layer: int | None = None, pos=None
) -> tuple[Float[Tensor, "batch probe d_feature"], list[str], list[int], list[int | None]]:
    """The activations one probe per head (head sites) or per layer (residual sites) reads.

    site:  "z", "q", "k", "v", "result" (per head; "result" = z @ W_O[head], without b_O, as
           TransformerLens's hook_result) or "resid_pre", "resid_post", "attn_out", "embed" (no head
           axis; "embed" is hook_embed, the token embedding, and ignores `layer`).
    head:  None (every head of the layer(s)), or heads in any form `hc.ablate` takes: an int (that head in
           each selected layer), (layer, head), "L0H3", or a list.
    layer: an int, or None for every layer (the same in every function that takes a layer).
    pos:   read-out position, an int or a [batch] tensor; default: a Batch's answer_pos, else the last.

    Returns (features [batch, probe, d_feature], names, layers, heads) with one probe per
    (layer, head) in (layer, head) order; heads are None on residual sites.
    """
    check_choice("site", site, SITES)
    check_finite(model, "hc.probe")
    toks = as_tokens(model, tokens)
    if site in RESID_SITES and head is not None:
        raise ValueError(f"site {site!r} has no head axis; pass head=None (head sites are {list(HEAD_SITES)})")
    if site == "embed":
        layers = [0]
    elif head is None:
        layers = layers_of(model, layer)
    else:
        pairs = parse_heads(model, head, layer)
        layers = sorted({lay for lay, _ in pairs})
    heads_of = {lay: list(range(model.cfg.n_heads)) for lay in layers}
    if head is not None:
        heads_of = {lay: [h for la, h in pairs if la == lay] for lay in layers}
    hook_site = "z" if site == "result" else site
    hook_names = [get_act_name("embed")] if site == "embed" else [get_act_name(hook_site, lay) for lay in layers]
    pos_index = read_positions(tokens, toks, pos)

    with torch.no_grad():
        _, cache = model.run_with_cache(toks, names_filter=lambda name: name in hook_names)
    rows = torch.arange(toks.shape[0], device=toks.device)
    feats, names, out_layers = [], [], []
    out_heads: list[int | None] = []
    for lay, hook_name in zip(layers, hook_names):
        act = cache[hook_name][rows, pos_index]  # [batch, (head,) d]
        if site in RESID_SITES:
            feats.append(act[:, None])
            names.append("embed" if site == "embed" else layer_name(lay))
            out_layers.append(lay)
            out_heads.append(None)
            continue
        if act.shape[1] != model.cfg.n_heads:
            raise ValueError(
                f"site {site!r} has {act.shape[1]} heads, not n_heads={model.cfg.n_heads} "
                "(grouped-query attention is not supported)"
            )
        heads = heads_of[lay]
        act = act[:, heads]
        if site == "result":
            act = torch.einsum("bhd,hdm->bhm", act, model.blocks[lay].attn.W_O[heads].detach())
        feats.append(act)
        names += [head_name(lay, h) for h in heads]
        out_layers += [lay] * len(heads)
        out_heads += heads
    return torch.cat(feats, 1), names, out_layers, out_heads


# --------------------------------------------------------------------------------------------
# ROC AUC
# --------------------------------------------------------------------------------------------
def roc_auc(scores: Float[Tensor, "*probe n"], positive: Tensor) -> Float[Tensor, " *probe"]:
    """Area under the ROC curve of `scores` against the boolean labels `positive` ([n] or [*probe, n]), by
    scikit-learn's `roc_auc_score` per probe (tied scores count 1/2); NaN where all labels are equal."""
    from sklearn.metrics import roc_auc_score

    scores = scores.double().cpu()
    positive = torch.as_tensor(positive).bool().cpu().expand_as(scores)
    flat_scores, flat_labels = (
        scores.reshape(-1, scores.shape[-1]).numpy(),
        positive.reshape(-1, scores.shape[-1]).numpy(),
    )
    out = [roc_auc_score(y, s) if 0 < y.sum() < len(y) else float("nan") for s, y in zip(flat_scores, flat_labels)]
    return torch.tensor(out, dtype=torch.float64).reshape(scores.shape[:-1])


# --------------------------------------------------------------------------------------------
# the batched fit
# --------------------------------------------------------------------------------------------
@dataclasses.dataclass
class LogisticFit:
    """Solution of a batched fit: weight [probe, M, d], bias [probe, M] (M = 1 for binary, else K)."""

    weight: Tensor
    bias: Tensor
    n_iter: int
    converged: Tensor
    grad_norm: Tensor


def _logits(theta: Tensor, x1: Tensor, binary: bool) -> Tensor:
    z = torch.einsum("pnd,pmd->pnm", x1, theta)
    return torch.cat([torch.zeros_like(z), z], -1) if binary else z


def fit_logistic(
    x: Float[Tensor, "probe n d"],
    y: Int[Tensor, " n"],
    n_classes: int,
    l2: float = 1e-3,
    max_iter: int = 100,
    tol: float = 1e-8,
) -> LogisticFit:
    """Minimise, for every probe p at once, (1/n) sum_i CE(y_i, softmax(logits_pi)) + (l2/2) ||W_p||^2.

    x: [probe, n, d] features (used as given: standardise before), y: [n] labels 0..n_classes-1.
    Binary problems (n_classes == 2) have logits [0, x.w + b]; otherwise one row of W per class.
    Damped Newton in float64 over the stacked problem: one batched Hessian solve per iteration,
    a backtracking (Armijo) line search per probe, stopping when every gradient's max-norm is < tol.
    """
    if n_classes < 2:
        raise ValueError(f"need at least 2 classes, got {n_classes}")
    dev = x.device if x.device.type != "mps" else torch.device("cpu")
    x = x.to(dev, torch.float64)
    P, n, d = x.shape
    binary = n_classes == 2
    M = 1 if binary else n_classes
    D = d + 1
    x1 = torch.cat([x, torch.ones(P, n, 1, dtype=x.dtype, device=dev)], -1)
    y = torch.as_tensor(y, device=dev).long()
    target = torch.nn.functional.one_hot(y, n_classes).double()
    target_free = target[:, 1:] if binary else target  # [n, M]
    penal = torch.ones(D, dtype=x.dtype, device=dev)
    penal[-1] = 0.0  # the bias is not penalised

    def objective(theta):
        z = _logits(theta, x1, binary)
        ce = (torch.logsumexp(z, -1) - (z * target).sum(-1)).mean(-1)
        return ce + 0.5 * l2 * (theta[..., :d] ** 2).sum((-1, -2))

    theta = torch.zeros(P, M, D, dtype=x.dtype, device=dev)
    eye = torch.eye(M * D, dtype=x.dtype, device=dev)
    done = torch.zeros(P, dtype=torch.bool, device=dev)
    grad_norm = torch.full((P,), float("inf"), dtype=x.dtype, device=dev)
    n_iter = 0
    for n_iter in range(1, max_iter + 1):
        prob = torch.softmax(_logits(theta, x1, binary), -1)
        prob_free = prob[..., 1:] if binary else prob  # [P, n, M]
        grad = torch.einsum("pnm,pnd->pmd", prob_free - target_free, x1) / n + l2 * theta * penal
        grad_norm = grad.abs().flatten(1).amax(1)
        done = grad_norm < tol
        if done.all():
            break
        # Hessian of the CE term: sum_n x x^T (diag(p) - p p^T) over the free classes
        curv = torch.diag_embed(prob_free) - prob_free[..., :, None] * prob_free[..., None, :]
        hess = torch.einsum("pni,pnab,pnj->paibj", x1, curv, x1) / n
        hess = hess.reshape(P, M * D, M * D) + torch.diag_embed((l2 * penal).repeat(M)) + 1e-12 * eye
        step = -torch.linalg.solve(hess, grad.reshape(P, M * D, 1)).reshape(P, M, D)
        step = torch.where(done[:, None, None], 0.0, step)
        f0 = objective(theta)
        slope = (grad * step).sum((-1, -2))
        t = torch.ones(P, dtype=x.dtype, device=dev)
        accepted = done.clone()
        for _ in range(50):
            trial = objective(theta + t[:, None, None] * step)
            accepted = accepted | (trial <= f0 + 1e-4 * t * slope)
            if accepted.all():
                break
            t = torch.where(accepted, t, t / 2)
        t = torch.where(accepted, t, 0.0)  # a probe whose step found no decrease stays put
        if not accepted.any():
            break
        theta = theta + t[:, None, None] * step
    return LogisticFit(weight=theta[..., :d], bias=theta[..., d], n_iter=n_iter, converged=done, grad_norm=grad_norm)


# --------------------------------------------------------------------------------------------
# the result
# --------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ProbeResult(Result):
    """Probes fitted by `probe`, one per head (or per layer on residual sites).

    names:     ["L0H0", ...] (head sites) or ["L0", ...] / ["embed"] (residual sites)
    layers, heads: the (layer, head) of each probe; heads are None on residual sites
    classes:   [K] the label values, in the order of the probability columns
    weight:    float64, original feature units: [probe, d_feature] when K == 2 (the logit of
               classes[1]), else [probe, K, d_feature] (softmax logits)
    bias:      [probe] or [probe, K]
    acc, roc_auc, train_acc: [probe] held-out accuracy, held-out ROC AUC (K > 2: macro average of
               one-vs-rest AUCs over the classes present in the held-out split), train accuracy
    mean, std: [probe, d_feature] the train-split standardisation the fit used
    train_index, test_index: example indices of the two splits
    converged: [probe] whether the Newton solve reached its gradient tolerance
    """

    site: str
    names: list[str]
    layers: list[int]
    heads: list[int | None]
    classes: Tensor
    weight: Tensor
    bias: Tensor
    acc: Tensor
    roc_auc: Tensor
    train_acc: Tensor
    mean: Tensor
    std: Tensor
    train_index: Tensor
    test_index: Tensor
    converged: Tensor
    n_iter: int
    l2: float

    @property
    def binary(self) -> bool:
        return len(self.classes) == 2

    def logits(self, features: Float[Tensor, "batch probe d_feature"]) -> Float[Tensor, "batch probe K"]:
        """Softmax logits (binary: [0, w.x + b]) of every probe on [batch, probe, d_feature] features."""
        x = features.to(self.weight.device, torch.float64)
        if self.binary:
            z = torch.einsum("bpd,pd->bp", x, self.weight) + self.bias
            return torch.stack([torch.zeros_like(z), z], -1)
        return torch.einsum("bpd,pkd->bpk", x, self.weight) + self.bias

    def predict_proba(self, features: Float[Tensor, "batch probe d_feature"]) -> Float[Tensor, "batch probe K"]:
        """Class probabilities [batch, probe, K] (float64) of every probe on raw features."""
        return torch.softmax(self.logits(features), -1)

    def predict(self, features: Float[Tensor, "batch probe d_feature"]) -> Tensor:
        """Predicted label values [batch, probe]."""
        return self.classes[self.logits(features).argmax(-1).cpu()]

    def to_dataframe(self) -> pd.DataFrame:
        """One row per probe: name, layer, head, acc, roc_auc, train_acc, converged."""
        return pd.DataFrame(
            {
                "name": self.names,
                "layer": self.layers,
                "head": pd.array(self.heads, dtype="Int64"),
                "acc": self.acc.tolist(),
                "roc_auc": self.roc_auc.tolist(),
                "train_acc": self.train_acc.tolist(),
                "converged": self.converged.tolist(),
            }
        )

    def plot(self, title: str | None = None) -> go.Figure:
        """Plotly bars of held-out accuracy and ROC AUC per probe (chance level dashed)."""
        fig = go.Figure(
            [
                go.Bar(name="accuracy", x=self.names, y=self.acc.tolist()),
                go.Bar(name="ROC AUC", x=self.names, y=self.roc_auc.tolist()),
            ]
        )
        fig.add_hline(y=0.5, line_dash="dash", line_color="gray")
        fig.update_layout(
            barmode="group",
            title=title or f"linear probes on {self.site} (held-out, {len(self.test_index)} examples)",
            yaxis=dict(range=[0, 1.02], title="held-out score"),
            xaxis_title="probe",
        )
        return fig

    def __repr__(self) -> str:
        best = int(self.acc.argmax())
        return (
            f"ProbeResult(site={self.site!r}, {len(self.names)} probes, {len(self.classes)} classes, "
            f"best {self.names[best]} acc={self.acc[best]:.3f} auc={self.roc_auc[best]:.3f})"
        )


# --------------------------------------------------------------------------------------------
# probe
# --------------------------------------------------------------------------------------------
def split_indices(n: int, test_fraction: float, seed: int) -> tuple[Int[Tensor, " n_train"], Int[Tensor, " n_test"]]:
    """Deterministic train / held-out split of range(n): a seeded shuffle, the first part held out."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must lie strictly between 0 and 1, got {test_fraction!r}")
    n_test = int(round(n * test_fraction))
    if n_test < 1 or n - n_test < 2:
        raise ValueError(
            f"{n} examples with test_fraction={test_fraction} leave {n_test} held out and {n - n_test} to train"
        )
    perm = torch.randperm(n, generator=generator(seed))
    return perm[n_test:].sort().values, perm[:n_test].sort().values


def probe(
    model: HookedTransformer,
    tokens,
    labels=None,
    site: Site = "z",
    head=None,
    layer: int | None = None,
    pos=None,
    test_fraction: float = 0.25,
    seed: int = 0,
    l2: float = 1e-3,
    max_iter: int = 100,
    tol: float = 1e-8,
) -> ProbeResult:
    """Logistic-regression probes of `labels` from the activations at `site`, one per head.

    tokens: a Batch, text(s) or [batch, pos] ids (see `as_tokens`).
    labels: [batch] integer labels; default: the Batch's `labels`. Two classes: logistic regression;
            more: softmax regression.
    site:   head sites "z", "q", "k", "v", "result" (one probe per head) or residual sites
            "resid_pre", "resid_post", "attn_out", "embed" (one probe per layer).
    head:   None: every head of the layer(s), all fitted in one batched Newton solve; or heads as
            `hc.ablate` takes them (an int: that head in each selected layer; (layer, head); "L0H3"; a list).
    layer:  an int, or None for every layer.
    pos:    read-out position, an int or a [batch] tensor; default: the Batch's answer_pos, else
            the last position.
    test_fraction, seed: the held-out share and the seed of the shuffle that chooses it.
    l2:     penalty of (l2/2)||W||^2 added to the mean cross-entropy over the train split, on the
            standardised features; scikit-learn's LogisticRegression(C=1 / (l2 * n_train)) on the
            same standardised features solves the same problem. The bias is not penalised.
    max_iter, tol: Newton iteration cap and gradient max-norm tolerance (a warning if unmet).

    Features are standardised with the train split's mean and standard deviation (constant
    features are left unscaled); `weight` and `bias` are reported back in original units.
    Returns a ProbeResult (acc, roc_auc, train_acc per probe; `.to_dataframe()`, `.plot()`).
    Long: the docstring documents each argument; the body is 66 lines.
    """
    if labels is None:
        if not isinstance(tokens, Batch):
            raise ValueError("labels are required unless tokens is a Batch (whose labels are used)")
        labels = tokens.labels
    features, names, layers, heads = probe_features(model, tokens, site=site, head=head, layer=layer, pos=pos)
    if isinstance(labels, (list, tuple)) and any(isinstance(x, str) for x in labels):
        raise TypeError(f"labels must be integer class ids, got strings such as {next(x for x in labels if isinstance(x, str))!r}; "
                        "map them to ids first, e.g. [classes.index(x) for x in labels]")  # fmt: skip
    try:
        labels = torch.as_tensor(labels).cpu()
    except (TypeError, ValueError, RuntimeError) as err:
        raise TypeError(
            f"labels must be a [batch] vector of integer class ids, got {type(labels).__name__} ({err})"
        ) from None
    if labels.ndim != 1:
        raise ValueError(f"labels must be a [batch] vector, got shape {tuple(labels.shape)}")
    if labels.dtype.is_floating_point:
        if not torch.equal(labels, labels.round()):
            raise ValueError("labels must be integers (class ids)")
        labels = labels.long()
    n = features.shape[0]
    if len(labels) != n:
        raise ValueError(f"labels has length {len(labels)} but the tokens hold batch size {n}")
    if not l2 >= 0:
        raise ValueError(f"l2 must be non-negative, got {l2!r}")

    classes, y = torch.unique(labels, return_inverse=True)
    K = len(classes)
    if K < 2:
        raise ValueError(f"labels hold a single class {classes.tolist()}; a probe needs at least 2")
    train_idx, test_idx = split_indices(n, test_fraction, seed)
    missing = sorted(set(range(K)) - set(y[train_idx].tolist()))
    if missing:
        raise ValueError(
            f"the train split holds no example of class(es) {classes[missing].tolist()}; use more examples"
        )

    x = features.detach().to(torch.float64).cpu().transpose(0, 1)  # [probe, batch, d]
    x_train = x[:, train_idx]
    mean = x_train.mean(1)
    std = x_train.std(1, unbiased=False)
    std = torch.where(std > 1e-12 * (1 + mean.abs()), std, torch.ones_like(std))
    fit = fit_logistic((x_train - mean[:, None]) / std[:, None], y[train_idx], K, l2=l2, max_iter=max_iter, tol=tol)
    if not fit.converged.all():
        bad = [names[i] for i in (~fit.converged).nonzero().flatten().tolist()]
        warnings.warn(
            f"probe fit did not reach tol={tol} within {max_iter} Newton steps for {bad} "
            f"(max gradient {fit.grad_norm.max().item():.2e}); separable data with tiny l2 diverges",
            stacklevel=2,
        )

    weight = fit.weight / std[:, None]  # [probe, M, d]
    bias = fit.bias - (fit.weight * (mean / std)[:, None]).sum(-1)
    if K == 2:
        weight, bias = weight[:, 0], bias[:, 0]
    result = ProbeResult(
        site=site, names=names, layers=layers, heads=heads, classes=classes, weight=weight, bias=bias,
        acc=torch.zeros(0), roc_auc=torch.zeros(0), train_acc=torch.zeros(0), mean=mean, std=std,
        train_index=train_idx, test_index=test_idx, converged=fit.converged, n_iter=fit.n_iter, l2=float(l2),
    )  # fmt: skip
    proba_test = result.predict_proba(x[:, test_idx].transpose(0, 1))  # [n_test, probe, K]
    proba_train = result.predict_proba(x_train.transpose(0, 1))
    return dataclasses.replace(  # built whole: the scores come from the fitted probes' own predictions
        result,
        acc=(proba_test.argmax(-1) == y[test_idx, None]).double().mean(0),
        train_acc=(proba_train.argmax(-1) == y[train_idx, None]).double().mean(0),
        roc_auc=_auc(proba_test, y[test_idx], K),
    )


def _auc(proba: Float[Tensor, "n probe K"], y: Int[Tensor, " n"], K: int) -> Float[Tensor, " probe"]:
    """Binary: AUC of P(classes[1]); K > 2: macro one-vs-rest AUC over the classes present in y."""
    if K == 2:
        return roc_auc(proba[..., 1].T, y == 1)
    present = [k for k in range(K) if 0 < (y == k).sum() < len(y)]
    if not present:
        return torch.full((proba.shape[1],), float("nan"), dtype=torch.float64)
    return torch.stack([roc_auc(proba[..., k].T, y == k) for k in present]).mean(0)
