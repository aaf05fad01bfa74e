"""hc.head_metrics against an independent computation from the weights (plain torch) and sklearn."""

import math

import pytest
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

import headcoop as hc
from headcoop.studies.count01 import COLUMNS

ZERO, ONE, TWO, EQ, FOUR, FIVE = 0, 1, 2, 3, 4, 5
N, SEED = 1200, 3


@pytest.fixture(scope="module")
def tiny():
    task = hc.Count01()
    return hc.train(task, task.model(seed=0, n_heads=4, d_model=8, d_head=2), steps=150, batch_size=128, progress=False)


@pytest.fixture(scope="module")
def shipped():
    return hc.load("count01")


def forward_by_hand(model, tokens):
    """Per layer: pattern [batch, head, q, k] and z [batch, pos, head, d_head], plus every layer's
    residual input, computed from the weights with plain torch (no hooks)."""
    W = model.W_E[tokens] + model.W_pos[: tokens.shape[1]]
    out, resid = [], W
    n = tokens.shape[1]
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    for block in model.blocks:
        a = block.attn
        q = torch.einsum("bpd,hde->bphe", resid, a.W_Q) + a.b_Q
        k = torch.einsum("bpd,hde->bphe", resid, a.W_K) + a.b_K
        v = torch.einsum("bpd,hde->bphe", resid, a.W_V) + a.b_V
        scores = torch.einsum("bqhe,bkhe->bhqk", q, k) / math.sqrt(a.cfg.d_head)
        pattern = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        z = torch.einsum("bhqk,bkhe->bqhe", pattern, v)
        out.append((pattern, z))
        resid = resid + torch.einsum("bphe,hed->bpd", z, a.W_O) + a.b_O
    return out


def reference(model, n=N, seed=SEED, l2=1e-3, test_fraction=0.25):
    """Every head_metrics column recomputed independently: rows in (layer, head) order."""
    task = hc.Count01()
    batch = task.sample(n, seed=seed)
    rows = torch.arange(n)
    eq = batch.answer_pos
    y = batch.labels.numpy()
    n_test = int(round(n * test_fraction))
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    test, train = perm[:n_test].sort().values.numpy(), perm[n_test:].sort().values.numpy()
    const = (model.W_E[EQ] + model.W_pos[eq] + sum(b.attn.b_O for b in model.blocks)) @ model.W_U + model.b_U
    direction = model.W_U[:, FIVE] - model.W_U[:, FOUR]
    out = []
    with torch.no_grad():
        layers = forward_by_hand(model, batch.tokens)
        for layer, (pattern, z) in enumerate(layers):
            a = model.blocks[layer].attn
            for h in range(model.cfg.n_heads):
                zh = z[rows, eq, h].double().numpy()
                mu, sd = zh[train].mean(0), zh[train].std(0)
                xs = (zh - mu) / sd
                clf = LogisticRegression(C=1 / (l2 * len(train)), tol=1e-12, max_iter=20_000).fit(xs[train], y[train])
                s_acc = clf.score(xs[test], y[test])
                auc = roc_auc_score(y[test], clf.decision_function(xs[test]))
                head_out = z[rows, eq, h] @ a.W_O[h]
                logits = head_out @ model.W_U + const
                l_acc = ((logits[:, FIVE] > logits[:, FOUR]).numpy() == (y == 1)).mean()
                push = (head_out @ direction).double().numpy()
                bias = (push[y == 1].mean() + push[y == 0].mean()) / 2
                # attention per key of each token at '=', averaged per string, then a geometric mean
                p = pattern[rows, h, eq].double()  # [batch, key]
                toks = batch.tokens
                per = {t: (p * (toks == t)).sum(1) / (toks == t).sum(1) for t in (ZERO, ONE, TWO)}
                has = {t: (toks == t).any(1) for t in (ZERO, ONE, TWO)}
                r01 = (per[ZERO] / per[ONE])[has[ZERO] & has[ONE]]
                r02 = ((per[ZERO] + per[ONE]) / 2 / per[TWO])[has[ZERO] & has[ONE] & has[TWO]]
                out.append(
                    dict(
                        s_acc=s_acc,
                        roc_auc=auc,
                        l_acc=l_acc,
                        bias_45=bias,
                        w01=r01.log().mean().exp().item(),
                        w02=r02.log().mean().exp().item(),
                        readout_45=(a.W_O[h] @ direction).norm().item(),
                    )  # fmt: skip
                )
    return out


@torch.no_grad()
def qk_by_hand(model, h):
    a = model.blocks[0].attn
    q = model.W_E[EQ] @ a.W_Q[h] + a.b_Q[h]
    k = model.W_E @ a.W_K[h] + a.b_K[h]
    s = (k @ q / math.sqrt(a.cfg.d_head)).double()
    return math.exp(s[ZERO] - s[ONE]), ((torch.exp(s[ZERO] - s[TWO]) + torch.exp(s[ONE] - s[TWO])) / 2).item()


def check_against_reference(model, df, n_test):
    ref = reference(model)
    assert len(df) == len(ref) == model.cfg.n_layers * model.cfg.n_heads
    for i, r in enumerate(ref):
        row = df.iloc[i]
        # the fits solve the same problem; allow one borderline held-out example to fall either way
        assert row.s_acc == pytest.approx(r["s_acc"], abs=1.01 / n_test)
        assert row.roc_auc == pytest.approx(r["roc_auc"], abs=2e-3)
        assert row.l_acc == pytest.approx(r["l_acc"], abs=1e-12)
        assert row.bias_45 == pytest.approx(r["bias_45"], rel=1e-4, abs=1e-4)
        assert row.w01 == pytest.approx(r["w01"], rel=1e-4)
        assert row.w02 == pytest.approx(r["w02"], rel=1e-4)
        assert row.readout_45 == pytest.approx(r["readout_45"], rel=1e-5)


@pytest.mark.parametrize("which", ["tiny", "shipped"])
def test_matches_independent_computation(which, request):
    model = request.getfixturevalue(which)
    df = hc.head_metrics(model, n=N, seed=SEED).to_dataframe()
    assert list(df.columns) == COLUMNS
    assert df.name.tolist() == [f"L0H{h}" for h in range(model.cfg.n_heads)]
    check_against_reference(model, df, n_test=int(round(N * 0.25)))
    for h in range(model.cfg.n_heads):
        w01, w02 = qk_by_hand(model, h)
        # without positions the ratio is the same in every string and equals the QK-table value
        assert df.w01[h] == pytest.approx(w01, rel=1e-4) and df.w01_qk[h] == pytest.approx(w01, rel=1e-4)
        assert df.w02[h] == pytest.approx(w02, rel=1e-4) and df.w02_qk[h] == pytest.approx(w02, rel=1e-4)
    assert (df.successful == (df.s_acc >= 0.95)).all()


def test_shipped_model_shows_the_headline_pattern(shipped):
    df = hc.head_metrics(shipped, n=2048, seed=0).to_dataframe()
    ok = df[df.successful]
    assert len(ok) >= len(df) // 2
    # most successful heads attend to '0' and '1' about equally
    assert ((ok.w01 > 0.5) & (ok.w01 < 2)).mean() >= 0.75


def test_two_layer_and_positional_models():
    task = hc.Count01()
    two = task.model(seed=1, n_heads=2, d_model=8, d_head=2, n_layers=2)
    df = hc.head_metrics(two, n=N, seed=SEED).to_dataframe()
    assert df.name.tolist() == ["L0H0", "L0H1", "L1H0", "L1H1"]
    check_against_reference(two, df, n_test=int(round(N * 0.25)))
    assert df.w01_qk[:2].notna().all() and df.w01_qk[2:].isna().all()

    pos_task = hc.Count01(positional=True)
    pos = pos_task.model(seed=2, n_heads=2, d_model=8, d_head=2)
    with torch.no_grad():
        pos.W_pos.normal_(0, 0.5, generator=torch.Generator().manual_seed(0))
    dfp = hc.head_metrics(pos, n=N, seed=SEED).to_dataframe()
    check_against_reference(pos, dfp, n_test=int(round(N * 0.25)))
    assert dfp.w01_qk.isna().all()


def test_model_without_task_needs_one(tiny):
    bare = hc.Count01().model(seed=0, n_heads=2, d_model=4, d_head=2)
    del bare.task
    with pytest.raises(ValueError, match="carries no headcoop task"):
        hc.head_metrics(bare).to_dataframe()
    assert len(hc.head_metrics(bare, task=hc.Count01(), n=256)) == 2


def test_bad_input(tiny):
    with pytest.raises(ValueError, match="Count01 quantities"):
        hc.head_metrics(tiny, task=hc.SkipPair())
    skip = hc.SkipPair().model(seed=0, n_heads=2, d_head=2)
    with pytest.raises(ValueError, match="needs a model with d_vocab 8 .* has d_vocab 12"):
        hc.head_metrics(skip, task=hc.Count01())
    with pytest.raises(ValueError, match="n must be >= 8, got 4"):
        hc.head_metrics(tiny, n=4).to_dataframe()
    with pytest.raises(ValueError, match="test_fraction"):
        hc.head_metrics(tiny, n=64, test_fraction=1.5).to_dataframe()
