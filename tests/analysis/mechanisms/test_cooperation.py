"""hc.cooperation names the mechanism planted in hand-weighted models (headcoop.tasks.planted), and the
evidence behind it; its coalition logits match the reference path."""

from __future__ import annotations

import pytest
import torch

import headcoop as hc
from headcoop.analysis.games.coalitions import CoalitionGame, all_masks
from headcoop.tasks.planted import PLANTED

# Under resample ablation a copy head's replacement votes for another input's answer as strongly as the
# head itself would vote for this one's, so two heads copying the same token look both needed there (a
# tie is no answer). Issue 48: resample detects it (the lost answers go to the injected input's answer)
# and abstains, so under resample alone these pairs are "undetermined" with "resample cannot see it".
RESAMPLE_WORDS = {
    "redundant": {("L0H0", "L0H1"): "undetermined"},
    "division": {("L0H0", "L0H1"): "undetermined"},
    "mixed": {("L0H0", "L0H1"): "undetermined"},
    "superposition": {("L0H0", "L0H1"): "undetermined"},
}


def verdicts(result) -> dict:
    return {(row.head_a, row.head_b): row.mechanism for row in result.pairs.itertuples()}


@pytest.mark.parametrize("how", ["zero", "mean", "resample"])
@pytest.mark.parametrize("mechanism", PLANTED)
def test_planted_mechanism_is_named_under_each_ablation(mechanism, how):
    model = hc.planted(mechanism)
    result = hc.cooperation(model, how=how, n=256)
    expected = dict(model.planted["pairs"])
    if how == "resample":
        expected.update(RESAMPLE_WORDS.get(mechanism, {}))
    assert verdicts(result) == expected
    for row in result.pairs.itertuples():
        if how == "resample" and (row.head_a, row.head_b) in RESAMPLE_WORDS.get(mechanism, {}):
            assert row.flips_under.startswith("resample cannot see it: resample injects another input's"), (
                row.flips_under
            )
    assert result.roles == model.planted["roles"]


@pytest.mark.parametrize("mechanism", PLANTED)
def test_over_the_whole_family_a_word_is_the_truth_or_undetermined_with_its_flip(mechanism):
    """The default family (zero, mean, resample, mean-aligned, reference draws, threshold bands): where
    resample disagrees the word is "undetermined" and names the first reading that flips it."""
    model = hc.planted(mechanism)
    result = hc.cooperation(model, n=256)
    for row in result.pairs.itertuples():
        truth = model.planted["pairs"][(row.head_a, row.head_b)]
        assert row.mechanism in (truth, "undetermined"), (row.head_a, row.head_b, row.mechanism, truth)
        if row.mechanism == "undetermined":
            assert row.flips_under and row.agreement < 0.9 and row.primary_word == truth
        else:
            assert row.agreement >= 0.9
    # 1 zero + 2 x 4 draws, x (1 + 8 thresholds x 2 factors + 2 write readings + the universal reading)
    assert len(result.readings) == 9 * 24


@pytest.mark.slow
@pytest.mark.parametrize("how", ["zero", "mean"])
@pytest.mark.parametrize("mechanism", PLANTED)
def test_planted_mechanism_survives_weight_noise(mechanism, how):
    model = hc.planted(mechanism, weight_noise=0.01, seed=7)
    result = hc.cooperation(model, how=how, n=256, seed=1)
    assert verdicts(result) == model.planted["pairs"]
    assert result.roles == model.planted["roles"]


def test_an_additive_metric_gives_not_testable():
    """Logit difference in a one-layer attention-only model without norms adds over heads whatever the
    weights: either-alone and both-needed cannot occur on it, so the instrument says "not testable"; on
    accuracy both heads are needed ("conjunction", the Count01 paper's "only solve the original task in
    conjunction"); where additivity is not built in (two layers) the logit difference does decide."""
    result = hc.cooperation(hc.planted("independent"), metric="logit_diff", how="zero")
    assert result.mechanism == "not testable"
    assert "by construction" in result.pairs.reason[0]
    assert hc.cooperation(hc.planted("independent"), how="zero").mechanism == "conjunction"
    assert hc.cooperation(hc.planted("independent-2l"), metric="logit_diff", how="zero").mechanism == "conjunction"
    # superposition is read from the writes, so the additive metric does not hide it
    assert hc.cooperation(hc.bench("post"), metric="logit_diff", how="zero").mechanism == "superposition"


def test_backup_head_and_self_repair():
    result = hc.cooperation(hc.planted("backup"), how="zero")
    table = result.head_table
    assert table.loc["L1H0", "backs_up"] == "L0H0" and table.loc["L0H0", "backs_up"] == ""
    assert table.loc["L0H0", "direct_effect"] == pytest.approx(1.0, abs=1e-4)
    assert table.loc["L0H0", "total_effect"] == pytest.approx(-0.5, abs=1e-4)  # the backup over-restores
    assert table.loc["L0H0", "self_repair"] == pytest.approx(1.5, abs=1e-4)
    assert float(result.compensation[0, 1]) == pytest.approx(1.5, abs=1e-4)
    row = result.backup.set_index(["backup", "of", "how"]).loc[("L1H0", "L0H0", "zero")]
    assert row.own_compensation == pytest.approx(1.5, abs=1e-4) and row.norm_compensation == pytest.approx(
        0.0, abs=1e-6
    )
    assert row.answers_restored == 1.0 and row.backs_up
    # without the backup there is nothing to repair
    plain = hc.cooperation(hc.planted("redundant"), how="zero").head_table
    assert (plain["backs_up"] == "").all()


def test_the_competing_head_is_named_and_the_result_displays_itself():
    result = hc.cooperation(hc.planted("mixed"), how="mean")
    assert "competing heads: L0H2" in repr(result)
    assert result.mechanism == "competition"  # 2 of 3 pairs
    frame = result.to_dataframe()
    assert {"head_a", "head_b", "mechanism", "agreement", "flips_under", "reason", "or", "and", "a_only", "b_only",
            "multi", "only_answer", "distributed", "rank_a", "rank_b", "composition", "interaction"} <= set(frame.columns)  # fmt: skip
    fig = result.plot()
    assert "mechanism" in fig.layout.title.text.lower() and "frozen" in fig.layout.title.text
    assert fig.layout.yaxis.automargin  # the head names on the y axis are not cut off
    assert "Cooperation(" in result._repr_html_()


def test_a_model_verdict_needs_a_majority_of_pairs():
    result = hc.cooperation(hc.planted("mixed"), how="mean")
    assert result.shares["competition"] == pytest.approx(2 / 3) and result.shares["redundant"] == pytest.approx(1 / 3)


def test_interactions_and_cooperation_share_the_tie_rule():
    """Two heads that each alone leave a two-way tie: a tie is no answer in both hc.interactions and the
    per-input evidence, so the Shapley interaction of two heads equals the pair's 2 x 2 interaction."""
    model = hc.bench("rank1")
    batch = model.task.sample(128)
    result = hc.cooperation(model, how="zero", inputs=batch)
    inter = hc.interactions(model, tokens=batch, metric="accuracy", how="zero").interaction[0, 1]
    assert float(inter) == pytest.approx(result.pairs.interaction_full[0], abs=1e-9)
    assert result.pairs["and"][0] == 1.0  # alone, each head ties two outputs: no answer


def test_bad_arguments():
    model = hc.planted("redundant")
    with pytest.raises(ValueError, match="metric"):
        hc.cooperation(model, metric="margin")
    with pytest.raises(ValueError, match="how"):
        hc.cooperation(model, how="scale")
    with pytest.raises(ValueError, match="at least 2 heads"):
        hc.cooperation(model, heads=["L0H0"])
    with pytest.raises(TypeError, match="inputs= must be a Batch"):
        hc.cooperation(model, inputs=torch.zeros(4, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="unknown planted mechanism"):
        hc.planted("synergy")
    with pytest.raises(ValueError, match="unknown threshold 'tau'"):
        hc.cooperation(model, thresholds={"tau": 0.1})
    with pytest.raises(ValueError, match="band"):
        hc.cooperation(model, band=(0.5,))
    with pytest.raises(ValueError, match="agree"):
        hc.cooperation(model, agree=0.2)
    with pytest.raises(ValueError, match=r"outputs\[0\] must be in 0\.\.\d+, got 999"):
        hc.cooperation(model, outputs=[999])


@pytest.mark.parametrize("mechanism", ["backup", "independent-2l"])
def test_row_logits_equal_the_reference(mechanism):
    model = hc.planted(mechanism, weight_noise=0.05)
    batch = model.task.sample(32, seed=2)
    players = [(0, 0), (1, 0)]
    out = {}
    for method in ("auto", "stacked", "reference"):
        game = CoalitionGame(model, players, tokens=batch, metric="logit_diff", how="mean",
                             reference=model.task.sample(64, seed=3), method=method)  # fmt: skip
        out[method] = game.row_logits(all_masks(2))
    torch.testing.assert_close(out["auto"], out["reference"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out["stacked"], out["reference"], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("hooked", [False, True])
def test_caller_given_replacements_equal_the_games_own(hooked):
    """replacements= (hc.cooperation's stacked reference draws) gives the logits of the game that computes
    the same mean replacement itself, on the fast path and, with a user's hook installed, on the reference."""
    from headcoop.analysis.engine.ablation import reference_z, replacement

    model = hc.planted("backup", weight_noise=0.05)
    batch, ref = model.task.sample(16, seed=2), model.task.sample(64, seed=3)
    players = [(0, 0), (1, 0)]
    if hooked:  # installed first: the reference's z is read as the model runs now, hook included
        model.blocks[1].hook_resid_pre.add_hook(lambda act, hook: act * 1.01)
    try:
        ref_z = reference_z(model, ref, {0, 1})
        given = {(lay, h): replacement(ref_z[lay][:, :, h, None], "mean", 16, 3, None)[:, :, 0] for lay, h in players}
        own = CoalitionGame(model, players, tokens=batch, metric="logit_diff", how="mean", reference=ref)
        mine = CoalitionGame(model, players, tokens=batch, metric="logit_diff", how="mean", reference=ref,
                             replacements=given)  # fmt: skip
        torch.testing.assert_close(mine.row_logits(all_masks(2)), own.row_logits(all_masks(2)), atol=1e-5, rtol=1e-5)
        assert ("reference" in mine.method) == hooked
    finally:
        model.reset_hooks()
    with pytest.raises(ValueError, match="replacements= has no value for player L1H0"):
        CoalitionGame(model, players, tokens=batch, metric="logit_diff", how="mean", reference=ref,
                      replacements={(0, 0): given[(0, 0)]})  # fmt: skip


def test_a_users_hook_is_respected():
    """With a hook of the user's installed the game takes the reference path (hc.ablate + forward passes);
    a hook that changes nothing gives the same evidence, and the method says why."""
    model = hc.planted("superposition")
    plain = hc.cooperation(model, how="mean", n=64)
    model.blocks[0].hook_resid_pre.add_hook(lambda act, hook: act)
    try:
        hooked = hc.cooperation(model, how="mean", n=64)
    finally:
        model.reset_hooks()
    assert "reference" in hooked.method and "hooks installed" in hooked.method
    cols = ["or", "and", "a_only", "b_only", "multi", "only_answer", "interaction"]
    assert hooked.pairs[cols].values == pytest.approx(plain.pairs[cols].values, abs=1e-6)
    assert hooked.mechanism == plain.mechanism == "conjunction"


def test_per_input_evidence_adds_up_to_the_pair_shares():
    """`per_input` is the evidence the pair table summarises: its class shares over the inputs where the
    pair matters are the table's or / and / a_only / b_only."""
    result = hc.cooperation(hc.planted("mixed"), how="mean", n=128)
    rows = result.per_input()
    assert len(rows) == len(result.pairs) * 128
    for _, pair in result.pairs.iterrows():
        mine = rows[(rows.head_a == pair.head_a) & (rows.head_b == pair.head_b)]
        matters = mine[mine["class"] != "not_needed"]
        assert len(matters) / 128 == pytest.approx(pair.matters)
        for c in ("or", "and", "a_only", "b_only"):
            assert (matters["class"] == c).mean() == pytest.approx(pair[c])
    on_superposition = hc.cooperation(hc.planted("superposition"), how="zero", n=128).per_input()
    assert on_superposition.superposed.all()


def test_superposed_writes_under_each_reading():
    # input 0: a writes to tokens 0 and 1, b to 0 and 2, answer 0 -> superposed under every reading
    # input 1: both write to 0 and 1 -> several, but they add up on 1 as well
    # input 2: a writes to one token only -> not several
    a = torch.tensor([[4.0, 4.0, -1.0, -1.0], [4.0, 4.0, -1.0, -1.0], [4.0, -1.0, -1.0, -1.0]])
    b = torch.tensor([[4.0, -1.0, 4.0, -1.0], [4.0, 4.0, -1.0, -1.0], [4.0, 4.0, -1.0, -1.0]])
    answer = torch.tensor([0, 0, 0])
    outputs = torch.arange(4)
    for reading in ("half_answer", "positive", "centered"):
        several, superposed = hc.superposed_writes(a, b, answer, outputs, reading=reading)
        assert several.tolist() == [True, True, False] and superposed.tolist() == [True, False, False], reading
    # a shift common to all logits changes the raw reading only
    shifted = a + 10
    assert hc.superposed_writes(shifted, b, answer, outputs, reading="positive")[1].tolist() == [False, False, False]
    assert hc.superposed_writes(shifted, b, answer, outputs, reading="centered")[1].tolist() == [True, False, False]
    # restricted to outputs 0 and 2, a writes to one output on input 0
    assert hc.superposed_writes(a, b, answer, outputs=torch.tensor([0, 2]))[0].tolist() == [False, False, False]
    # counting only outputs consistent with the attended source: a's token 1 is never an answer with its source
    src = torch.tensor([5, 5, 5])
    assert hc.superposed_writes(a, b, answer, outputs, source_a=src, source_b=src)[0].tolist() == [False] * 3
    with pytest.raises(ValueError, match="reading"):
        hc.superposed_writes(a, b, answer, reading="raw")
    with pytest.raises(ValueError, match="one of `outputs`"):
        hc.superposed_writes(a, b, answer, outputs=torch.tensor([1, 2]))
    with pytest.raises(ValueError, match=r"\[batch, vocab\]"):
        hc.superposed_writes(a[0], b[0], answer)


def test_a_completion_written_more_strongly_than_the_answer_does_not_hide_superposition():
    """bench("post") with the repeated-token completions c(t, t) read 1.4x more strongly: a head attending t
    writes more on c(t, t) than on the answer c(t, u), and the answer (both heads' writes) still wins:
    still superposition, though the answer is not a head's largest write."""
    model = hc.bench("post")
    task = model.task
    repeated = [task.index[f"c{i}{i}"] for i in range(1, 5)]
    with torch.no_grad():
        model.W_U[:, repeated] *= 1.4
    result = hc.cooperation(model, how="zero", n=256)
    assert result.mechanism == "superposition", result.pairs.reason[0]


# Planted models with other weights than the shipped ones (each head's W_O scaled): the verdicts must not
# hang on the particular numbers of headcoop.tasks.planted.
VARIANTS = [
    ("redundant", {(0, 1): 0.7}), ("redundant", {(0, 0): 1.5, (0, 1): 1.5}),
    ("independent", {(0, 0): 0.875, (0, 1): 1.125}), ("competition", {(0, 1): 0.5}), ("competition", {(0, 1): 1.5}),
    ("division", {(0, 0): 1.5, (0, 1): 1.5}), ("superposition", {(0, 0): 1.2, (0, 1): 1.2}), ("backup", {(1, 0): 0.8}),
]  # fmt: skip


@pytest.mark.parametrize("how", ["zero", "mean"])
@pytest.mark.parametrize(("mechanism", "scales"), VARIANTS)
def test_planted_variants_with_other_weights(mechanism, scales, how):
    model = hc.planted(mechanism)
    with torch.no_grad():
        for (layer, head), factor in scales.items():
            model.W_O[layer, head] *= factor
    result = hc.cooperation(model, how=how, n=256)
    assert verdicts(result) == model.planted["pairs"]
    assert result.roles == model.planted["roles"]


def test_word_sources_quote_the_sources_verbatim():
    """Every double-quoted phrase in WORD_SOURCES is in the source documents word for word."""
    import re
    from pathlib import Path

    from headcoop.analysis.mechanisms.cooperation import MECHANISMS, WORD_SOURCES

    seeds = Path(__file__).resolve().parents[4] / "shared" / "seeds"
    if not seeds.exists():
        pytest.skip("../shared/seeds is not present in this checkout")
    text = " ".join(p.read_text(encoding="utf-8") for p in seeds.glob("*.md"))
    assert set(MECHANISMS) <= set(WORD_SOURCES)
    quoted = [q for entry in WORD_SOURCES.values() for q in re.findall(r'"([^"]+)"', entry)]
    assert len(quoted) >= 6
    for q in quoted:
        assert q in text, q


def test_the_answer_aligned_mean_equals_its_definition():
    """mean-aligned: at input b's position p, the mean over references of z at the same offset from their
    answer position (the per-position mean where no reference has that offset), against a plain loop."""
    from headcoop.analysis.mechanisms.references import aligned_mean as _aligned_mean

    g = torch.Generator().manual_seed(0)
    ref = torch.randn(7, 6, 2, 3, generator=g)
    ref_ans, ans = torch.tensor([1, 5, 3, 0, 2, 4, 5]), torch.tensor([0, 3, 5, 2])
    out = _aligned_mean(ref, ref_ans, ans, 6)
    for b in range(4):
        for p in range(6):
            rows = [ref[r, ref_ans[r] + p - ans[b]] for r in range(7) if 0 <= ref_ans[r] + p - ans[b] < 6]
            want = torch.stack(rows).mean(0) if rows else ref[:, p].mean(0)
            torch.testing.assert_close(out[b, p], want)
    # on a fixed-length task the aligned mean is the plain mean
    same = torch.full((7,), 5)
    torch.testing.assert_close(_aligned_mean(ref, same, torch.full((4,), 5), 6), ref.mean(0).expand(4, -1, -1, -1))


@pytest.mark.slow
def test_the_count01_word_under_eight_reference_seeds():
    """The shipped Count01 model, same inputs, eight reference samples: one word, and where it is "undetermined"
    an ablation named as what flips it (issue 37: the word was the seed of the mean reference; since issue 59
    abstaining readings do not vote, so which of mean and resample holds the candidate least varies by seed)."""
    model = hc.load("count01")
    batch = model.task.mechanism_inputs(256, seed=0)
    words, flips = set(), set()
    for s in range(8):
        result = hc.cooperation(model, inputs=batch, reference=model.task.sample(512, seed=100 + s), max_exact=2)
        words.add(result.mechanism)
        flips.add(result.flips.split(" under ")[-1] if result.mechanism == "undetermined" else "")
    assert len(words) == 1, words
    assert flips <= {"", "zero", "mean", "resample"}, flips


def test_the_shipped_skip_pair_models_read_as_the_post_reads_them():
    """The shipped d_head 5 model is superposition in the post's sense on the typical readings (conditional
    writes on every input that shows them, the answer the only completion both write on 66% of the
    multi-output inputs) and not on the universal one: its family word falls short of 90% of the votes,
    and flips_under names the readings that fail and why resample cannot see the pair. The d_head 1 model, whose heads write one fixed vector each
    (rank 1), is superposition under no reading."""
    five = hc.cooperation(hc.load("skip-pair"), n=512)
    row = five.pairs.iloc[0]
    # issue 59: the injection guard covers every reading of a resample draw, so resample has no vote (88%)
    assert row.primary_word == "superposition" and 0.8 <= five.agreement < 0.9, five.flips
    assert "resample cannot see it: resample injects" in row.flips_under
    assert row.conditional_a == 1.0 and row.conditional_b == 1.0 and 0.5 <= row.only_answer < 0.75
    assert five.words.loc["L0H0&L0H1", "zero, universal"] != "superposition"
    assert "superposition in" in five.flips and "majority x2" in five.flips
    assert row.rank_a >= 2 and row.rank_b >= 2 and row.distributed >= 0.5
    one = hc.cooperation(hc.load("skip-pair-dhead1"), n=512)
    assert one.mechanism != "superposition" and "superposition" not in one.words.values
    assert one.pairs.rank_a[0] == 1 and one.pairs.rank_b[0] == 1
