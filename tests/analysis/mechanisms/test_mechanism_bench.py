"""The mechanism bench (headcoop.tasks.bench): each model's truth is checked here with plain
TransformerLens hooks on hook_z, independently of hc.cooperation, and then hc.cooperation is run on it
under every ablation and metric: it gives the truth or "undetermined", never another word (issue 37)."""

from __future__ import annotations

import pytest
import torch

import headcoop as hc
from headcoop.tasks.bench import BENCH, LOGIT_DIFF_ROLES, LOGIT_DIFF_TRUTH, SAME


def _logits(model, tokens, off=(), keep=None):
    """Logits at the last position with the heads in `off` zeroed on hook_z (plain hooks); keep: {(layer,
    head): z} values to hold instead."""
    hooks = []
    for layer in range(model.cfg.n_layers):

        def hook(z, hook, layer=layer):
            z = z.clone()
            for lay, head in off:
                if lay == layer:
                    z[:, :, head] = 0.0
            for (lay, head), value in (keep or {}).items():
                if lay == layer:
                    z[:, :, head] = value
            return z

        hooks.append((f"blocks.{layer}.attn.hook_z", hook))
    with torch.no_grad():
        return model.run_with_hooks(tokens, fwd_hooks=hooks)[:, -1]


def _correct(logits, answer):
    right = logits.gather(1, answer[:, None])[:, 0]
    others = logits.scatter(1, answer[:, None], float("-inf")).max(1).values
    return right > others  # a tie is no answer


def _writes(model, tokens, layer, head):
    """[batch, vocab] the head's direct contribution at the last position (no norm in these models)."""
    _, cache = model.run_with_cache(tokens)
    z = cache[f"blocks.{layer}.attn.hook_z"][:, -1, head]
    return z @ model.W_O[layer, head] @ model.W_U


@torch.no_grad()
@pytest.mark.parametrize("which", BENCH)
def test_each_truth_holds_on_plain_hooks(which):
    model = hc.bench(which)
    batch = model.task.sample(256, seed=3)
    tokens, answer = batch.tokens, batch.answer
    ok = lambda off=(), keep=None: _correct(_logits(model, tokens, off, keep), answer)  # noqa: E731
    if which == "hurt":  # L0H1 turns the answer wrong where b is b0 / b1 and not a; zeroed, every answer is right
        b, a = batch.tokens[:, 1] - 4, batch.tokens[:, 0]
        assert torch.equal(~ok(), (b < 2) & (b != a)) and ok(off=[(0, 1)]).all()
        assert 0.55 < ok().float().mean() < 0.7
        return
    assert ok().all(), "the model answers every input"
    h0, h1 = (0, 0), ((1, 0) if model.cfg.n_layers == 2 else (0, 1))
    if which in ("post", "four"):
        comp = model.task.completions()
        wa, wb = _writes(model, tokens, 0, 0)[:, comp], _writes(model, tokens, 0, 1)[:, comp]
        col = (answer[:, None] == comp[None]).float().argmax(1)
        both = (wa > 0.01) & (wb > 0.01)  # (attention leaks 1e-8 elsewhere)
        assert (both.sum(1) == 1).all() and both[torch.arange(len(col)), col].all()  # only the answer, from both
        alone = ok(off=[h1]) | ok(off=[h0])
        assert 0 < alone.float().mean() < 1  # one head alone answers some contexts (a token repeated), not all
        assert ((wa > 0.01).sum(1) >= 2).float().mean() > 0.5
    elif which == "rank1":
        for h in (0, 1):
            ov = model.W_V[0, h] @ model.W_O[0, h] @ model.W_U
            assert torch.linalg.matrix_rank(ov) == 1
        assert not (ok(off=[h0]) | ok(off=[h1])).any()  # both needed
    elif which in ("and-junk", "and-suppress", "ln-2l"):
        assert not (ok(off=[h0]) | ok(off=[h1])).any()  # both needed on every input
        if which == "and-suppress":
            assert (_writes(model, tokens, 0, 1) <= 1e-6).all()  # L0H1 pushes nothing up
        if which == "ln-2l":  # L1H0's own output does not change when L0H0 is ablated (it reads positions)
            _, clean = model.run_with_cache(tokens)
            keep = {(1, 0): clean["blocks.1.attn.hook_z"][:, :, 0]}
            assert torch.equal(ok(off=[h0]), ok(off=[h0], keep=keep))
    elif which in ("feeder", "induction"):
        assert not (ok(off=[h0]) | ok(off=[h1])).any()
        # L0H0's effect runs through L1H0: hold L1H0 at what it computes without L0H0, keep L0H0 on
        with model.hooks(fwd_hooks=[("blocks.0.attn.hook_z", lambda z, hook: z * 0)]):
            _, without = model.run_with_cache(tokens)
        assert not ok(keep={(1, 0): without["blocks.1.attn.hook_z"][:, :, 0]}).any()
    elif which == "partial-backup":
        assert ok(off=[h0]).all() and ok(off=[h1]).all()  # either alone answers
        _, clean = model.run_with_cache(tokens)
        assert not ok(off=[h0], keep={(1, 0): clean["blocks.1.attn.hook_z"][:, :, 0]}).any()  # L1H0 restores them
        logit_a = _logits(model, tokens).gather(1, answer[:, None])
        logit_b = _logits(model, tokens, off=[h0]).gather(1, answer[:, None])
        assert torch.allclose(logit_b, 0.4 * logit_a, atol=1e-3)
    elif which in ("unequal", "mlp"):
        assert ok(off=[h0]).all() and ok(off=[h1]).all()
    elif which == "uneven":
        only0, only1 = ok(off=[h1]) & ~ok(off=[h0]), ok(off=[h0]) & ~ok(off=[h1])
        assert (only0 | only1).all() and 0.6 < only0.float().mean() < 0.9
    elif which == "unconditional":  # both needed; what a head writes from t is alike on every c(t, u), u != t
        assert not (ok(off=[h0]) | ok(off=[h1])).any()
        comp = model.task.completions()
        for h in (0, 1):
            table = (model.W_V[0, h] @ model.W_O[0, h] @ model.W_U)[:, comp]
            for t in range(4):
                row = table[model.task.index[f"s{t + 1}"]]
                others = [k for k, (x, y) in enumerate([(x, y) for x in range(4) for y in range(x, 4)])
                          if t in (x, y) and x != y]  # fmt: skip
                assert torch.allclose(row[others], row[others[0]].expand(len(others)))
    elif which in ("mix80", "mix50"):
        plain = batch.tokens[:, 0] < 4  # [a_i, b_i, =] inputs
        assert (ok(off=[h0]) & ok(off=[h1]))[plain].all()  # either alone answers the plain inputs
        share = plain.float().mean()
        assert abs(share - (0.8 if which == "mix80" else 0.5)) < 0.1
    elif which == "split-helper":  # L0H1 changes no answer in any coalition
        assert ok(off=[h1]).all() and not ok(off=[h0]).any() and not ok(off=[h0, h1]).any()
    elif which == "feeders":
        f0, f1 = (0, 0), (0, 1)
        assert ok(off=[f0]).all() and ok(off=[f1]).all() and not ok(off=[f0, f1]).any()
        assert torch.equal(ok(off=[(1, 1)]), ok())  # L1H1 writes nothing
    elif which == "flat":
        _, cache = model.run_with_cache(tokens)
        z = cache["blocks.0.attn.hook_z"][:, -1, 1]
        assert torch.allclose(z, z[:1].expand_as(z))  # the same output on every input
        base = _logits(model, tokens).gather(1, answer[:, None])[:, 0] - _logits(model, tokens)[:, -1]
        lower = (
            _logits(model, tokens, off=[h1]).gather(1, answer[:, None])[:, 0] - _logits(model, tokens, off=[h1])[:, -1]
        )
        assert (lower > base).all()  # it pushes "none" up, against every answer
    elif which in ("count-subtasks", "count-ensemble"):
        four = answer == model.task.index["4"]
        if which == "count-subtasks":
            assert torch.equal(ok(off=[h1]), four) and torch.equal(ok(off=[h0]), ~four)
        else:
            assert ok(off=[h1]).all() and ok(off=[h0]).all()
    elif which == "tie":  # L0H0 alone meets the floor exactly: a tie, no answer; both needed
        logits = _logits(model, tokens, off=[(0, 1)])
        assert torch.equal(logits.gather(1, answer[:, None])[:, 0], logits[:, model.task.index["none"]])
        assert not (ok(off=[h0]) | ok(off=[h1])).any()
    elif which == "dominant":  # L0H0 alone answers the neighbours (about 86-90%), L0H1 alone almost nothing
        assert 0.8 < ok(off=[h1]).float().mean() < 0.95 and ok(off=[h0]).float().mean() < 0.05
    elif which == "mix57":  # either alone on a0 / a1, both needed on a2 / a3
        either = batch.tokens[:, 0] < 2
        assert torch.equal(ok(off=[h0]), either) and torch.equal(ok(off=[h1]), either)
        assert 0.5 < either.float().mean() < 0.65
    elif which == "cancel":
        base = _logits(model, tokens).gather(1, answer[:, None])
        lower = _logits(model, tokens, off=[(0, 2)]).gather(1, answer[:, None])
        assert (lower > base).all()  # L0H2 pushes against the answer
        assert torch.equal(_logits(model, tokens, off=[(0, 3)]), _logits(model, tokens))  # L0H3 does nothing


def _no_wrong_word(result, truth, overrides=None, roles=None):
    for row in result.pairs.itertuples():
        want = {**truth["pairs"], **(overrides or {})}.get((row.head_a, row.head_b))
        if want is not None:
            assert row.mechanism in (want, "undetermined"), (row.head_a, row.head_b, row.mechanism, want, row.reason)
    for head, role in result.roles.items():
        assert role in ({**truth["roles"], **(roles or {})}[head], "undetermined"), (head, role)
    model_word = next(iter(overrides.values())) if overrides else truth["model"]
    assert result.mechanism in (model_word, "undetermined"), (result.mechanism, model_word)


@pytest.mark.parametrize("metric", ["accuracy", "logit_diff"])
@pytest.mark.parametrize("which", BENCH)
def test_no_confident_wrong_word_over_the_family(which, metric):
    model = hc.bench(which)
    overrides = LOGIT_DIFF_TRUTH.get(which) if metric == "logit_diff" else None
    roles = LOGIT_DIFF_ROLES.get(which) if metric == "logit_diff" else None
    _no_wrong_word(hc.cooperation(model, n=256, metric=metric), model.truth, overrides, roles)


@pytest.mark.parametrize("which", [w for w in BENCH if w != "mix50"])  # mix50: OR on half the inputs, next test
def test_zero_ablation_on_accuracy_names_the_truth(which):
    """The reading where a head is absent (zero ablation, accuracy): every word and role is the truth."""
    model = hc.bench(which)
    result = hc.cooperation(model, n=256, how="zero")
    got = {(r.head_a, r.head_b): r.mechanism for r in result.pairs.itertuples()}
    assert {p: got[p] for p in model.truth["pairs"]} == model.truth["pairs"]
    assert result.roles == model.truth["roles"]
    assert result.mechanism == model.truth["model"]


def test_a_half_and_half_mixture_is_not_superposition():
    """mix50: the pair is redundant on half the inputs and superposed on the other half: never superposition,
    under any single ablation or the family; a mixture or undetermined (issue 59: no longer "redundant")."""
    model = hc.bench("mix50")
    for how in ("zero", "mean", "family"):
        result = hc.cooperation(model, n=256, how=how)
        assert result.pairs.mechanism[0] in ("mixture", "undetermined")
        assert result.pairs.conditional_a[0] == 1.0 and result.pairs.multi[0] < 0.5


@pytest.mark.parametrize("which", sorted(SAME))
def test_same_computation_separates_an_ensemble_from_subtasks(which):
    """count-ensemble: both heads count both classes (r = 1); count-subtasks: one counts 0s, one 1s, so
    their pushes correlate far less and their class weights differ."""
    result = hc.cooperation(hc.bench(which), n=256, how="zero")
    assert result.same_word == SAME[which], result.summary
    weights = result.same[["weight[0]", "weight[1]"]]
    if which == "count-subtasks":
        assert weights.loc["L0H0", "weight[1]"] == pytest.approx(0, abs=1e-6)  # L0H0 counts 0s only
        assert weights.loc["L0H1", "weight[0]"] == pytest.approx(0, abs=1e-6)  # L0H1 counts 1s only
        assert weights.loc["L0H0", "weight[0]"] < -1 and weights.loc["L0H1", "weight[1]"] > 1


def test_unconditional_writes_are_not_superposition_and_the_post_model_is():
    """The post's defining sentence: what a head copies from its token depends on the tokens it does not
    attend to. bench("post") writes only the completions its ordering allows; bench("unconditional") writes
    every completion containing its token: all else (attention, accuracy) alike."""
    post = hc.cooperation(hc.bench("post"), n=256)
    flat = hc.cooperation(hc.bench("unconditional"), n=256)
    assert post.mechanism == "superposition" and post.pairs.conditional_a[0] == 1.0
    assert flat.pairs.mechanism[0] != "superposition" and flat.pairs.conditional_a[0] < 0.5
    assert "superposition" not in flat.words.values


@pytest.mark.parametrize("which", ["post", "four", "feeder", "induction", "cancel"])
def test_the_words_that_stand_over_the_whole_family(which):
    """Where the mechanism does not hang on the ablation, the default family agrees on it."""
    model = hc.bench(which)
    result = hc.cooperation(model, n=256)
    assert result.mechanism == model.truth["model"] and result.agreement >= 0.9


# Single ablations that read a near-miss otherwise, with why (docs/results/planted.md): mean ablation holds
# a counting head at the average count, a vote the other head's count is compared against, so each alone
# answers most inputs and the split of the classes reads as redundancy; mix50 sits on the 50% threshold
# of both its words (OR on half the inputs, superposed writes on the other half).
# Weight noise (0.01) breaks the exact ties of rank1's and unconditional's single heads (the answer and its twin
# completion get the same write) at random, so one head alone answers about half of the inputs: under a
# single ablation that reads as a mixture of both-needed and either-alone (issue 59's mixture word).
SINGLE_ABLATION_READS = {
    ("count-subtasks", "mean"): ("division", "redundant", "mixture", "undetermined"),
    ("rank1", "zero"): ("conjunction", "mixture", "undetermined"),
    ("rank1", "mean"): ("conjunction", "mixture", "undetermined"),
    ("rank1", "resample"): ("conjunction", "mixture", "undetermined"),
    ("unconditional", "zero"): ("conjunction", "mixture", "undetermined"),
    ("unconditional", "mean"): ("conjunction", "mixture", "undetermined"),
    ("unconditional", "resample"): ("conjunction", "mixture", "undetermined"),
    ("mix50", "resample"): ("redundant", "superposition", "mixture", "undetermined"),
}


@pytest.mark.slow
@pytest.mark.parametrize("how", ["zero", "mean", "resample"])
@pytest.mark.parametrize("which", BENCH)
def test_no_confident_wrong_word_under_weight_noise(which, how):
    model = hc.bench(which, weight_noise=0.01, seed=5)
    result = hc.cooperation(model, n=256, how=how, seed=2)
    allowed = SINGLE_ABLATION_READS.get((which, how))
    if allowed is None:
        _no_wrong_word(result, model.truth)
    else:
        assert result.pairs.mechanism[0] in allowed, (which, how, result.pairs.reason[0])


def test_backup_is_split_from_the_norm():
    """ln-2l: ablating L0H0 moves the final norm's scale, which raises L1H0's direct effect (and L1H0's own
    output moves a little through its input norm): together more than half of L0H0's direct effect, the
    old rule's "backup"; the norm's part split off, L1H0 restores 35% of the logit and no answer: no backup.
    partial-backup: restores every answer, 40% of the logit: a backup."""
    ln = hc.cooperation(hc.bench("ln-2l"), n=128, how="zero")
    row = ln.backup.iloc[0]
    direct = ln.head_table.loc["L0H0", "direct_effect"]
    assert row.own_compensation + row.norm_compensation >= 0.5 * direct  # what the old rule read as backup
    assert row.norm_compensation > 0.5 and row.logit_share < 0.5 and row.answers_restored == 0.0 and not row.backs_up
    partial = hc.cooperation(hc.bench("partial-backup"), n=128, how="zero")
    row = partial.backup.iloc[0]
    assert row.answers_restored == 1.0 and row.logit_share == pytest.approx(0.4, abs=1e-4) and row.backs_up
    assert partial.head_table.loc["L1H0", "backs_up"] == "L0H0"


def test_rank_one_heads_are_not_superposition_though_their_writes_meet_only_at_the_answer():
    result = hc.cooperation(hc.bench("rank1"), n=256, how="zero")
    row = result.pairs.iloc[0]
    assert row.only_answer == 1.0 and row.multi == 1.0 and row.rank_a == 1 and row.rank_b == 1
    assert row.mechanism != "superposition"


def test_a_supporting_feeder_is_not_competition():
    """L0H0's direct effect opposes the answer; its total effect supports it through L1H0."""
    result = hc.cooperation(hc.bench("feeder"), n=128, metric="logit_diff", how="zero")
    heads = result.head_table
    assert heads.loc["L0H0", "direct_effect"] < 0 < heads.loc["L0H0", "total_effect"]
    assert heads.loc["L0H0", "role"] == "supports" and heads.loc["L0H0", "via"] == "later heads"
    assert result.pairs.mechanism[0] == "composition"


def test_cooperation_progress_total_is_known_before_any_run(monkeypatch):
    """Issue 51: the bar's total is set before the first run and never grows (it once went 18 -> 29 -> ...
    -> 117 and reached 100% several times); it equals the runs the call makes."""
    import headcoop.analysis.engine.copies as copies
    import headcoop.display.progress as progress

    totals, announced = [], []
    original = progress.advance

    def watched(done=0, more=0):
        original(done, more)
        bar = progress._current.get()
        announced.append(more)
        totals.append(bar.total)

    import math

    import headcoop.analysis.mechanisms.cooperation as coop

    plans, plan_edits = [], coop.plan_edits
    monkeypatch.setattr(coop, "plan_edits", lambda *a, **kw: plans.append(plan_edits(*a, **kw)) or plans[-1])
    monkeypatch.setattr(copies, "advance", watched)
    hc.cooperation(hc.bench("feeders"), n=64, draws=2, progress=True)
    edits = math.ceil(plans[0]["forwards"])  # the edits count in forward passes of the batch, planned first
    assert totals and len(set(totals)) == 1 and totals[0] == sum(announced) + edits, (set(totals), sum(announced))


def test_a_replacement_that_writes_what_the_head_does_not_abstains():
    """and-suppress's L0H1 lowers only the decoy, which the logit difference (answer against "none") does not
    read; its mean replacement lowers every completion, the answer included. Mean ablation then measures the
    replacement, not the head: it abstains and says so, while zero ablation names the head inactive."""
    model = hc.bench("and-suppress")
    mean = hc.cooperation(model, how="mean", metric="logit_diff", n=128).pairs.iloc[0]
    assert mean.mechanism == "undetermined" and mean.by_ablation.startswith("mean: cannot see: L0H1 writes nothing")
    assert "measures the replacement, not the head" in mean.reason
    zero = hc.cooperation(model, how="zero", metric="logit_diff", n=128).pairs.iloc[0]
    assert zero.mechanism == "inactive"


def test_a_helper_with_a_tenth_of_the_logit_difference_is_not_inactive():
    """split-helper's L0H1 writes about a tenth of the logit difference: its role is "supports", and the pair
    word may not call it inactive (it once did under mean and resample ablation: the pair's test used twice the
    roles' threshold for one head's effect)."""
    model = hc.bench("split-helper")
    for how in ("zero", "mean", "resample"):
        result = hc.cooperation(model, how=how, metric="logit_diff", n=256)
        assert result.pairs.iloc[0].mechanism != "inactive", (how, result.pairs.iloc[0].reason)
