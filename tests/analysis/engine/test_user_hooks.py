"""Every fast path is exact with a user's own hook installed anywhere: the user-hook matrix (every hook point
of the model x every fast path x model shapes). A hook that changes its activation (x -> 1.1 x + 0.01) is
added with `model.add_hook` at one hook point; each fast path must then equal its slow reference run with the
same hook, or step aside to it. Path patching is also checked against its own baseline: with clean = corrupt,
every edge must equal the unpatched metric."""

from __future__ import annotations

import itertools

import pytest
import torch
from test_any_model import build
from transformer_lens import patching

import headcoop as hc
from headcoop.analysis.games.coalitions import CoalitionGame

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.slow]

SHAPES = ["LN", "gelu-LN", "shortformer-LN", "rotary-partial", "rotary-RMS-gqa-mlp", "LN-3layer"]
FAST_PATHS = [
    "patch z each",
    "patch q all",
    "patch pattern each",
    "path_patch",
    "coalitions",
    "dla",
    "attribute",
    "cooperation",
]


def model_of(shape: str):
    return build("LN", n_layers=3) if shape == "LN-3layer" else build(shape)


def hook_points(shape: str) -> list[str]:
    """Every hook point a plain forward pass of this model runs (points such as hook_result or hook_q_input
    fire only under other config switches)."""
    model = model_of(shape)
    _, cache = model.run_with_cache(torch.zeros(1, 4, dtype=torch.long))
    return sorted(cache.keys())


CASES = [(shape, point) for shape in SHAPES for point in hook_points(shape)]


def nudge(x, hook):
    return x * 1.1 + 0.01


def inputs(model):
    gen = torch.Generator().manual_seed(4)
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 4), generator=gen)
    corrupt = torch.randint(0, model.cfg.d_vocab, (2, 4), generator=gen)
    return tokens, corrupt


def metric_of(model):
    n_out = model.cfg.d_vocab_out

    def metric(logits):
        return logits[:, -1, 1 % n_out].mean() - logits[:, -1, 2 % n_out].mean()

    return metric


def reference_path_edge(model, clean, corrupt, metric, sender, receiver, via):
    """Canonical two-step path patching with the user's hook on (tests/test_path_patching.canonical_edge)."""
    from test_path_patching import canonical_edge

    return canonical_edge(model, clean, corrupt, metric, sender, receiver, via)


@pytest.mark.parametrize("shape, point", CASES, ids=[f"{s}:{p}" for s, p in CASES])
@pytest.mark.parametrize("fast_path", FAST_PATHS)
def test_fast_paths_are_exact_with_a_user_hook_anywhere(shape, point, fast_path):
    model = model_of(shape)
    clean, corrupt = inputs(model)
    metric = metric_of(model)
    model.add_hook(point, nudge)
    try:
        if fast_path.startswith("patch"):
            _, component, positions = fast_path.split()
            ours = hc.patch(model, clean=clean, corrupt=corrupt, metric=metric, component=component,
                            positions=positions)  # fmt: skip
            _, cache = model.run_with_cache(clean)
            reference = {
                ("z", "each"): patching.get_act_patch_attn_head_out_by_pos,
                ("q", "all"): patching.get_act_patch_attn_head_q_all_pos,
                ("pattern", "each"): patching.get_act_patch_attn_head_pattern_by_pos,
            }[component, positions]
            theirs = reference(model, corrupt, cache, metric)
            if positions == "all":
                theirs = theirs.reshape(ours.values.shape)
            if component == "pattern":  # TransformerLens: [layer, head, dest_pos]
                theirs = theirs.transpose(1, 2)
            torch.testing.assert_close(ours.values.cpu(), theirs.cpu(), atol=2e-5, rtol=2e-5)
        elif fast_path == "path_patch" and model.cfg.n_key_value_heads is not None:
            with pytest.raises(ValueError, match="grouped-query"):
                hc.path_patch(model, clean=clean, corrupt=corrupt, metric=metric)
        elif fast_path == "path_patch":
            senders, receivers = ["L0H1"], [f"L{model.cfg.n_layers - 1}H2"]
            ours = hc.path_patch(model, clean=clean, corrupt=corrupt, metric=metric, senders=senders,
                                 receivers=receivers, direct=False)  # fmt: skip
            for (s, r, via), value in ours.values.items():
                want = reference_path_edge(model, clean, corrupt, metric, (0, 1), (int(r[1]), 2), via)
                assert value == pytest.approx(want, abs=2e-5, rel=2e-5), (s, r, via)
            baseline = hc.path_patch(model, clean=clean, corrupt=clean, metric=metric, senders=senders,
                                     receivers=receivers)  # fmt: skip
            unpatched = float(metric(model(clean).detach()))
            for key, value in baseline.values.items():
                assert value == pytest.approx(unpatched, abs=2e-5, rel=2e-5), key
        elif fast_path == "coalitions":
            players = [(0, 0), (0, 3), (1, 1)]
            game = CoalitionGame(model, players, tokens=clean, metric=metric, how="mean", reference=clean)
            masks = torch.tensor(list(itertools.product([False, True], repeat=len(players))))
            values = game.values(masks)
            for mask, value in zip(masks, values):
                off = [p for p, on in zip(players, mask.tolist()) if not on]
                with hc.ablate(model, heads=[f"L{a}H{b}" for a, b in off], how="mean", reference=clean) \
                        if off else _nothing():  # fmt: skip
                    want = float(metric(model(clean)))
                assert float(value) == pytest.approx(want, abs=2e-5, rel=2e-5), mask.tolist()
        elif fast_path == "attribute":  # the verified cells: exact patching with the hook on
            _, cache = model.run_with_cache(clean)
            theirs = patching.get_act_patch_attn_head_out_by_pos(model, corrupt, cache, metric)
            est = hc.attribute(model, clean=clean, corrupt=corrupt, metric=metric, verify=3, sample=2)
            checked = ~torch.isnan(est.exact)
            assert int(checked.sum()) == 5
            torch.testing.assert_close(est.exact[checked].float(), theirs[checked].float(), atol=2e-5, rtol=2e-5)
        elif fast_path == "cooperation":  # each pair's 2 x 2 game with the other player on, against hc.ablate
            players = [(0, 0), (0, 3), (1, 1)]
            heads = [f"L{a}H{b}" for a, b in players]
            answer = torch.tensor([1 % model.cfg.d_vocab_out] * len(clean))
            batch = hc.Batch.from_answers(clean, answer, (answer + 1) % model.cfg.d_vocab_out)
            coop = hc.cooperation(model, inputs=batch, heads=heads, metric="logit_diff", reference=clean)
            rows = torch.arange(len(clean))

            def ld(off):
                with hc.ablate(model, heads=off, how="mean", reference=clean) if off else _nothing():
                    logits = model(clean)[rows, -1]
                return float((logits[rows, answer] - logits[rows, (answer + 1) % model.cfg.d_vocab_out]).mean())

            for _, row in coop.pairs.iterrows():
                a, b = row.head_a, row.head_b
                want = ld([]) - ld([b]) - ld([a]) + ld([a, b])
                assert row.interaction_full == pytest.approx(want, abs=2e-5, rel=2e-5), (a, b)
        else:  # dla: the components sum to the hooked forward pass's logits, or it refuses by name
            try:
                result = hc.dla(
                    model,
                    clean,
                    answer=torch.ones(len(clean), dtype=torch.long),
                    wrong=torch.zeros(len(clean), dtype=torch.long),
                )
            except ValueError as err:
                assert "hooks installed" in str(err)
            else:
                torch.testing.assert_close(result.values.sum(1), model(clean)[:, -1], atol=1e-4, rtol=1e-4)
    finally:
        model.reset_hooks(including_permanent=True)


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False
