"""A coalition game's third state (`CoalitionGame.values(zeroed=)`): an absent player zeroed instead of replaced,
on every path (linear, layered, stacked, reference), against plain hook_z hooks."""

from __future__ import annotations

import pytest
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

import headcoop as hc
from headcoop.analysis.games.coalitions import CoalitionGame


def model_of(n_layers: int, attn_only: bool, norm) -> HookedTransformer:
    cfg = HookedTransformerConfig(n_layers=n_layers, d_model=32, d_head=8, n_heads=3, d_vocab=20, n_ctx=8,
                                  attn_only=attn_only, d_mlp=None if attn_only else 64, act_fn="gelu",
                                  normalization_type=norm, seed=1)  # fmt: skip
    return HookedTransformer(cfg).eval()


def plain(model, tokens, pos, values: dict) -> torch.Tensor:
    """[batch, vocab] at the read rows with each player's z set to values[player] by plain hooks."""
    hooks = []
    for (lay, head), value in values.items():

        def hook(z, hook=None, head=head, value=value):
            z[:, :, head] = value.to(z)
            return z

        hooks.append((f"blocks.{lay}.attn.hook_z", hook))
    with torch.no_grad():
        logits = model.run_with_hooks(tokens, fwd_hooks=hooks)
    return logits[torch.arange(len(tokens)), pos].double()


@pytest.mark.parametrize("n_layers, attn_only, norm, method", [
    (1, True, None, "auto"),  # linear
    (2, False, "LN", "layered"),
    (2, False, "LN", "stacked"),
    (2, False, "LN", "reference"),
    (1, False, "RMS", "layered"),
])  # fmt: skip
def test_zeroed_players_equal_plain_hooks(n_layers, attn_only, norm, method):
    model = model_of(n_layers, attn_only, norm)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 20, (5, 8), generator=gen)
    answer = torch.randint(0, 20, (5,), generator=gen)
    batch = hc.Batch.from_answers(tokens, answer, (answer + 1) % 20)
    players = [(lay, h) for lay in range(n_layers) for h in range(3)]
    repl = {p: torch.randn(5, 8, 8, generator=gen) for p in players}
    game = CoalitionGame(model, players, tokens=batch, metric="logit_diff", how="mean", replacements=repl,
                         method=method)  # fmt: skip
    k = len(players)
    masks = torch.rand(12, k, generator=gen) < 0.4
    zeroed = (torch.rand(12, k, generator=gen) < 0.5) & ~masks
    got = game.row_logits(masks, zeroed=zeroed)
    for c in range(len(masks)):
        values = {p: (torch.zeros(5, 8, 8) if bool(zeroed[c, i]) else repl[p])
                  for i, p in enumerate(players) if not bool(masks[c, i])}  # fmt: skip
        want = plain(model, tokens, batch.answer_pos, values)
        torch.testing.assert_close(got[c].double(), want, atol=1e-4, rtol=1e-4)


def test_zeroed_must_be_an_absent_player():
    model = model_of(1, True, None)
    game = CoalitionGame(model, [(0, 0), (0, 1)], tokens=hc.Batch.from_answers(torch.zeros(2, 8, dtype=torch.long),
                         torch.tensor([1, 2]), torch.tensor([3, 4])), metric="logit_diff", how="zero")  # fmt: skip
    with pytest.raises(ValueError, match="only an absent player can be zeroed"):
        game.row_logits(torch.tensor([[True, False]]), zeroed=torch.tensor([[True, False]]))
