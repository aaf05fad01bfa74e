"""The pair map (headcoop.analysis.pairs): every pair's interaction against plain hook_z hooks, the progress bar's
total known before the first run, the screen's exact top and its miss bound against an exhaustive map, the
planted GPT-2-shaped bench's pairs ranked first (and named right, slow tier), hooks, bad input, save / load."""

from __future__ import annotations

import itertools

import pytest
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

import headcoop as hc
from experiments.pair_map import planted
from headcoop.analysis.pairs.compute import interaction_of
from headcoop.display import progress


def random_model(n_layers: int = 3, n_heads: int = 4, seed: int = 0, d_model: int = 64) -> tuple:
    cfg = HookedTransformerConfig(n_layers=n_layers, d_model=d_model, d_head=16, n_heads=n_heads, d_mlp=128, d_vocab=50,
                                  n_ctx=16, act_fn="gelu", normalization_type="LN", seed=seed)  # fmt: skip
    model = HookedTransformer(cfg).eval()
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 50, (8, 10), generator=gen)
    answer = torch.randint(0, 50, (8,), generator=gen)
    return model, hc.Batch.from_answers(tokens, answer, (answer + 1) % 50)


def hooked_value(model, batch, reference, off: list[tuple[int, int]]) -> float:
    """The logit difference with the heads `off` set to their mean z over `reference`, by plain hook_z hooks."""
    _, cache = model.run_with_cache(reference.tokens, names_filter=lambda name: name.endswith("hook_z"))
    hooks = []
    for lay, head in off:
        mean = cache[f"blocks.{lay}.attn.hook_z"].mean(0)

        def hook(z, hook=None, head=head, mean=mean):
            z[:, :, head] = mean[None, :, head]
            return z

        hooks.append((f"blocks.{lay}.attn.hook_z", hook))
    rows = torch.arange(len(batch.tokens))
    with torch.no_grad():
        logits = model.run_with_hooks(batch.tokens, fwd_hooks=hooks)[rows, -1]
    return float((logits[rows, batch.answer] - logits[rows, batch.wrong]).double().mean())


@pytest.fixture(scope="module")
def small():
    model, batch = random_model()
    return model, batch, hc.pair_map(model, batch, named=0, progress=False)


def test_every_pair_matches_plain_hooks(small):
    model, batch, result = small
    players = [(lay, h) for lay in range(3) for h in range(4)]
    full = hooked_value(model, batch, batch, [])
    alone = [hooked_value(model, batch, batch, [p]) for p in players]
    assert result.exact and result.v_full == pytest.approx(full, abs=1e-4)
    for i, j in itertools.combinations(range(len(players)), 2):
        both = hooked_value(model, batch, batch, [players[i], players[j]])
        expected = interaction_of(full, alone[i], alone[j], both)
        assert float(result.interaction[i, j]) == pytest.approx(expected, abs=1e-4), (i, j)
        assert float(result.interaction[j, i]) == float(result.interaction[i, j])
    frame = result.to_dataframe()
    assert len(frame) == 66 and frame.interaction.abs().is_monotonic_decreasing
    assert frame.interacts.sum() == (frame.interaction.abs() >= result.threshold).sum() > 0


def test_progress_total_is_known_before_the_first_run():
    model, batch = random_model(n_layers=2, n_heads=3)
    k = 6
    with progress.task("outer", progress=True) as bar:
        hc.pair_map(model, batch, named=0, method="exact")
        assert (bar.n, bar.total) == (1 + k + k * (k - 1) // 2,) * 2
    with progress.task("outer", progress=True) as bar:  # the screen: fewer runs, the total lowered to them
        hc.pair_map(model, batch, named=0, method="screen", verify=3, sample=4)
        assert bar.total == 1 + k + (k + 1) + 3 + 4 and bar.n == bar.total  # its k + 1 gradient runs count too


def test_screen_exact_top_and_miss_bound_against_the_exhaustive_map():
    """A 4-layer x 8-head model: the screen's verified and sampled pairs equal the exhaustive map's values, and
    the true count of missed pairs (screened out, |I| above the verified top's smallest) lies in the bound."""
    model, batch = random_model(n_layers=4, n_heads=8, seed=1, d_model=32)
    full = hc.pair_map(model, batch, method="exact", named=0, progress=False)
    screened = hc.pair_map(model, batch, method="screen", verify=60, sample=150, named=0, progress=False)
    assert not screened.exact and screened.estimate is not None
    done = ~torch.isnan(screened.interaction)
    assert int(done.sum()) // 2 == 60 + 150
    assert torch.allclose(screened.interaction[done], full.interaction[done], atol=1e-9)
    bound = screened.missed
    k = 32
    estimate = screened.estimate
    pairs = list(itertools.combinations(range(k), 2))
    order = sorted(range(len(pairs)), key=lambda n: -abs(float(estimate[pairs[n]])))
    top = {pairs[n] for n in order[:60]}
    threshold = min(abs(float(full.interaction[p])) for p in top)
    missed = sum(abs(float(full.interaction[p])) > threshold for p in pairs if p not in top)
    assert bound["threshold"] == pytest.approx(threshold)
    assert bound["rest"] == len(pairs) - 60
    assert bound["low"] <= missed <= bound["high"], (missed, bound)
    # the screen ranks: its verified top holds more of the exhaustive map's strongest pairs than chance
    strongest = set(sorted(pairs, key=lambda p: -abs(float(full.interaction[p])))[:20])
    assert len(strongest & top) >= 12
    assert "screened: second-order attribution" in repr(screened) and "misses:" in repr(screened)


@pytest.fixture(scope="module")
def bench():
    model = planted.build(n_layers=10, n_heads=10, d_model=128, d_head=16, d_mlp=256, d_vocab=200, names=16)
    return model, planted.inputs(model, 16), planted.inputs(model, 64, seed=1)


PLANTED_HEADS = sorted({h for pair in planted.PLANTED for h in pair})
OTHERS = ["L0H0", "L3H3", "L5H5", "L8H8", "L9H9", "L6H1", "L2H2", "L7H7"]


def test_planted_truths_by_plain_hooks(bench):
    model, batch, reference = bench
    truths = planted.truths(model, batch, reference)
    for pair, (_, sign) in planted.PLANTED.items():
        assert truths[pair]["interaction"] * sign > 1.5, (pair, truths[pair])


def test_planted_pairs_rank_first(bench):
    model, batch, reference = bench
    result = hc.pair_map(model, batch, reference=reference, heads=PLANTED_HEADS + OTHERS, named=0, progress=False)
    frame = result.to_dataframe()
    top = {tuple(sorted(p)) for p in zip(frame.head_a[:4], frame.head_b[:4])}
    assert top == {tuple(sorted(p)) for p in planted.PLANTED}
    truths = planted.truths(model, batch, reference)
    for row in frame.head(4).itertuples():
        pair = (row.head_a, row.head_b) if (row.head_a, row.head_b) in truths else (row.head_b, row.head_a)
        assert row.interaction == pytest.approx(truths[pair]["interaction"], abs=1e-3)
    assert frame.interacts.sum() == 4  # nothing else reaches 10% of the strongest head's effect


@pytest.mark.slow
def test_planted_pairs_named_right(bench):
    model, batch, reference = bench
    result = hc.pair_map(model, batch, reference=reference, heads=PLANTED_HEADS + OTHERS, named=4, progress=False)
    words = {(r.head_a, r.head_b): r.word for r in result.named.itertuples()}
    expected = {pair: word for pair, (word, _) in planted.PLANTED.items()}
    assert {tuple(sorted(p)): w for p, w in words.items()} == {tuple(sorted(p)): w for p, w in expected.items()}
    assert "backups (redundant): L4H0+L4H5" in repr(result)
    fig = result.graph()
    assert {t.name for t in fig.data if t.name} == set(expected.values())


def test_a_hook_anywhere_steps_aside_to_the_reference_path(small):
    model, batch, result = small
    calls = []
    model.blocks[1].hook_resid_pre.add_hook(lambda x, hook: calls.append(1))
    try:
        hooked = hc.pair_map(model, batch, named=0, progress=False)
    finally:
        model.reset_hooks()
    assert calls and "reference" in hooked.method
    assert torch.allclose(hooked.interaction, result.interaction, atol=1e-4, equal_nan=True)


def test_plot_graph_save_and_load(small, tmp_path):
    _, _, result = small
    fig = result.plot()
    assert len(fig.layout.shapes) == 2 * 2  # two layer boundaries, each a row and a column line
    assert "I = " in fig.data[0].text[0][1]
    back = hc.load_result(result.save(tmp_path / "map"))
    assert torch.equal(back.interaction.nan_to_num(7.0), result.interaction.nan_to_num(7.0))
    assert repr(back) == repr(result)
    assert "<pre>" in result._repr_html_()


@pytest.mark.parametrize("kwargs, error, text", [
    (dict(method="fast"), ValueError, "method"),
    (dict(budget_s=-1.0), ValueError, "budget_s"),
    (dict(heads=["L0H0"]), ValueError, "at least 2 heads"),
    (dict(verify=-1), ValueError, "verify"),
    (dict(how="median"), ValueError, "how"),
])  # fmt: skip
def test_bad_input_is_named(small, kwargs, error, text):
    model, batch, _ = small
    with pytest.raises(error, match=text):
        hc.pair_map(model, batch, named=0, progress=False, **kwargs)


def test_tokens_without_answers_are_refused(small):
    model, batch, _ = small
    with pytest.raises(ValueError, match="answer= and wrong="):
        hc.pair_map(model, batch.tokens, named=0, progress=False)


# --- issue 76, item 2: refuse what cannot be right, never lose a computed map -----------------------------------


def test_a_model_with_a_nan_weight_is_refused(small):
    model, batch, _ = small
    broken = random_model()[0]
    with torch.no_grad():
        broken.blocks[1].attn.W_O[2, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="non-finite weights"):
        hc.pair_map(broken, batch, named=0, progress=False)


@pytest.mark.parametrize("inputs, kwargs, error, text", [
    ("the cat sat", {}, TypeError, "Batch or tokens"),
    ({"tokens": 1}, {}, TypeError, "Batch or tokens"),
    ("batch", dict(answer=torch.zeros(8, dtype=torch.long)), ValueError, "a Batch carries its own answers"),
    ("empty", {}, ValueError, "0 inputs"),
])  # fmt: skip
def test_inputs_of_the_wrong_kind_are_named(small, inputs, kwargs, error, text):
    model, batch, _ = small
    if inputs == "batch":
        inputs = batch
    with pytest.raises(error, match=text):
        if inputs == "empty":
            inputs = hc.Batch.from_answers(batch.tokens[:0], batch.answer[:0], batch.wrong[:0])
        hc.pair_map(model, inputs, named=0, progress=False, **kwargs)


def test_budget_zero_is_no_limit_and_threshold_zero_counts_every_nonzero_pair(small):
    model, batch, _ = small
    result = hc.pair_map(model, batch, named=0, progress=False, budget_s=0, heads=["L0H0", "L1H1", "L2H2"])
    assert result.exact  # 0 reads as "no limit", as everywhere else in the API
    every = hc.pair_map(model, batch, named=0, progress=False, threshold=0, heads=["L0H0", "L1H1", "L2H2"])
    frame = every.to_dataframe()
    assert bool(frame.interacts.eq(frame.interaction.abs() > 0).all()) and int(frame.interacts.sum()) == 3


def test_naming_without_a_task_reads_the_inputs_as_reference_and_a_callable_metric_says_what_it_read(small):
    model, batch, _ = small

    def loss(logits):  # a user's metric that happens to share a built-in's name
        return logits[:, -1].logsumexp(-1).mean()

    result = hc.pair_map(model, batch, how="zero", metric=loss, named=1, threshold=0, progress=False,
                         heads=["L0H0", "L2H1"])  # fmt: skip
    assert result.metric == "callable loss"
    assert len(result.named) == 1 and result.named.read_on.iloc[0].startswith("accuracy")
    assert any("read on accuracy" in line for line in result.lines())


def test_a_failed_naming_returns_the_map_unnamed_with_how_to_name_it(small, monkeypatch):
    from headcoop.analysis.pairs import result as result_module

    model, batch, _ = small

    def fails(*args, **kwargs):
        raise RuntimeError("the naming broke")

    monkeypatch.setattr(result_module.PairMap, "with_words", fails)
    with pytest.warns(UserWarning, match="returned unnamed.*with_words"):
        result = hc.pair_map(model, batch, named=1, threshold=0, progress=False, heads=["L0H0", "L2H1"])
    assert result.named.empty and result.exact and not torch.isnan(result.interaction[0, 1])


def test_a_saved_map_whose_heads_disagree_with_its_matrix_is_refused(small, tmp_path):
    import json

    _, _, result = small
    folder = result.save(tmp_path / "map")
    meta = json.loads((folder / "result.json").read_text())
    text = json.dumps(meta).replace('"L2H3"', '"L9H9", "L9H8"', 1)
    (folder / "result.json").write_text(text)
    with pytest.raises(ValueError, match="head list and matrices disagree"):
        hc.load_result(folder)
