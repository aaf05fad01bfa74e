"""`layer` means the same thing in every function that takes it: None selects every layer, an int that
layer; an int head names that head in each selected layer; a name or (layer, head) carries its layer, and
contradicting `layer` is a ValueError everywhere; a function about one head refuses a selection of several."""

import pytest
import torch

import headcoop as hc
from headcoop.analysis.nodes.attention import attention_data


@pytest.fixture(scope="module")
def deep():
    return hc.Count01(max_len=6).model(seed=0, n_heads=3, d_model=6, d_head=2, n_layers=2)


@pytest.fixture(scope="module")
def batch():
    return hc.Count01(max_len=6).sample(64, seed=0)


def test_patch(deep, batch):
    clean, corrupt = batch, hc.Count01(max_len=6).corrupt(batch)
    every = hc.patch(deep, head=1, clean=clean, corrupt=corrupt)
    one = hc.patch(deep, head=1, layer=1, clean=clean, corrupt=corrupt)
    assert every.values.shape == (2, 1) and one.values.shape == (1, 1)
    torch.testing.assert_close(every.values[1], one.values[0])
    with pytest.raises(ValueError, match="layer=0 was passed"):
        hc.patch(deep, head="L1H1", layer=0, clean=clean, corrupt=corrupt)


def test_probe(deep, batch):
    assert hc.probe(deep, batch, site="z").names == ["L0H0", "L0H1", "L0H2", "L1H0", "L1H1", "L1H2"]
    assert hc.probe(deep, batch, site="z", head=1).names == ["L0H1", "L1H1"]
    assert hc.probe(deep, batch, site="z", head=1, layer=1).names == ["L1H1"]
    assert hc.probe(deep, batch, site="z", head="L1H2").names == ["L1H2"]
    with pytest.raises(ValueError, match="layer=0 was passed"):
        hc.probe(deep, batch, site="z", head="L1H2", layer=0)


def test_ablate_and_set_attention_select_like_patch(deep, batch):
    def zeroed(**kw):
        seen = {}
        hooks = [
            (f"blocks.{lay}.attn.hook_z", lambda z, hook, lay=lay: seen.setdefault(lay, z.clone())) for lay in (0, 1)
        ]
        with hc.ablate(deep, how="zero", **kw):
            deep.run_with_hooks(batch.tokens, fwd_hooks=hooks)
        return {lay: [h for h in range(3) if not z[:, :, h].any()] for lay, z in seen.items()}

    assert zeroed(heads=1) == {0: [1], 1: [1]}
    assert zeroed(heads=1, layer=1) == {0: [], 1: [1]}
    assert zeroed(heads="L0H2") == {0: [2], 1: []}
    with pytest.raises(ValueError, match="layer=1 was passed"):
        with hc.ablate(deep, heads="L0H2", layer=1):
            pass
    with pytest.raises(ValueError, match="layer=1 was passed"):
        with hc.set_attention(deep, head="L0H2", layer=1, tokens={"0": 1.0}):
            pass


def test_one_head_functions_refuse_several(deep):
    with pytest.raises(ValueError, match="expected one head.*L0H1, L1H1"):
        hc.qk(deep, head=1)
    with pytest.raises(ValueError, match="expected one head"):
        hc.ov(deep, head=1)
    assert (hc.qk(deep, head=1, layer=1).layer, hc.qk(deep, head="L1H1").layer) == (1, 1)
    one_layer = hc.Count01().model(seed=0, n_heads=2, d_model=4, d_head=2)
    assert hc.qk(one_layer, head=1).layer == 0  # a one-layer model: an int head is one head


def test_attention_views_every_layer(deep, batch):
    assert [h.split(",")[0] for h, _ in attention_data(deep, batch)] == ["layer 0", "layer 1"]
    assert [h.split(",")[0] for h, _ in attention_data(deep, batch, layer=1)] == ["layer 1"]
    with pytest.raises(IndexError, match="layers 0..1"):
        attention_data(deep, batch, layer=2)


@pytest.mark.parametrize("call", ["patch", "probe", "qk", "ablate", "attention"])
def test_a_layer_out_of_range_is_the_same_error_everywhere(deep, batch, call):
    clean, corrupt = batch, hc.Count01(max_len=6).corrupt(batch)
    run = {
        "patch": lambda: hc.patch(deep, layer=5, clean=clean, corrupt=corrupt),
        "probe": lambda: hc.probe(deep, batch, layer=5),
        "qk": lambda: hc.qk(deep, head=0, layer=5),
        "ablate": lambda: hc.ablate(deep, heads=0, layer=5).__enter__(),
        "attention": lambda: hc.attention(deep, batch, layer=5),
    }[call]
    with pytest.raises(IndexError, match=r"layer 5 is out of range: this model has layers 0..1"):
        run()


@pytest.mark.parametrize("call", ["dla", "probe"])
def test_a_position_out_of_range_is_the_same_error_everywhere(deep, batch, call):
    width = batch.tokens.shape[1]
    run = {"dla": lambda: hc.dla(deep, batch, pos=width), "probe": lambda: hc.probe(deep, batch, pos=width)}[call]
    with pytest.raises(IndexError, match=f"pos {width} is out of range"):
        run()
