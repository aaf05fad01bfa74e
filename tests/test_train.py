"""Training: loss only at the loss positions, deterministic, history kept."""

import pytest
import torch

import headcoop as hc


def test_training_is_deterministic_and_learns():
    task = hc.Count01(max_len=8)
    a = hc.train(task, task.model(seed=0, n_heads=4, d_model=8), steps=150, seed=3, progress=False)
    b = hc.train(task, task.model(seed=0, n_heads=4, d_model=8), steps=150, seed=3, progress=False)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert a.history[-1]["loss"] < a.history[0]["loss"] / 4
    assert a.train_settings["steps"] == 150 and a.task is task
    assert hc.evaluate(a)["answer_acc"] > 0.9


def test_frozen_weights_stay_fixed():
    task = hc.SkipPair()
    model = hc.train(task, task.model(seed=0, d_head=2), steps=20, progress=False)
    assert torch.equal(model.embed.W_E, torch.eye(12)) and (model.unembed.b_U == 0).all()
    count = hc.train(hc.Count01(), hc.Count01().model(seed=0, n_heads=2, d_model=4), steps=20, progress=False)
    assert (count.pos_embed.W_pos == 0).all()


def test_loss_ignores_everything_but_loss_positions():
    task = hc.Count01()
    batch = task.sample(8, seed=0)
    logits = torch.randn(8, task.n_ctx, 8)
    noisy = logits.clone()
    keep = torch.zeros_like(noisy, dtype=torch.bool)
    keep[torch.arange(8)[:, None], batch.loss_pos] = True
    noisy[~keep] = 1e3
    assert torch.allclose(task.loss(logits, batch), task.loss(noisy, batch))


@pytest.mark.parametrize(
    "kwargs, match", [(dict(steps=0), "steps"), (dict(batch_size=-2), "batch_size"), (dict(lr=0), "lr")]
)
def test_bad_training_arguments(kwargs, match):
    task = hc.Count01()
    with pytest.raises(ValueError, match=match):
        hc.train(task, task.model(seed=0, n_heads=1, d_model=2), progress=False, **kwargs)


def test_evaluate_needs_a_task_for_a_foreign_model():
    from headcoop.tasks.base import build_model

    model = build_model(hc.Count01().config(n_heads=1, d_model=2), seed=0)
    with pytest.raises(ValueError, match="carries no task"):
        hc.evaluate(model)
    assert set(hc.evaluate(model, hc.Count01(), n=64)) >= {"answer_acc", "eos_acc"}


def test_skip_pair_evaluate_reports_every_pair_and_noise_optimum():
    task = hc.SkipPair()
    metrics = task.evaluate(task.model(seed=0), n=16)
    assert {f"acc_{a}{b}" for a, b in task.pairs} <= set(metrics)
    assert metrics["noise_loss_optimum"] == pytest.approx(torch.log(torch.tensor(7.0)).item())
