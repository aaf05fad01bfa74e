"""hc.path_patch against a slow reference built from TransformerLens's own split q/k/v inputs: one forward
pass per edge, hooking the receiver head's input and freezing its LayerNorm scale at the target run's."""

import pytest
import torch
from helpers import attn_only_2l_like

import headcoop as hc

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@torch.no_grad()
def reference_edge(model, clean, corrupt, metric, sender, receiver, via):
    """Denoising: run corrupt; receiver's `via` input = corrupt resid_pre + (clean - corrupt) sender output,
    normalised with the corrupt run's scale (TransformerLens's ln1 on split inputs, scale hooked)."""
    (a, i), (b, _) = sender, receiver  # the receiver's head is not read here
    _, src = model.run_with_cache(clean)
    _, tgt = model.run_with_cache(corrupt)
    delta = (src[f"blocks.{a}.attn.hook_z"][:, :, i] - tgt[f"blocks.{a}.attn.hook_z"][:, :, i]) @ model.W_O[a, i]
    return split_input_metric(model, corrupt, tgt, metric, receiver, via, tgt[f"blocks.{b}.hook_resid_pre"] + delta)


def split_input_metric(model, corrupt, tgt, metric, receiver, via, resid):
    """The metric of the corrupt run with the receiver's split `via` input set to `resid` [batch, pos, d_model]
    and its ln1 scale frozen at the corrupt run's (`tgt`)."""
    b, j = receiver
    model.set_use_split_qkv_input(True)
    try:

        def put(x, hook):
            x = x.clone()
            x[:, :, j] = resid
            return x

        hooks = [(f"blocks.{b}.hook_{via}_input", put)]
        if model.cfg.normalization_type is not None:
            frozen = tgt[f"blocks.{b}.ln1.hook_scale"]  # [batch, pos, 1]

            def scale(s, hook):
                s = s.clone()
                s[:, :, j] = frozen
                return s

            hooks.append((f"blocks.{b}.ln1.hook_scale", scale))
        return float(metric(model.run_with_hooks(corrupt, fwd_hooks=hooks)))
    finally:
        model.set_use_split_qkv_input(False)


@torch.no_grad()
def canonical_edge(model, clean, corrupt, metric, sender, receiver, via):
    """Canonical two-step path patching, written here in plain TransformerLens with every installed hook on:
    (1) run corrupt with the sender's z from clean, every other z and MLP output frozen at corrupt's, and read
    the residual stream entering the receiver's layer; (2) run corrupt with the receiver's split `via` input
    set to it and its ln1 scale frozen at corrupt's. Without hooks it equals `reference_edge`."""
    (a, i), (b, _) = sender, receiver  # the receiver's head is not read here
    _, src = model.run_with_cache(clean)
    _, tgt = model.run_with_cache(corrupt)
    hooks = []
    for lay in range(model.cfg.n_layers):
        z = tgt[f"blocks.{lay}.attn.hook_z"].clone()
        if lay == a:
            z[:, :, i] = src[f"blocks.{a}.attn.hook_z"][:, :, i]
        hooks.append((f"blocks.{lay}.attn.hook_z", lambda x, hook, z=z: z))
        if f"blocks.{lay}.hook_mlp_out" in tgt.cache_dict:
            hooks.append((f"blocks.{lay}.hook_mlp_out", lambda x, hook, v=tgt[f"blocks.{lay}.hook_mlp_out"]: v))
    with model.hooks(fwd_hooks=hooks):
        _, step_one = model.run_with_cache(corrupt, names_filter=f"blocks.{b}.hook_resid_pre")
    resid = step_one[f"blocks.{b}.hook_resid_pre"]
    return split_input_metric(model, corrupt, tgt, metric, receiver, via, resid)


@torch.no_grad()
def reference_direct(model, clean, corrupt, metric, sender):
    a, i = sender
    _, src = model.run_with_cache(clean)
    _, tgt = model.run_with_cache(corrupt)
    delta = (src[f"blocks.{a}.attn.hook_z"][:, :, i] - tgt[f"blocks.{a}.attn.hook_z"][:, :, i]) @ model.W_O[a, i]
    last = model.cfg.n_layers - 1
    hooks = [(f"blocks.{last}.hook_resid_post", lambda x, hook: x + delta)]
    if model.cfg.normalization_type is not None:
        hooks.append(("ln_final.hook_scale", lambda s, hook: tgt["ln_final.hook_scale"]))
    return float(metric(model.run_with_hooks(corrupt, fwd_hooks=hooks)))


@pytest.mark.parametrize("shape", ["attn-only, no norm", "LN, shortformer", "LN, MLPs", "rotary"])
def test_every_edge_matches_the_slow_reference(shape):
    changes = {
        "attn-only, no norm": dict(normalization_type=None, positional_embedding_type="standard"),
        "LN, shortformer": dict(),
        "LN, MLPs": dict(attn_only=False, d_mlp=16, act_fn="gelu", positional_embedding_type="standard"),
        "rotary": dict(positional_embedding_type="rotary", rotary_dim=4),
    }[shape]
    model = attn_only_2l_like(seed=2, n_layers=3, **changes)
    gen = torch.Generator().manual_seed(0)
    clean = torch.randint(0, model.cfg.d_vocab, (6, 8), generator=gen)
    corrupt = clean.clone()
    corrupt[:, 2] = (clean[:, 2] + 3) % model.cfg.d_vocab

    def metric(logits):
        return logits[:, -1, 4].mean() - logits[:, -1, 7].mean()

    result = hc.path_patch(model, clean=clean, corrupt=corrupt, metric=metric, senders=["L0H1", "L1H2"],
                           receivers=["L1H0", "L2H3"])  # fmt: skip
    frame = result.to_dataframe()
    assert len(frame) == (1 + 2) * 3 + 2  # L0H1->L1H0, L0H1->L2H3, L1H2->L2H3 via q, k, v; 2 direct paths
    for _, row in frame.iterrows():
        sender = (int(row.sender[1]), int(row.sender[3]))
        if row.via == "direct":
            want = reference_direct(model, clean, corrupt, metric, sender)
        else:
            receiver = (int(row.receiver[1]), int(row.receiver[3]))
            want = reference_edge(model, clean, corrupt, metric, sender, receiver, row.via)
        assert row.value == pytest.approx(want, abs=1e-5, rel=1e-5), (row.sender, row.receiver, row.via)
    assert "PathPatchResult" in repr(result) and result.plot().layout.title.text.startswith("Path patching")


def test_inside_an_ablation_the_hooks_are_honoured():
    """With hooks installed (hc.ablate), every edge runs from the tokens through them: the same values as the
    slow reference run inside the same ablation."""
    model = attn_only_2l_like(seed=3, n_layers=3, positional_embedding_type="standard")
    gen = torch.Generator().manual_seed(1)
    clean = torch.randint(0, model.cfg.d_vocab, (5, 8), generator=gen)
    corrupt = clean.flip(0)

    def metric(logits):
        return logits[:, -1, 2].mean() - logits[:, -1, 6].mean()

    with hc.ablate(model, heads="L1H3", how="zero"):
        result = hc.path_patch(model, clean=clean, corrupt=corrupt, metric=metric, senders=["L0H0"],
                               receivers=["L2H1"], direct=False)  # fmt: skip
        for (_, _, via), value in result.values.items():
            assert value == pytest.approx(reference_edge(model, clean, corrupt, metric, (0, 0), (2, 1), via), abs=1e-5)


@pytest.mark.parametrize(
    "point",
    [
        "blocks.0.hook_attn_out",
        "blocks.0.hook_resid_post",
        "blocks.1.hook_resid_pre",
        "blocks.1.hook_resid_mid",
        "blocks.1.hook_mlp_out",
        "blocks.2.hook_resid_pre",
    ],
)
def test_a_hook_between_sender_and_receiver_acts_on_the_senders_change(point):
    """A hook that is part of the model (a scaled attn_out, a steering vector on the residual stream) changes
        what reaches the receiver: every edge equals canonical two-step path patching with the hook on, which here
        differs from adding the sender's raw change (so the test can fail), and `method` names the hook. A hook on
    an MLP's output is not on the path (MLPs are frozen at the target in step one): no difference there."""
    model = attn_only_2l_like(seed=2, n_layers=3, attn_only=False, d_mlp=16, act_fn="gelu",
                              positional_embedding_type="standard")  # fmt: skip
    with torch.no_grad():
        for block in model.blocks:
            block.attn.W_O.mul_(3.0)
    gen = torch.Generator().manual_seed(0)
    clean = torch.randint(0, model.cfg.d_vocab, (6, 8), generator=gen)
    corrupt = clean.flip(0)

    def metric(logits):
        return logits[:, -1, 4].mean() - logits[:, -1, 7].mean()

    model.add_hook(point, lambda x, hook: x * 1.5 + 0.05)
    try:
        result = hc.path_patch(model, clean=clean, corrupt=corrupt, metric=metric, senders=["L0H1"],
                               receivers=["L2H3"], direct=False)  # fmt: skip
        moved = 0.0
        for (_, _, via), value in result.values.items():
            want = canonical_edge(model, clean, corrupt, metric, (0, 1), (2, 3), via)
            assert value == pytest.approx(want, abs=1e-5, rel=1e-5), via
            moved = max(moved, abs(want - reference_edge(model, clean, corrupt, metric, (0, 1), (2, 3), via)))
        assert moved < 1e-5 if "mlp_out" in point else moved > 5e-4, moved
        assert "canonical two-step" in result.method and point in result.method
    finally:
        model.reset_hooks(including_permanent=True)


def test_bad_input():
    model = attn_only_2l_like()
    tokens = torch.zeros(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="unknown via"):
        hc.path_patch(model, clean=tokens, corrupt=tokens, metric=lambda l: l.mean(), via=("o",))
    with pytest.raises(ValueError, match="unknown direction"):
        hc.path_patch(model, clean=tokens, corrupt=tokens, metric=lambda l: l.mean(), direction="up")


def test_bidirectional_attention_takes_the_reference_and_says_so():
    """A block layout the stacked path does not model (bidirectional attention) is path-patched by the
    canonical reference, which needs no causal mask: equal to canonical_edge; method='stacked' is refused."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(n_layers=2, d_model=16, n_ctx=8, d_head=4, n_heads=4, d_vocab=12, attn_only=True,
                                  act_fn="relu", attention_dir="bidirectional", seed=0, normalization_type="LN")  # fmt: skip
    model = HookedTransformer(cfg)
    gen = torch.Generator().manual_seed(0)
    clean, corrupt = torch.randint(0, 12, (3, 6), generator=gen), torch.randint(0, 12, (3, 6), generator=gen)

    def metric(logits):
        return logits[:, -1, 1].mean() - logits[:, -1, 2].mean()

    for method in ("auto", "reference"):
        result = hc.path_patch(model, clean=clean, corrupt=corrupt, metric=metric, senders=["L0H1"], receivers=["L1H2"],
                               direct=False, method=method)  # fmt: skip
        assert result.method.startswith("reference: canonical two-step")
        for (_, _, via), value in result.values.items():
            assert value == pytest.approx(canonical_edge(model, clean, corrupt, metric, (0, 1), (1, 2), via), abs=1e-6)
    with pytest.raises(ValueError, match="another block layout: use method='auto'"):
        hc.path_patch(model, clean=clean, corrupt=corrupt, metric=metric, method="stacked")
