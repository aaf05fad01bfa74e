"""Save/load round trips, shipped checkpoints, and every way a checkpoint can be bad."""

import json

import pytest
import torch

import headcoop as hc
from headcoop.storage.checkpoints import META, SHIPPED, WEIGHTS


@pytest.fixture
def saved(tmp_path):
    task = hc.Count01(max_len=6)
    model = hc.train(task, task.model(seed=1, n_heads=2, d_model=4), steps=5, progress=False)
    return model, hc.save(model, tmp_path / "m")


def test_round_trip_is_exact(saved):
    model, path = saved
    loaded = hc.load(path)
    assert loaded.task == model.task
    for (n, p), (n2, q) in zip(model.named_parameters(), loaded.named_parameters()):
        assert n == n2 and torch.equal(p, q) and p.requires_grad == q.requires_grad
    tokens = model.task.sample(16, seed=0).tokens
    assert torch.equal(model(tokens), loaded(tokens))
    meta = json.loads((path / META).read_text())
    assert meta["train"]["steps"] == 5 and "answer_acc" in meta["metrics"] and meta["headcoop_version"]
    assert meta["task"] == {"name": "count01", "params": model.task.params()}


def test_skip_pair_round_trip_keeps_frozen_one_hot(tmp_path):
    task = hc.SkipPair(seq_len=6)
    model = task.model(seed=0, d_head=1)
    loaded = hc.load(hc.save(model, tmp_path / "sp", metrics={}))
    assert not loaded.embed.W_E.requires_grad and loaded.task.seq_len == 6


def test_save_overwrites_and_leaves_no_temp(saved, tmp_path):
    model, path = saved
    hc.save(model, path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_missing_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="no headcoop checkpoint"):
        hc.load(tmp_path / "absent")
    with pytest.raises(FileNotFoundError, match="shipped names"):
        hc.load("count02")


def test_damaged_weights(saved):
    _, path = saved
    (path / WEIGHTS).write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="SHA-256"):
        hc.load(path)


def test_truncated_weights(saved):
    _, path = saved
    data = (path / WEIGHTS).read_bytes()
    (path / WEIGHTS).write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="SHA-256"):
        hc.load(path)


def test_damaged_weights_of_a_checkpoint_without_checksum(saved):
    """Older checkpoints record no checksum: a warning says so, and a damaged file is still caught."""
    _, path = saved
    meta = json.loads((path / META).read_text())
    del meta["weights_sha256"]
    (path / META).write_text(json.dumps(meta))
    (path / WEIGHTS).write_bytes(b"not a safetensors file")
    with (
        pytest.warns(UserWarning, match="no weights checksum"),
        pytest.raises(ValueError, match="damaged weights file"),
    ):
        hc.load(path)


def test_damaged_json(saved):
    _, path = saved
    (path / META).write_text("{ not json")
    with pytest.raises(ValueError, match="damaged checkpoint metadata"):
        hc.load(path)


def test_config_that_does_not_match_weights(saved):
    _, path = saved
    meta = json.loads((path / META).read_text())
    meta["config"]["n_heads"] = 3
    (path / META).write_text(json.dumps(meta))
    with pytest.raises(
        ValueError,
        match=r"do not match its config: the config says n_heads=3, but the weights' blocks.0.attn.W_Q gives 2",
    ):
        hc.load(path)


def test_config_with_missing_weights(saved):
    _, path = saved
    meta = json.loads((path / META).read_text())
    meta["config"]["n_layers"] = 2
    (path / META).write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="the config says n_layers=2, but the weights' number of blocks gives 1"):
        hc.load(path)


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_checkpoints_load_offline_with_task(name):
    model = hc.load(name)
    assert model.task is not None
    meta = model.checkpoint_meta
    assert meta["config"]["n_layers"] == 1


def test_shipped_count01_is_the_primary_configuration_and_solves_the_task():
    model = hc.load("count01")
    assert (model.cfg.d_model, model.cfg.n_heads, model.cfg.d_head) == (32, 16, 2)
    metrics = hc.evaluate(model, n=4000, seed=123)
    assert metrics["answer_acc"] >= 0.995 and metrics["eos_acc"] >= 0.995


@pytest.mark.parametrize("name, d_head", [("skip-pair", 5), ("skip-pair-dhead1", 1)])
def test_shipped_skip_pair_solves_every_signal_pair(name, d_head):
    model = hc.load(name)
    assert (model.cfg.n_heads, model.cfg.d_head) == (2, d_head)
    metrics = hc.evaluate(model, n=200, seed=321)
    assert metrics["signal_acc"] == 1.0


def test_independent_count01_strings():
    """Strings built here by plain Python (not the project's sampler) are answered right."""
    import random

    model = hc.load("count01")
    task = model.task
    rng = random.Random(2024)
    texts, answers = [], []
    while len(texts) < 1000:
        w = "".join(rng.choice("012") for _ in range(rng.randint(1, 20)))
        if w.count("0") != w.count("1"):
            texts.append(w)
            answers.append("5" if w.count("1") > w.count("0") else "4")
    right = 0
    for w, a in zip(texts, answers):
        ids = task.encode(w + "=" + a)
        logits = model(ids[None])[0]
        right += task.vocab[logits[-2].argmax()] == a and task.vocab[logits[-1].argmax()] == "[EOS]"
    assert right / len(texts) >= 0.99


@pytest.mark.parametrize("name", ["skip-pair", "skip-pair-dhead1"])
def test_independent_skip_pair_contexts(name):
    """Every pair type, both orders, at random positions in random noise, built with plain Python."""
    import random

    model = hc.load(name)
    task = model.task
    rng = random.Random(7)
    mapping = {
        (1, 1): 5,
        (1, 2): 9,
        (1, 3): 1,
        (1, 4): 3,
        (2, 2): 11,
        (2, 3): 6,
        (2, 4): 2,
        (3, 3): 7,
        (3, 4): 10,
        (4, 4): 4,
    }
    rows, answers = [], []
    for (a, b), completion in mapping.items():
        for _ in range(60):
            context = [rng.randint(5, 11) for _ in range(task.seq_len - 1)]
            i, j = rng.sample(range(task.seq_len - 1), 2)
            context[i], context[j] = (a, b) if rng.random() < 0.5 else (b, a)
            rows.append(context + [0])
            answers.append(completion)
    logits = model(torch.tensor(rows))[:, -1]
    assert logits.argmax(-1).tolist() == answers


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize(
    "shape",
    [
        dict(positional_embedding_type="rotary", rotary_dim=2),
        dict(normalization_type="LN", attn_only=False, d_mlp=16, act_fn="gelu"),
        dict(normalization_type="RMS", positional_embedding_type="rotary", rotary_dim=2, n_key_value_heads=1),
        dict(positional_embedding_type="shortformer", normalization_type="LNPre"),
    ],
    ids=["rotary", "gelu-LN", "rotary-RMS-gqa", "shortformer-LNPre"],
)
def test_a_checkpoint_of_any_shape_round_trips_exactly(tmp_path, shape):
    """Trained with hc.train on a Count01 task, saved and loaded: equal weights, the same parameters
    frozen (a rotary model has no W_pos for Count01 to freeze; nothing else is frozen by loading)."""
    from transformer_lens import HookedTransformerConfig

    from headcoop.tasks.base import build_model

    task = hc.Count01(max_len=6)
    cfg = HookedTransformerConfig(**{**dict(n_layers=1, d_model=8, d_head=2, n_heads=2, n_ctx=task.n_ctx,
                                            d_vocab=task.d_vocab, attn_only=True), **shape})  # fmt: skip
    model = task.prepare(build_model(cfg, seed=0))
    model = hc.train(task, model, steps=3, batch_size=8, warmup=1, progress=False)
    loaded = hc.load(hc.save(model, tmp_path / "ckpt"))
    mine, theirs = dict(model.named_parameters()), dict(loaded.named_parameters())
    assert mine.keys() == theirs.keys()
    for name, param in mine.items():
        assert torch.equal(param, theirs[name]), name
        assert param.requires_grad == theirs[name].requires_grad, name
    assert loaded.task == task


def test_load_keeps_w_pos_trainable_when_it_was(tmp_path):
    task = hc.Count01(max_len=6)
    model = task.model(seed=0, n_heads=2, d_model=4)
    model.pos_embed.W_pos.requires_grad_(True)  # a user's choice: learn positions after all
    with torch.no_grad():
        model.pos_embed.W_pos.normal_()
    loaded = hc.load(hc.save(model, tmp_path / "ckpt"))
    assert loaded.pos_embed.W_pos.requires_grad
    assert torch.equal(loaded.pos_embed.W_pos, model.pos_embed.W_pos)
