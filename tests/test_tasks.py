"""The two tasks exactly as design.md specifies them."""

import itertools
import re

import pytest
import torch

import headcoop as hc
from headcoop.tasks.count01 import BOS, EOS, EQ


# --- Count01 ---------------------------------------------------------------------------
def test_count01_vocab_order():
    assert hc.Count01().vocab == ["0", "1", "2", "=", "4", "5", "[EOS]", "[BOS]"]


def test_count01_encode_decode_roundtrip():
    task = hc.Count01()
    ids = task.encode("0121=")
    assert ids.tolist() == [BOS, 0, 1, 2, 1, EQ]
    assert task.decode(ids) == "[BOS]0121="
    assert task.encode("[BOS]0 1 2=5[EOS]").tolist() == [BOS, 0, 1, 2, EQ, 5, EOS]
    assert task.decode(task.encode(task.decode(ids))).startswith("[BOS]0121=")


@pytest.mark.parametrize("text, symbol, pos", [("01x2", "x", 2), ("3", "3", 0), ("01[PAD]", "[", 2)])
def test_count01_unknown_symbol_names_symbol_and_position(text, symbol, pos):
    with pytest.raises(ValueError, match=re.escape(f"unknown symbol '{symbol}' at position {pos}")):
        hc.Count01().encode(text)


def test_count01_decode_rejects_ids_outside_vocab():
    with pytest.raises(ValueError, match="id 9 is outside the vocabulary 0..7"):
        hc.Count01().decode([7, 9])


def _strings(batch):
    """(w, answer symbol) of each example, read back from the tokens."""
    out = []
    for row, eq in zip(batch.tokens.tolist(), batch.answer_pos.tolist()):
        assert row[0] == BOS and row[eq] == EQ and row[eq + 2] == EOS
        assert all(t == EOS for t in row[eq + 2 :])
        out.append(("".join(map(str, row[1:eq])), row[eq + 1]))
    return out


def test_count01_sample_labels_lengths_and_loss_positions():
    task = hc.Count01()
    batch = task.sample(2000, seed=3)
    assert batch.tokens.shape == (2000, 24)
    lengths = set()
    for (w, answer), label, loss_pos, targets in zip(
        _strings(batch), batch.labels.tolist(), batch.loss_pos.tolist(), batch.targets.tolist()
    ):
        assert set(w) <= {"0", "1", "2"} and 1 <= len(w) <= 20
        lengths.add(len(w))
        assert w.count("1") != w.count("0")  # ties excluded by default
        more_ones = w.count("1") > w.count("0")
        assert label == int(more_ones) and answer == (5 if more_ones else 4)
        assert loss_pos == [len(w) + 1, len(w) + 2]
        assert targets == [answer, EOS]
    assert lengths == set(range(1, 21))
    assert batch.answer.tolist() == batch.targets[:, 0].tolist()
    assert ((batch.answer == 4) ^ (batch.wrong == 4)).all()


def test_count01_symbols_roughly_uniform_and_ties_optional():
    task = hc.Count01(include_ties=True, min_len=4, max_len=4)
    batch = task.sample(4000, seed=0)
    ws = [w for w, _ in _strings(batch)]
    counts = [sum(w.count(s) for w in ws) for s in "012"]
    assert max(counts) / min(counts) < 1.1
    ties = [(w, a) for w, a in _strings(batch) if w.count("0") == w.count("1")]
    assert ties and all(a == 4 for _, a in ties)


def test_count01_sampling_is_seeded():
    task = hc.Count01()
    assert torch.equal(task.sample(64, seed=5).tokens, task.sample(64, seed=5).tokens)
    assert not torch.equal(task.sample(64, seed=5).tokens, task.sample(64, seed=6).tokens)


def test_count01_corrupt_swaps_zeros_and_ones():
    task = hc.Count01()
    clean = task.sample(500, seed=1)
    bad = task.corrupt(clean)
    for (w, a), (w2, a2) in zip(_strings(clean), _strings(bad)):
        assert w2 == w.translate(str.maketrans("01", "10"))
        assert a2 == 9 - a
    assert torch.equal(bad.answer, clean.wrong) and torch.equal(bad.wrong, clean.answer)
    assert torch.equal(bad.labels, 1 - clean.labels)
    assert torch.equal(task.corrupt(bad).tokens, clean.tokens)


def test_count01_config_and_model():
    task = hc.Count01()
    cfg = task.config()
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.d_head, cfg.d_vocab) == (1, 32, 16, 2, 8)
    assert cfg.attn_only and cfg.normalization_type is None
    model = task.model(seed=0)
    assert model.task is task
    assert (model.pos_embed.W_pos == 0).all() and not model.pos_embed.W_pos.requires_grad
    positional = hc.Count01(positional=True).model(seed=0)
    assert positional.pos_embed.W_pos.requires_grad and positional.pos_embed.W_pos.abs().sum() > 0
    a, b = task.model(seed=1, n_heads=2, d_model=4), task.model(seed=1, n_heads=2, d_model=4)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(n_heads=0), ValueError, "n_heads must be >= 1, got 0"),
        (dict(d_model=-1), ValueError, "d_model must be >= 1"),
        (dict(d_head=1.5), TypeError, "d_head must be an int, got 1.5"),
        (dict(n_heads=True), TypeError, "n_heads must be an int"),
    ],
)
def test_count01_bad_config(kwargs, error, message):
    with pytest.raises(error, match=message):
        hc.Count01().config(**kwargs)


def test_count01_bad_lengths():
    with pytest.raises(ValueError, match="min_len"):
        hc.Count01(min_len=5, max_len=3)


def test_later_tokens_cannot_reach_loss_positions():
    task = hc.Count01()
    model = task.model(seed=0, n_heads=2, d_model=8)
    batch = task.sample(32, seed=0)
    changed = batch.tokens.clone()
    rows = torch.arange(32)
    changed[rows, batch.answer_pos + 2] = 2  # what follows the answer
    a = task.loss_logits(model(batch.tokens), batch)
    b = task.loss_logits(model(changed), batch)
    assert torch.allclose(a, b)


# --- SkipPair ---------------------------------------------------------------------------
def test_skip_pair_vocab_and_mapping():
    task = hc.SkipPair()
    assert task.vocab == [str(i) for i in range(12)]
    assert sorted(task.mapping) == list(itertools.combinations_with_replacement(range(1, 5), 2))
    assert task.mapping[(1, 4)] == 3 and task.mapping[(3, 3)] == 7
    assert len(set(task.mapping.values())) == 10


@pytest.mark.parametrize(
    "mapping, match",
    [
        ({(1, 1): 5}, "cover all 10 pairs"),
        ({**hc.SkipPair().mapping, (1, 5): 2}, "not a pair"),
        ({**hc.SkipPair().mapping, (1, 1): 3}, "distinct"),
    ],
)
def test_skip_pair_bad_mapping(mapping, match):
    with pytest.raises(ValueError, match=match):
        hc.SkipPair(mapping=mapping)


def test_skip_pair_encode_decode():
    task = hc.SkipPair()
    assert task.encode("5 3 11 1 0").tolist() == [5, 3, 11, 1, 0]
    assert task.decode(task.encode("5,3, 11 1 0")) == "5 3 11 1 0"
    with pytest.raises(ValueError, match="unknown symbol '12' at token position 2"):
        task.encode("5 3 12 0")


def test_skip_pair_sample():
    task = hc.SkipPair(seq_len=9, signal_fraction=0.5)
    batch = task.sample(4000, seed=0)
    assert batch.tokens.shape == (4000, 9)
    signal = batch.labels >= 0
    assert 0.45 < signal.float().mean() < 0.55
    for row, answer, label in zip(batch.tokens.tolist(), batch.answer.tolist(), batch.labels.tolist()):
        if label >= 0:
            assert row[-1] == 0
            sig = [t for t in row[:-1] if 1 <= t <= 4]
            assert len(sig) == 2 and all(5 <= t <= 11 for t in row[:-1] if t not in sig)
            assert answer == task.mapping[tuple(sorted(sig))]
            assert task.pairs[label] == tuple(sorted(sig))
        else:
            assert all(5 <= t <= 11 for t in row) and 5 <= answer <= 11
    assert (batch.loss_pos == 8).all() and torch.equal(batch.targets[:, 0], batch.answer)
    repeats = [(r.count(t)) for r, lab in zip(batch.tokens.tolist(), batch.labels.tolist()) if lab >= 0 for t in (3,)]
    assert 2 in repeats  # repeated pairs such as {3, 3} occur


def test_skip_pair_fixed_pair_and_all_pairs_occur():
    task = hc.SkipPair()
    batch = task.sample(100, seed=0, pair=(4, 1))
    assert (batch.answer == 3).all()
    labels = task.sample(2000, seed=1, signal_fraction=1.0).labels
    assert set(labels.tolist()) == set(range(10))


def test_skip_pair_corrupt_changes_one_signal_token_and_completion():
    task = hc.SkipPair()
    clean = task.sample(500, seed=2)
    bad = task.corrupt(clean)
    signal = clean.labels >= 0
    diff = (clean.tokens != bad.tokens).sum(1)
    assert (diff[signal] == 1).all() and (diff[~signal] == 0).all()
    assert (bad.answer[signal] != clean.answer[signal]).all()
    for row, answer in zip(bad.tokens[signal].tolist(), bad.answer[signal].tolist()):
        sig = [t for t in row[:-1] if 1 <= t <= 4]
        assert answer == task.mapping[tuple(sorted(sig))]
    assert torch.equal(bad.wrong[signal], clean.answer[signal])


def test_skip_pair_model_is_one_hot_and_frozen():
    task = hc.SkipPair()
    model = task.model(seed=0, d_head=1)
    eye = torch.eye(12)
    assert torch.equal(model.embed.W_E, eye) and torch.equal(model.unembed.W_U, eye)
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen == {"embed.W_E", "pos_embed.W_pos", "unembed.W_U", "unembed.b_U"}
    with pytest.raises(ValueError, match="d_model must be 12"):
        task.config(d_model=11)


def test_metric_is_mean_logit_difference():
    task = hc.SkipPair()
    model = task.model(seed=0)
    batch = task.sample(16, seed=0, signal_fraction=1.0)
    logits = model(batch.tokens)
    by_hand = torch.stack([logits[i, -1, batch.answer[i]] - logits[i, -1, batch.wrong[i]] for i in range(16)]).mean()
    assert torch.allclose(task.metric(logits, batch), by_hand)


def test_task_round_trips_through_dict():
    for task in (hc.Count01(max_len=12, include_ties=True), hc.SkipPair(seq_len=7, signal_fraction=0.3)):
        assert hc.task_from_dict(task.to_dict()) == task
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        hc.task_from_dict({"name": "nope"})


def test_the_task_metric_keeps_leading_copy_axes():
    """hc.patch scores its stacked copies with one call of Task.metric: [copies, batch, pos, vocab] -> [copies]."""
    task = hc.Count01(max_len=6)
    batch = task.sample(5, seed=0)
    logits = torch.randn(3, 2, 5, task.n_ctx, task.d_vocab)
    values = task.metric(logits, batch)
    assert values.shape == (3, 2)
    for i in range(3):
        for j in range(2):
            torch.testing.assert_close(values[i, j], task.metric(logits[i, j], batch))
    assert task.logit_diff(logits, batch).shape == (3, 2, 5)
