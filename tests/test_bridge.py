"""Every analysis on a TransformerBridge (TransformerLens 3.x's Hugging Face loader, compatibility mode), on
three shapes built offline (tests/bridge_shapes.py: GPT-2; Llama with RMSNorm, rotary and grouped-query
attention; GPT-NeoX with parallel attention and MLP and partial rotary). Each is checked against
TransformerLens's own patching and cache on the same Bridge, and against the same analysis on the
HookedTransformer TransformerLens's weight conversion makes of the same weights (the twin)."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from transformer_lens import patching as tl_patching

import headcoop as hc
from headcoop.models.bridge import is_bridge, is_hf_folder, kind_label, user_hooks
from tests import bridge_shapes as shapes

warnings.filterwarnings("ignore", message=".*gated-off hook.*")
BATCH, WIDTH = 4, 8
ATOL = 2e-5


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for shape in shapes.SHAPES:
        folder = shapes.model_folder(shape, root)
        out[shape] = (shapes.bridge(folder), shapes.hooked_twin(shape, folder), folder)
    return out


@pytest.fixture(scope="module")
def inputs():
    g = torch.Generator().manual_seed(0)
    clean = torch.randint(1, shapes.VOCAB, (BATCH, WIDTH), generator=g)
    corrupt = torch.randint(1, shapes.VOCAB, (BATCH, WIDTH), generator=g)
    answer = torch.randint(1, shapes.VOCAB, (BATCH,), generator=g)
    wrong = (answer + 7) % shapes.VOCAB
    return clean, corrupt, answer, wrong


def metric_of(answer, wrong):
    rows = torch.arange(len(answer))
    return lambda logits: (logits[rows, -1, answer] - logits[rows, -1, wrong]).mean()


def close(a, b, atol=ATOL):
    a, b = torch.as_tensor(a).detach().float(), torch.as_tensor(b).detach().float()
    assert a.shape == b.shape, (a.shape, b.shape)
    scale = max(1.0, float(b.abs().max()))
    assert torch.allclose(a, b, atol=atol * scale, rtol=0), float((a - b).abs().max())


@pytest.mark.parametrize("shape", shapes.SHAPES)
def test_bridge_runs_like_its_twin_and_carries_no_user_hooks(built, inputs, shape):
    bridge, twin, _ = built[shape]
    clean = inputs[0]
    assert is_bridge(bridge) and not is_bridge(twin)
    assert user_hooks(bridge) == []  # the Bridge's own routing hooks on the Hugging Face modules are not a user's
    assert kind_label(bridge).startswith("TransformerBridge")
    logits_b, cache_b = bridge.run_with_cache(clean)
    logits_t, cache_t = twin.run_with_cache(clean)
    close(logits_b, logits_t)
    names = [f"blocks.{lay}.{n}" for lay in range(2) for n in ("hook_resid_pre", "attn.hook_z", "attn.hook_q", "attn.hook_k",
                                                               "attn.hook_v", "attn.hook_pattern", "hook_attn_out",
                                                               "hook_mlp_out", "ln1.hook_scale")]  # fmt: skip
    for name in names:
        close(cache_b[name], cache_t[name])


@pytest.mark.parametrize("shape", shapes.SHAPES)
def test_patch_matches_transformer_lens_own_patching_on_the_bridge(built, inputs, shape):
    bridge = built[shape][0]
    clean, corrupt, answer, wrong = inputs
    metric = metric_of(answer, wrong)
    _, clean_cache = bridge.run_with_cache(clean)
    ours = hc.patch(bridge, clean=clean, corrupt=corrupt, metric=metric)
    theirs = tl_patching.get_act_patch_attn_head_out_all_pos(bridge, corrupt, clean_cache, metric)
    close(ours.values, theirs)
    resid = hc.patch(bridge, clean=clean, corrupt=corrupt, metric=metric, component="resid_pre", positions="each")
    close(resid.values, tl_patching.get_act_patch_resid_pre(bridge, corrupt, clean_cache, metric))
    pattern = hc.patch(bridge, clean=clean, corrupt=corrupt, metric=metric, component="pattern")
    close(pattern.values, tl_patching.get_act_patch_attn_head_pattern_all_pos(bridge, corrupt, clean_cache, metric))
    v = hc.patch(bridge, clean=clean, corrupt=corrupt, metric=metric, component="v", positions="each")
    close(v.values, tl_patching.get_act_patch_attn_head_v_by_pos(bridge, corrupt, clean_cache, metric))
    assert "TransformerBridge" in ours.method and "from the tokens" in ours.method


@pytest.mark.parametrize("shape", shapes.SHAPES)
@pytest.mark.parametrize("component", ["z", "q", "k", "v", "pattern", "resid_pre", "attn_out", "mlp_out"])
def test_patch_every_component_matches_the_twin(built, inputs, shape, component):
    bridge, twin, _ = built[shape]
    clean, corrupt, answer, wrong = inputs
    metric = metric_of(answer, wrong)
    ours = hc.patch(bridge, clean=clean, corrupt=corrupt, metric=metric, component=component, positions="each")
    twins = hc.patch(twin, clean=clean, corrupt=corrupt, metric=metric, component=component, positions="each")
    assert ours.dims == twins.dims
    close(ours.values, twins.values)
    assert ours.values.abs().max() > 1e-3  # the patches move the metric: the comparison is not of zeros


@pytest.mark.parametrize("shape", shapes.SHAPES)
def test_bridge_reference_path_and_stacked_path_agree(built, inputs, shape):
    bridge = built[shape][0]
    clean, corrupt, answer, wrong = inputs
    metric = metric_of(answer, wrong)
    stacked = hc.patch(bridge, clean=clean, corrupt=corrupt, metric=metric, component="v", positions="each")
    ref = hc.patch(
        bridge, clean=clean, corrupt=corrupt, metric=metric, component="v", positions="each", method="reference"
    )
    close(stacked.values, ref.values)
    assert ref.method.startswith("reference")
    with pytest.raises(ValueError, match="head-local"):
        hc.patch(bridge, clean=clean, corrupt=corrupt, metric=metric, method="head-local")


def test_a_users_hook_on_the_bridge_is_honoured(built, inputs):
    bridge, twin, _ = built["gpt2"]
    clean, corrupt, answer, wrong = inputs
    metric = metric_of(answer, wrong)

    def halve(z, hook):
        return z * 0.5

    results = []
    for model in (bridge, twin):
        model.add_hook("blocks.0.attn.hook_z", halve)
        try:
            assert user_hooks(model) == ["blocks.0.attn.hook_z"]
            results.append(hc.patch(model, clean=clean, corrupt=corrupt, metric=metric, head=1))
        finally:
            model.reset_hooks()
    assert user_hooks(bridge) == []
    assert "hooks at blocks.0.attn.hook_z" in results[0].method
    close(results[0].values, results[1].values)
    plain = hc.patch(bridge, clean=clean, corrupt=corrupt, metric=metric, head=1)
    assert (plain.values - results[0].values).abs().max() > 1e-4  # the hook changed the answer


def test_compatibility_mode_off_names_the_fix(built, inputs):
    folder = built["gpt2"][2]
    from transformer_lens.model_bridge import TransformerBridge

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        raw = TransformerBridge.boot_transformers(str(folder))
    clean, corrupt, answer, wrong = inputs
    for call in (lambda: hc.patch(raw, clean=clean, corrupt=corrupt, metric=metric_of(answer, wrong)),
                 lambda: hc.dla(raw, clean, answer=answer), lambda: hc.qk(raw, head=0, layer=0),
                 lambda: hc.composition(raw)):  # fmt: skip
        with pytest.raises(ValueError, match=r"enable_compatibility_mode\(\)"):
            call()
    with pytest.raises(TypeError, match="TransformerBridge in compatibility mode"):
        hc.patch(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("shape", shapes.SHAPES)
def test_dla_qk_ov_composition_probe_match_the_twin(built, inputs, shape):
    bridge, twin, _ = built[shape]
    clean, _, answer, wrong = inputs
    a, b = hc.dla(bridge, clean, answer=answer, wrong=wrong), hc.dla(twin, clean, answer=answer, wrong=wrong)
    assert a.components == b.components
    close(a.values, b.values)
    close(a.values.sum(1), a.logits, atol=1e-4)  # the decomposition sums to the Bridge's own logits
    for layer, head in ((0, 1), (1, 3)):
        close(hc.qk(bridge, head=head, layer=layer).scores, hc.qk(twin, head=head, layer=layer).scores)
        close(hc.ov(bridge, head=head, layer=layer).effects, hc.ov(twin, head=head, layer=layer).effects)
    ca, cb = hc.composition(bridge), hc.composition(twin)
    for mode in ("Q", "K", "V"):
        close(ca.scores[mode], cb.scores[mode], atol=1e-4)
    labels = torch.tensor([0, 1, 0, 1])
    pa, pb = hc.probe(bridge, clean, labels=labels, site="z"), hc.probe(twin, clean, labels=labels, site="z")
    close(pa.weight, pb.weight, atol=1e-3)


@pytest.mark.parametrize("shape", shapes.SHAPES)
def test_attribute_and_path_patch_match_the_twin(built, inputs, shape):
    bridge, twin, _ = built[shape]
    clean, corrupt, answer, wrong = inputs
    metric = metric_of(answer, wrong)
    a = hc.attribute(bridge, clean=clean, corrupt=corrupt, metric=metric, method="atp*", verify=4, sample=4)
    b = hc.attribute(twin, clean=clean, corrupt=corrupt, metric=metric, method="atp*", verify=4, sample=4)
    close(a.values, b.values, atol=1e-4)
    close(a.exact[a.top], b.exact[b.top], atol=1e-4)
    if shape == "llama":  # grouped-query: refused alike (a k or v input is shared by heads)
        for model in (bridge, twin):
            with pytest.raises(ValueError, match="grouped-query"):
                hc.path_patch(model, clean=clean, corrupt=corrupt, metric=metric)
        return
    pa = hc.path_patch(bridge, clean=clean, corrupt=corrupt, metric=metric)
    pb = hc.path_patch(twin, clean=clean, corrupt=corrupt, metric=metric)
    assert pa.values.keys() == pb.values.keys()
    close(torch.tensor(list(pa.values.values())), torch.tensor(list(pb.values.values())), atol=1e-4)
    ref = hc.path_patch(bridge, clean=clean, corrupt=corrupt, metric=metric, method="reference")
    close(torch.tensor(list(ref.values.values())), torch.tensor(list(pb.values.values())), atol=1e-4)
    assert "TransformerBridge" in pa.method


@pytest.mark.parametrize("shape", shapes.SHAPES)
def test_interventions_and_attention_views_match_the_twin(built, inputs, shape):
    bridge, twin, _ = built[shape]
    clean = inputs[0]
    for how in ("zero", "mean"):
        outs = []
        for model in (bridge, twin):
            with hc.ablate(model, heads=["L0H1", "L1H2"], how=how, reference=inputs[1] if how == "mean" else None):
                outs.append(model(clean))
        close(*outs)
    outs = []
    for model in (bridge, twin):
        with hc.set_attention(model, head="L1H0", weights=torch.ones(WIDTH)):
            outs.append(model(clean))
    close(*outs)
    assert user_hooks(bridge) == []
    from headcoop.analysis.nodes.attention import attention_data

    view_b, view_t = (attention_data(m, clean, layer=1) for m in (bridge, twin))
    close(torch.tensor(view_b[0][1]["attention"]), torch.tensor(view_t[0][1]["attention"]))


@pytest.mark.parametrize("shape", shapes.SHAPES)
def test_interactions_and_cooperation_match_the_twin(built, inputs, shape):
    bridge, twin, _ = built[shape]
    clean, corrupt, answer, wrong = inputs
    metric = metric_of(answer, wrong)
    ia = hc.interactions(bridge, clean, metric=metric, reference=corrupt)
    ib = hc.interactions(twin, clean, metric=metric, reference=corrupt)
    close(ia.shapley, ib.shapley, atol=1e-4)
    close(ia.interaction, ib.interaction, atol=1e-4)
    assert "TransformerBridge" in ia.method
    batch = hc.Batch.from_answers(clean, answer, wrong)
    ca = hc.cooperation(bridge, inputs=batch, metric="logit_diff", reference=corrupt)
    cb = hc.cooperation(twin, inputs=batch, metric="logit_diff", reference=corrupt)
    assert list(ca.pairs["mechanism"]) == list(cb.pairs["mechanism"])
    close(torch.tensor(ca.pairs["interaction_full"].to_numpy()), torch.tensor(cb.pairs["interaction_full"].to_numpy()),
          atol=1e-4)  # fmt: skip


def test_batch_from_answers_checks_its_input():
    batch = hc.Batch.from_answers(torch.zeros(2, 5, dtype=torch.long), [1, 2], [3, 4])
    assert batch.answer_pos.tolist() == [4, 4] and batch.labels.tolist() == [-1, -1]
    with pytest.raises(ValueError, match="answer must be \\[2\\]"):
        hc.Batch.from_answers(torch.zeros(2, 5, dtype=torch.long), [1], [3, 4])
    with pytest.raises(ValueError, match="answer_pos"):
        hc.Batch.from_answers(torch.zeros(2, 5, dtype=torch.long), [1, 2], [3, 4], answer_pos=5)
    with pytest.raises(ValueError, match="integer ids"):
        hc.Batch.from_answers(torch.zeros(2, 5), [1, 2], [3, 4])


def test_report_reads_a_hugging_face_folder(built, tmp_path):
    from headcoop.cli import main

    folder = built["llama"][2]
    assert is_hf_folder(folder)
    prompts = {"clean": ["w1 w2 w3 w4 w5", "w6 w7 w8 w9 w10", "w11 w12 w13 w14 w15", "w16 w17 w18 w19 w20"],
               "corrupt": ["w21 w2 w3 w4 w5", "w22 w7 w8 w9 w10", "w23 w12 w13 w14 w15", "w24 w17 w18 w19 w20"],
               "answer": ["w30", "w31", "w32", "w33"], "wrong": ["w40", "w41", "w42", "w43"]}  # fmt: skip
    (tmp_path / "prompts.json").write_text(json.dumps(prompts))
    out = tmp_path / "report.html"
    assert main(["report", str(folder), "--prompts", str(tmp_path / "prompts.json"), "--out", str(out),
                 "--no-progress"]) == 0  # fmt: skip
    page = out.read_text()
    for title in ("Head patching", "Direct logit attribution", "Cooperation", "QK and OV circuits"):
        assert title in page
    assert "TransformerBridge" in page


@pytest.mark.parametrize("shape", shapes.MORE_SHAPES)
def test_more_architectures_against_transformer_lens(tmp_path_factory, inputs, shape):
    bridge = shapes.bridge(shapes.model_folder(shape, tmp_path_factory.mktemp(shape)))
    clean, corrupt, answer, wrong = inputs
    metric = metric_of(answer, wrong)
    _, clean_cache = bridge.run_with_cache(clean)
    ours = hc.patch(bridge, clean=clean, corrupt=corrupt, metric=metric)
    close(ours.values, tl_patching.get_act_patch_attn_head_out_all_pos(bridge, corrupt, clean_cache, metric))
    resid = hc.patch(bridge, clean=clean, corrupt=corrupt, metric=metric, component="resid_pre", positions="each")
    close(resid.values, tl_patching.get_act_patch_resid_pre(bridge, corrupt, clean_cache, metric))
    attr = hc.dla(bridge, clean, answer=answer, wrong=wrong)
    close(attr.values.sum(1), attr.logits, atol=1e-4)  # checked inside too: it raises rather than miss
    coop = hc.cooperation(bridge, inputs=hc.Batch.from_answers(clean, answer, wrong), metric="logit_diff", how="zero")
    assert len(coop.pairs) == 28
    # the QK table is checked against the Bridge's cached scores on layer 0, and refuses what it cannot read:
    # Qwen3's q/k norm, OPT, GPT-J's interleaved rotary pairs
    if shape in ("qwen3", "opt", "gptj"):
        with pytest.raises(ValueError, match="qk|rotate"):
            hc.qk(bridge, head="L1H2")
    else:
        assert hc.qk(bridge, head="L1H2").scores.ndim == 4


@pytest.mark.parametrize("shape", ["gpt2", "llama"])
def test_edges_and_faithfulness_match_the_twin(built, inputs, shape):
    """Issue 51: hc.edges (exact, EAP, EAP-IG) and hc.faithfulness take a TransformerBridge and give what they
    give on the HookedTransformer twin: on Llama's grouped-query heads the key/value readers take their key/value
    head's weights, and EAP reads the final norm's output, which the Bridge's hook_normalized is not on the
    path to."""
    bridge, twin, _ = built[shape]
    clean, corrupt, answer, wrong = inputs
    metric = metric_of(answer, wrong)
    for method in ("exact", "eap", "eap-ig"):
        ours = hc.edges(bridge, clean=clean, corrupt=corrupt, metric=metric, method=method).frame
        theirs = hc.edges(twin, clean=clean, corrupt=corrupt, metric=metric, method=method).frame
        assert list(ours.writer + ours.reader + ours.via) == list(theirs.writer + theirs.reader + theirs.via)
        close(ours.score.values, theirs.score.values, atol=1e-4)
    faithful = [hc.faithfulness(m, hc.edges(m, clean=clean, corrupt=corrupt, metric=metric), clean=clean,
                                corrupt=corrupt, metric=metric, random=1) for m in (bridge, twin)]  # fmt: skip
    close(faithful[0].frame["faithfulness"].values, faithful[1].frame["faithfulness"].values, atol=1e-4)


def test_edges_name_what_they_cannot_take_on_a_bridge(built, inputs):
    """GPT-NeoX runs attention and MLP in parallel: hc.edges refuses it on the Bridge as on the twin, naming why."""
    clean, corrupt, answer, wrong = inputs
    for model in built["neox"][:2]:
        with pytest.raises(ValueError, match="parallel_attn_mlp=True"):
            hc.edges(model, clean=clean, corrupt=corrupt, metric=metric_of(answer, wrong))


def test_a_torch_hook_on_a_wrapped_module_is_seen_and_honoured(built, inputs):
    """Issue 61: a torch forward hook on a Hugging Face module the Bridge wraps (`_original_component`) changes
    the model's output; every analysis now sees it (the reference path) and gives what the twin gives with the
    same change as a TransformerLens hook (block 1's MLP output halved: the twin's centring moves only the mean
    direction, which every reader's LayerNorm removes)."""
    bridge, twin, _ = built["gpt2"]
    clean, corrupt, answer, wrong = inputs
    metric = metric_of(answer, wrong)

    def halve(module, args, output):
        return (output[0] * 0.5, *output[1:]) if isinstance(output, tuple) else output * 0.5

    wrapped = bridge.blocks[1].mlp._original_component
    before = bridge(clean)
    handle = wrapped.register_forward_hook(halve)
    twin.add_hook("blocks.1.hook_mlp_out", lambda x, hook: x * 0.5)
    try:
        assert (bridge(clean) - before).abs().max() > 1e-3  # the hook changes the output
        assert user_hooks(bridge) == ["blocks.1.mlp._original_component"]
        ours = hc.patch(bridge, clean=clean, corrupt=corrupt, metric=metric, head=1)
        assert "hooks at blocks.1.mlp._original_component" in ours.method
        close(ours.values, hc.patch(twin, clean=clean, corrupt=corrupt, metric=metric, head=1).values, atol=1e-4)
        mine = hc.edges(bridge, clean=clean, corrupt=corrupt, metric=metric, method="exact").frame
        theirs = hc.edges(twin, clean=clean, corrupt=corrupt, metric=metric, method="exact").frame
        close(mine.score.values, theirs.score.values, atol=1e-4)
        with pytest.raises(ValueError, match="blocks.1.mlp._original_component.*estimator='exact'"):
            hc.edges(bridge, clean=clean, corrupt=corrupt, metric=metric, method="eap")  # it ran in parts, unseen
        circuit = hc.edges(twin, clean=clean, corrupt=corrupt, metric=metric, method="exact")
        faithful = [hc.faithfulness(m, circuit, clean=clean, corrupt=corrupt, metric=metric, random=1)
                    for m in (bridge, twin)]  # fmt: skip
        a, b = (hc.attribute(m, clean=clean, corrupt=corrupt, metric=metric, method="atp", verify=4, sample=0)
                for m in (bridge, twin))  # fmt: skip
        close(a.values, b.values, atol=1e-4)
        close(a.exact[a.top], b.exact[b.top], atol=1e-4)
        pa, pb = (hc.path_patch(m, clean=clean, corrupt=corrupt, metric=metric) for m in (bridge, twin))
        close(torch.tensor(list(pa.values.values())), torch.tensor(list(pb.values.values())), atol=1e-4)
        close(faithful[0].frame["faithfulness"].values, faithful[1].frame["faithfulness"].values, atol=1e-4)
    finally:
        handle.remove()
        twin.reset_hooks()
    assert user_hooks(bridge) == []
    with_kwargs = wrapped.register_forward_pre_hook(lambda module, args, kwargs: None, with_kwargs=True)
    try:
        assert user_hooks(bridge) == ["blocks.1.mlp._original_component"]
    finally:
        with_kwargs.remove()
