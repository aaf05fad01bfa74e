"""train_many against the slow references: HookedTransformer.forward + task.loss, and hc.train."""

import pytest
import torch
from transformer_lens import HookedTransformer

import headcoop as hc
from headcoop.models.fused import fused_logits, stack_parameters
from headcoop.training.fast import sample_streams, train_many

TINY = dict(n_heads=4, d_model=8, d_head=2)
CASES = {
    "count01-L1": (hc.Count01(), TINY),
    "count01-L2": (hc.Count01(), dict(TINY, n_layers=2)),
    "count01-pos-L1": (hc.Count01(positional=True), TINY),
    "count01-pos-L2": (hc.Count01(positional=True), dict(TINY, n_layers=2)),
    "skip-pair-L1": (hc.SkipPair(), dict(n_heads=2, d_head=3)),
    "skip-pair-L2": (hc.SkipPair(), dict(n_heads=2, d_head=3, n_layers=2)),
}
SETTINGS = dict(steps=5, batch_size=32, warmup=2, progress=False)


def reference_loss(model: HookedTransformer, task, batch) -> tuple[torch.Tensor, torch.Tensor]:
    logits = model(batch.tokens)
    return task.loss_logits(logits, batch), task.loss(logits, batch)


@pytest.mark.parametrize("case", sorted(CASES))
def test_fused_forward_matches_hooked_transformer(case):
    task, kw = CASES[case]
    models = train_many(task, [kw] * 3, seeds=[0, 1, 2], **SETTINGS)
    data = sample_streams(task, 48, [7, 8, 9])
    logits = fused_logits(stack_parameters(models), models[0].cfg, data.tokens, data.loss_pos)
    losses = task.row_loss(logits, data)
    for k, model in enumerate(models):
        ref_logits, ref_loss = reference_loss(model, task, task.sample(48, seed=7 + k))
        torch.testing.assert_close(logits[k], ref_logits, atol=1e-5, rtol=0)
        assert abs(losses[k].item() - ref_loss.item()) < 1e-5


@pytest.mark.parametrize("case", ["count01-L1", "count01-pos-L1", "count01-L2", "skip-pair-L1"])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_same_optimisation_as_train(case, weight_decay):
    """After a few steps train_many's weights are hc.train's. b_K is left out: its gradient is
    exactly zero (it shifts every score of a query equally), so in hc.train Adam amplifies
    float round-off into a random walk of size ~lr; train_many's one-layer path keeps it fixed."""
    task, kw = CASES[case]
    fast = train_many(task, [kw, kw], seeds=[3, 4], weight_decay=weight_decay, **SETTINGS)
    for model, seed in zip(fast, [3, 4]):
        slow = hc.train(task, task.model(seed=seed, **kw), seed=seed, weight_decay=weight_decay, **SETTINGS)
        fast_params = dict(model.named_parameters())
        for name, param in slow.named_parameters():
            if not name.endswith("b_K"):
                torch.testing.assert_close(fast_params[name], param, atol=1e-4, rtol=0, msg=name)
        assert model.train_settings == slow.train_settings
        assert [h["step"] for h in model.history] == [h["step"] for h in slow.history]
        for mine, theirs in zip(model.history, slow.history):
            assert abs(mine["loss"] - theirs["loss"]) < 1e-4 and abs(mine["acc"] - theirs["acc"]) < 1e-6


def test_one_layer_key_bias_stays_fixed_without_weight_decay():
    task = hc.Count01()
    before = task.model(seed=0, **TINY).blocks[0].attn.b_K.detach().clone()
    (model,) = train_many(task, [TINY], **SETTINGS)
    assert torch.equal(model.blocks[0].attn.b_K, before)


def test_deterministic_and_attributes():
    task = hc.Count01()
    a = train_many(task, [TINY, TINY], seeds=[5, 6], **SETTINGS)
    b = train_many(task, [TINY, TINY], seeds=[5, 6], **SETTINGS)
    for m, n in zip(a, b):
        for (name, p), q in zip(m.named_parameters(), n.parameters()):
            assert torch.equal(p, q), name
    assert a[0].task is task and not a[0].training
    assert a[0].train_settings == dict(
        steps=5, batch_size=32, lr=1e-2, weight_decay=0.0, warmup=2, schedule="cosine", seed=5
    )
    assert a[1].train_settings["seed"] == 6
    assert [h["step"] for h in a[0].history] == [0, 4]
    assert not torch.equal(a[0].blocks[0].attn.W_Q, a[1].blocks[0].attn.W_Q)


def test_frozen_parameters_unchanged(tmp_path):
    task = hc.SkipPair()
    start = task.model(seed=1, n_heads=2, d_head=3)
    frozen = {n: p.detach().clone() for n, p in start.named_parameters() if not p.requires_grad}
    assert sorted(frozen) == sorted(task.frozen_parameters())
    (model,) = train_many(task, [start], seeds=[1], **SETTINGS)
    assert model is start
    for name, p in model.named_parameters():
        if name in frozen:
            assert torch.equal(p, frozen[name]) and not p.requires_grad, name
    # and the Count01 W_pos held at zero, for a model trained with weight decay
    (count,) = train_many(hc.Count01(), [TINY], weight_decay=0.5, **SETTINGS)
    assert not count.pos_embed.W_pos.any() and not count.pos_embed.W_pos.requires_grad
    loaded = hc.load(hc.save(count, tmp_path / "m"))
    assert loaded.train_settings == count.train_settings and loaded.history == count.history


def test_items_of_every_kind_and_mixed_shapes_keep_input_order():
    task = hc.Count01()
    items = [
        dict(TINY, n_heads=2),
        task.config(**TINY),
        task.model(seed=11, **dict(TINY, d_model=4)),
        dict(TINY, n_layers=2),
        dict(TINY, n_heads=2),
    ]
    models = train_many(task, items, seeds=[0, 1, 11, 3, 4], **SETTINGS)
    assert models[2] is items[2]
    assert [(m.cfg.n_heads, m.cfg.d_model, m.cfg.n_layers) for m in models] == [
        (2, 8, 1), (4, 8, 1), (4, 4, 1), (4, 8, 2), (2, 8, 1)
    ]  # fmt: skip
    # each model equals the one trained alone with its own seed
    for item, seed, model in zip(items, [0, 1, 11, 3, 4], models):
        alone_item = item if not isinstance(item, HookedTransformer) else task.model(seed=11, **dict(TINY, d_model=4))
        (alone,) = train_many(task, [alone_item], seeds=[seed], **SETTINGS)
        for p, q in zip(model.parameters(), alone.parameters()):
            torch.testing.assert_close(p, q, atol=1e-6, rtol=0)


def test_bad_input():
    task = hc.Count01()
    with pytest.raises(ValueError, match="unknown count01 model setting.*'heads'.*valid ones"):
        train_many(task, [{"heads": 2}], **SETTINGS)
    with pytest.raises(ValueError, match="got 1 seeds for 2 models"):
        train_many(task, [TINY, TINY], seeds=[0], **SETTINGS)
    with pytest.raises(TypeError, match="each seed must be an int, got 0.5"):
        train_many(task, [TINY], seeds=[0.5], **SETTINGS)
    with pytest.raises(TypeError, match="train_many items must be"):
        train_many(task, ["count01"], **SETTINGS)
    with pytest.raises(ValueError, match="at least one"):
        train_many(task, [], **SETTINGS)
    with pytest.raises(ValueError, match="steps must be >= 1, got 0"):
        train_many(task, [TINY], steps=0)
    with pytest.raises(ValueError, match="needs d_vocab 8"):
        train_many(task, [hc.SkipPair().model(seed=0)], **SETTINGS)
    model = task.model(seed=0, **TINY)
    with pytest.raises(ValueError, match="more than once"):
        train_many(task, [model, model], **SETTINGS)
    cfg = task.config(**TINY)
    cfg.attn_only, cfg.d_mlp, cfg.act_fn = False, 8, "relu"
    with pytest.raises(ValueError, match="attn_only=False.*Use hc.train"):
        train_many(task, [cfg], **SETTINGS)


def test_groups_with_different_seed_sets_each_read_their_own_streams():
    """A group whose seeds are 0..k-1 must not be handed every stream when another group has more seeds."""
    task = hc.SkipPair()
    items = [dict(n_heads=1, d_head=1), dict(n_heads=2, d_head=1), dict(n_heads=2, d_head=1)]
    together = hc.train_many(task, items, seeds=[0, 0, 1], steps=3, progress=False)
    alone = hc.train_many(task, items[:1], seeds=[0], steps=3, progress=False)
    for p, q in zip(together[0].parameters(), alone[0].parameters()):
        assert torch.allclose(p, q, atol=1e-6)


def test_a_task_with_its_own_objective_trains_the_same_with_train_and_train_many():
    """A task that overrides row_loss (cross-entropy with the answer position weighted 3x) is trained by
    train_many through that objective, with no check of which methods it overrides: hc.train and
    train_many end with the same weights (b_K aside, see test_same_optimisation_as_train), and those
    differ from the weights the standard objective gives."""
    import headcoop as hc

    class Weighted(hc.Count01):
        def row_loss(self, row_logits, batch):
            targets = batch.targets.to(row_logits.device).expand(row_logits.shape[:-1])
            ce = torch.nn.functional.cross_entropy(row_logits.flatten(0, -2), targets.flatten(), reduction="none").view(
                targets.shape
            )  # [*copies, batch, n_loss]: answer, then [EOS]
            return (ce * torch.tensor([3.0, 1.0], device=ce.device)).mean((-1, -2))

    settings = dict(steps=12, batch_size=16, lr=1e-2, warmup=2, progress=False)
    weighted, plain = Weighted(max_len=6), hc.Count01(max_len=6)
    one = hc.train(weighted, weighted.model(seed=3, n_heads=2, d_model=4), seed=3, **settings)
    (many,) = train_many(weighted, [dict(n_heads=2, d_model=4)], seeds=[3], **settings)
    (standard,) = train_many(plain, [dict(n_heads=2, d_model=4)], seeds=[3], **settings)
    many_params, standard_params = dict(many.named_parameters()), dict(standard.named_parameters())
    for name, param in one.named_parameters():
        if not name.endswith("b_K"):
            torch.testing.assert_close(many_params[name], param, atol=1e-5, rtol=0, msg=name)
    assert (many_params["blocks.0.attn.W_O"] - standard_params["blocks.0.attn.W_O"]).abs().max() > 1e-3


def test_checkpoint_callback_sees_the_weights_and_changes_nothing():
    task = hc.Count01(max_len=6)
    items = [dict(n_heads=2, d_model=4, d_head=2), dict(n_heads=1, d_model=4, d_head=2)]
    seen = []

    def record(step, models):
        seen.append((step, [m.W_Q.detach().clone() for m in models]))

    with_cb = hc.train_many(task, items, seeds=[0, 1], steps=30, batch_size=16, progress=False, on_checkpoint=record,
                            checkpoint_every=10)  # fmt: skip
    plain = hc.train_many(task, items, seeds=[0, 1], steps=30, batch_size=16, progress=False)
    assert [step for step, _ in seen] == [10, 20, 30]
    for a, b in zip(with_cb, plain):
        assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert all(torch.equal(w, m.W_Q) for w, m in zip(seen[-1][1], with_cb))
    assert not torch.equal(seen[0][1][0], seen[-1][1][0])
    with pytest.raises(ValueError, match="together"):
        hc.train_many(task, items, steps=2, progress=False, on_checkpoint=record)
    with pytest.raises(ValueError, match="checkpoint_every"):
        hc.train_many(task, items, steps=2, progress=False, on_checkpoint=record, checkpoint_every=0)
