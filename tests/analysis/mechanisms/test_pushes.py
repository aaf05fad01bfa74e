"""The function axis's pushes (issue 72): the prefix-shared path equals full runs with plain hooks, on every
architecture it takes and on edits that insert and delete tokens; it steps aside where a hook is installed; a
task without features gets a stated, seeded sample whose cost is known before it runs."""

import pytest
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

import headcoop as hc
from headcoop.analysis.mechanisms.edits import EDIT_SAMPLE, edit_inputs, plan_edits
from headcoop.analysis.mechanisms.pushes import fast_path, prefix_pushes, push_rows, reference_pushes
from headcoop.tasks.base import Batch

ARCHITECTURES = {
    "attn-only, no norm": dict(n_layers=1, attn_only=True, normalization_type=None),
    "LN + MLP": dict(n_layers=2, normalization_type="LN", d_mlp=64, act_fn="gelu"),
    "RMS + rotary": dict(n_layers=2, normalization_type="RMS", d_mlp=64, act_fn="silu",
                         positional_embedding_type="rotary", rotary_dim=8),
    "LNPre + shortformer": dict(n_layers=2, normalization_type="LNPre", d_mlp=64, act_fn="gelu",
                                positional_embedding_type="shortformer"),
}  # fmt: skip


def small(kw: dict) -> HookedTransformer:
    cfg = HookedTransformerConfig(d_model=32, d_head=8, n_heads=4, n_ctx=12, d_vocab=20, seed=0, **kw)
    return HookedTransformer(cfg).eval()


def inputs():
    gen = torch.Generator().manual_seed(0)
    return torch.randint(0, 20, (6, 12), generator=gen), torch.tensor([11, 10, 11, 9, 11, 8])


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
@pytest.mark.parametrize("total", [(True, True, True), (False, False, False), (True, False, True)])
def test_prefix_shared_pushes_equal_full_runs_with_plain_hooks(arch, total):
    model = small(ARCHITECTURES[arch])
    tokens, pos = inputs()
    edits = edit_inputs(tokens, pos, None, sample=60)
    players = [(0, 1), (model.cfg.n_layers - 1, 2), (0, 3)]
    outs = torch.tensor([1, 4, 7, 9])
    assert fast_path(model) is None
    fast = prefix_pushes(model, tokens, pos, edits, players, list(total), outs, memory_budget_mb=1)  # small chunks
    slow = reference_pushes(model, torch.cat([tokens, edits["tokens"]]), torch.cat([pos, edits["read"]]), players,
                            list(total), outs, memory_budget_mb=256)  # fmt: skip
    assert fast.shape == (3, len(tokens) + len(edits["source"]), 4)
    assert torch.allclose(fast, slow, atol=1e-5 * float(slow.abs().max()) + 1e-7)


def test_insertions_and_deletions_of_the_counts_take_the_prefix_path_exactly():
    model = hc.load("count01")
    task = model.task
    batch = task.mechanism_inputs(24, seed=0)
    features = task.features()
    edits = edit_inputs(batch.tokens, batch.answer_pos, features, n_inputs=6)
    assert {0, 1, 2} <= set(edits["kind"].tolist())  # substitutions, insertions and deletions
    n = edits["inputs"]
    players = [(0, 0), (0, 3), (0, 5)]
    outs = torch.arange(model.cfg.d_vocab_out)
    for total in ([False] * 3, [True] * 3):
        fast = prefix_pushes(model, batch.tokens[:n], batch.answer_pos[:n], edits, players, total, outs, 256)
        slow = reference_pushes(model, torch.cat([batch.tokens[:n], edits["tokens"]]),
                                torch.cat([batch.answer_pos[:n], edits["read"]]), players, total, outs, 256)  # fmt: skip
        assert torch.allclose(fast, slow, atol=1e-5 * float(slow.abs().max()))


def test_a_user_hook_sends_the_pushes_to_the_hooked_path_and_is_honoured():
    model = small(ARCHITECTURES["LN + MLP"])
    tokens, pos = inputs()
    gen = torch.Generator().manual_seed(1)
    answer = torch.randint(0, 20, (6,), generator=gen)
    batch = Batch.from_answers(tokens, answer, (answer + 1) % 20, answer_pos=pos)
    players = [(0, 1), (1, 2)]

    def damp(x, hook):
        return x * 0.5

    model.add_hook("blocks.0.hook_resid_post", damp)
    try:
        plan = plan_edits(model, batch, players)
        assert plan["path"].startswith("hooks are installed at blocks.0.hook_resid_post")
        result = hc.cooperation(model, inputs=batch, heads=["L0H1", "L1H2"], how="zero", metric="logit_diff",
                                progress=False)  # fmt: skip
        assert result.function_numbers["path"] == plan["path"]
    finally:
        model.reset_hooks()
    plain = hc.cooperation(model, inputs=batch, heads=["L0H1", "L1H2"], how="zero", metric="logit_diff",
                           progress=False)  # fmt: skip
    assert plain.function_numbers["path"] == "prefix-shared"
    assert plain.function_numbers["cos_min"] != pytest.approx(result.function_numbers["cos_min"], abs=1e-9)


def test_a_task_without_features_gets_a_stated_seeded_sample_its_cost_known_before_it_runs():
    model = small(ARCHITECTURES["LN + MLP"])
    gen = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, 20, (16, 12), generator=gen)
    answer = torch.randint(0, 20, (16,), generator=gen)
    batch = Batch.from_answers(tokens, answer, (answer + 1) % 20)
    plan = plan_edits(model, batch, [(0, 1), (1, 2)], sample=64, seed=3)
    edits = plan["edits"]
    assert len(edits["source"]) == 64 and edits["total"] > 64
    assert edits["how"] == f"a seeded sample of 64 of the {edits['total']:,} substitutions (seed 3)"
    again = plan_edits(model, batch, [(0, 1), (1, 2)], sample=64, seed=3)["edits"]
    assert torch.equal(again["tokens"], edits["tokens"])
    # the cost: per condition (unablated, and each head read by its total effect) the inputs' rows, and each
    # edit's rows from its position to its read row, from the condition's first layer (0; the zeroed head's)
    n = edits["inputs"]
    first = torch.cat([torch.zeros(n, dtype=torch.long), edits["position"]])
    width = torch.cat([batch.answer_pos[:n], edits["read"]]) + 1
    inputs, edited = int(width[:n].sum()), int((width - first)[n:].sum())
    assert plan["rows"] == push_rows(width, first, n, [0, 0, 1], 2, True) == inputs * 3 + edited * (1 + 1 + 0.5)
    result = hc.cooperation(model, inputs=batch, heads=["L0H1", "L1H2"], how="zero", metric="logit_diff",
                            progress=False)  # fmt: skip
    assert result.function_numbers["how"].startswith(f"a seeded sample of {EDIT_SAMPLE // 16 * 16}")
    assert "the task declares no features" in result.summary


@pytest.mark.parametrize(("k", "edits", "inputs"), [(16, 2048, 30), (3, 50, 5), (2, 7, 7)])
def test_per_input_alike_at_once_equals_its_loop(k, edits, inputs):
    from headcoop.analysis.mechanisms.edits import per_input_alike, per_input_alike_reference

    gen = torch.Generator().manual_seed(k)
    resp = torch.randn(k, edits, 5, generator=gen, dtype=torch.float64)
    resp *= torch.rand(k, 1, 1, generator=gen, dtype=torch.float64)
    source = torch.randint(0, inputs, (edits,), generator=gen)
    resp[:, source == 0] = 0  # an input with no response is left out of both
    fast, slow = per_input_alike(resp, source), per_input_alike_reference(resp, source)
    assert torch.allclose(fast["cos"], slow["cos"], atol=1e-12)
    for key in ("share", "cos_min", "cos_median"):
        assert fast[key] == pytest.approx(slow[key], abs=1e-12)
