"""The near-misses of "the same function on the counts" (issue 71): each model's truth checked first with plain
hooks on hook_z and hand-made edits (no headcoop analysis), then the model-level word hc.cooperation names."""

from __future__ import annotations

import pytest
import torch

import headcoop as hc
from headcoop.tasks.bench import FUNCTION
from headcoop.tasks.function_bench import FUNCTION_BENCH, FUNCTION_TRUTH, function_bench


def _writes(model, rows: list[list[int]]) -> torch.Tensor:
    """[head, input, vocab] each head's direct write at "=" (z @ W_O @ W_U, every layer's heads in order), read
    from a plain cache: every input a list of digits, then "=" and padding."""
    task = model.task
    tokens = torch.full((len(rows), task.n_ctx), task.index["none"])
    for b, digits in enumerate(rows):
        tokens[b, : len(digits)] = torch.tensor(digits)
        tokens[b, len(digits)] = task.index["="]
    at = torch.tensor([len(r) for r in rows])
    _, cache = model.run_with_cache(tokens)
    out = []
    for layer in range(model.cfg.n_layers):
        z = cache[f"blocks.{layer}.attn.hook_z"][torch.arange(len(rows)), at]  # [input, head, d_head]
        out += [z[:, h] @ model.W_O[layer, h] @ model.W_U for h in range(model.cfg.n_heads)]
    return torch.stack(out)


def _logits_without(model, rows, layer, head) -> torch.Tensor:
    """[input, vocab] the logits at "=" with one head's z zeroed (a plain hook)."""
    task = model.task
    tokens = torch.full((len(rows), task.n_ctx), task.index["none"])
    for b, digits in enumerate(rows):
        tokens[b, : len(digits)] = torch.tensor(digits)
        tokens[b, len(digits)] = task.index["="]

    def zero(z, hook):
        z[:, :, head] = 0.0
        return z

    hooks = [(f"blocks.{layer}.attn.hook_z", zero)] if layer >= 0 else []
    logits = model.run_with_hooks(tokens, fwd_hooks=hooks)
    return logits[torch.arange(len(rows)), torch.tensor([len(r) for r in rows])]


@torch.no_grad()
def test_each_truth_holds_on_plain_hooks_and_hand_made_edits():
    four, five = 4, 5
    # count-noise: on strings without a '2' the two heads write the same, edit by edit; a '2' moves only L0H1's "4"
    m = function_bench("count-noise")
    plain = [[1, 0, 1], [1, 0, 1, 1], [0, 0, 1, 1, 0], [1, 1, 0, 0, 0, 1]]
    w = _writes(m, plain)
    torch.testing.assert_close(w[0], w[1])
    w = _writes(m, [[1, 0, 1, 2], [1, 2, 0, 1]])
    assert bool((w[1, :, four] > w[0, :, four] + 0.5).all())
    torch.testing.assert_close(w[0, :, five], w[1, :, five])
    # count-position: L0H1's response to a 0 -> 1 flip grows with the digit's position; L0H0's does not
    m = function_bench("count-position")
    base = [0, 0, 0, 0, 0, 0]
    flips = [base[:p] + [1] + base[p + 1 :] for p in range(6)]
    w = _writes(m, [base] + flips)
    resp = (w[:, 1:, five] - w[:, 1:, four]) - (w[:, :1, five] - w[:, :1, four])
    assert torch.allclose(resp[0], resp[0, :1].expand(6), atol=1e-5)
    assert bool((resp[1].diff() > 0).all()) and float(resp[1, -1] / resp[1, 0]) > 10
    # count-last3: L0H1 responds to a flip among the last 3 digits only
    w = _writes(function_bench("count-last3"), [base] + flips)
    resp = (w[:, 1:, five] - w[:, 1:, four]) - (w[:, :1, five] - w[:, :1, four])
    assert resp[1, :3].abs().max() < 1e-3 and bool((resp[1, 3:] > 1).all()) and bool((resp[0] > 0.1).all())
    # count-2l-read: the layer-0 heads write nothing on the logits directly; zeroing either halves L1H0's push
    m = function_bench("count-2l-read")
    rows = [[1, 0, 1], [0, 0, 2, 1], [1, 1, 1, 0, 2]]
    w = _writes(m, rows)
    assert w[:2].abs().max() < 1e-6
    full = _logits_without(m, rows, -1, 0)
    for h in (0, 1):
        lost = full - _logits_without(m, rows, 0, h)
        torch.testing.assert_close(lost, 0.5 * w[2], atol=1e-4, rtol=1e-4)
    # count-floor: L0H2 writes 12% of L0H0's, edit by edit
    w = _writes(function_bench("count-floor"), plain)
    torch.testing.assert_close(w[2], 0.12 * w[0])
    # count-specialists: L0H0 never writes "5", L0H1 never writes "4"
    w = _writes(function_bench("count-specialists"), plain + [[2, 0, 1]])
    assert w[0, :, five].abs().max() < 1e-6 and w[1, :, four].abs().max() < 1e-6


@pytest.mark.parametrize("which", FUNCTION_BENCH)
def test_cooperation_names_each_near_miss(which):
    result = hc.cooperation(function_bench(which), n=128, how="zero")
    assert result.function_word == FUNCTION_TRUTH[which], result.summary


def test_what_sets_the_near_misses_apart_is_reported_beside_the_word():
    noise = hc.cooperation(function_bench("count-noise"), n=128, how="zero")
    assert "weigh the count of 2s (the noise token) differently" in noise.summary
    other = noise.function_numbers["other"]["the count of 2s (the noise token)"]
    assert other["cos_min"] < 0.9 and noise.function_numbers["cos_min"] >= 0.9
    special = hc.cooperation(function_bench("count-specialists"), n=128, how="zero")
    assert special.function_numbers["specialised"].startswith("L0H0 counts 0s")
    assert "L0H1 counts 1s" in special.function_numbers["specialised"]
    position = hc.cooperation(function_bench("count-position"), n=128, how="zero")
    assert position.function.loc["L0H1", "position_share"] > 0.2 > position.function.loc["L0H0", "position_share"]
    floor = hc.cooperation(function_bench("count-floor"), n=128, how="zero")
    assert floor.function_numbers["deciding"] == ["L0H0", "L0H1", "L0H2"]  # at the default floor it decides
    assert "readings disagree" not in floor.summary  # at twice the floor it does not, and the word stands


def test_on_inputs_of_one_length_the_noise_cannot_be_taken_out_and_the_result_says_so():
    result = hc.cooperation(hc.bench("count-subtasks"), n=128, how="zero")
    assert result.function_word == FUNCTION["count-subtasks"]
    assert "not separable from the counts here (one length" in result.summary
    assert result.function_numbers["specialised"] == "L0H0 counts 0s (its response to the other counts alone at " \
        "most 0.00 of that); L0H1 counts 1s (0.00)"  # fmt: skip


def test_the_shipped_count01_model_answers_on_the_counts_with_the_noise_token_apart():
    result = hc.cooperation(hc.load("count01"), max_exact=2, how="zero", n=256)
    assert result.function_word == "same function on the counts (pseudo-ensemble)"
    numbers = result.function_numbers
    assert numbers["scope"] == "the counts" and numbers["semantic"] == ["the count of 1s", "the count of 0s"]
    assert len(numbers["deciding"]) >= 10 and numbers["cos_min"] >= 0.95
    assert "the count of 2s (the noise token)" in numbers["other"]
    assert numbers["other"]["the count of 2s (the noise token)"]["separable"] == 1.0
