"""The engine's two small specifications (issue 36), each against a plain TransformerLens loop: residual-stream
patching read by a probe (`probe_patch`: a `Readout` at the probe's site), and mean-ablating edges between
heads over several mean references in one engine call (`ablate_edges`: per-copy replacement values)."""

from __future__ import annotations

import pytest
import torch
from helpers import attn_only_2l_like

import headcoop as hc
from headcoop.analysis.nodes.probe_patching import probe_patch

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _inputs(model, seed=0, batch=12, width=6):
    gen = torch.Generator().manual_seed(seed)
    clean = torch.randint(0, model.cfg.d_vocab, (batch, width), generator=gen)
    return clean, torch.randint(0, model.cfg.d_vocab, (batch, width), generator=gen)


@torch.no_grad()
def plain_probe_patch(model, clean, corrupt, probe, index, pos):
    """For each (layer, position): the corrupt run with that clean resid_pre row, the probe's mean logit."""
    layer, head, site = probe.layers[index], probe.heads[index], probe.site
    name = (
        f"blocks.{layer}.attn.hook_{'z' if site == 'result' else site}"
        if head is not None
        else f"blocks.{layer}.hook_{site}"
    )
    _, clean_cache = model.run_with_cache(clean)
    out = torch.zeros(model.cfg.n_layers, clean.shape[1])
    rows = torch.arange(len(clean))
    for lay in range(model.cfg.n_layers):
        for p in range(clean.shape[1]):

            def put(x, hook, p=p, lay=lay):
                x = x.clone()
                x[:, p] = clean_cache[f"blocks.{lay}.hook_resid_pre"][:, p]
                return x

            with model.hooks(fwd_hooks=[(f"blocks.{lay}.hook_resid_pre", put)]):
                _, cache = model.run_with_cache(corrupt)
            x = cache[name][rows, pos]
            x = x[:, head] if head is not None else x
            if site == "result":
                x = x @ model.blocks[layer].attn.W_O[head]
            out[lay, p] = float((x.double() @ probe.weight[index] + probe.bias[index]).mean())
    return out


@pytest.mark.parametrize("site, index", [("z", 5), ("resid_pre", 1), ("result", 2)])
def test_probe_patch_equals_the_plain_loop(site, index):
    model = attn_only_2l_like(seed=1, n_layers=2)
    clean, corrupt = _inputs(model)
    labels = (clean[:, -1] % 2).long()
    probe = hc.probe(model, clean, labels=labels, site=site)
    result = probe_patch(model, clean, corrupt, probe, index=index)
    want = plain_probe_patch(model, clean, corrupt, probe, index, torch.full((len(clean),), clean.shape[1] - 1))
    torch.testing.assert_close(result.values, want, atol=1e-5, rtol=1e-5)
    assert result.dims == ("layer", "pos") and "probe" in result.method
    layer = probe.layers[index]
    if layer < model.cfg.n_layers - 1:  # patches after the probe's block read as the corrupt run
        assert torch.allclose(result.values[layer + 1 :], torch.tensor(result.corrupt_value), atol=1e-6)


def test_probe_patch_with_a_user_hook_takes_the_reference():
    model = attn_only_2l_like(seed=1, n_layers=2)
    clean, corrupt = _inputs(model)
    probe = hc.probe(model, clean, labels=(clean[:, -1] % 2).long(), site="z")
    model.add_hook("blocks.0.hook_resid_post", lambda x, hook: x * 1.2)
    try:
        result = probe_patch(model, clean, corrupt, probe, index=5)
        want = plain_probe_patch(model, clean, corrupt, probe, 5, torch.full((len(clean),), clean.shape[1] - 1))
        torch.testing.assert_close(result.values, want, atol=1e-5, rtol=1e-5)
        assert result.method.startswith("reference")
    finally:
        model.reset_hooks(including_permanent=True)


@torch.no_grad()
def plain_edge_ablation(model, tokens, reference, metric, sender, receiver, via):
    """The receiver's split `via` input = the run's resid_pre - the sender's output + its mean output over
    `reference` (per position), ln1's scale frozen at the run's: one forward pass."""
    from test_path_patching import split_input_metric

    (a, i), (b, _) = sender, receiver  # the receiver's head is not read here
    _, run = model.run_with_cache(tokens)
    _, ref = model.run_with_cache(reference)
    z = run[f"blocks.{a}.attn.hook_z"][:, :, i]
    mean = ref[f"blocks.{a}.attn.hook_z"][:, :, i].mean(0, keepdim=True)
    resid = run[f"blocks.{b}.hook_resid_pre"] + (mean - z) @ model.W_O[a, i]
    return split_input_metric(model, tokens, run, metric, receiver, via, resid)


@pytest.mark.parametrize(
    "shape",
    [
        dict(),
        dict(positional_embedding_type="rotary", rotary_dim=4),
        dict(attn_only=False, d_mlp=16, act_fn="gelu", positional_embedding_type="standard"),
    ],
)
def test_ablate_edges_over_several_references_equals_the_plain_loop(shape):
    from headcoop.analysis.edges.ablation import ablate_edges

    model = attn_only_2l_like(seed=2, n_layers=3, **shape)
    tokens, _ = _inputs(model, seed=3, batch=6)
    references = [_inputs(model, seed=s, batch=8)[0] for s in (4, 5, 6)]

    def metric(logits):
        return logits[:, -1, 4].mean() - logits[:, -1, 7].mean()

    edges = [("L0H1", "L2H3", "q"), ("L0H1", "L1H0", "v"), ("L1H2", "L2H0", "k")]
    result = ablate_edges(model, tokens, edges, references, metric)
    frame = result.to_dataframe()
    assert len(frame) == 9
    for _, row in frame.iterrows():
        sender, receiver = (int(row.sender[1]), int(row.sender[3])), (int(row.receiver[1]), int(row.receiver[3]))
        want = plain_edge_ablation(model, tokens, references[row.reference], metric, sender, receiver, row.via)
        assert row.value == pytest.approx(want, abs=1e-5, rel=1e-5), (row.sender, row.receiver, row.via, row.reference)
    assert frame.groupby(["sender", "receiver", "via"]).value.nunique().max() > 1  # the references differ
    assert result.method.startswith("stacked")
    assert "mean over 8 reference inputs, per position" in repr(result) and "norm scale frozen" in repr(result)


def test_ablate_edges_with_a_user_hook_takes_the_canonical_reference():
    from headcoop.analysis.edges.ablation import ablate_edges

    model = attn_only_2l_like(seed=2, n_layers=3)
    tokens, _ = _inputs(model, seed=3, batch=6)
    references = [_inputs(model, seed=s, batch=8)[0] for s in (4, 5)]

    def metric(logits):
        return logits[:, -1, 4].mean() - logits[:, -1, 7].mean()

    model.add_hook("blocks.2.hook_resid_post", lambda x, hook: x * 1.1 + 0.01)  # after every receiver
    try:
        frame = ablate_edges(model, tokens, [("L0H1", "L2H3", "v")], references, metric).to_dataframe()
        for _, row in frame.iterrows():
            want = plain_edge_ablation(model, tokens, references[row.reference], metric, (0, 1), (2, 3), "v")
            assert row.value == pytest.approx(want, abs=1e-5, rel=1e-5)
    finally:
        model.reset_hooks(including_permanent=True)


def test_probe_patch_reads_where_the_probe_was_fit_by_default():
    """hc.probe fits at a Batch's answer position; hc.probe_patch's default reads there too (issue 46: it read
    the last position, -15.86 against 0.71 on a tiny model), so its clean reading is the fitted probe's own mean
    logit on the clean inputs."""
    task = hc.Count01()
    model = task.model(n_heads=2, d_model=8, d_head=2, seed=0)
    batch = task.sample(48, seed=3)
    assert len(set(batch.answer_pos.tolist())) > 1  # variable lengths: the last position is not the answer's
    probe = hc.probe(model, batch, labels=batch.labels, site="resid_post")
    corrupt = task.corrupt(batch)
    default = probe_patch(model, batch, corrupt, probe, index=0)
    explicit = probe_patch(model, batch, corrupt, probe, index=0, pos=batch.answer_pos)
    last = probe_patch(model, batch, corrupt, probe, index=0, pos=batch.tokens.shape[1] - 1)
    torch.testing.assert_close(default.values, explicit.values)
    from headcoop.analysis.nodes.probes import probe_features

    features, *_ = probe_features(model, batch, site="resid_post")  # at hc.probe's positions
    fitted = float((features[:, 0].double() @ probe.weight[0] + probe.bias[0]).mean())
    assert default.clean_value == pytest.approx(fitted, abs=1e-6)
    assert last.clean_value != pytest.approx(fitted, abs=1e-3)


@torch.no_grad()
def plain_recomputed_edge_ablation(model, tokens, reference, metric, sender, receiver, via):
    """hc.faithfulness's definition: the receiver's split `via` input = the run's resid_pre - the sender's output
    + its mean output over `reference` (per position), with ln1 recomputed on that input (no scale frozen)."""
    (a, i), (b, j) = sender, receiver
    _, run = model.run_with_cache(tokens)
    _, ref = model.run_with_cache(reference)
    z = run[f"blocks.{a}.attn.hook_z"][:, :, i]
    mean = ref[f"blocks.{a}.attn.hook_z"][:, :, i].mean(0, keepdim=True)
    resid = run[f"blocks.{b}.hook_resid_pre"] + (mean - z) @ model.W_O[a, i]
    model.set_use_split_qkv_input(True)
    try:

        def put(x, hook):
            x = x.clone()
            x[:, :, j] = resid
            return x

        return float(metric(model.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{b}.hook_{via}_input", put)])))
    finally:
        model.set_use_split_qkv_input(False)


def test_one_mean_ablated_edge_under_both_named_definitions():
    """Issue 46: mean-ablating one edge gave 0.62417 through hc.faithfulness and 0.62481 through hc.ablate_edges
    with neither saying which definition ran. Both now take the mean by the one ablation (`replacement`) over the
    same reference; they differ only in the norm (frozen at the run's scale for the edge, recomputed for the
    circuit), each value equals its plain TransformerLens reference, and each result names its definition."""
    from headcoop.analysis.edges.ablation import ablate_edges
    from headcoop.analysis.edges.faithfulness import Circuit
    from headcoop.analysis.edges.graph import graph, reader_name, writer_name

    model = attn_only_2l_like(seed=2)  # LayerNorm: the two definitions differ
    tokens, corrupt = _inputs(model, seed=3, batch=6)
    reference = _inputs(model, seed=4, batch=8)[0]

    def metric(logits):
        return logits[:, -1, 4].mean() - logits[:, -1, 7].mean()

    edge = ("L0H1", "L1H2", "v")
    frozen = ablate_edges(model, tokens, [edge], [reference], metric)
    frozen_value = float(frozen.to_dataframe().value.iloc[0])
    assert frozen_value == pytest.approx(
        plain_edge_ablation(model, tokens, reference, metric, (0, 1), (1, 2), "v"), abs=1e-5
    )
    everything = {(writer_name(w), *reader_name(r)) for w, r in graph(model)[2]}
    result = hc.faithfulness(model, Circuit(frozenset(everything - {edge})), clean=tokens, corrupt=corrupt,
                             metric=metric, how="mean", reference=reference)  # fmt: skip
    recomputed_value = float(result.to_dataframe().metric.iloc[-1])
    want = plain_recomputed_edge_ablation(model, tokens, reference, metric, (0, 1), (1, 2), "v")
    assert recomputed_value == pytest.approx(want, abs=1e-5)
    assert abs(frozen_value - recomputed_value) > 1e-4  # two readings of "mean-ablate an edge", named
    assert "mean over 8 reference inputs, per position" in repr(frozen) and "norm scale frozen" in repr(frozen)
    assert "mean over 8 reference inputs, per position" in repr(result) and "norms recomputed" in repr(result)
    with pytest.raises(ValueError, match="reference= only applies"):
        hc.faithfulness(model, result_circuit := Circuit(frozenset({edge})), clean=tokens, corrupt=corrupt,
                        metric=metric, how="zero", reference=reference)  # fmt: skip
    assert result_circuit.edges
