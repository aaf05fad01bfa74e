"""hc.edges: exact edge patching on the engine against one forward pass per edge at TransformerLens's own split
inputs, against hc.path_patch where the two define the same edge, EAP as the derivative of the exact patch,
EAP-IG where the model is linear in its embeddings, the verification's bound, and bad input."""

import numpy as np
import pytest
import torch
from helpers import attn_only_2l_like

import headcoop as hc
from headcoop.analysis.edges.exact import edge_copies, writer_activation, writer_outputs
from headcoop.analysis.edges.graph import graph
from headcoop.analysis.engine.copies import clean_corrupt, evaluate, target_run

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")

SHAPES = {
    "attn-only, no norm": dict(normalization_type=None, positional_embedding_type="standard"),
    "LN, shortformer": dict(),
    "LN, MLPs": dict(attn_only=False, d_mlp=16, act_fn="gelu", positional_embedding_type="standard"),
    "RMS, gated MLPs, rotary": dict(
        attn_only=False,
        d_mlp=16,
        act_fn="silu",
        gated_mlp=True,
        normalization_type="RMS",
        positional_embedding_type="rotary",
        rotary_dim=4,
    ),
    "bidirectional": dict(
        attention_dir="bidirectional", positional_embedding_type="standard", attn_only=False, d_mlp=16
    ),
    "grouped-query": dict(n_key_value_heads=2, positional_embedding_type="standard", attn_only=False, d_mlp=16),
}


def _inputs(model, seed=0):
    gen = torch.Generator().manual_seed(seed)
    clean = torch.randint(0, model.cfg.d_vocab, (6, 8), generator=gen)
    corrupt = clean.clone()
    corrupt[:, 2] = (clean[:, 2] + 3) % model.cfg.d_vocab
    return clean, corrupt


def metric(logits):
    return logits[:, -1, 4].mean() - logits[:, -1, 7].mean()


def _exact(model, clean, corrupt, scale=1.0, path="stacked"):
    """Every edge's exact change of the metric, by the engine's `path`, the writers' changes scaled by `scale`."""
    writers, _, all_edges = graph(model)
    clean_t, corrupt_t, score = clean_corrupt(model, clean, corrupt, metric)
    _, source = model.run_with_cache(clean_t)
    target = target_run(model, corrupt_t, score, lambda n: True)
    out_s, out_t = writer_outputs(model, source, writers), writer_outputs(model, target.cache, writers)
    deltas = {w: scale * (out_s[w] - out_t[w]) for w in writers}
    ordered = sorted(all_edges, key=lambda e: model.cfg.n_layers if e[1][0] == "logits" else e[1][1])

    def scaled(w):  # the writer's activation whose output change is `scale` times the source's
        return w, writer_activation(target.cache, w) + scale * (
            writer_activation(source, w) - writer_activation(target.cache, w)
        )

    copies = edge_copies(model, ordered, deltas, target, scaled)
    return (evaluate(target, copies, path, 256) - target.value).double().numpy()


@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_edge_on_the_engine_matches_one_pass_per_edge_at_the_split_inputs(shape):
    model = attn_only_2l_like(seed=3, **SHAPES[shape])
    clean, corrupt = _inputs(model)
    stacked, reference = _exact(model, clean, corrupt), _exact(model, clean, corrupt, path="reference")
    assert np.abs(stacked).max() > 1e-3  # the edges do something
    np.testing.assert_allclose(stacked, reference, atol=2e-5, rtol=1e-4)
    result = hc.edges(model, clean=clean, corrupt=corrupt, metric=metric, estimator="exact")
    np.testing.assert_allclose(result.to_dataframe().score, stacked, atol=1e-6)


def test_head_edges_agree_with_path_patching():
    """Head -> head (q, k, v) and head -> logits edges are hc.path_patch's edges: the same numbers."""
    model = attn_only_2l_like(seed=4, n_layers=3)
    clean, corrupt = _inputs(model, seed=1)
    frame = hc.edges(model, clean=clean, corrupt=corrupt, metric=metric, estimator="exact").to_dataframe()
    paths = hc.path_patch(model, clean=clean, corrupt=corrupt, metric=metric)
    target = float(metric(model(corrupt)))
    checked = 0
    for (sender, receiver, via), value in paths.values.items():
        row = frame[(frame.writer == sender) & (frame.reader == receiver) & (frame.via == via)]
        assert len(row) == 1, (sender, receiver, via)
        assert float(row.score.iloc[0]) == pytest.approx(value - target, abs=2e-5)
        checked += 1
    assert checked == 3 * 16 * 3 + 12  # 3 layer pairs x 16 head pairs x q/k/v, and the 12 direct paths


@pytest.mark.parametrize("shape", ["attn-only, no norm", "LN, MLPs", "RMS, gated MLPs, rotary", "grouped-query"])
def test_eap_is_the_derivative_of_the_exact_patch(shape):
    """EAP's score is the first-order change: the exact patch of eps times the writer's change, over eps."""
    model = attn_only_2l_like(seed=5, **SHAPES[shape]).to(torch.float64)
    clean, corrupt = _inputs(model, seed=2)
    eps = 1e-4
    slope = _exact(model, clean, corrupt, scale=eps) / eps
    eap = hc.edges(model, clean=clean, corrupt=corrupt, metric=metric, estimator="eap").to_dataframe().score.to_numpy()
    np.testing.assert_allclose(eap, slope, atol=1e-3 * np.abs(slope).max(), rtol=1e-3)


def test_on_a_model_linear_in_its_embeddings_every_estimate_is_exact():
    """Uniform attention (W_Q = W_K = 0), no norm, no MLP: the metric is linear in the embeddings, so EAP,
    EAP-IG and the exact patch agree on every edge."""
    model = attn_only_2l_like(seed=6, normalization_type=None, positional_embedding_type="standard")
    with torch.no_grad():
        for block in model.blocks:
            block.attn.W_Q.zero_()
            block.attn.W_K.zero_()
    clean, corrupt = _inputs(model, seed=3)
    exact = hc.edges(model, clean=clean, corrupt=corrupt, metric=metric, estimator="exact").to_dataframe().score
    for method in ("eap", "eap-ig"):
        est = (
            hc.edges(model, clean=clean, corrupt=corrupt, metric=metric, estimator=method, steps=3).to_dataframe().score
        )
        np.testing.assert_allclose(est, exact, atol=1e-5)


def test_eap_ig_differs_from_eap_where_the_model_is_not_linear_and_tracks_the_exact_patch():
    model = attn_only_2l_like(seed=7, **SHAPES["LN, MLPs"])
    clean, corrupt = _inputs(model, seed=4)
    exact = hc.edges(model, clean=clean, corrupt=corrupt, metric=metric, estimator="exact").to_dataframe().score
    eap = hc.edges(model, clean=clean, corrupt=corrupt, metric=metric, estimator="eap").to_dataframe().score
    ig = hc.edges(model, clean=clean, corrupt=corrupt, metric=metric, estimator="eap-ig", steps=8).to_dataframe().score
    assert not np.allclose(eap, ig, atol=1e-4)
    assert np.corrcoef(ig, exact)[0, 1] > 0.8


def test_verification_patches_the_top_and_a_seeded_sample_exactly():
    model = attn_only_2l_like(seed=8, **SHAPES["LN, MLPs"])
    clean, corrupt = _inputs(model, seed=5)
    exact = hc.edges(model, clean=clean, corrupt=corrupt, metric=metric, estimator="exact").to_dataframe()
    result = hc.edges(model, clean=clean, corrupt=corrupt, metric=metric, verify=5, sample=12, seed=1)
    frame = result.to_dataframe()
    assert frame.top.sum() == 5 and frame.sampled.sum() == 12 and frame.exact.notna().sum() == 17
    ranked = frame.score.abs().sort_values(ascending=False).index[:5]
    assert set(frame.index[frame.top]) == set(ranked)
    np.testing.assert_allclose(frame.exact.dropna(), exact.score[frame.exact.notna()], atol=1e-6)
    missed = result.missed
    threshold = frame.exact[frame.top].abs().min()
    assert missed["above"] == int((frame.exact[frame.sampled].abs() > threshold).sum())
    assert missed["rest"] == len(frame) - 5 and 0 <= missed["share_low"] <= missed["share_high"] <= 1
    again = hc.edges(model, clean=clean, corrupt=corrupt, metric=metric, verify=5, sample=12, seed=1).to_dataframe()
    assert (again.sampled == frame.sampled).all()  # the seed decides the sample


def test_edges_and_attribute_bound_their_misses_in_one_unit():
    """One verification routine: `missed` has the same keys from hc.edges and hc.attribute, "estimate" / "low" /
    "high" count items of the rest in both (issue 46: 0.522 from hc.edges was a fraction, 19.307 from
    hc.attribute a count) and "share*" are the same bound as fractions."""
    model = attn_only_2l_like(seed=8, **SHAPES["LN, MLPs"])
    clean, corrupt = _inputs(model, seed=5)
    edge = hc.edges(model, clean=clean, corrupt=corrupt, metric=metric, verify=5, sample=40, seed=1).missed
    node = hc.attribute(model, clean=clean, corrupt=corrupt, metric=metric, verify=3, sample=10, seed=1).missed
    assert (
        set(edge)
        == set(node)
        == {"threshold", "rest", "sampled", "above", "estimate", "low", "high", "share", "share_low", "share_high"}
    )
    for m in (edge, node):
        assert m["share"] == pytest.approx(m["above"] / m["sampled"])
        assert m["estimate"] == pytest.approx(m["share"] * m["rest"])
        assert m["low"] == pytest.approx(m["share_low"] * m["rest"]) and m["high"] == pytest.approx(
            m["share_high"] * m["rest"]
        )
        assert 0 <= m["share_low"] <= m["share"] <= m["share_high"] <= 1 <= m["rest"]
    assert edge["high"] > 1  # a count: 40 of thousands of edges sampled leaves an upper bound above one edge


def test_the_result_shows_itself():
    model = attn_only_2l_like(seed=9, **SHAPES["LN, MLPs"])
    clean, corrupt = _inputs(model)
    result = hc.edges(model, clean=clean, corrupt=corrupt, metric=metric, verify=3, sample=3)
    writers, readers, all_edges = graph(model)
    frame = result.to_dataframe()
    assert list(frame.columns) == ["writer", "reader", "via", "score", "exact", "top", "sampled"]
    assert len(frame) == len(all_edges) and {"embed", "pos_embed", "MLP0", "L1H3"} <= set(frame.writer)
    assert {"q", "k", "v", "in", "direct"} == set(frame.via)
    assert "EdgeResult" in repr(result) and "norm scale" in repr(result)
    fig = result.plot(k=10)
    assert "10 strongest" in fig.layout.title.text and "assumes" in fig.layout.title.text
    assert "<table" in result._repr_html_()


def test_a_user_hook_sends_the_patches_down_the_reference_path_and_is_honoured():
    model = attn_only_2l_like(seed=10, **SHAPES["LN, MLPs"])
    clean, corrupt = _inputs(model)
    model.add_hook("blocks.0.hook_mlp_out", lambda x, hook: 2 * x)
    try:
        result = hc.edges(model, clean=clean, corrupt=corrupt, metric=metric, estimator="exact")
    finally:
        model.reset_hooks()
    assert result.method.startswith("reference") and "blocks.0.hook_mlp_out" in result.method
    plain = hc.edges(model, clean=clean, corrupt=corrupt, metric=metric, estimator="exact").to_dataframe().score
    assert not np.allclose(result.to_dataframe().score, plain, atol=1e-4)


def test_bad_input():
    model = attn_only_2l_like(seed=11)
    clean, corrupt = _inputs(model)
    with pytest.raises(ValueError, match="estimator"):
        hc.edges(model, clean=clean, corrupt=corrupt, metric=metric, estimator="acdc")
    with pytest.warns(DeprecationWarning, match="estimator"):  # the old spelling: `method` names the path
        old = hc.edges(model, clean=clean, corrupt=corrupt, metric=metric, method="exact")
    assert old.estimator == "exact" and old.method == "stacked copies from the reader's layer"
    with pytest.raises(ValueError, match="same choice"):
        hc.edges(model, clean=clean, corrupt=corrupt, metric=metric, method="exact", estimator="eap-ig")
    with pytest.raises(ValueError, match="verify"):
        hc.edges(model, clean=clean, corrupt=corrupt, metric=metric, verify=-1)
    gqa = attn_only_2l_like(seed=11, n_key_value_heads=2)
    with pytest.raises(ValueError, match="grouped-query"):
        hc.export_mib(hc.edges(gqa, clean=clean, corrupt=corrupt, metric=metric), "never.json", gqa)
    with pytest.raises(ValueError, match="differentiable"):
        hc.edges(model, clean=clean, corrupt=corrupt, metric=lambda logits: float(metric(logits)))


# --- circuits and faithfulness ----------------------------------------------------------------------------
def _random_masks(model, n=5, seed=0):
    from headcoop.analysis.edges.scores import graph

    writers, readers, _ = graph(model)
    return torch.rand(n, len(writers), len(readers), generator=torch.Generator().manual_seed(seed)) > 0.5


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("how", ["corrupt", "mean", "zero", "resample"])
def test_ablated_runs_on_the_engine_match_one_pass_per_circuit_at_the_split_inputs(shape, how):
    from headcoop.analysis.edges.faithfulness import _reference_outputs, circuit_copies
    from headcoop.analysis.edges.scores import graph

    model = attn_only_2l_like(seed=12, **SHAPES[shape])
    clean, corrupt = _inputs(model)
    writers, readers, _ = graph(model)
    clean_t, corrupt_t, score = clean_corrupt(model, clean, corrupt, metric)
    _, corrupt_cache = model.run_with_cache(corrupt_t)
    target = target_run(model, clean_t, score, lambda n: True)
    copies = circuit_copies(model, target, _random_masks(model), writers, readers,
                            _reference_outputs(model, writers, corrupt_cache, how, *clean_t.shape))  # fmt: skip
    stacked, reference = evaluate(target, copies, "stacked", 256), evaluate(target, copies, "reference", 256)
    torch.testing.assert_close(stacked, reference, atol=2e-5, rtol=1e-4)
    assert float(stacked.std()) > 1e-4  # the circuits differ


@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_whole_graph_is_the_clean_run_and_no_edge_the_corrupt_run(shape):
    model = attn_only_2l_like(seed=13, **SHAPES[shape])
    clean, corrupt = _inputs(model)
    result = hc.faithfulness(model, hc.edges(model, clean=clean, corrupt=corrupt, metric=metric), clean=clean,
                             corrupt=corrupt, metric=metric)  # fmt: skip
    assert result.full == pytest.approx(float(metric(model(clean))), abs=1e-5)
    assert result.empty == pytest.approx(float(metric(model(corrupt))), abs=1e-5)
    frame = result.to_dataframe()
    assert frame.faithfulness.iloc[0] == pytest.approx(0.0, abs=1e-6) and frame.faithfulness.iloc[-1] == pytest.approx(
        1.0
    )
    assert frame.edges.iloc[-1] == result.n_edges and 0 <= result.cmd and "CPR" in repr(result)
    assert "Faithfulness" in result.plot().layout.title.text


def _one_head_model():
    """Two attention-only layers, no norm, every head's output zeroed but L0H0's: the true circuit is every edge
    from the embeddings and L0H0 into L0H0's q, k, v and the logits."""
    model = attn_only_2l_like(seed=14, normalization_type=None, positional_embedding_type="standard")
    with torch.no_grad():
        for block in model.blocks:
            block.attn.W_O.zero_()
            block.attn.b_O.zero_()
        model.blocks[0].attn.W_O[0] = torch.randn(
            model.cfg.d_head, model.cfg.d_model, generator=torch.Generator().manual_seed(0)
        )
    true = [(w, r, v) for w in ("embed", "pos_embed") for r, v in [("L0H0", "q"), ("L0H0", "k"), ("L0H0", "v")]]
    true += [("embed", "logits", "direct"), ("pos_embed", "logits", "direct"), ("L0H0", "logits", "direct")]
    return model, true


def test_a_known_circuit_is_fully_faithful_and_loses_what_it_drops():
    model, true = _one_head_model()
    clean, corrupt = _inputs(model, seed=6)
    for how in ("corrupt", "mean", "zero"):
        whole = hc.faithfulness(model, hc.circuit(true), clean=clean, corrupt=corrupt, metric=metric, how=how)
        assert whole.frame.faithfulness.iloc[0] == pytest.approx(1.0, abs=1e-5), how
    partial = hc.faithfulness(model, hc.circuit([e for e in true if e != ("L0H0", "logits", "direct")]),
                              clean=clean, corrupt=corrupt, metric=metric)  # fmt: skip
    assert abs(partial.frame.faithfulness.iloc[0] - 1.0) > 0.05
    # exact edge scores find it: every edge outside the true circuit scores 0
    frame = hc.edges(model, clean=clean, corrupt=corrupt, metric=metric, estimator="exact").to_dataframe()
    outside = ~frame.apply(lambda r: (r.writer, r.reader, r.via) in set(true), axis=1)
    assert frame.score[outside].abs().max() < 1e-6 and frame.score[~outside].abs().max() > 1e-3


def test_circuit_picks_by_size_or_threshold_and_checks_its_input():
    model = attn_only_2l_like(seed=15, **SHAPES["LN, MLPs"])
    clean, corrupt = _inputs(model)
    result = hc.edges(model, clean=clean, corrupt=corrupt, metric=metric)
    top = hc.circuit(result, k=5)
    ranked = result.ranked().head(5)
    assert top.edges == frozenset(zip(ranked.writer, ranked.reader, ranked.via))
    cut = float(ranked.score.abs().iloc[-1])
    assert hc.circuit(result, threshold=cut).edges == top.edges
    assert "Circuit(5 edges" in repr(top) and len(top.to_dataframe()) == 5 and top.plot().data
    with pytest.raises(ValueError, match="exactly one of k"):
        hc.circuit(result)
    with pytest.raises(ValueError, match="k"):
        hc.circuit(result, k=10**6)
    with pytest.raises(ValueError, match="not in this model's graph"):
        hc.faithfulness(model, hc.circuit([("L9H9", "logits", "direct")]), clean=clean, corrupt=corrupt, metric=metric)
    with pytest.raises(ValueError, match="how"):
        hc.faithfulness(model, top, clean=clean, corrupt=corrupt, metric=metric, how="mean-ish")
    with pytest.raises(ValueError, match="sizes"):
        hc.faithfulness(model, result, clean=clean, corrupt=corrupt, metric=metric, sizes=[10**6])
    with pytest.raises(TypeError, match="Circuit"):
        hc.faithfulness(model, ["L0H0"], clean=clean, corrupt=corrupt, metric=metric)


def _eap_ig_names(n_layers: int, n_heads: int) -> set[str]:
    """EAP-IG's edge names for a sequential model (its Graph.from_model, read from hannamw/EAP-IG's graph.py):
    every earlier node into each head's q, k, v and each MLP, everything into the logits."""
    stream, names = ["input"], set()
    for lay in range(n_layers):
        heads = [f"a{lay}.h{h}" for h in range(n_heads)]
        names |= {f"{p}->{a}<{x}>" for p in stream for a in heads for x in "qkv"}
        stream = stream + heads
        names |= {f"{p}->m{lay}" for p in stream}
        stream = stream + [f"m{lay}"]
    return names | {f"{p}->logits" for p in stream}


def test_the_mib_export_names_every_edge_as_eap_ig_does_and_never_overwrites(tmp_path):
    import json

    model = attn_only_2l_like(seed=16, **SHAPES["LN, MLPs"])
    clean, corrupt = _inputs(model)
    result = hc.edges(model, clean=clean, corrupt=corrupt, metric=metric, verify=4, sample=4)
    circuit = hc.circuit(result, k=6)
    path = hc.export_mib(result, tmp_path / "circuit.json", model, circuit=circuit)
    data = json.loads(path.read_text())
    assert set(data) == {"cfg", "nodes", "edges"} and data["cfg"]["n_layers"] == 2 and data["cfg"]["d_model"] == 32
    assert set(data["edges"]) == _eap_ig_names(2, 4)
    frame = result.to_dataframe()
    value = frame.exact.where(frame.exact.notna(), frame.score)
    embed_to_logits = value[(frame.writer.isin(["embed", "pos_embed"])) & (frame.reader == "logits")].sum()
    assert data["edges"]["input->logits"]["score"] == pytest.approx(float(embed_to_logits))
    kept = sum(e["in_graph"] for e in data["edges"].values())
    assert 1 <= kept <= 6
    for name, entry in data["edges"].items():
        if entry["in_graph"]:
            parent, child = name.split("->")
            assert data["nodes"][parent]["in_graph"] and data["nodes"][child.split("<")[0]]["in_graph"]
    with pytest.raises(FileExistsError, match="overwrite=True"):
        hc.export_mib(result, path, model)
    assert json.loads(path.read_text()) == data  # untouched
    hc.export_mib(result, path, model, overwrite=True)
    assert not any(json.loads(path.read_text())["edges"][n]["in_graph"] for n in data["edges"])  # no circuit given


def test_a_grouped_query_model_has_one_reader_per_key_value_head():
    """n_key_value_heads=2 of 4: the k and v inputs are read per key/value head ("L1KV0"), shared by two query heads;
    its edges on the engine match one pass per edge at TransformerLens's split inputs (test above), and the
    circuit runs too."""
    model = attn_only_2l_like(seed=17, **SHAPES["grouped-query"])
    clean, corrupt = _inputs(model)
    frame = hc.edges(model, clean=clean, corrupt=corrupt, metric=metric, estimator="exact").to_dataframe()
    kv = frame[frame.via.isin(["k", "v"])]
    assert set(kv.reader) == {"L0KV0", "L0KV1", "L1KV0", "L1KV1"} and set(frame[frame.via == "q"].reader) >= {"L1H3"}
    assert kv.score.abs().max() > 1e-4
    result = hc.faithfulness(model, hc.edges(model, clean=clean, corrupt=corrupt, metric=metric), clean=clean,
                             corrupt=corrupt, metric=metric)  # fmt: skip
    assert result.full == pytest.approx(float(metric(model(clean))), abs=1e-5)
    assert result.empty == pytest.approx(float(metric(model(corrupt))), abs=1e-5)
    assert hc.edges(model, clean=clean, corrupt=corrupt, metric=metric).plot().data


def test_noising_patches_the_corrupt_run_into_the_clean_one():
    """direction="noise": the clean run is the target, the corrupt run the source; head edges agree with
    hc.path_patch's noising, and EAP is still the exact patch's derivative there."""
    model = attn_only_2l_like(seed=18, n_layers=2)
    clean, corrupt = _inputs(model, seed=7)
    frame = hc.edges(
        model, clean=clean, corrupt=corrupt, metric=metric, estimator="exact", direction="noise"
    ).to_dataframe()
    paths = hc.path_patch(model, clean=clean, corrupt=corrupt, metric=metric, direction="noise")
    target = float(metric(model(clean)))
    for (sender, receiver, via), value in paths.values.items():
        row = frame[(frame.writer == sender) & (frame.reader == receiver) & (frame.via == via)]
        assert float(row.score.iloc[0]) == pytest.approx(value - target, abs=2e-5)
    flipped = hc.edges(model, clean=corrupt, corrupt=clean, metric=metric, estimator="exact").to_dataframe()
    np.testing.assert_allclose(frame.score, flipped.score, atol=1e-6)  # noising = denoising with the roles swapped


def test_a_user_hook_sends_the_ablated_runs_down_the_reference_path_and_is_honoured():
    model = attn_only_2l_like(seed=19, **SHAPES["LN, MLPs"])
    clean, corrupt = _inputs(model)
    result = hc.edges(model, clean=clean, corrupt=corrupt, metric=metric)
    plain = hc.faithfulness(model, result, clean=clean, corrupt=corrupt, metric=metric, random=0)
    model.add_hook("blocks.0.hook_mlp_out", lambda x, hook: 2 * x)
    try:
        hooked = hc.faithfulness(model, result, clean=clean, corrupt=corrupt, metric=metric, random=0)
        want = float(metric(model(clean)))
    finally:
        model.reset_hooks()
    assert hooked.method.startswith("reference") and "blocks.0.hook_mlp_out" in hooked.method
    assert hooked.full == pytest.approx(want, abs=1e-5) and abs(hooked.full - plain.full) > 1e-4


def _full_table_products(deltas, grads, ordered, writers, readers):
    """The previous EAP product: the whole writer x reader table, then the edges picked from it."""
    D = torch.stack([deltas[w].reshape(-1) for w in writers])
    table = D @ torch.stack([grads[r].reshape(-1).to(D) for r in readers]).T
    w_index, r_index = {w: i for i, w in enumerate(writers)}, {r: i for i, r in enumerate(readers)}
    return table[[w_index[w] for w, _ in ordered], [r_index[r] for _, r in ordered]]


@pytest.mark.parametrize("shape", ["LN, MLPs", "grouped-query", "LN, shortformer"])
def test_eap_at_its_floor_keeps_its_scores(shape):
    """Issue 46: EAP runs the source once and the target once (forward and backward) when nothing is verified,
    and computes only the edges' products; the scores equal the full table's and the verified run's."""
    from headcoop.analysis.edges.scores import _products, _reader_grads
    from headcoop.analysis.engine.copies import Score

    model = attn_only_2l_like(seed=12, **SHAPES[shape])
    clean, corrupt = _inputs(model, seed=6)
    calls = []
    forward = model.forward
    model.forward = lambda *a, **k: calls.append(1) or forward(*a, **k)
    try:
        floor = hc.edges(model, clean=clean, corrupt=corrupt, metric=metric, estimator="eap")
        assert len(calls) == 2 and floor.cost["passes"] == 3.0  # source forward; target forward + backward
        calls.clear()
        checked = hc.edges(model, clean=clean, corrupt=corrupt, metric=metric, estimator="eap", verify=2)
        assert len(calls) > 3
    finally:
        del model.forward
    np.testing.assert_allclose(floor.to_dataframe().score, checked.to_dataframe().score, rtol=1e-6, atol=1e-9)
    writers, readers, all_edges = graph(model)
    ordered = sorted(all_edges, key=lambda e: model.cfg.n_layers if e[1][0] == "logits" else e[1][1])
    _, source = model.run_with_cache(clean)
    _, target = model.run_with_cache(corrupt)
    out_s, out_t = writer_outputs(model, source, writers), writer_outputs(model, target, writers)
    deltas = {w: out_s[w] - out_t[w] for w in writers}
    grads, _ = _reader_grads(model, corrupt, Score(metric), readers)
    torch.testing.assert_close(
        _products(deltas, grads, ordered, writers),
        _full_table_products(deltas, grads, ordered, writers, readers),
        rtol=1e-5,
        atol=1e-7,
    )
    np.testing.assert_allclose(
        floor.to_dataframe().score, _products(deltas, grads, ordered, writers).detach().numpy(), rtol=1e-5, atol=1e-7
    )


def test_non_finite_metrics_and_scores_are_refused():
    """Issue 47, item 3: a NaN or inf metric, or logits that overflow, are a ValueError naming what is not finite."""
    model = attn_only_2l_like(seed=13, **SHAPES["LN, MLPs"])
    clean, corrupt = _inputs(model)
    for estimator in ("eap", "exact"):
        with pytest.raises(ValueError, match="NaN or inf"):
            hc.edges(model, clean=clean, corrupt=corrupt, metric=lambda logits: metric(logits) * float("nan"),
                     estimator=estimator)  # fmt: skip
    with pytest.raises(ValueError, match="NaN or inf"):
        hc.edges(model, clean=clean, corrupt=corrupt, metric=lambda logits: metric(logits) + float("inf"))


def _named_batches(model, seed=0):
    """(clean, corrupt) Batches of _inputs' tokens with right and wrong answers at the last position."""
    from headcoop.tasks.base import Batch

    clean, corrupt = _inputs(model, seed)
    n, pos = clean.shape
    gen = torch.Generator().manual_seed(seed + 1)
    answer, wrong = torch.randint(0, model.cfg.d_vocab_out, (2, n), generator=gen)
    last = torch.full((n,), pos - 1)

    def batch(tokens, a, w):
        return Batch(
            tokens=tokens,
            loss_pos=last[:, None],
            targets=a[:, None],
            answer_pos=last,
            answer=a,
            wrong=w,
            labels=torch.zeros(n, dtype=torch.long),
        )

    return batch(clean, answer, wrong), batch(corrupt, wrong, answer)


@pytest.mark.parametrize(
    "estimator, extra",
    [("eap", {}), ("eap", dict(verify=3)), ("eap-ig", dict(steps=3)), ("eap", dict(direction="noise", how="mean"))],
)
def test_eap_in_parts_within_the_memory_budget_equals_the_whole_batch(estimator, extra):
    """Issue 51, item 8: a budget too small for the batch runs the gradient passes in parts (a named metric is a
    mean over inputs, so each part counts by its share); the scores and the metric's values are the whole
    batch's. A callable metric cannot be split: it runs at once, with a warning naming the budget."""
    from headcoop.analysis.engine.copies import inputs_per_gradient_chunk

    model = attn_only_2l_like(seed=21, **SHAPES["LN, MLPs"])
    clean, corrupt = _named_batches(model)
    assert inputs_per_gradient_chunk(model, 8, 1e-4) == 1 and inputs_per_gradient_chunk(model, 8, 256) > 6
    kw = dict(clean=clean, corrupt=corrupt, metric="logit_diff", estimator=estimator, **extra)
    whole, parts = hc.edges(model, **kw), hc.edges(model, memory_budget_mb=1e-4, **kw)
    assert (whole.cost["parts"], parts.cost["parts"]) == (1, 6)
    np.testing.assert_allclose(parts.to_dataframe().score, whole.to_dataframe().score, rtol=1e-5, atol=1e-6)
    assert np.abs(whole.to_dataframe().score).max() > 1e-3
    # float32 logits: a mean over 6 inputs and a sum of 6 shares of it agree to float32 precision (2e-7 relative
    # on this machine's kernels), not to 1e-9
    assert parts.target_value == pytest.approx(whole.target_value, rel=1e-6, abs=1e-9)
    np.testing.assert_allclose(parts.to_dataframe().exact, whole.to_dataframe().exact, rtol=1e-6, atol=1e-6)
    with pytest.warns(UserWarning, match="a callable metric cannot be split over inputs"):  # 6 inputs, 1 a part
        callable_parts = hc.edges(
            model, memory_budget_mb=1e-4, **dict(kw, clean=clean.tokens, corrupt=corrupt.tokens, metric=metric)
        )
    callable_whole = hc.edges(model, **dict(kw, clean=clean.tokens, corrupt=corrupt.tokens, metric=metric))
    np.testing.assert_allclose(callable_parts.to_dataframe().score, callable_whole.to_dataframe().score, rtol=1e-6)


def test_with_a_hook_installed_the_gradient_passes_do_not_run_in_parts():
    """A user's hook may read the whole batch (here: a share of the batch mean added to the residual stream), so
    no part would be the batch's share: with hooks installed the inputs run at once, and say so past the budget."""
    model = attn_only_2l_like(seed=22, **SHAPES["LN, MLPs"])
    clean, corrupt = _named_batches(model)
    model.add_hook("blocks.1.hook_resid_pre", lambda act, hook: act + 0.5 * act.mean(0, keepdim=True))
    try:
        kw = dict(clean=clean, corrupt=corrupt, metric="logit_diff")
        with pytest.warns(UserWarning, match="hooks are installed on the model"):
            tight = hc.edges(model, memory_budget_mb=1e-4, **kw)
        whole = hc.edges(model, **kw)
        att = hc.attribute(model, memory_budget_mb=1e-4, estimator="atp", verify=0, sample=0, progress=False, **kw)
    finally:
        model.reset_hooks()
    assert tight.cost["parts"] == 1 and att.cost["parts"] == 1
    np.testing.assert_allclose(tight.to_dataframe().score, whole.to_dataframe().score, rtol=1e-6, atol=1e-9)
