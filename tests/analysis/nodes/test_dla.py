"""hc.dla: components sum to the logits exactly; each head's part matches TransformerLens's hook_result."""

import pytest
import torch
from helpers import jiggle
from transformer_lens import HookedTransformer, HookedTransformerConfig

import headcoop as hc
from headcoop.analysis.nodes.dla import DLAResult

ATOL = 1e-5


def count01(n_layers=1, positional=False):
    task = hc.Count01(positional=positional)
    model = task.model(seed=0, n_heads=4, d_model=8, d_head=2, n_layers=n_layers)
    return jiggle(model, skip=() if positional else ("pos_embed.W_pos",))


def reference_logits(model, tokens, pos):
    logits = model(tokens)
    return logits[torch.arange(len(tokens)), pos]


@pytest.mark.parametrize("n_layers", [1, 2])
@pytest.mark.parametrize("positional", [False, True])
def test_components_sum_to_logits(n_layers, positional):
    model = count01(n_layers, positional)
    batch = hc.Count01().sample(64, seed=3)
    result = hc.dla(model, batch)
    assert isinstance(result, DLAResult)
    assert result.values.shape == (64, len(result.components), 8)
    assert torch.equal(result.pos, batch.answer_pos)
    torch.testing.assert_close(
        result.total(), reference_logits(model, batch.tokens, batch.answer_pos), atol=ATOL, rtol=0
    )


def test_skip_pair_sums_to_logits():
    model = jiggle(hc.SkipPair().model(seed=0, n_heads=2, d_head=3), skip=hc.SkipPair().frozen_parameters())
    result = hc.dla(model)  # default: the task's signal-only clean batch
    clean = hc.SkipPair().patching_inputs()[0]
    torch.testing.assert_close(
        result.total(), reference_logits(model, clean.tokens, clean.answer_pos), atol=ATOL, rtol=0
    )
    assert result.vocab == hc.SkipPair().vocab


def test_float64_is_exact_to_rounding():
    model = count01(2, positional=True).to(torch.float64)
    batch = hc.Count01().sample(32, seed=4)
    result = hc.dla(model, batch)
    ref = reference_logits(model, batch.tokens, batch.answer_pos)
    assert (result.total() - ref).abs().max() < 1e-12


def test_component_names_and_order():
    result = hc.dla(count01(2), hc.Count01().sample(4))
    heads = [f"L{l}H{h}" for l in range(2) for h in range(4)]
    assert result.components == ["embed", "pos_embed", *heads[:4], "L0.b_O", *heads[4:], "L1.b_O", "b_U"]
    assert result.heads().shape == (4, 2, 4, 8)
    torch.testing.assert_close(result.heads()[:, 1, 2], result["L1H2"])


def test_heads_match_transformer_lens_hook_result():
    """Each head's component is TransformerLens's per-head result pushed through W_U (direct path)."""
    model = count01(2, positional=True)
    batch = hc.Count01().sample(16, seed=5)
    result = hc.dla(model, batch)
    model.set_use_attn_result(True)
    _, cache = model.run_with_cache(batch.tokens)
    model.set_use_attn_result(False)
    rows = torch.arange(16)
    for layer in range(2):
        head_out = cache[f"blocks.{layer}.attn.hook_result"][rows, batch.answer_pos]  # [batch, head, d_model]
        for head in range(4):
            torch.testing.assert_close(result[f"L{layer}H{head}"], head_out[:, head] @ model.W_U, atol=ATOL, rtol=0)
        torch.testing.assert_close(result[f"L{layer}.b_O"][0], model.blocks[layer].attn.b_O @ model.W_U)
    torch.testing.assert_close(result["embed"], model.W_E[batch.tokens[rows, batch.answer_pos]] @ model.W_U)
    torch.testing.assert_close(result["pos_embed"], model.W_pos[batch.answer_pos] @ model.W_U)
    torch.testing.assert_close(result["b_U"], model.b_U.expand(16, -1))


def test_default_tokens_and_pos():
    model = count01()
    clean = hc.Count01().patching_inputs()[0]
    default = hc.dla(model)
    explicit = hc.dla(model, clean)
    torch.testing.assert_close(default.values, explicit.values)
    assert torch.equal(default.pos, clean.answer_pos)


def test_pos_forms():
    model = count01(positional=True)
    tokens = torch.randint(0, 8, (6, 10), generator=torch.Generator().manual_seed(0))
    last = hc.dla(model, tokens)
    assert torch.equal(last.pos, torch.full((6,), 9))
    torch.testing.assert_close(last.total(), model(tokens)[:, -1], atol=ATOL, rtol=0)
    torch.testing.assert_close(hc.dla(model, tokens, pos=-3).total(), model(tokens)[:, 7], atol=ATOL, rtol=0)
    each = torch.tensor([0, 1, 2, 3, 4, 9])
    torch.testing.assert_close(
        hc.dla(model, tokens, pos=each).total(), model(tokens)[torch.arange(6), each], atol=ATOL, rtol=0
    )
    text = hc.dla(model, "0121=")
    torch.testing.assert_close(text.total(), model(hc.Count01().encode("0121="))[:, -1], atol=ATOL, rtol=0)


def test_logit_diff_matches_task_metric():
    model = count01()
    batch = hc.Count01().sample(32, seed=6)
    result = hc.dla(model, batch)
    diff = result.logit_diff()
    assert diff.shape == (32, len(result.components))
    torch.testing.assert_close(diff.sum(1), hc.Count01.logit_diff(model(batch.tokens), batch), atol=ATOL, rtol=0)
    # token strings, ids and per-example tensors are interchangeable
    by_name = result.logit_diff("5", "4")
    by_id = result.logit_diff(5, 4)
    by_tensor = result.logit_diff(torch.full((32,), 5), torch.full((32,), 4))
    torch.testing.assert_close(by_name, by_id)
    torch.testing.assert_close(by_name, by_tensor)
    torch.testing.assert_close(by_name, result.logit("5") - result.logit(4))


def test_dataframe_and_plot():
    result = hc.dla(count01(), hc.Count01().sample(8))
    df = result.to_dataframe()
    assert list(df.index) == result.components
    assert list(df.columns) == hc.Count01().vocab + ["logit_diff", "logit_diff_std"]
    assert df["logit_diff"].sum() == pytest.approx(result.logit_diff().sum(1).mean().item(), abs=1e-4)
    fig = result.plot()
    assert list(fig.data[0].x) == result.components
    fig = result.plot(token="5")
    assert fig.data[0].y == pytest.approx(result.logit("5").mean(0).tolist(), abs=1e-6)


def test_model_without_task():
    model = count01()
    del model.task
    tokens = torch.randint(0, 8, (3, 7), generator=torch.Generator().manual_seed(1))
    result = hc.dla(model, tokens)
    assert result.vocab == [str(i) for i in range(8)]
    torch.testing.assert_close(result.total(), model(tokens)[:, -1], atol=ATOL, rtol=0)
    with pytest.raises(ValueError, match="no headcoop task"):
        hc.dla(model)
    with pytest.raises(ValueError, match="needs answer and wrong"):
        result.logit_diff()


def test_bad_inputs():
    model = count01()
    batch = hc.Count01().sample(4)
    result = hc.dla(model, batch)
    with pytest.raises(ValueError, match="unknown component 'L9H9'; valid values are"):
        result["L9H9"]
    with pytest.raises(ValueError, match="unknown token 'x'; valid tokens are"):
        result.logit("x")
    with pytest.raises(ValueError, match="outside 0..7"):
        result.logit_diff(8, 4)
    with pytest.raises(ValueError, match="one token or one per example"):
        result.logit_diff(torch.tensor([4, 5]), 4)
    with pytest.raises(IndexError, match=r"pos 24 is out of range: these inputs have positions 0..23"):
        hc.dla(model, batch, pos=24)
    with pytest.raises(ValueError, match=r"one position per example \(4\)"):
        hc.dla(model, batch, pos=torch.tensor([1, 2]))
    with pytest.raises(TypeError, match="integer position"):
        hc.dla(model, batch, pos=1.5)
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        hc.dla(model, torch.tensor([[7, 0, 9]]))


def _config(**overrides):
    base = dict(n_layers=1, d_model=8, d_head=2, n_heads=2, n_ctx=6, d_vocab=5, attn_only=True, normalization_type=None)
    return HookedTransformerConfig(**{**base, **overrides})


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_refuses_models_it_cannot_decompose():
    """Soft-capped logits and blocks that normalise their outputs before the residual add have no exact
    decomposition: refused by name."""
    with pytest.raises(ValueError, match="soft-caps"):
        hc.dla(HookedTransformer(_config(output_logits_soft_cap=5.0)), torch.tensor([[0, 1, 2]]))
    with pytest.raises(ValueError, match="normalises each block's attention and MLP output"):
        hc.dla(HookedTransformer(_config(normalization_type="RMS", use_normalization_before_and_after=True)),
               torch.tensor([[0, 1, 2]]))  # fmt: skip


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_shortformer_has_no_pos_embed_component():
    torch.manual_seed(0)
    model = jiggle(HookedTransformer(_config(positional_embedding_type="shortformer", n_layers=2)))
    tokens = torch.randint(0, 5, (4, 6))
    result = hc.dla(model, tokens)
    assert "pos_embed" not in result.components
    torch.testing.assert_close(result.total(), model(tokens)[:, -1], atol=ATOL, rtol=0)
