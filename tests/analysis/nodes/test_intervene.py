"""Attention interventions: the imposed pattern against a plain-loop reference, its downstream effect, errors."""

import pytest
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

import headcoop as hc

PATTERN = "blocks.0.attn.hook_pattern"
ZERO, ONE, TWO = 0, 1, 2


@pytest.fixture(scope="module")
def model():
    return hc.Count01().model(seed=0, n_heads=4, d_model=8, d_head=2)


@pytest.fixture(scope="module")
def batch():
    return hc.Count01().sample(24, seed=2)


def hooks_left(model):
    return sum(len(hp.fwd_hooks) + len(hp._forward_hooks) for hp in model.hook_dict.values()) + len(
        model.embed._forward_pre_hooks
    )


def loop_reference(own, tokens, weight_of, others):
    """The documented rules, one row and one key at a time. own: [batch, q, k]; weight_of: {id: w}."""
    out = own.clone().double()
    batch, n_q, _ = own.shape
    for b in range(batch):
        for q in range(n_q):
            keys = range(q + 1)
            listed = [k for k in keys if tokens[b, k].item() in weight_of]
            row = torch.zeros(own.shape[-1], dtype=torch.float64)
            if others == "model":
                mass = sum(own[b, q, k].item() for k in listed)
                total_w = sum(weight_of[tokens[b, k].item()] for k in listed)
                for k in keys:
                    if k in listed:
                        row[k] = mass * weight_of[tokens[b, k].item()] / total_w if total_w > 0 else 0.0
                    else:
                        row[k] = own[b, q, k].item()
            else:
                for k in keys:
                    row[k] = weight_of[tokens[b, k].item()] if k in listed else others
            out[b, q] = row / row.sum() if row.sum() > 0 else row
    return out


@torch.no_grad()
@pytest.mark.parametrize("w01", [1e-3, 0.5, 1.0, 1e3])
def test_count01_reproduction_case(model, batch, w01):
    """Attention to '2' zeroed, weight(0-key) / weight(1-key) = w01, renormalised, at the '=' query."""
    with hc.set_attention(model, head=2, tokens={"2": 0.0, "0": w01, "1": 1.0}, query_pos=batch.answer_pos):
        _, cache = model.run_with_cache(batch.tokens)
    rows = torch.arange(len(batch))
    row = cache[PATTERN][rows, 2, batch.answer_pos].double()  # [batch, key]
    allowed = torch.arange(row.shape[1])[None] <= batch.answer_pos[:, None]
    tok = batch.tokens
    torch.testing.assert_close(row.sum(-1), torch.ones(len(batch), dtype=torch.float64), atol=1e-6, rtol=0)
    assert (row[~allowed] == 0).all()
    assert (row[tok == TWO] == 0).all()
    assert (row[allowed & (tok > TWO)] == 0).all()  # BOS and '=' keys get others=0
    has_both = ((tok == ZERO) & allowed).any(1) & ((tok == ONE) & allowed).any(1)
    assert has_both.sum() > 10
    w0 = row.masked_fill(tok != ZERO, float("nan"))[has_both]
    w1 = row.masked_fill(tok != ONE, float("nan"))[has_both]
    ratio = w0.nanmean(1) / w1.nanmean(1)
    torch.testing.assert_close(ratio, torch.full_like(ratio, w01), rtol=1e-4, atol=0)
    # every '0' key of a row gets the same weight
    torch.testing.assert_close(w0.nan_to_num(0).amax(1), w0.nanmean(1), rtol=1e-5, atol=0)
    # other heads and other query rows keep the model's own pattern
    own = model.run_with_cache(batch.tokens)[1][PATTERN]
    keep = torch.ones_like(own, dtype=torch.bool)
    keep[rows, 2, batch.answer_pos] = False
    assert torch.equal(cache[PATTERN][keep], own[keep])


@torch.no_grad()
@pytest.mark.parametrize("others", [0.0, 0.25, "model"])
def test_token_rules_match_a_plain_loop(model, batch, others):
    weight_of = {TWO: 0.0, ZERO: 3.0, ONE: 1.0}
    own = model.run_with_cache(batch.tokens)[1][PATTERN][:, 1]
    with hc.set_attention(model, "L0H1", tokens={"2": 0.0, "0": 3.0, 1: 1.0}, others=others):
        new = model.run_with_cache(batch.tokens)[1][PATTERN][:, 1]
    want = loop_reference(own, batch.tokens, weight_of, others)
    torch.testing.assert_close(new.double(), want, atol=1e-6, rtol=1e-5)
    sums = new.sum(-1)
    if others == 0.0:  # rows seeing no '0' or '1' key have no mass: the head reads nothing there
        seen = torch.cummax(((batch.tokens == ZERO) | (batch.tokens == ONE)).long(), 1).values.bool()
        torch.testing.assert_close(sums, seen.float(), atol=1e-5, rtol=0)
    else:
        torch.testing.assert_close(sums, torch.ones_like(sums), atol=1e-5, rtol=0)


@torch.no_grad()
def test_model_keeps_unlisted_keys_with_others_model(model, batch):
    own = model.run_with_cache(batch.tokens)[1][PATTERN][:, 3]
    with hc.set_attention(model, 3, tokens={"0": 2.0, "1": 1.0}, others="model"):
        new = model.run_with_cache(batch.tokens)[1][PATTERN][:, 3]
    unlisted = (batch.tokens != ZERO) & (batch.tokens != ONE)
    mask = unlisted[:, None, :].expand_as(own)
    torch.testing.assert_close(new[mask], own[mask])
    listed = ~unlisted[:, None, :]
    torch.testing.assert_close((new * listed).sum(-1), (own * listed).sum(-1))


@torch.no_grad()
def test_own_pattern_as_weights_leaves_the_output_unchanged(model, batch):
    full, cache = model.run_with_cache(batch.tokens)
    with hc.set_attention(model, head=[0, 2], weights=cache[PATTERN][:, 0]):
        same_as_head0 = model(batch.tokens)
    assert not torch.allclose(same_as_head0, full)  # head 2 now reads head 0's pattern
    for h in range(4):
        with hc.set_attention(model, head=h, weights=cache[PATTERN][:, h]):
            torch.testing.assert_close(model(batch.tokens), full, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_imposed_pattern_drives_the_output(model, batch):
    """One layer: the logits move by (new - old pattern) @ v @ W_O @ W_U of that head alone."""
    full, cache = model.run_with_cache(batch.tokens)
    n = batch.tokens.shape[1]
    weights = torch.rand(n, n, generator=torch.Generator().manual_seed(0))
    with hc.set_attention(model, head=1, weights=weights):
        logits, new = model.run_with_cache(batch.tokens)
    want_pattern = weights.tril() / weights.tril().sum(-1, keepdim=True)
    torch.testing.assert_close(new[PATTERN][:, 1], want_pattern.expand(len(batch), n, n))
    v = cache["blocks.0.attn.hook_v"][:, :, 1]  # [batch, k, d_head]
    delta = torch.einsum("bqk,bkd->bqd", new[PATTERN][:, 1] - cache[PATTERN][:, 1], v)
    torch.testing.assert_close(logits, full + delta @ model.W_O[0, 1] @ model.W_U, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_per_key_vector_and_zero_rows(model, batch):
    n = batch.tokens.shape[1]
    per_key = torch.ones(n)
    per_key[0] = 0.0  # query 0 only sees key 0, so its row has no mass
    with hc.set_attention(model, 0, weights=per_key, query_pos=None):
        p = model.run_with_cache(batch.tokens)[1][PATTERN][:, 0]
    assert (p[:, 0] == 0).all()
    for q in range(1, n):
        torch.testing.assert_close(p[:, q, 1 : q + 1], torch.full((len(batch), q), 1.0 / q))
    own = model.run_with_cache(batch.tokens)[1][PATTERN][:, 0]
    with hc.set_attention(model, 0, weights=per_key, query_pos=-1):
        p = model.run_with_cache(batch.tokens)[1][PATTERN][:, 0]
    assert torch.equal(p[:, :-1], own[:, :-1])
    torch.testing.assert_close(p[:, -1, 1:], torch.full((len(batch), n - 1), 1.0 / (n - 1)))


@torch.no_grad()
def test_model_without_task_takes_ids():
    cfg = HookedTransformerConfig(
        n_layers=2, d_model=6, d_head=2, n_heads=2, n_ctx=5, d_vocab=4, attn_only=True, normalization_type=None
    )
    model = HookedTransformer(cfg)
    tokens = torch.randint(0, 4, (3, 5), generator=torch.Generator().manual_seed(0))
    with hc.set_attention(model, (1, 1), tokens={3: 1.0, "0": 2.0}):
        p = model.run_with_cache(tokens)[1]["blocks.1.attn.hook_pattern"][:, 1]
    for b in range(3):
        for q in range(5):
            keys = tokens[b, : q + 1]
            w = torch.where(keys == 3, 1.0, torch.where(keys == 0, 2.0, 0.0))
            want = w / w.sum() if w.sum() > 0 else w
            torch.testing.assert_close(p[b, q, : q + 1], want)


def test_bad_inputs(model, batch):
    n = batch.tokens.shape[1]
    with pytest.raises(ValueError, match=r"unknown token '7'.*'\[BOS\]'"):
        with hc.set_attention(model, 0, tokens={"7": 1.0}):
            pass
    with pytest.raises(ValueError, match=r"unknown token id 12"):
        with hc.set_attention(model, 0, tokens={12: 1.0}):
            pass
    with pytest.raises(ValueError, match=rf"expected \[{n}\] \(per key\), \[{n}, {n}\] .*\[24, {n}, {n}\]"):
        with hc.set_attention(model, 0, weights=torch.ones(3, 3)):
            model(batch.tokens)
    with pytest.raises(ValueError, match=r"shape \[key\], \[query, key\] or \[batch, query, key\]"):
        with hc.set_attention(model, 0, weights=torch.ones(2, 2, 2, 2)):
            pass
    with pytest.raises(ValueError, match="exactly one of"):
        with hc.set_attention(model, 0):
            pass
    with pytest.raises(ValueError, match=">= 0"):
        with hc.set_attention(model, 0, tokens={"0": -1.0}):
            pass
    with pytest.raises(ValueError, match=r"unknown others 'own'.*\['model'\]"):
        with hc.set_attention(model, 0, tokens={"0": 1.0}, others="own"):
            pass
    with pytest.raises(IndexError, match=r"head 9 is out of range.*0\.\.3"):
        with hc.set_attention(model, 9, tokens={"0": 1.0}):
            pass
    with pytest.raises(IndexError, match=r"query_pos .* out of range"):
        with hc.set_attention(model, 0, tokens={"0": 1.0}, query_pos=99):
            model(batch.tokens)
    with pytest.raises(RuntimeError, match="boom"):
        with hc.set_attention(model, 0, tokens={"0": 1.0}):
            raise RuntimeError("boom")
    assert hooks_left(model) == 0
