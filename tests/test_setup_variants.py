"""Setup variants the sources leave open, as task options: Count01's heads-only readout (logits a linear
map of the concatenated head outputs, no embedding or bias path) and SkipPair's loss at every position."""

import math

import pytest
import torch
import torch.nn.functional as F

import headcoop as hc
from headcoop.tasks.skip_pair import NOISE

HEADS = hc.Count01(max_len=8, readout="heads")
SHAPE = dict(n_heads=4, d_model=8, d_head=2)


def held_zero(model) -> bool:
    """Every entry the heads-only readout holds is exactly zero."""
    held = model.task.held_entries(model)
    params = dict(model.named_parameters())
    biases = [model.unembed.b_U] + [block.attn.b_O for block in model.blocks]
    return all(bool((params[n][m] == 0).all()) for n, m in held.items()) and all(bool((b == 0).all()) for b in biases)


def test_heads_only_readout_is_a_linear_map_of_the_head_outputs(tmp_path):
    model = HEADS.model(seed=0, **SHAPE)
    assert model.cfg.model_name == "count01-L1-H4-d8-dh2-heads" and model.cfg.d_model == 8 + 4 * 2
    trained = hc.train(HEADS, model, steps=200, progress=False)
    (many,) = hc.train_many(HEADS, [SHAPE], seeds=[0], steps=200, progress=False)
    for m in (trained, many):
        assert held_zero(m)
        assert m.W_U[8:].abs().max() > 0 and m.W_E[:, :8].abs().max() > 0  # the rest did train
    same = [(a - b).abs().max().item() for (n, a), b in zip(trained.named_parameters(), many.parameters())
            if not n.endswith("b_K")]  # fmt: skip
    assert max(same) < 1e-5
    batch = HEADS.sample(64, seed=1)
    with torch.no_grad():
        logits, cache = trained.run_with_cache(batch.tokens)
        z = cache["blocks.0.attn.hook_z"]  # [batch, pos, head, d_head]
        by_heads = torch.einsum("bphd,hdm,mv->bpv", z, trained.W_O[0], trained.W_U)
    torch.testing.assert_close(logits, by_heads, atol=1e-4, rtol=1e-5)
    dla = hc.dla(trained, batch)
    values = dict(zip(dla.components, dla.values.transpose(0, 1)))
    for name in ("embed", "pos_embed", "L0.b_O", "b_U"):
        assert values[name].abs().max() == 0, name
    assert hc.evaluate(trained)["answer_acc"] > 0.9

    hc.save(trained, tmp_path / "ck")
    loaded = hc.load(tmp_path / "ck")
    assert loaded.task.readout == "heads" and held_zero(loaded)
    again = hc.train(loaded.task, loaded, steps=20, progress=False)  # training after load keeps the zeros
    assert held_zero(again)


def test_heads_only_runs_in_a_sweep_and_bad_values_are_named(tmp_path):
    table = hc.sweep(HEADS, {"n_heads": [2], "d_model": [4], "d_head": [2]}, [0], tmp_path, steps=5,
                     batch_size=16, warmup=1, progress=False)  # fmt: skip
    assert list(table["name"]) == ["count01-L1-H2-d4-dh2-heads-s0"]
    with pytest.raises(ValueError, match="unknown readout 'logits'"):
        hc.Count01(readout="logits")
    plain = hc.Count01(max_len=8).model(seed=0, **SHAPE)
    with pytest.raises(ValueError, match="readout='heads' needs a model built by this task's config"):
        HEADS.prepare(plain)
    assert hc.Count01().to_dict() == {"name": "count01", "params": {"min_len": 1, "max_len": 20,
                                      "include_ties": False, "positional": False}}  # fmt: skip


def test_skip_pair_loss_at_every_position():
    task = hc.SkipPair(loss_positions="all")
    batch = task.sample(16, seed=0)
    assert batch.loss_pos.shape == (16, task.seq_len) and (batch.targets[:, :-1] == -1).all()
    assert torch.equal(batch.targets[:, -1], batch.answer)
    model = task.model(seed=0)
    with torch.no_grad():
        logits = model(batch.tokens)
        logp = logits.log_softmax(-1)
        by_hand = torch.cat([-logp[:, :-1, NOISE[0]:].mean(-1),
                             -logp[torch.arange(16), -1, batch.answer][:, None]], 1).mean()  # fmt: skip
        torch.testing.assert_close(task.loss(logits, batch), by_hand)
        assert hc.evaluate(model)["noise_loss"] == pytest.approx(
            F.cross_entropy(model(task.sample(1024, seed=10_100, signal_fraction=0.0).tokens)[:, -1],
                            task.sample(1024, seed=10_100, signal_fraction=0.0).answer).item())  # fmt: skip
    trained = hc.train(task, task.model(seed=0), steps=300, progress=False)
    (many,) = hc.train_many(task, [dict()], seeds=[0], steps=300, progress=False)
    gap = max((a - b).abs().max().item() for (n, a), b in zip(trained.named_parameters(), many.parameters())
              if not n.endswith("b_K"))  # fmt: skip
    assert gap < 1e-4
    with torch.no_grad():  # the earlier positions learnt the uniform-over-noise target
        early = trained(task.sample(256, seed=5).tokens)[:, :-1].softmax(-1)[..., NOISE[0] :].sum(-1)
    assert early.mean() > 0.9
    assert hc.SkipPair().to_dict()["params"].keys() == {"seq_len", "signal_fraction", "mapping"}
    with pytest.raises(ValueError, match="unknown loss_positions 'every'"):
        hc.SkipPair(loss_positions="every")
    assert math.isclose(hc.evaluate(trained)["noise_loss_optimum"], math.log(7), rel_tol=1e-6)
