"""hc.edges under a user's hook anywhere on the path (issue 47, items 1 and 2): exact edge patching against
canonical two-step path patching written here in plain TransformerLens, and EAP against central finite
differences of that exact patch, over hook points x shapes (attention-only, LN + MLPs, rotary, grouped-query).

Before the one edge engine, exact edges ignored a hook between writer and reader (0.744 of a 1.92 gap on
L0H3 -> L1H0 with x * 1.5 at blocks.0.hook_resid_post), and EAP was 1/1.3 of the derivative on every edge into
a reader whose input carries x * 1.3 + 0.05."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import attn_only_2l_like
from test_edges import _inputs, metric  # the edge tests' inputs and metric

import headcoop as hc

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.slow]

SHAPES = {
    "attn-only": dict(normalization_type=None, positional_embedding_type="standard"),
    "LN, MLPs": dict(attn_only=False, d_mlp=16, act_fn="gelu", positional_embedding_type="standard"),
    "rotary": dict(
        attn_only=False,
        d_mlp=16,
        act_fn="silu",
        gated_mlp=True,
        normalization_type="RMS",
        positional_embedding_type="rotary",
        rotary_dim=4,
    ),
    "grouped-query": dict(n_key_value_heads=2, positional_embedding_type="standard", attn_only=False, d_mlp=16),
}
# (hook point, whether it sits at a reader's own input or after it, so that EAP's derivative includes it)
HOOKS = {
    "writer z": ("blocks.0.attn.hook_z", True),
    "between: resid_post": ("blocks.0.hook_resid_post", False),
    "between: resid_pre": ("blocks.1.hook_resid_pre", False),
    "reader: q": ("blocks.1.attn.hook_q", True),
    "reader: ln1": ("blocks.1.ln1.hook_normalized", True),
    "reader: mlp pre": ("blocks.1.mlp.hook_pre", True),
    "reader: final norm": ("ln_final.hook_normalized", True),
}


def _writer_site(writer: str):
    if writer == "embed":
        return "hook_embed", None
    if writer.startswith("MLP"):
        return f"blocks.{writer[3:]}.hook_mlp_out", None
    layer, head = writer[1:].split("H")
    return f"blocks.{layer}.attn.hook_z", int(head)


@torch.no_grad()
def canonical(model, clean, corrupt, writer: str, reader: str, via: str, alpha: float = 1.0) -> float:
    """The edge's metric change by canonical two-step path patching, in plain TransformerLens with every
    installed hook on: (1) corrupt with the writer's activation moved alpha of the way to clean's, every head's
    z and every MLP's output otherwise frozen at corrupt's, reading the residual stream at the reader; (2)
    corrupt with that residual stream at the reader's own split input (its norm scale held at corrupt's)."""
    _, src = model.run_with_cache(clean)
    _, tgt = model.run_with_cache(corrupt)
    site, head = _writer_site(writer)
    hooks = []
    for name in [n for n in tgt.cache_dict if n.endswith(("attn.hook_z", "hook_mlp_out"))] + ["hook_embed"]:
        value = tgt[name].clone()
        if name == site:
            moved = tgt[name] + alpha * (src[name] - tgt[name])
            if head is None:
                value = moved
            else:
                value[:, :, head] = moved[:, :, head]
        hooks.append((name, lambda x, hook, v=value: v))
    if reader == "logits":
        layer = model.cfg.n_layers - 1
    elif reader.startswith("MLP"):
        layer = int(reader[3:])
    else:  # "L1H2" or a key/value head "L1KV0"
        layer = int(reader[1:].split("KV")[0].split("H")[0])
    entry = (
        f"blocks.{layer}.hook_resid_post"
        if reader == "logits"
        else f"blocks.{layer}.hook_resid_mid"
        if reader.startswith("MLP")
        else f"blocks.{layer}.hook_resid_pre"
    )
    with model.hooks(fwd_hooks=hooks):
        _, one = model.run_with_cache(corrupt, names_filter=entry)
    resid = one[entry]
    if reader == "logits":
        two = [(entry, lambda x, hook: resid)]
        if "ln_final.hook_scale" in tgt.cache_dict:
            two.append(("ln_final.hook_scale", lambda s, hook: tgt["ln_final.hook_scale"]))
        return float(metric(model.run_with_hooks(corrupt, fwd_hooks=two)) - metric(model(corrupt)))
    mlp = not model.cfg.attn_only
    model.set_use_split_qkv_input(True)
    if mlp:
        model.set_use_hook_mlp_in(True)
    try:
        if reader.startswith("MLP"):
            two = [(f"blocks.{layer}.hook_mlp_in", lambda x, hook: resid)]
            if f"blocks.{layer}.ln2.hook_scale" in tgt.cache_dict:
                two.append((f"blocks.{layer}.ln2.hook_scale", lambda s, hook: tgt[f"blocks.{layer}.ln2.hook_scale"]))
        else:
            index = int(reader.split("KV")[1]) if "KV" in reader else int(reader.split("H")[1])

            def put(x, hook):
                x = x.clone()
                x[:, :, index] = resid
                return x

            two = [(f"blocks.{layer}.hook_{via}_input", put)]
            scale = tgt.cache_dict.get(f"blocks.{layer}.ln1.hook_scale")
            if scale is not None:
                two.append((f"blocks.{layer}.ln1.hook_scale", lambda s, hook: scale[:, :, None].expand_as(s)))
        return float(metric(model.run_with_hooks(corrupt, fwd_hooks=two)) - metric(model(corrupt)))
    finally:
        model.set_use_split_qkv_input(False)
        if mlp:
            model.set_use_hook_mlp_in(False)


def _checked_edges(frame):
    """A spread of edges into layer 1 and the logits: from the embedding, a layer-0 head and a layer-0 MLP."""
    writers = {"embed", "L0H1", "MLP0"}
    readers = frame.reader.str.startswith(("L1", "MLP1")) | (frame.reader == "logits")
    picked = frame[frame.writer.isin(writers) & readers]
    return picked.groupby(["writer", "via"]).head(1)


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("point", list(HOOKS))
def test_exact_edges_and_eap_honour_a_hook_anywhere(shape, point):
    name, at_reader = HOOKS[point]
    model = attn_only_2l_like(seed=5, **SHAPES[shape]).to(torch.float64)
    if name not in model.hook_dict:
        pytest.skip(f"{shape} has no {name}")
    clean, corrupt = _inputs(model, seed=2)
    model.add_hook(name, lambda x, hook: x * 1.3 + 0.05)
    try:
        exact = hc.edges(model, clean=clean, corrupt=corrupt, metric=metric, estimator="exact")
        assert exact.method.startswith("reference: canonical two-step") and name in exact.method
        frame = exact.to_dataframe()
        picked = _checked_edges(frame)
        assert len(picked) >= 4
        for _, row in picked.iterrows():
            want = canonical(model, clean, corrupt, row.writer, row.reader, row.via)
            assert row.score == pytest.approx(want, abs=1e-9), (row.writer, row.reader, row.via)
        eap = hc.edges(model, clean=clean, corrupt=corrupt, metric=metric, estimator="eap")
        scores = eap.to_dataframe().set_index(["writer", "reader", "via"]).score
        if not at_reader:  # the estimate carries each change unchanged, and says so
            assert any(name in said for said in eap.assumptions)
            return
        eps = 1e-5
        for _, row in picked.iterrows():
            slope = (
                canonical(model, clean, corrupt, row.writer, row.reader, row.via, eps)
                - canonical(model, clean, corrupt, row.writer, row.reader, row.via, -eps)
            ) / (2 * eps)
            assert scores[(row.writer, row.reader, row.via)] == pytest.approx(slope, abs=1e-6 * max(1.0, abs(slope)))
    finally:
        model.reset_hooks(including_permanent=True)


def test_without_hooks_the_gradients_through_hooks_equal_the_fast_ones():
    """The autograd path (taken under any hook) and the hand-mapped one agree where both apply."""
    from headcoop.analysis.edges.graph import graph
    from headcoop.analysis.edges.scores import _reader_grads
    from headcoop.analysis.engine.copies import Score

    for shape in SHAPES.values():
        model = attn_only_2l_like(seed=3, **shape).to(torch.float64)
        clean, _ = _inputs(model)
        _, readers, _ = graph(model)
        fast, v1 = _reader_grads(model, clean, Score(metric), readers)
        slow, v2 = _reader_grads(model, clean, Score(metric), readers, through_hooks=True)
        assert float(v1) == pytest.approx(float(v2))
        for r in readers:
            torch.testing.assert_close(fast[r], slow[r], atol=1e-10, rtol=1e-8)
    assert np.isfinite(float(v1))
