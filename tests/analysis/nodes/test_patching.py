"""hc.patch against transformer_lens.patching (the slow reference: one forward pass per patch)."""

from __future__ import annotations

import warnings

import plotly.graph_objects as go
import pytest
import torch
import transformer_lens.patching as tlp
from transformer_lens import HookedTransformer

import headcoop as hc
from headcoop.analysis.nodes.patching import PatchResult, patches_per_chunk

warnings.filterwarnings("ignore", category=DeprecationWarning)
tlp.tqdm = lambda iterable, *args, **kwargs: iterable  # silence the reference's progress bars

TOL = 1e-5
TINY_BUDGET_MB = 0.02  # forces several chunks per layer on these models

REFERENCE = {
    ("z", "all"): tlp.get_act_patch_attn_head_out_all_pos,
    ("z", "each"): tlp.get_act_patch_attn_head_out_by_pos,
    ("q", "all"): tlp.get_act_patch_attn_head_q_all_pos,
    ("q", "each"): tlp.get_act_patch_attn_head_q_by_pos,
    ("k", "all"): tlp.get_act_patch_attn_head_k_all_pos,
    ("k", "each"): tlp.get_act_patch_attn_head_k_by_pos,
    ("v", "all"): tlp.get_act_patch_attn_head_v_all_pos,
    ("v", "each"): tlp.get_act_patch_attn_head_v_by_pos,
    ("pattern", "all"): tlp.get_act_patch_attn_head_pattern_all_pos,
    ("pattern", "each"): tlp.get_act_patch_attn_head_pattern_by_pos,
    ("resid_pre", "each"): tlp.get_act_patch_resid_pre,
}


def _resid_pre_all(model, corrupted_tokens, clean_cache, metric):
    """Reference for resid_pre over all positions: TL's generic loop, replacing the whole activation."""
    return tlp.generic_activation_patch(
        model, corrupted_tokens, clean_cache, metric,
        patch_setter=lambda corrupted, index, clean: clean.clone(),
        activation_name="resid_pre", index_axis_names=("layer",),
    )  # fmt: skip


REFERENCE[("resid_pre", "all")] = _resid_pre_all

MODELS = {
    "count01": lambda: hc.Count01(max_len=6).model(seed=0, n_heads=4, d_model=8, d_head=2),
    "skip-pair": lambda: hc.SkipPair(seq_len=6).model(seed=0, n_heads=2, d_head=3),
    "two-layer": lambda: hc.Count01(max_len=6).model(seed=1, n_heads=3, d_model=8, d_head=2, n_layers=2),
}


@pytest.fixture(scope="module")
def setups():
    """name -> (model, clean Batch, corrupt Batch) with weights scaled up so patches matter."""
    out = {}
    for name, build in MODELS.items():
        model = build()
        with torch.no_grad():
            for block in model.blocks:  # larger attention logits than the default init: non-trivial patterns
                block.attn.W_Q.mul_(4)
                block.attn.W_K.mul_(4)
        clean, corrupt = model.task.patching_inputs(n=6, seed=1)
        out[name] = (model, clean, corrupt)
    return out


def _user_metric(logits):
    """A metric that reads every position, not only the answer's."""
    return logits.log_softmax(-1)[:, :, 3].mean() + 0.1 * logits[:, -1, 1].mean()


def _reference(model, component, positions, clean, corrupt, metric, direction, require_effect=True):
    """TL's result, and (unless require_effect is False) a check that some patch moves the metric."""
    source, target = (clean, corrupt) if direction == "denoise" else (corrupt, clean)
    with torch.no_grad():
        _, cache = model.run_with_cache(source)
        ref = REFERENCE[component, positions](model, target, cache, metric)
        unpatched = metric(model(target)).item()
    if require_effect:
        assert (ref - unpatched).abs().max() > 10 * TOL, "no patch moves the metric: the comparison would be vacuous"
    if component == "pattern" and positions == "each":
        ref = ref.permute(0, 2, 1)  # TL: [layer, head, dest_pos]; headcoop: [layer, dest_pos, head]
    return ref.cpu()


CASES = [(c, p) for c, p in REFERENCE]


@pytest.mark.parametrize("model_name", list(MODELS))
@pytest.mark.parametrize("component,positions", CASES)
def test_matches_transformer_lens_task_metric(setups, model_name, component, positions):
    model, clean, corrupt = setups[model_name]
    # In one layer the answer position's query token is the same in clean and corrupt inputs, so q
    # patches cannot move the task metric there (q is checked on two layers and with the user metric).
    vacuous = component == "q" and model.cfg.n_layers == 1
    ref = _reference(
        model,
        component,
        positions,
        clean.tokens,
        corrupt.tokens,
        lambda logits: model.task.metric(logits, clean),
        "denoise",
        require_effect=not vacuous,
    )
    for head_local in (True, False):
        result = hc.patch(
            model,
            clean=clean,
            corrupt=corrupt,
            component=component,
            positions=positions,
            memory_budget_mb=TINY_BUDGET_MB,
            head_local=head_local,
        )
        assert result.values.shape == ref.shape
        torch.testing.assert_close(result.values, ref, atol=TOL, rtol=0)


@pytest.mark.parametrize(
    "model_name,metric_kind", [("count01", "task"), ("skip-pair", "user"), ("two-layer", "user"), ("two-layer", "task")]
)
@pytest.mark.parametrize("component,positions", CASES)
def test_matches_transformer_lens_noise(setups, model_name, metric_kind, component, positions):
    """direction="noise" equals TL run on the clean input with corrupt activations patched in."""
    model, clean, corrupt = setups[model_name]
    if metric_kind == "user":
        metric, clean_arg, corrupt_arg = _user_metric, clean.tokens, corrupt.tokens
    else:
        metric, clean_arg, corrupt_arg = (lambda logits: model.task.metric(logits, clean)), clean, None
    vacuous = metric_kind == "task" and component == "q" and model.cfg.n_layers == 1
    ref = _reference(
        model, component, positions, clean.tokens, corrupt.tokens, metric, "noise", require_effect=not vacuous
    )
    for head_local in (True, False):
        result = hc.patch(
            model,
            clean=clean_arg,
            corrupt=corrupt_arg,
            metric=None if metric_kind == "task" else metric,
            component=component,
            positions=positions,
            direction="noise",
            memory_budget_mb=TINY_BUDGET_MB,
            head_local=head_local,
        )
        torch.testing.assert_close(result.values, ref, atol=TOL, rtol=0)


def test_tiny_budget_uses_several_chunks(setups):
    model, clean, corrupt = setups["two-layer"]
    batch, n_pos = clean.tokens.shape
    per_layer_patches = n_pos * model.cfg.n_heads
    assert patches_per_chunk(model, batch, n_pos, TINY_BUDGET_MB) < per_layer_patches
    assert patches_per_chunk(model, batch, n_pos, TINY_BUDGET_MB, head_local=True) < per_layer_patches


@pytest.mark.parametrize("head_local", [True, False])
def test_one_forward_pass_per_chunk_not_per_patch(setups, monkeypatch, head_local):
    model, clean, corrupt = setups["two-layer"]
    calls = []
    original = HookedTransformer.forward
    monkeypatch.setattr(HookedTransformer, "forward", lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    from headcoop.analysis.engine import kernels as suffix

    suffix_calls = []
    original_suffix = suffix.run_from
    monkeypatch.setattr(suffix, "run_from", lambda *a, **k: suffix_calls.append(1) or original_suffix(*a, **k))
    result = hc.patch(model, clean=clean, corrupt=corrupt, positions="each", head_local=head_local)
    n_pos, n_heads, n_layers = clean.tokens.shape[1], model.cfg.n_heads, model.cfg.n_layers
    assert result.values.numel() == n_layers * n_pos * n_heads
    if head_local:
        # two baseline runs; the later layers run once per (layer, first changed row) for all its heads
        assert len(calls) == 2 and len(suffix_calls) <= n_layers * n_pos < result.values.numel()
    else:
        # two baseline runs, then one stacked pass per layer for all its (pos, head) patches
        assert len(calls) == 2 + n_layers


def test_default_inputs_and_single_head(setups):
    model, _, _ = setups["two-layer"]
    sweep = hc.patch(model)
    one = hc.patch(model, head=2)  # no other argument: the task's inputs and metric
    assert one.dims == ("layer", "head") and one.coords == {"layer": [0, 1], "head": [2]}
    torch.testing.assert_close(one.values, sweep.values[:, 2:3], atol=TOL, rtol=0)
    single = hc.patch(model, head=2, layer=1)
    assert single.values.shape == (1, 1)
    assert float(single) == pytest.approx(float(sweep.values[1, 2]), abs=TOL)
    by_pos = hc.patch(model, head=-1, layer=0, positions="each", component="q")
    full = hc.patch(model, layer=0, positions="each", component="q")
    torch.testing.assert_close(by_pos.values, full.values[:, :, -1:], atol=TOL, rtol=0)
    clean, corrupt = model.task.patching_inputs()
    assert sweep.clean_value == pytest.approx(model.task.metric(model(clean.tokens), clean).item(), abs=TOL)
    assert sweep.corrupt_value == pytest.approx(model.task.metric(model(corrupt.tokens), clean).item(), abs=TOL)


def test_clean_batch_alone_derives_corrupt_and_metric(setups):
    model, clean, corrupt = setups["count01"]
    a = hc.patch(model, clean=clean)
    b = hc.patch(model, clean=clean, corrupt=corrupt, metric=lambda logits: model.task.metric(logits, clean))
    torch.testing.assert_close(a.values, b.values, atol=TOL, rtol=0)


def test_texts_and_plain_model_without_task(setups):
    model, _, _ = setups["count01"]
    clean_texts, corrupt_texts = ["0112=", "2010=", "1102="], ["1002=", "2101=", "0012="]
    metric = lambda logits: logits[:, -1, 5].mean() - logits[:, -1, 4].mean()  # noqa: E731
    from_texts = hc.patch(model, clean=clean_texts, corrupt=corrupt_texts, metric=metric, positions="each")
    task = model.task
    clean_ids = torch.stack([task.encode(t) for t in clean_texts])
    corrupt_ids = torch.stack([task.encode(t) for t in corrupt_texts])
    bare = HookedTransformer(model.cfg)
    bare.load_state_dict(model.state_dict())
    assert getattr(bare, "task", None) is None
    from_ids = hc.patch(bare, clean=clean_ids, corrupt=corrupt_ids, metric=metric, positions="each")
    torch.testing.assert_close(from_texts.values, from_ids.values, atol=TOL, rtol=0)
    ref = _reference(bare, "z", "each", clean_ids, corrupt_ids, metric, "denoise")
    torch.testing.assert_close(from_ids.values, ref, atol=TOL, rtol=0)
    assert from_ids.pos_labels == [str(p) for p in range(clean_ids.shape[1])]
    assert from_texts.pos_labels[0] == "0 [BOS]" and from_texts.pos_labels[-1] == "5 ="


def test_metric_returning_a_float(setups):
    model, clean, corrupt = setups["count01"]
    as_tensor = hc.patch(model, clean=clean, corrupt=corrupt, metric=_user_metric)
    as_float = hc.patch(model, clean=clean, corrupt=corrupt, metric=lambda logits: float(_user_metric(logits)))
    torch.testing.assert_close(as_float.values, as_tensor.values, atol=TOL, rtol=0)


@pytest.mark.parametrize("direction", ["denoise", "noise"])
def test_patching_the_whole_residual_stream_reaches_the_other_baseline(setups, direction):
    model, clean, corrupt = setups["two-layer"]
    result = hc.patch(model, clean=clean, corrupt=corrupt, component="resid_pre", layer=0, direction=direction)
    expected = result.clean_value if direction == "denoise" else result.corrupt_value
    assert result.item() == pytest.approx(expected, abs=TOL)
    assert result.normalized().item() == pytest.approx(1.0 if direction == "denoise" else 0.0, abs=1e-4)


def test_result_helpers(setups):
    model, clean, corrupt = setups["two-layer"]
    result = hc.patch(model, clean=clean, corrupt=corrupt, positions="each")
    assert isinstance(result, PatchResult)
    assert result.dims == ("layer", "pos", "head")
    gap = result.clean_value - result.corrupt_value
    torch.testing.assert_close(result.normalized(), (result.values - result.corrupt_value) / gap)
    frame = result.to_dataframe()
    assert len(frame) == result.values.numel()
    assert list(frame.columns[:3]) == ["layer", "pos", "head"]
    row = frame[(frame["layer"] == 1) & (frame["pos"] == 4) & (frame["head"] == 2)].iloc[0]
    assert row.value == pytest.approx(float(result.values[1, 4, 2]))
    assert row.pos_label == result.pos_labels[4]
    with pytest.raises(ValueError, match="holds 60 values"):
        result.item()


def test_plots(setups):
    model, clean, corrupt = setups["two-layer"]
    by_pos = hc.patch(model, clean=clean, corrupt=corrupt, positions="each", component="pattern").plot()
    assert isinstance(by_pos, go.Figure) and len(by_pos.data) == model.cfg.n_layers
    assert list(by_pos.data[1].y) == ["L1H0", "L1H1", "L1H2"]
    assert by_pos.data[0].x[0] == "0 [BOS]" and "value" in by_pos.data[0].hovertemplate
    grid = hc.patch(model, clean=clean, corrupt=corrupt).plot(normalized=True)
    assert len(grid.data) == 1 and list(grid.data[0].y) == ["L0", "L1"]
    assert grid.data[0].customdata[1][2] == "L1H2"
    assert "share of the clean − corrupt gap restored" in grid.layout.title.text
    assert "&" not in grid.layout.title.text  # plotly draws HTML entities literally
    default = hc.patch(model, clean=clean, corrupt=corrupt).plot()  # normalised by default: not a uniform map
    torch.testing.assert_close(torch.tensor(default.data[0].z), torch.tensor(grid.data[0].z))
    raw = hc.patch(model, clean=clean, corrupt=corrupt).plot(normalized=False)
    assert "the metric after each patch" in raw.layout.title.text
    assert "positions are absolute" in by_pos.layout.title.text  # Count01 inputs differ in length
    resid = hc.patch(model, clean=clean, corrupt=corrupt, component="resid_pre", positions="each").plot()
    assert resid.data[0].z.shape == (2, clean.tokens.shape[1])
    resid_all = hc.patch(model, clean=clean, corrupt=corrupt, component="resid_pre").plot()
    assert resid_all.data[0].z.shape == (1, 2)


# --- bad input -----------------------------------------------------------------------------------------
def test_out_of_range_head_and_layer(setups):
    model, clean, corrupt = setups["two-layer"]
    with pytest.raises(IndexError, match=r"heads 0\.\.2"):
        hc.patch(model, head=3)
    with pytest.raises(IndexError, match=r"layers 0\.\.1"):
        hc.patch(model, head=0, layer=2)


def test_unknown_names(setups):
    model, clean, corrupt = setups["count01"]
    with pytest.raises(ValueError, match=r"unknown component 'attn'.*'z', 'q', 'k', 'v', 'pattern', 'resid_pre'"):
        hc.patch(model, component="attn")
    with pytest.raises(ValueError, match=r"unknown positions 'some'.*'all', 'each'"):
        hc.patch(model, positions="some")
    with pytest.raises(ValueError, match=r"unknown direction 'up'.*'denoise', 'noise'"):
        hc.patch(model, direction="up")
    with pytest.raises(ValueError, match="no head axis"):
        hc.patch(model, head=0, component="resid_pre")
    with pytest.raises(ValueError, match="memory_budget_mb must be > 0, got 0.0"):
        hc.patch(model, memory_budget_mb=0)


def test_bad_inputs(setups):
    model, clean, corrupt = setups["count01"]
    with pytest.raises(ValueError, match=r"clean \(6, 10\) and corrupt \(5, 10\)"):
        hc.patch(model, clean=clean, corrupt=corrupt[:5])
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        hc.patch(model, clean=clean, corrupt=corrupt.tokens.clamp(max=7) + 1)
    with pytest.raises(ValueError, match="unknown symbol"):
        hc.patch(model, clean=["01x="], corrupt=["10x="], metric=_user_metric)
    with pytest.raises(ValueError, match="without clean"):
        hc.patch(model, corrupt=corrupt)
    with pytest.raises(ValueError, match="corrupt= is missing"):
        hc.patch(model, clean=clean.tokens)
    with pytest.raises(ValueError, match="needs clean= as a Batch"):
        hc.patch(model, clean=clean.tokens, corrupt=corrupt.tokens)
    with pytest.raises(TypeError, match="metric must be a name .* or a callable"):
        hc.patch(model, metric=3)
    with pytest.raises(ValueError, match="needs the right answers: pass clean="):  # a name needs the answers
        hc.patch(model, clean=clean.tokens, corrupt=corrupt.tokens, metric="logit_diff")


def test_model_without_task_needs_inputs_and_metric(setups):
    model, clean, corrupt = setups["count01"]
    bare = HookedTransformer(model.cfg)
    with pytest.raises(ValueError, match="carries no headcoop task"):
        hc.patch(bare, head=0)
    with pytest.raises(ValueError, match="no default metric"):
        hc.patch(bare, clean=clean.tokens, corrupt=corrupt.tokens)


# --- hooks already on the model: every path must honour them ------------------------------------------
def _hooked_context(kind, model):
    if kind == "ablate-mean":
        return hc.ablate(model, heads=[0, 1], how="mean")
    if kind == "ablate-resample":  # per-example references: depends on the batch, so copies cannot be stacked
        return hc.ablate(
            model, heads=[(model.cfg.n_layers - 1, 1)], how="resample", reference=model.task.sample(5, seed=3)
        )
    if kind == "set_attention":
        return hc.set_attention(
            model, head=1, layer=model.cfg.n_layers - 1, tokens={"0": 3.0, "1": 1.0}, others="model"
        )
    if kind == "user-resid-hook":  # additive: applying it twice (a restart from a cached stream) would show
        import contextlib

        @contextlib.contextmanager
        def steer():
            model.add_hook("blocks.0.hook_resid_pre", lambda resid, hook: resid + 0.5)
            try:
                yield model
            finally:
                model.reset_hooks()

        return steer()
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["ablate-mean", "ablate-resample", "set_attention", "user-resid-hook"])
@pytest.mark.parametrize("model_name", ["count01", "two-layer"])
@pytest.mark.parametrize("component,positions", CASES)
def test_patching_inside_hooks_matches_transformer_lens(setups, kind, model_name, component, positions):
    model, clean, corrupt = setups[model_name]
    with _hooked_context(kind, model):
        ref = _reference(
            model, component, positions, clean.tokens, corrupt.tokens, _user_metric, "denoise", require_effect=False
        )
        result = hc.patch(
            model,
            clean=clean.tokens,
            corrupt=corrupt.tokens,
            metric=_user_metric,
            component=component,
            positions=positions,
            memory_budget_mb=TINY_BUDGET_MB,
        )
    assert result.method.startswith("reference: one pass per patch (hooks at")
    torch.testing.assert_close(result.values, ref, atol=TOL, rtol=0)
    assert not model.hook_dict["blocks.0.hook_resid_pre"].fwd_hooks  # the context removed its hooks


def test_issue_example_v_patching_with_every_head_ablated(setups):
    """The report: with every head ablated, no patch of v can change anything, so every value equals the
    ablated model's corrupt baseline (the head-local shortcut used to return values far from it)."""
    model, clean, corrupt = setups["count01"]
    with hc.ablate(model, heads=[0, 1, 2, 3], how="mean", reference=clean):
        result = hc.patch(model, clean=clean, corrupt=corrupt, component="v")
        ablated = model.task.metric(model(corrupt.tokens), clean).item()
    torch.testing.assert_close(result.values, torch.full_like(result.values, ablated), atol=TOL, rtol=0)
    assert result.corrupt_value == pytest.approx(ablated, abs=TOL)
    outside = hc.patch(model, clean=clean, corrupt=corrupt, component="v")
    assert (outside.values - ablated).abs().max() > 0.01  # the comparison is not vacuous
    assert outside.method == "head-local"


def test_a_gap_near_zero_is_warned_about_where_effects_are_normalized():
    """Issue 51: a clean - corrupt gap of 0.011 gave normalized effects of -1.87 without a word."""
    import warnings

    from headcoop.analysis.engine.grid import normalized

    values = torch.tensor([0.98, 1.0, 1.02])
    with pytest.warns(UserWarning, match=r"the clean - corrupt gap is 0.011, under 5% .* mostly measure the gap"):
        normalized(values, clean=1.011, corrupt=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(normalized(values, clean=2.0, corrupt=0.0), values / 2)
