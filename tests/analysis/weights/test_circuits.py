"""hc.qk / hc.ov: tables reproduce the model's cached attention scores and, with the pattern, the head's DLA."""

import pytest
import torch
from helpers import jiggle
from transformer_lens import FactoredMatrix, HookedTransformer, HookedTransformerConfig

import headcoop as hc

ATOL = 1e-5


def make(kind, n_layers=1):
    if kind == "count01":
        return jiggle(
            hc.Count01().model(seed=0, n_heads=3, d_model=8, d_head=2, n_layers=n_layers), skip=("pos_embed.W_pos",)
        )
    if kind == "count01-pos":
        return jiggle(hc.Count01(positional=True).model(seed=0, n_heads=3, d_model=8, d_head=2, n_layers=n_layers))
    task = hc.SkipPair()
    return jiggle(task.model(seed=0, n_heads=2, d_head=3, n_layers=n_layers), skip=task.frozen_parameters())


def random_tokens(model, n=6, seed=0):
    return torch.randint(0, model.cfg.d_vocab, (n, model.cfg.n_ctx), generator=torch.Generator().manual_seed(seed))


KINDS = ["count01", "count01-pos", "skip-pair"]


@pytest.mark.parametrize("kind", KINDS)
def test_qk_reproduces_cached_scores(kind):
    model = make(kind)
    tokens = random_tokens(model)
    _, cache = model.run_with_cache(tokens)
    n_tok = model.cfg.d_vocab
    for head in range(model.cfg.n_heads):
        table = hc.qk(model, head)
        positional = kind == "count01-pos"
        assert table.positional == positional and not table.direct_path
        shape = (n_tok, model.cfg.n_ctx, n_tok, model.cfg.n_ctx) if positional else (n_tok, n_tok)
        assert table.scores.shape == shape
        cached = cache["blocks.0.attn.hook_attn_scores"][:, head]
        allowed = torch.ones(tokens.shape[1], tokens.shape[1], dtype=torch.bool).tril()
        ours = table.scores_for(tokens)
        torch.testing.assert_close(ours[:, allowed], cached[:, allowed], atol=ATOL, rtol=0)
        assert torch.isneginf(ours[:, ~allowed]).all() and torch.isneginf(cached[:, ~allowed]).all()
        # the same numbers by plain loops over the table
        b, q, k = 1, 5, 2
        if positional:
            assert torch.isclose(table.scores[tokens[b, q], q, tokens[b, k], k], cached[b, q, k], atol=ATOL)
        else:
            assert torch.isclose(table.scores[tokens[b, q], tokens[b, k]], cached[b, q, k], atol=ATOL)


@pytest.mark.parametrize("kind", KINDS)
def test_ov_with_pattern_reproduces_head_dla(kind):
    model = make(kind)
    tokens = random_tokens(model, seed=1)
    _, cache = model.run_with_cache(tokens)
    for head in range(model.cfg.n_heads):
        table = hc.ov(model, head)
        assert table.positional == (kind == "count01-pos")
        effects = table.effects_for(tokens)  # [batch, k_pos, vocab]
        pattern = cache["blocks.0.attn.hook_pattern"][:, head]  # [batch, q_pos, k_pos]
        for q in (0, 3, tokens.shape[1] - 1):
            dla = hc.dla(model, tokens, pos=q)[f"L0H{head}"]
            via_ov = torch.einsum("bk,bkv->bv", pattern[:, q], effects)
            torch.testing.assert_close(via_ov, dla, atol=ATOL, rtol=0)


@pytest.mark.parametrize("kind", ["count01", "count01-pos"])
def test_factored_matrices_are_the_bilinear_parts(kind):
    model = make(kind)
    attn = model.blocks[0].attn
    qk, ov = hc.qk(model, 1), hc.ov(model, 1)
    assert isinstance(qk.matrix, FactoredMatrix) and isinstance(ov.matrix, FactoredMatrix)
    x = model.W_E if kind == "count01" else (model.W_E[:, None] + model.W_pos[None]).flatten(0, 1)
    with torch.no_grad():
        q, k = x @ attn.W_Q[1], x @ attn.W_K[1]
        bias = (attn.b_Q[1] @ k.T)[None, :] + (q @ attn.b_K[1])[:, None] + attn.b_Q[1] @ attn.b_K[1]
        torch.testing.assert_close(
            qk.matrix.AB + bias / attn.attn_scale, qk.scores.reshape(len(x), len(x)), atol=ATOL, rtol=0
        )
        torch.testing.assert_close(
            ov.matrix.AB + attn.b_V[1] @ attn.W_O[1] @ model.W_U, ov.effects.reshape(len(x), -1), atol=ATOL, rtol=0
        )
    assert qk.matrix.mdim == 2 and ov.matrix.mdim == 2  # inner dimension d_head


def test_layer_one_is_the_direct_path():
    """Layer-1 tables equal the model's scores / head outputs when layer 0's attention output is zeroed."""
    model = make("count01-pos", n_layers=2)
    tokens = random_tokens(model, seed=2)
    zero = [("blocks.0.hook_attn_out", lambda act, hook: torch.zeros_like(act))]
    with model.hooks(fwd_hooks=zero):
        model.set_use_attn_result(True)
        _, cache = model.run_with_cache(tokens)
        model.set_use_attn_result(False)
    allowed = torch.ones(tokens.shape[1], tokens.shape[1], dtype=torch.bool).tril()
    for head in range(3):
        table = hc.qk(model, head, layer=1)
        assert table.direct_path and "direct path" in repr(table)
        cached = cache["blocks.1.attn.hook_attn_scores"][:, head]
        torch.testing.assert_close(table.scores_for(tokens)[:, allowed], cached[:, allowed], atol=ATOL, rtol=0)
        ov = hc.ov(model, head, layer=1)
        via_ov = torch.einsum("bqk,bkv->bqv", cache["blocks.1.attn.hook_pattern"][:, head], ov.effects_for(tokens))
        head_out = cache["blocks.1.attn.hook_result"][:, :, head] @ model.W_U
        torch.testing.assert_close(via_ov, head_out, atol=ATOL, rtol=0)


def test_positional_choice():
    model = make("count01")  # W_pos held at zero: token-only tables
    assert not hc.qk(model, 0).positional and not hc.ov(model, 0).positional
    forced = hc.qk(model, 0, positional=True)
    assert forced.scores.shape == (8, 24, 8, 24)
    torch.testing.assert_close(forced.scores[:, 3, :, 1], hc.qk(model, 0).scores)


def _config(**overrides):
    base = dict(n_layers=1, d_model=8, d_head=2, n_heads=2, n_ctx=6, d_vocab=5, attn_only=True, normalization_type=None)
    return HookedTransformerConfig(**{**base, **overrides})


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_shortformer_positions_reach_qk_but_not_ov():
    torch.manual_seed(0)
    model = jiggle(HookedTransformer(_config(positional_embedding_type="shortformer")))
    tokens = torch.randint(0, 5, (4, 6))
    _, cache = model.run_with_cache(tokens)
    table = hc.qk(model, 1)
    assert table.positional
    allowed = torch.ones(6, 6, dtype=torch.bool).tril()
    torch.testing.assert_close(
        table.scores_for(tokens)[:, allowed],
        cache["blocks.0.attn.hook_attn_scores"][:, 1][:, allowed],
        atol=ATOL,
        rtol=0,
    )
    ov = hc.ov(model, 1)
    assert not ov.positional
    via_ov = torch.einsum("bk,bkv->bv", cache["blocks.0.attn.hook_pattern"][:, 1, -1], ov.effects_for(tokens))
    torch.testing.assert_close(via_ov, hc.dla(model, tokens)["L0H1"], atol=ATOL, rtol=0)
    with pytest.raises(ValueError, match="does not reach this circuit"):
        hc.ov(model, 1, positional=True)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_refuses_unsupported_models():
    """What the tables cannot model is refused by name: QK norms, soft-capped logits, per-block output norms,
    and dense tables beyond MAX_TABLE_ENTRIES."""
    with pytest.raises(ValueError, match="normalises q and k per head"):
        hc.qk(HookedTransformer(_config(normalization_type="RMS", use_qk_norm=True)), 0)
    with pytest.raises(ValueError, match="soft-caps"):
        hc.ov(HookedTransformer(_config(output_logits_soft_cap=5.0)), 0)
    with pytest.raises(ValueError, match="normalises each block's attention"):
        hc.qk(HookedTransformer(_config(normalization_type="RMS", use_normalization_before_and_after=True)), 0)
    with pytest.raises(ValueError, match="dense table would hold"):
        hc.qk(HookedTransformer(_config(d_vocab=5000, n_ctx=64)), 0, positional=True)


def test_out_of_range():
    model = make("count01", n_layers=2)
    with pytest.raises(IndexError, match=r"heads 0\.\.2"):
        hc.qk(model, 3)
    with pytest.raises(IndexError, match=r"heads 0\.\.2"):
        hc.ov(model, head=-4)
    with pytest.raises(IndexError, match=r"layers 0\.\.1"):
        hc.qk(model, 0, layer=2)
    with pytest.raises(IndexError, match=r"layers 0\.\.1"):
        hc.ov(model, 0, layer=5)
    assert hc.qk(model, -1, layer=-1).head == 2


def test_labels_dataframes_and_plots():
    model = make("count01")
    qk, ov = hc.qk(model, 0), hc.ov(model, 0)
    vocab = hc.Count01().vocab
    assert qk.vocab == vocab and ov.vocab == vocab and ov.out_vocab == vocab
    df = qk.to_dataframe()
    assert list(df.index) == vocab and list(df.columns) == vocab
    assert df.loc["=", "1"] == pytest.approx(qk.scores[3, 1].item())
    assert ov.to_dataframe().loc["1", "5"] == pytest.approx(ov.effects[1, 5].item())
    fig = qk.plot()
    assert list(fig.data[0].x) == vocab and "L0H0" in fig.layout.title.text
    assert ov.plot().data[0].z.shape == (8, 8)
    with pytest.raises(ValueError, match="give both"):
        hc.qk(make("count01-pos"), 0).plot(q_pos=2)


def test_positional_dataframe_and_plots():
    model = make("count01-pos")
    qk, ov = hc.qk(model, 2), hc.ov(model, 2)
    df = qk.to_dataframe()
    assert len(df) == 8 * 8 * (24 * 25 // 2)  # causal pairs only
    row = df[(df.q_tok == "=") & (df.q_pos == 5) & (df.k_tok == "1") & (df.k_pos == 2)]
    assert row.score.item() == pytest.approx(qk.scores[3, 5, 1, 2].item())
    assert qk.plot(q_pos=5, k_pos=2).data[0].z.shape == (8, 8)
    full = qk.plot().data[0].z
    assert full.shape == (8 * 24, 8 * 24)
    assert torch.isnan(torch.as_tensor(full[0, 1]))  # key after query: blank
    assert ov.to_dataframe().shape == (8 * 24, 8)
    with pytest.raises(IndexError, match="out of range"):
        qk.plot(q_pos=30, k_pos=0)
