"""hc.composition against the scores computed from dense weight matrices."""

import pytest
import torch
from helpers import attn_only_2l_like

import headcoop as hc

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@torch.no_grad()
def dense(model, a, i, b, j, mode):
    def ov(lay, h):
        return model.W_V[lay, h] @ model.W_O[lay, h]

    def qk(lay, h):
        return model.W_Q[lay, h] @ model.W_K[lay, h].T

    right = {"Q": qk(b, j), "K": qk(b, j).T, "V": ov(b, j)}[mode]
    left = ov(a, i)
    return float((left @ right).norm() / (left.norm() * right.norm()))


def test_scores_match_dense_weights():
    model = hc.Count01(max_len=6).model(seed=2, n_heads=2, d_model=8, d_head=2, n_layers=3)
    result = hc.composition(model)
    frame = result.to_dataframe()
    assert len(frame) == 3 * (2 * 2) * 3  # 3 later-layer pairs of layers x 4 head pairs x 3 modes
    for _, row in frame.sample(12, random_state=0).iterrows():
        a, i = int(row.sender[1]), int(row.sender[3])
        b, j = int(row.receiver[1]), int(row.receiver[3])
        assert row.score == pytest.approx(dense(model, a, i, b, j, row["mode"]), rel=1e-4)
    assert result.assumptions == () and "composition" in result.plot().layout.annotations[0].text


def test_layernorm_is_folded_on_a_copy():
    model = attn_only_2l_like()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = hc.composition(model, mode="K")
    assert list(result.scores) == ["K"] and "folded" in repr(result)
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name  # the model itself is untouched
    with pytest.raises(ValueError, match="unknown mode"):
        hc.composition(model, mode="O")
