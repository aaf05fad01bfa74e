"""The user-hook matrix on TransformerBridges (GPT-2, Llama, GPT-NeoX shapes built offline): a user's hook
(x -> 1.3 x + 0.05) at one hook point, on the path between a sender and a receiver or on a receiver's own
inputs, and six analyses, each exact against an independent reference run with the same hook, or refusing
by naming the hook:

- hc.path_patch: canonical two-step path patching written in plain TransformerLens on the HookedTransformer
  twin of the same weights with the same hook (tests/test_path_patching.canonical_edge); with clean ==
  corrupt every edge equals the hooked metric; Llama (grouped-query) is refused by name;
- hc.patch: TransformerLens's own `patching` on the Bridge with the hook on;
- hc.dla: the components sum to the hooked logits, or a refusal naming the hooks;
- hc.attribute: its exactly verified cells equal TransformerLens's patching on the Bridge;
- hc.interactions and hc.cooperation: Shapley values, pair interaction indices and the pairs' 2 x 2 games
  against brute force over every coalition (the heads outside it mean-ablated with hc.ablate, the hook on)."""

from __future__ import annotations

import itertools
import math
import sys
import warnings
from pathlib import Path

import pytest
import torch
from transformer_lens import patching as tl_patching

import headcoop as hc
from tests import bridge_shapes as shapes

sys.path.insert(0, str(Path(__file__).parent))
from test_path_patching import canonical_edge  # noqa: E402

warnings.filterwarnings("ignore", message=".*gated-off hook.*")
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.slow]

POINTS = ["blocks.0.hook_attn_out", "blocks.0.hook_resid_post", "blocks.1.hook_resid_pre",
          "blocks.1.ln1.hook_normalized", "blocks.1.attn.hook_q", "blocks.1.attn.hook_v", "blocks.0.hook_mlp_out",
          "blocks.1.attn.hook_z", "ln_final.hook_normalized"]  # fmt: skip
PLAYERS = [(0, 1), (1, 0), (1, 2)]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return {shape: (shapes.bridge(shapes.model_folder(shape, root)), shapes.hooked_twin(shape, shapes.model_folder(shape, root / "t")))
            for shape in shapes.SHAPES}  # fmt: skip


def data():
    g = torch.Generator().manual_seed(0)
    clean = torch.randint(1, shapes.VOCAB, (4, 6), generator=g)
    corrupt = torch.randint(1, shapes.VOCAB, (4, 6), generator=g)
    answer = torch.randint(1, shapes.VOCAB, (4,), generator=g)
    return clean, corrupt, answer, (answer + 7) % shapes.VOCAB


def nudge(x, hook):
    return x * 1.3 + 0.05


def brute_force_game(model, tokens, metric, reference):
    """v(S) for every coalition S of PLAYERS: the others mean-ablated over `reference`, every hook on."""
    values = {}
    for mask in itertools.product([False, True], repeat=len(PLAYERS)):
        off = [f"L{a}H{b}" for (a, b), on in zip(PLAYERS, mask) if not on]
        if off:
            with hc.ablate(model, heads=off, how="mean", reference=reference):
                values[mask] = float(metric(model(tokens)))
        else:
            values[mask] = float(metric(model(tokens)))
    return values


def shapley_and_sii(values, n):
    """Shapley values [n] and Shapley interaction indices {(i, j)} from v over all 2^n coalitions."""

    def v(members):
        return values[tuple(k in members for k in range(n))]

    phi = []
    for i in range(n):
        rest = [k for k in range(n) if k != i]
        phi.append(sum(math.factorial(len(s)) * math.factorial(n - len(s) - 1) / math.factorial(n)
                       * (v(set(s) | {i}) - v(set(s))) for r in range(n) for s in itertools.combinations(rest, r)))  # fmt: skip
    sii = {}
    for i, j in itertools.combinations(range(n), 2):
        rest = [k for k in range(n) if k not in (i, j)]
        sii[i, j] = sum(math.factorial(len(s)) * math.factorial(n - len(s) - 2) / math.factorial(n - 1)
                        * (v(set(s) | {i, j}) - v(set(s) | {i}) - v(set(s) | {j}) + v(set(s)))
                        for r in range(n - 1) for s in itertools.combinations(rest, r))  # fmt: skip
    return torch.tensor(phi), sii


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("shape", shapes.SHAPES)
def test_every_analysis_on_a_bridge_honours_a_users_hook(built, shape, point):
    bridge, twin = built[shape]
    clean, corrupt, answer, wrong = data()
    rows = torch.arange(len(answer))

    def metric(logits):
        return (logits[rows, -1, answer] - logits[rows, -1, wrong]).mean()

    for model in (bridge, twin):
        model.add_hook(point, nudge)
    try:
        # path patching: canonical two-step on the twin, plain TransformerLens
        if shape == "llama":
            with pytest.raises(ValueError, match="grouped-query"):
                hc.path_patch(bridge, clean=clean, corrupt=corrupt, metric=metric)
        else:
            result = hc.path_patch(bridge, clean=clean, corrupt=corrupt, metric=metric, senders=["L0H1"],
                                   receivers=["L1H2"], direct=False)  # fmt: skip
            for (_, _, via), value in result.values.items():
                want = canonical_edge(twin, clean, corrupt, metric, (0, 1), (1, 2), via)
                assert value == pytest.approx(want, abs=1e-4, rel=1e-4), via
            assert point in result.method
            baseline = hc.path_patch(
                bridge, clean=clean, corrupt=clean, metric=metric, senders=["L0H1"], receivers=["L1H2"]
            )
            hooked = float(metric(bridge(clean)))
            for key, value in baseline.values.items():
                assert value == pytest.approx(hooked, abs=1e-4, rel=1e-4), key
        # activation patching: TransformerLens's own on the Bridge
        _, cache = bridge.run_with_cache(clean)
        theirs = tl_patching.get_act_patch_attn_head_out_by_pos(bridge, corrupt, cache, metric)
        ours = hc.patch(bridge, clean=clean, corrupt=corrupt, metric=metric, component="z", positions="each")
        torch.testing.assert_close(ours.values.float(), theirs.float(), atol=1e-4, rtol=1e-4)
        # attribution: the exactly verified cells
        est = hc.attribute(bridge, clean=clean, corrupt=corrupt, metric=metric, verify=3, sample=2)
        checked = est.exact[~torch.isnan(est.exact)]
        assert len(checked) == 5
        torch.testing.assert_close(checked.float(), theirs[~torch.isnan(est.exact)].float(), atol=1e-4, rtol=1e-4)
        # direct logit attribution: sums to the hooked logits, or refuses by naming the hooks
        try:
            dla = hc.dla(bridge, clean, answer=answer, wrong=wrong)
        except ValueError as err:
            assert "hooks installed" in str(err) and point in str(err)
        else:
            torch.testing.assert_close(dla.values.sum(1), bridge(clean)[:, -1], atol=1e-3, rtol=1e-3)
        # coalition games: brute force over every coalition
        game = brute_force_game(bridge, clean, metric, corrupt)
        phi, sii = shapley_and_sii(game, len(PLAYERS))
        heads = [f"L{a}H{b}" for a, b in PLAYERS]
        inter = hc.interactions(bridge, clean, heads=heads, metric=metric, reference=corrupt)
        torch.testing.assert_close(inter.shapley.float(), phi.float(), atol=1e-4, rtol=1e-4)
        batch = hc.Batch.from_answers(clean, answer, wrong)
        coop = hc.cooperation(bridge, inputs=batch, heads=heads, metric="logit_diff", reference=corrupt)
        for _, row in coop.pairs.iterrows():
            i, j = heads.index(row.head_a), heads.index(row.head_b)
            assert row.interaction == pytest.approx(sii[min(i, j), max(i, j)], abs=1e-4, rel=1e-4)
            drop = lambda *out: game[tuple(k not in out for k in range(len(PLAYERS)))]  # noqa: E731
            full = drop() - drop(i) - drop(j) + drop(i, j)  # the pair's 2 x 2 game with every other head on
            assert row.interaction_full == pytest.approx(full, abs=1e-4, rel=1e-4)
    finally:
        for model in (bridge, twin):
            model.reset_hooks(including_permanent=True)
