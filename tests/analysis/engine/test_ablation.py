"""Head ablation: zero/scale against the head's direct effect by hand, mean/resample against the cache, hook hygiene."""

import pytest
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

import headcoop as hc
from headcoop.analysis.engine.inputs import parse_heads

Z = "blocks.0.attn.hook_z"


@pytest.fixture(scope="module")
def model():
    return hc.Count01().model(seed=0, n_heads=4, d_model=8, d_head=2)


@pytest.fixture(scope="module")
def batch():
    return hc.Count01().sample(32, seed=1)


def direct_effect(model, cache, head, layer=0):
    """A head's term in the logits of a one-layer attention-only model: z[h] @ W_O[h] @ W_U."""
    z = cache[f"blocks.{layer}.attn.hook_z"][:, :, head]
    return z @ model.W_O[layer, head] @ model.W_U


def hooks_left(model):
    return sum(len(hp.fwd_hooks) + len(hp._forward_hooks) for hp in model.hook_dict.values())


@torch.no_grad()
def test_zero_ablation_removes_the_heads_direct_effect(model, batch):
    full, cache = model.run_with_cache(batch.tokens)
    with hc.ablate(model, heads=[3, 1], how="zero"):
        ablated = model(batch.tokens)
    want = full - direct_effect(model, cache, 3) - direct_effect(model, cache, 1)
    torch.testing.assert_close(ablated, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(model(batch.tokens), full)
    assert hooks_left(model) == 0


@torch.no_grad()
def test_scale_amplifies_the_direct_effect(model, batch):
    full, cache = model.run_with_cache(batch.tokens)
    with hc.ablate(model, heads="L0H2", how="scale", factor=2.5):
        scaled = model(batch.tokens)
    torch.testing.assert_close(scaled, full + 1.5 * direct_effect(model, cache, 2), atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_mean_ablation_sets_z_to_the_positionwise_mean(model, batch):
    _, clean = model.run_with_cache(batch.tokens)
    mean = clean[Z].mean(0)  # [pos, head, d_head]
    with hc.ablate(model, heads=[0, 2], how="mean", reference=batch):
        _, cache = model.run_with_cache(batch.tokens)
        short = model.run_with_cache(batch.tokens[:5, :7])[1][Z]
    z = cache[Z]
    for h in (0, 2):
        torch.testing.assert_close(z[:, :, h], mean[None, :, h].expand_as(z[:, :, h]))
    for h in (1, 3):
        torch.testing.assert_close(z[:, :, h], clean[Z][:, :, h])
    torch.testing.assert_close(short[:, :, 0], mean[None, :7, 0].expand(5, 7, 2))


@torch.no_grad()
def test_mean_ablation_defaults_to_the_task_sample(model, batch):
    reference = hc.Count01().sample(512, seed=0)
    _, ref_cache = model.run_with_cache(reference.tokens)
    with hc.ablate(model, heads=1, how="mean"):
        _, cache = model.run_with_cache(batch.tokens)
    torch.testing.assert_close(cache[Z][:, :, 1], ref_cache[Z][:, :, 1].mean(0).expand(32, -1, -1))


@torch.no_grad()
def test_resample_uses_a_seeded_permutation_of_the_reference(model, batch):
    reference = hc.Count01().sample(20, seed=5)
    _, ref_cache = model.run_with_cache(reference.tokens)
    with hc.ablate(model, heads=[2], how="resample", reference=reference, seed=7):
        z = model.run_with_cache(batch.tokens)[1][Z]
        again = model.run_with_cache(batch.tokens)[1][Z]
    perm = torch.randperm(20, generator=torch.Generator().manual_seed(7))
    pick = perm[torch.arange(32) % 20]
    torch.testing.assert_close(z[:, :, 2], ref_cache[Z][pick, :, 2])
    torch.testing.assert_close(again, z)
    with hc.ablate(model, heads=[2], how="resample", reference=reference, seed=8):
        other = model.run_with_cache(batch.tokens)[1][Z]
    assert not torch.equal(other[:, :, 2], z[:, :, 2])


@torch.no_grad()
def test_hooks_are_removed_on_exception_and_nested_contexts_compose(model, batch):
    full, cache = model.run_with_cache(batch.tokens)
    with pytest.raises(RuntimeError, match="boom"):
        with hc.ablate(model, heads=[0], how="zero"):
            raise RuntimeError("boom")
    assert hooks_left(model) == 0
    torch.testing.assert_close(model(batch.tokens), full)
    with hc.ablate(model, heads=[0], how="zero"):
        outer = model(batch.tokens)
        with hc.ablate(model, heads=[(0, 3)], how="zero"):
            both = model(batch.tokens)
        torch.testing.assert_close(model(batch.tokens), outer)
        want = full - direct_effect(model, cache, 0) - direct_effect(model, cache, 3)
        torch.testing.assert_close(both, want, atol=1e-5, rtol=1e-5)
        # a reset or a run_with_hooks inside the block does not undo the ablation
        model.reset_hooks()
        model.run_with_hooks(batch.tokens, fwd_hooks=[(Z, lambda z, hook: None)])
        torch.testing.assert_close(model(batch.tokens), outer)
    assert hooks_left(model) == 0
    torch.testing.assert_close(model(batch.tokens), full)


@torch.no_grad()
def test_two_layer_heads_by_tuple_and_name():
    model = hc.Count01().model(seed=1, n_heads=2, d_model=8, d_head=2, n_layers=2)
    tokens = hc.Count01().sample(8, seed=0).tokens

    def zero(heads_by_layer):
        def hook(z, hook):
            z = z.clone()
            z[:, :, heads_by_layer[hook.layer()]] = 0
            return z

        return hook

    manual = model.run_with_hooks(
        tokens, fwd_hooks=[(f"blocks.{lay}.attn.hook_z", zero({0: [1], 1: [0]})) for lay in (0, 1)]
    )
    with hc.ablate(model, heads=[(0, 1), "L1H0"]):
        ours = model(tokens)
    torch.testing.assert_close(ours, manual)
    with hc.ablate(model, heads=[0], layer=1):
        layer_arg = model(tokens)
    assert parse_heads(model, [0], layer=1) == [(1, 0)]
    assert not torch.allclose(layer_arg, model(tokens))


def test_bad_inputs(model, batch):
    with pytest.raises(ValueError, match=r"unknown how 'drop'.*'zero', 'mean', 'resample', 'scale'"):
        with hc.ablate(model, heads=[0], how="drop"):
            pass
    with pytest.raises(IndexError, match=r"head 4 is out of range.*0\.\.3"):
        with hc.ablate(model, heads=[4]):
            pass
    with pytest.raises(IndexError, match=r"layer 1 is out of range.*0\.\.0"):
        with hc.ablate(model, heads=[(1, 0)]):
            pass
    with pytest.raises(ValueError, match="needs a numeric factor"):
        with hc.ablate(model, heads=[0], how="scale"):
            pass
    with pytest.raises(ValueError, match="factor= only applies"):
        with hc.ablate(model, heads=[0], how="zero", factor=2.0):
            pass
    with pytest.raises(ValueError, match="'L<layer>H<head>'"):
        with hc.ablate(model, heads=["head3"]):
            pass
    with pytest.raises(ValueError, match="longer than the mean-ablation reference"):
        with hc.ablate(model, heads=[0], how="mean", reference=batch.tokens[:, :5]):
            model(batch.tokens)
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        with hc.ablate(model, heads=[0], how="mean", reference=torch.full((2, 4), 99)):
            pass
    assert hooks_left(model) == 0


@torch.no_grad()
def test_model_without_task_needs_a_reference():
    cfg = HookedTransformerConfig(n_layers=1, d_model=6, d_head=2, n_heads=3, n_ctx=5, d_vocab=4, attn_only=True)
    model = HookedTransformer(cfg)
    tokens = torch.randint(0, 4, (6, 5), generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="carries no headcoop task"):
        with hc.ablate(model, heads=[1], how="mean"):
            pass
    _, clean = model.run_with_cache(tokens)
    with hc.ablate(model, heads=[1], how="mean", reference=tokens):
        z = model.run_with_cache(tokens)[1][Z]
    torch.testing.assert_close(z[:, :, 1], clean[Z][:, :, 1].mean(0).expand(6, -1, -1))
