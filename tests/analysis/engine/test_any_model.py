"""Every analysis on a matrix of model shapes headcoop never trained: no norm / LN / LNPre / RMS / RMSPre,
MLPs, standard / shortformer / rotary positions, grouped-query attention, d_vocab_out != d_vocab. In each
cell every analysis matches its reference (TransformerLens's own decomposition, patching and cached
activations) or refuses by name."""

from __future__ import annotations

import pytest
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig, patching

import headcoop as hc

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

SHAPES = {
    "attn-only": dict(),
    "LN": dict(normalization_type="LN"),
    "LNPre": dict(normalization_type="LNPre"),
    "RMS": dict(normalization_type="RMS"),
    "RMSPre": dict(normalization_type="RMSPre"),
    "gelu-LN": dict(normalization_type="LN", attn_only=False, d_mlp=32),
    "shortformer-LN": dict(normalization_type="LN", positional_embedding_type="shortformer"),
    "rotary-RMS-gqa-mlp": dict(
        normalization_type="RMS",
        positional_embedding_type="rotary",
        rotary_dim=4,
        n_key_value_heads=2,
        attn_only=False,
        d_mlp=32,
    ),  # fmt: skip
    "rotary-partial": dict(positional_embedding_type="rotary", rotary_dim=2),
    "vocab-out": dict(d_vocab_out=5, normalization_type="LN"),
}
VOCAB, N_CTX = 11, 8


def build(shape: str, dtype=torch.float32, **changes) -> HookedTransformer:
    cfg = dict(n_layers=2, d_model=16, d_head=4, n_heads=4, n_ctx=N_CTX, d_vocab=VOCAB, act_fn="gelu",
               attn_only=True, normalization_type=None, seed=0, dtype=dtype)  # fmt: skip
    cfg.update(SHAPES[shape], **changes)
    model = HookedTransformer(HookedTransformerConfig(**cfg))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # biases and norm weights away from their 0 / 1 initialisation
        for name, param in model.named_parameters():
            if "b_" in name or name.endswith((".b", ".w")):
                param.add_(0.3 * torch.randn(param.shape, generator=gen, dtype=param.dtype))
    return model.eval()


@pytest.fixture(scope="module", params=sorted(SHAPES))
def shaped(request):
    gen = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, VOCAB, (6, N_CTX), generator=gen)
    corrupt = torch.randint(0, VOCAB, (6, N_CTX), generator=gen)
    return request.param, build(request.param), tokens, corrupt


def test_dla_sums_to_the_logits_and_matches_transformer_lens(shaped):
    name, model, tokens, _ = shaped
    result = hc.dla(model, tokens)
    torch.testing.assert_close(result.total(), model(tokens)[:, -1], atol=1e-4, rtol=0)
    _, cache = model.run_with_cache(tokens)
    stack, labels = cache.get_full_resid_decomposition(apply_ln=True, pos_slice=-1, expand_neurons=False,
                                                       return_labels=True)  # fmt: skip
    final = getattr(model, "ln_final", None)
    if final is not None and hasattr(final, "w"):
        stack = stack * final.w  # apply_ln_to_stack centres and divides; the weight is ours to apply
    theirs = {label.replace("_mlp_out", ".mlp").replace("0.", "L0.").replace("1.", "L1."): stack[i] @ model.W_U
              for i, label in enumerate(labels)}  # fmt: skip
    checked = 0
    for component in result.components:
        if component in theirs:
            torch.testing.assert_close(result[component], theirs[component], atol=1e-4, rtol=0, msg=component)
            checked += 1
    assert checked >= 8 + (0 if model.cfg.attn_only else 2)
    held = result.assumptions
    assert bool(held) == (model.cfg.normalization_type is not None)
    if held:
        assert "frozen" in repr(result) and "frozen" in result.plot().layout.title.text


def test_dla_at_an_attention_input_sums_to_it(shaped):
    name, model, tokens, _ = shaped
    for site in "qkv":
        result = hc.dla(model, tokens, at=(1, site))
        _, cache = model.run_with_cache(tokens)
        resid = cache["blocks.1.hook_resid_pre"][:, -1]
        ln1 = model.blocks[1].ln1
        expected = resid if isinstance(ln1, torch.nn.Identity) else ln1(resid[:, None])[:, 0]
        if site in "qk" and model.cfg.positional_embedding_type == "shortformer":
            expected = expected + cache["hook_pos_embed"][:, -1]
        torch.testing.assert_close(result.total(), expected, atol=1e-4, rtol=0)
        assert result.target == f"L1 {site} input" and all(not c.startswith("L1") for c in result.components)
    with pytest.raises(ValueError, match="decomposes the L1 v input"):
        result.logit_diff(0, 1)


def test_layer0_qk_reproduces_the_cached_scores(shaped):
    name, model, tokens, _ = shaped
    _, cache = model.run_with_cache(tokens)
    for head in range(model.cfg.n_heads):
        table = hc.qk(model, head=head, layer=0)
        cached = cache["blocks.0.attn.hook_attn_scores"][:, head]
        looked_up = table.scores_for(tokens)
        finite = torch.isfinite(cached)
        assert torch.equal(finite, torch.isfinite(looked_up))
        torch.testing.assert_close(looked_up[finite], cached[finite], atol=1e-4, rtol=0)
        assert table.positional  # every shape here has positions that reach its scores
    later = hc.qk(model, head=0, layer=1)
    assert later.direct_path and "direct path" in repr(later) and "direct path" in later.plot().layout.title.text


def test_layer0_ov_times_the_pattern_is_the_heads_dla(shaped):
    """sum_k pattern[q, k] * effects[x_k] is the head's direct logit contribution, times the final norm's
    scale (which OV takes as 1)."""
    name, model, tokens, _ = shaped
    _, cache = model.run_with_cache(tokens)
    result = hc.dla(model, tokens)
    pattern = cache["blocks.0.attn.hook_pattern"][:, :, -1]  # [batch, head, key]
    has_norm = model.cfg.normalization_type is not None
    scale = cache["ln_final.hook_scale"][:, -1] if has_norm else torch.ones(len(tokens), 1)
    for head in range(model.cfg.n_heads):
        table = hc.ov(model, head=head, layer=0)
        effects = table.effects_for(tokens)  # [batch, pos, vocab]
        through_ov = torch.einsum("bk,bkv->bv", pattern[:, head], effects)
        torch.testing.assert_close(through_ov, result[f"L0H{head}"] * scale, atol=1e-4, rtol=0)
        assert ("scale taken as 1" in repr(table)) == has_norm


COMPONENT_REFERENCE = {
    "z": patching.get_act_patch_attn_head_out_by_pos,
    "q": patching.get_act_patch_attn_head_q_by_pos,
    "k": patching.get_act_patch_attn_head_k_by_pos,
    "v": patching.get_act_patch_attn_head_v_by_pos,
}


@pytest.mark.parametrize("component", sorted(COMPONENT_REFERENCE))
def test_patching_matches_transformer_lens(shaped, component):
    name, model, tokens, corrupt = shaped
    n_out = model.cfg.d_vocab_out
    answer, wrong = tokens[:, 0] % n_out, (tokens[:, 0] + 1) % n_out

    def metric(logits):
        last = logits[:, -1]
        return (last.gather(1, answer[:, None]) - last.gather(1, wrong[:, None])).mean()

    ours = hc.patch(model, clean=tokens, corrupt=corrupt, metric=metric, component=component, positions="each")
    _, cache = model.run_with_cache(tokens)
    theirs = COMPONENT_REFERENCE[component](model, corrupt, cache, metric)  # [layer, pos, head]
    torch.testing.assert_close(ours.values.cpu(), theirs.cpu(), atol=1e-5, rtol=1e-5)
    grouped = model.cfg.n_key_value_heads is not None
    rotary_qk = model.cfg.positional_embedding_type == "rotary" and component in ("q", "k")
    assert ours.method == ("stacked" if grouped or rotary_qk else "head-local"), (name, component, ours.method)


@pytest.mark.parametrize("component", ["attn_out", "mlp_out"])
def test_block_output_patching_matches_transformer_lens(shaped, component):
    """attn_out / mlp_out, one patch per (layer, position) and per layer: TransformerLens's own patchers."""
    name, model, tokens, corrupt = shaped

    def metric(logits):
        return logits[:, -1, 1].mean() - logits[:, -1, 2].mean()

    if component == "mlp_out" and model.cfg.attn_only:
        with pytest.raises(ValueError, match="needs a model with MLPs"):
            hc.patch(model, clean=tokens, corrupt=corrupt, metric=metric, component=component)
        return
    _, cache = model.run_with_cache(tokens)
    ours = hc.patch(model, clean=tokens, corrupt=corrupt, metric=metric, component=component, positions="each")
    by_pos = patching.get_act_patch_attn_out if component == "attn_out" else patching.get_act_patch_mlp_out
    theirs = by_pos(model, corrupt, cache, metric)  # [layer, pos]
    assert (theirs - metric(model(corrupt))).abs().max() > 1e-4  # some patch moves the metric
    torch.testing.assert_close(ours.values.cpu(), theirs.cpu(), atol=1e-5, rtol=1e-5)
    whole = patching.generic_activation_patch(model, corrupt, cache, metric, activation_name=component,
                                              patch_setter=lambda act, index, clean: clean.clone(),
                                              index_axis_names=("layer",))  # fmt: skip
    every = hc.patch(model, clean=tokens, corrupt=corrupt, metric=metric, component=component, positions="all")
    torch.testing.assert_close(every.values.cpu(), whole.cpu(), atol=1e-5, rtol=1e-5)
    assert every.dims == ("layer",) and ours.dims == ("layer", "pos") and every.method == "stacked"


def test_grouped_query_patching_counts_key_value_heads():
    model = build("rotary-RMS-gqa-mlp")
    tokens = torch.randint(0, VOCAB, (4, N_CTX), generator=torch.Generator().manual_seed(3))
    corrupt = tokens.flip(0)

    def metric(logits):
        return logits[:, -1, 0].mean()

    assert hc.patch(model, clean=tokens, corrupt=corrupt, metric=metric, component="k").values.shape == (2, 2)
    assert hc.patch(model, clean=tokens, corrupt=corrupt, metric=metric, component="q").values.shape == (2, 4)
    with pytest.raises(IndexError, match="key/value heads 0..1"):
        hc.patch(model, head=3, clean=tokens, corrupt=corrupt, metric=metric, component="v")


def test_float64_sums_exactly():
    model = build("gelu-LN", dtype=torch.float64)
    tokens = torch.randint(0, VOCAB, (5, N_CTX), generator=torch.Generator().manual_seed(4))
    result = hc.dla(model, tokens)
    with torch.no_grad():
        assert float((result.total() - model(tokens)[:, -1]).abs().max()) < 1e-9


@pytest.mark.parametrize("read", ["first", "middle", "every"])
def test_patching_with_metrics_that_read_other_rows(read):
    """The row-wise suffix reads only the rows the metric reads when that is checked; a metric reading
    another row, or every row, still matches TransformerLens."""
    from headcoop.analysis.engine import kernels as suffix

    model = build("gelu-LN")
    gen = torch.Generator().manual_seed(5)
    clean, corrupt = (
        torch.randint(0, VOCAB, (5, N_CTX), generator=gen),
        torch.randint(0, VOCAB, (5, N_CTX), generator=gen),
    )
    rows = {"first": [0], "middle": [3], "every": list(range(N_CTX))}[read]

    def metric(logits):
        return logits[:, rows, 2].mean() - logits[:, rows, 5].mean()

    ours = hc.patch(model, clean=clean, corrupt=corrupt, metric=metric, component="z", positions="each")
    _, cache = model.run_with_cache(clean)
    theirs = patching.get_act_patch_attn_head_out_by_pos(model, corrupt, cache, metric)
    torch.testing.assert_close(ours.values, theirs, atol=1e-5, rtol=1e-5)
    logits = model(clean).detach()
    assert suffix.reads_only(metric, logits, torch.tensor(rows))
    assert not suffix.reads_only(metric, logits, torch.tensor([N_CTX - 1]))


def test_probe_and_mean_ablation_on_every_shape(shaped):
    """hc.probe reads each head's cached z at the read-out position (its features are those activations),
    and hc.ablate(how="mean") with explicit reference tokens replaces z by the reference mean."""
    name, model, tokens, corrupt = shaped
    batch = torch.cat([tokens, corrupt] * 4)
    labels = (batch[:, 0] > VOCAB // 2).long()
    result = hc.probe(model, batch, labels, site="z", pos=-1)
    assert result.names == [f"L{lay}H{h}" for lay in range(2) for h in range(4)]
    from headcoop.analysis.nodes.probes import probe_features

    features, *_ = probe_features(model, batch, site="z", pos=-1)
    _, cache = model.run_with_cache(batch)
    expected = torch.cat([cache[f"blocks.{lay}.attn.hook_z"][:, -1] for lay in range(2)], 1)
    torch.testing.assert_close(features, expected, atol=0, rtol=0)
    seen = {}
    with hc.ablate(model, heads="L1H2", how="mean", reference=corrupt):
        model.run_with_hooks(tokens, fwd_hooks=[("blocks.1.attn.hook_z", lambda z, hook: seen.update(z=z.clone()))])
    _, ref_cache = model.run_with_cache(corrupt)
    mean = ref_cache["blocks.1.attn.hook_z"][:, :, 2].mean(0)
    torch.testing.assert_close(seen["z"][:, :, 2], mean.expand_as(seen["z"][:, :, 2]), atol=1e-6, rtol=0)


@pytest.mark.slow  # the fast tier compares the game with hc.ablate in test_interactions.py
@pytest.mark.parametrize("how", ["zero", "resample"])
def test_coalition_values_on_every_shape(shaped, how):
    """CoalitionGame's layer-by-layer evaluation (shared prefixes, the last layer at the read rows only)
    equals hc.ablate of the heads outside each coalition plus a full forward pass, for every coalition of
    6 heads in both layers, named metrics and a callable, answers read at a different row per input."""
    from headcoop.analysis.games.coalitions import CoalitionGame, all_masks

    name, model, tokens, corrupt = shaped
    vocab_out = model.cfg.d_vocab_out
    rows = torch.arange(len(tokens))
    pos = torch.tensor([7, 5, 7, 3, 6, 7])
    answer, wrong = tokens[:, 0] % vocab_out, tokens[:, 1] % vocab_out
    players = [(0, 0), (0, 2), (0, 3), (1, 0), (1, 1), (1, 3)]
    reference = None if how == "zero" else corrupt
    metrics = {
        "logit_diff": lambda lg: (lg[rows, pos, answer] - lg[rows, pos, wrong]).double().mean(),
        "accuracy": lambda lg: (lg[rows, pos].argmax(-1) == answer).double().mean(),
        "prob": lambda lg: lg[rows, pos].double().softmax(-1)[rows, answer].mean(),
    }
    masks = all_masks(len(players))
    for metric_name, metric in metrics.items():
        want = []
        for mask in masks:
            off = [f"L{lay}H{h}" for (lay, h), on in zip(players, mask.tolist()) if not on]
            with torch.no_grad(), hc.ablate(model, heads=off or None, how=how, reference=reference) if off \
                    else torch.no_grad():  # fmt: skip
                want.append(float(metric(model(tokens))))
        want = torch.tensor(want, dtype=torch.float64)
        for chosen in (metric_name, metric):
            game = CoalitionGame(model, players, tokens=tokens, metric=chosen, how=how, reference=reference,
                                 answer=answer, wrong=wrong, pos=pos, seed=0)  # fmt: skip
            assert game.method.startswith("layer by layer"), game.method
            torch.testing.assert_close(game.values(masks), want, atol=1e-5, rtol=1e-5, msg=f"{name} {chosen}")
        if metric_name != "logit_diff":
            continue
        # every path through the switch against the library's reference (hc.ablate + a forward pass each)
        kwargs = dict(tokens=tokens, metric=metric_name, how=how, reference=reference, answer=answer, wrong=wrong,
                      pos=pos, seed=0)  # fmt: skip
        slow = CoalitionGame(model, players, method="reference", **kwargs)
        got_reference = slow.values(masks)
        assert slow.method.startswith("reference: hc.ablate"), slow.method
        torch.testing.assert_close(got_reference, want, atol=1e-6, rtol=1e-6, msg=f"{name} reference")
        for method in ("layered", "stacked"):
            fast = CoalitionGame(model, players, method=method, **kwargs)
            torch.testing.assert_close(fast.values(masks), got_reference, atol=1e-5, rtol=1e-5, msg=f"{name} {method}")


def test_patching_with_a_metric_that_returns_a_view_of_the_logits():
    """Copies' logits are handed to a user's metric one at a time in a reused buffer (`suffix.RowLogits`):
    a metric returning a view into it (logits[i, -1, j]) must still get each copy's own value."""
    model = build("LN")
    gen = torch.Generator().manual_seed(6)
    clean, corrupt = (
        torch.randint(0, VOCAB, (4, N_CTX), generator=gen),
        torch.randint(0, VOCAB, (4, N_CTX), generator=gen),
    )

    def metric(logits):
        return logits[1, -1, 3]

    for component in ("z", "v"):
        ours = hc.patch(model, clean=clean, corrupt=corrupt, metric=metric, component=component, positions="each")
        assert ours.method == "head-local"
        _, cache = model.run_with_cache(clean)
        tl = {"z": patching.get_act_patch_attn_head_out_by_pos, "v": patching.get_act_patch_attn_head_v_by_pos}
        theirs = tl[component](model, corrupt, cache, metric)
        torch.testing.assert_close(ours.values, theirs, atol=1e-5, rtol=1e-5)
        assert len(ours.values.unique()) > 4


@pytest.mark.slow
@pytest.mark.parametrize("component", ["z", "q", "k", "v", "pattern", "resid_pre"])
def test_patching_equals_its_reference_through_the_method_switch(shaped, component):
    """method="reference" is the one-pass-per-patch loop in the library; the fast path must equal it."""
    name, model, tokens, corrupt = shaped
    metric = lambda logits: logits[:, -1, 1].mean() - logits[:, -1, 0].mean()  # noqa: E731
    for positions in ("all", "each"):
        fast = hc.patch(model, clean=tokens, corrupt=corrupt, metric=metric, component=component, positions=positions)
        slow = hc.patch(model, clean=tokens, corrupt=corrupt, metric=metric, component=component, positions=positions,
                        method="reference")  # fmt: skip
        assert slow.method == "reference: one pass per patch (method='reference')" and not fast.method.startswith(
            "reference"
        )
        torch.testing.assert_close(fast.values, slow.values, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_path_patching_equals_its_reference_through_the_method_switch(shaped):
    name, model, tokens, corrupt = shaped
    metric = lambda logits: logits[:, -1, 1].mean() - logits[:, -1, 0].mean()  # noqa: E731
    if model.cfg.n_key_value_heads is not None:
        with pytest.raises(ValueError, match="grouped-query"):
            hc.path_patch(model, clean=tokens, corrupt=corrupt, metric=metric)
        return
    fast = hc.path_patch(model, clean=tokens, corrupt=corrupt, metric=metric)
    slow = hc.path_patch(model, clean=tokens, corrupt=corrupt, metric=metric, method="reference")
    assert slow.method.startswith("reference") and fast.method.startswith("stacked")
    assert fast.values.keys() == slow.values.keys()
    for key, value in fast.values.items():
        assert value == pytest.approx(slow.values[key], abs=1e-5, rel=1e-5), key


@pytest.mark.parametrize("shape", ["attn-only", "gelu-LN", "shortformer-LN", "rotary-partial", "RMSPre"])
def test_last_layer_with_one_changed_row_matches_a_forward_pass(shape):
    """suffix.last_layer_one_row (every copy's one changed row entering the last layer, read at several
    rows, including rows before, at and after the changed one) against the model's own blocks run from
    that layer on the whole changed residual stream."""
    from headcoop.analysis.engine import kernels as suffix
    from headcoop.analysis.engine.copies import continuation

    model = build(shape)
    gen = torch.Generator().manual_seed(6)
    tokens = torch.randint(0, VOCAB, (3, N_CTX), generator=gen)
    last = model.cfg.n_layers - 1
    _, cache = model.run_with_cache(tokens)
    base = cache[f"blocks.{last}.hook_resid_pre"]
    first_row = torch.arange(N_CTX).repeat(2)  # every position, twice
    new_rows = torch.randn(len(first_row), 3, model.cfg.d_model, generator=gen)
    needed = torch.tensor([0, 3, 5, N_CTX - 1])
    extras = continuation(model, tokens)
    ours = suffix.last_layer_one_row(model, base, new_rows, first_row, cache, extras["shortformer_pos_embed"], needed)
    for i, p in enumerate(first_row.tolist()):
        resid = base.clone()
        resid[:, p] = new_rows[i]
        with torch.no_grad():
            theirs = model(resid, start_at_layer=last, shortformer_pos_embed=extras["shortformer_pos_embed"])
        torch.testing.assert_close(
            ours.view(len(first_row), 3, len(needed), -1)[i], theirs[:, needed], atol=1e-5, rtol=1e-5
        )
