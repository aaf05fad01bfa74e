"""Linear probes: agreement with scikit-learn (fits and ROC AUC), batched == one at a time, input errors."""

import numpy as np
import plotly.graph_objects as go
import pytest
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

import headcoop as hc
from headcoop.analysis.nodes.probes import fit_logistic, probe_features, roc_auc


@pytest.fixture(scope="module")
def trained():
    task = hc.Count01()
    model = task.model(seed=0, n_heads=4, d_model=8, d_head=2)
    return hc.train(task, model, steps=150, batch_size=128, progress=False)


@pytest.fixture(scope="module")
def batch():
    return hc.Count01().sample(600, seed=1)


def sklearn_probs(x_train, y_train, x_test, C):
    clf = LogisticRegression(C=C, tol=1e-12, max_iter=20_000)
    clf.fit(x_train.numpy(), y_train.numpy())
    return clf, clf.predict_proba(x_test.numpy())


def test_agrees_with_sklearn_on_trained_head_activations(trained, batch):
    l2 = 1e-3
    result = hc.probe(trained, batch, batch.labels, site="z", l2=l2)
    feats, names, *_ = probe_features(trained, batch, site="z")
    assert result.names == names == ["L0H0", "L0H1", "L0H2", "L0H3"]
    assert result.weight.shape == (4, 2) and result.bias.shape == (4,)
    assert result.converged.all()
    x = feats.double().transpose(0, 1)
    tr, te = result.train_index, result.test_index
    y = batch.labels
    ours = result.predict_proba(feats[te])  # [n_test, probe, 2]
    for p in range(4):
        z = (x[p] - result.mean[p]) / result.std[p]
        clf, theirs = sklearn_probs(z[tr], y[tr], z[te], C=1 / (l2 * len(tr)))
        np.testing.assert_allclose(ours[:, p].numpy(), theirs, atol=1e-5)
        assert result.acc[p].item() == pytest.approx(clf.score(z[te].numpy(), y[te].numpy()), abs=1e-12)
        assert result.train_acc[p].item() == pytest.approx(clf.score(z[tr].numpy(), y[tr].numpy()), abs=1e-12)
        assert result.roc_auc[p].item() == pytest.approx(roc_auc_score(y[te].numpy(), theirs[:, 1]), abs=1e-9)
        # standardised-space coefficients map back to the reported original-unit weights
        coef = clf.coef_[0] / result.std[p].numpy()
        np.testing.assert_allclose(coef, result.weight[p].numpy(), rtol=1e-4, atol=1e-6)
    # the trained model solves the task, so some head must carry the label linearly
    assert result.acc.max() > 0.9


@pytest.mark.parametrize("n_classes", [2, 3, 5])
@pytest.mark.parametrize("separation", [0.3, 8.0])  # overlapping classes / linearly separable classes
def test_fit_agrees_with_sklearn_on_synthetic_data(n_classes, separation):
    g = torch.Generator().manual_seed(n_classes)
    n, d, P, l2 = 240, 3, 3, 1e-3
    y = torch.randint(0, n_classes, (n,), generator=g)
    centers = torch.randn(n_classes, d, generator=g, dtype=torch.float64) * separation
    x = centers[y][None] + torch.randn(P, n, d, generator=g, dtype=torch.float64)
    x = (x - x.mean(1, keepdim=True)) / x.std(1, keepdim=True, unbiased=False)
    fit = fit_logistic(x, y, n_classes, l2=l2)
    assert fit.converged.all()
    for p in range(P):
        z = x[p] @ fit.weight[p].T + fit.bias[p]
        if n_classes == 2:
            z = torch.cat([torch.zeros_like(z), z], -1)
        ours = torch.softmax(z, -1).numpy()
        _, theirs = sklearn_probs(x[p], y, x[p], C=1 / (l2 * n))
        np.testing.assert_allclose(ours, theirs, atol=1e-5)
        assert (ours.argmax(1) == theirs.argmax(1)).all()
    if separation > 5:
        assert (torch.softmax(z, -1).argmax(1) == y).all()


def _mann_whitney_auc(scores, positive):
    """The ROC AUC headcoop computed by hand before it used scikit-learn: (sum of the positives' mid-ranks -
    n_pos (n_pos + 1) / 2) / (n_pos n_neg), tied scores sharing their average rank; kept as the reference
    the library's numbers must equal."""
    scores = scores.double()
    positive = torch.as_tensor(positive).bool().expand_as(scores)
    ordered = scores.sort(-1).values.contiguous()
    below = torch.searchsorted(ordered, scores.contiguous(), right=False)
    upto = torch.searchsorted(ordered, scores.contiguous(), right=True)
    midrank = (below + upto + 1).double() / 2
    n_pos = positive.sum(-1).double()
    n_neg = positive.shape[-1] - n_pos
    return ((midrank * positive).sum(-1) - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def test_roc_auc_is_unchanged_from_the_hand_written_one():
    """scikit-learn's numbers equal the Mann-Whitney ones headcoop shipped before, ties included."""
    g = torch.Generator().manual_seed(1)
    scores = torch.randint(0, 5, (7, 64), generator=g).double()
    labels = torch.randint(0, 2, (7, 64), generator=g).bool()
    torch.testing.assert_close(roc_auc(scores, labels), _mann_whitney_auc(scores, labels), rtol=0, atol=1e-12)
    smooth = torch.randn(3, 50, generator=g).double()
    torch.testing.assert_close(roc_auc(smooth, labels[0, :50]), _mann_whitney_auc(smooth, labels[0, :50]), rtol=0,
                               atol=1e-12)  # fmt: skip


def test_roc_auc_matches_sklearn_with_ties():
    g = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 4, (5, 101), generator=g).double()  # heavy ties
    labels = torch.randint(0, 2, (101,), generator=g).bool()
    ours = roc_auc(scores, labels)
    for p in range(5):
        assert ours[p].item() == pytest.approx(roc_auc_score(labels.numpy(), scores[p].numpy()), abs=1e-12)
    per_row = torch.randint(0, 2, (5, 101), generator=g).bool()
    ours = roc_auc(scores, per_row)
    for p in range(5):
        assert ours[p].item() == pytest.approx(roc_auc_score(per_row[p].numpy(), scores[p].numpy()), abs=1e-12)
    assert roc_auc(torch.tensor([1.0, 1.0, 2.0]), torch.tensor([0, 1, 1])).item() == pytest.approx(0.75)
    assert roc_auc(torch.zeros(4), torch.ones(4)).isnan()


def test_batched_fit_equals_one_head_at_a_time(trained, batch):
    every = hc.probe(trained, batch, site="z")
    for h in range(4):
        one = hc.probe(trained, batch, site="z", head=h)
        assert one.names == [f"L0H{h}"]
        torch.testing.assert_close(one.weight[0], every.weight[h], atol=1e-9, rtol=1e-7)
        assert one.acc[0] == every.acc[h] and one.roc_auc[0] == every.roc_auc[h]
    by_name = hc.probe(trained, batch, site="z", head="L0H2")
    torch.testing.assert_close(by_name.weight[0], every.weight[2], atol=1e-9, rtol=1e-7)


def test_features_read_the_cache_at_the_answer_position(trained, batch):
    _, cache = hc.run(trained, batch)
    rows = torch.arange(len(batch))
    feats, *_ = probe_features(trained, batch, site="z")
    torch.testing.assert_close(feats, cache["blocks.0.attn.hook_z"][rows, batch.answer_pos])
    feats, *_ = probe_features(trained, batch.tokens, site="resid_post", pos=batch.answer_pos)
    torch.testing.assert_close(feats[:, 0], cache["blocks.0.hook_resid_post"][rows, batch.answer_pos])
    feats, *_ = probe_features(trained, batch.tokens, site="result", pos=3)
    want = torch.einsum("bhd,hdm->bhm", cache["blocks.0.attn.hook_z"][:, 3], trained.W_O[0])
    torch.testing.assert_close(feats, want.detach())
    assert not feats.requires_grad
    feats, *_ = probe_features(trained, batch.tokens, site="k", head=1)  # default: last position
    torch.testing.assert_close(feats[:, 0], cache["blocks.0.attn.hook_k"][:, -1, 1])


def test_residual_sites_and_every_layer():
    task = hc.Count01()
    model = task.model(seed=0, n_heads=2, d_model=8, d_head=2, n_layers=2)
    data = task.sample(200, seed=0)
    result = hc.probe(model, data, site="resid_post", layer=None)
    assert result.names == ["L0", "L1"] and result.weight.shape == (2, 8)
    assert result.heads == [None, None]
    heads = hc.probe(model, data, site="z", layer=None)
    assert heads.names == ["L0H0", "L0H1", "L1H0", "L1H1"]
    one = hc.probe(model, data, site="v", head="L1H1")
    assert one.layers == [1] and one.heads == [1]
    assert hc.probe(model, data, site="embed").names == ["embed"]


def test_multiclass_softmax_probe_agrees_with_sklearn():
    task = hc.SkipPair()
    model = task.model(seed=0)
    data = task.sample(400, seed=0, signal_fraction=1.0)
    l2 = 1e-2
    result = hc.probe(model, data, site="resid_pre", pos=data.answer_pos, l2=l2)
    K = len(result.classes)
    assert K == 10 and result.weight.shape == (1, K, 12) and result.bias.shape == (1, K)
    feats, *_ = probe_features(model, data, site="resid_pre")
    x = feats[:, 0].double()
    z = (x - result.mean[0]) / result.std[0]
    tr, te = result.train_index, result.test_index
    clf, theirs = sklearn_probs(z[tr], data.labels[tr], z[te], C=1 / (l2 * len(tr)))
    np.testing.assert_allclose(result.predict_proba(feats[te])[:, 0].numpy(), theirs, atol=1e-4)
    assert result.acc[0].item() == pytest.approx(clf.score(z[te].numpy(), data.labels[te].numpy()))
    want_auc = roc_auc_score(data.labels[te].numpy(), theirs, multi_class="ovr", labels=list(range(K)))
    assert result.roc_auc[0].item() == pytest.approx(want_auc, abs=1e-4)


def test_dataframe_plot_and_split(trained, batch):
    result = hc.probe(trained, batch, test_fraction=0.25, seed=3)
    df = result.to_dataframe()
    assert list(df.columns) == ["name", "layer", "head", "acc", "roc_auc", "train_acc", "converged"]
    assert len(df) == 4 and df["head"].tolist() == [0, 1, 2, 3]
    assert len(result.test_index) == 150 and len(result.train_index) == 450
    assert set(result.test_index.tolist()).isdisjoint(result.train_index.tolist())
    again = hc.probe(trained, batch, test_fraction=0.25, seed=3)
    assert torch.equal(again.test_index, result.test_index) and torch.equal(again.weight, result.weight)
    other = hc.probe(trained, batch, test_fraction=0.25, seed=4)
    assert not torch.equal(other.test_index, result.test_index)
    fig = result.plot()
    assert isinstance(fig, go.Figure) and [t.name for t in fig.data] == ["accuracy", "ROC AUC"]


def test_text_tokens_and_labels_list(trained):
    texts = ["0011=", "1101=", "0001=", "1110=", "2012=", "1121=", "0020=", "2111="]
    result = hc.probe(trained, texts, [0, 1, 0, 1, 0, 1, 0, 1], site="z", test_fraction=0.5)
    assert len(result.names) == 4


def test_bad_inputs(trained, batch):
    with pytest.raises(ValueError, match=r"unknown site 'x'.*'z'.*'resid_post'"):
        hc.probe(trained, batch, site="x")
    with pytest.raises(IndexError, match=r"head 4 is out of range.*0\.\.3"):
        hc.probe(trained, batch, head=4)
    with pytest.raises(IndexError, match=r"layer 1 is out of range.*0\.\.0"):
        hc.probe(trained, batch, layer=1)
    with pytest.raises(ValueError, match=r"labels has length 5 but the tokens hold batch size 600"):
        hc.probe(trained, batch, torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="no head axis"):
        hc.probe(trained, batch, site="resid_pre", head=0)
    with pytest.raises(ValueError, match="single class"):
        hc.probe(trained, batch, torch.ones(600, dtype=torch.long))
    with pytest.raises(ValueError, match="labels are required"):
        hc.probe(trained, batch.tokens)
    with pytest.raises(IndexError, match=r"pos 40 is out of range.*0\.\.23"):
        hc.probe(trained, batch, pos=40)
    with pytest.raises(ValueError, match=r"one position per example \(600\)"):
        hc.probe(trained, batch, pos=torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="test_fraction"):
        hc.probe(trained, batch, test_fraction=1.0)
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        hc.probe(trained, torch.full((4, 5), 9), [0, 1, 0, 1])
    with pytest.raises(ValueError, match="'L<layer>H<head>'"):
        hc.probe(trained, batch, head="H3")
    with pytest.raises(ValueError, match="labels must be integers"):
        hc.probe(trained, batch, torch.rand(600))
