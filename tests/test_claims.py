"""The claim registry (experiments/claims.py): each logical form can hold and can fail, a cell where the
measurement could not have come out the other way is "not testable here", and every quote is verbatim."""

from pathlib import Path

import pandas as pd
import pytest

from experiments import claims
from experiments.claims import FAILS, HOLDS, UNTESTABLE, Outcome, Reading, judge

SEEDS = Path(__file__).resolve().parents[2] / "shared" / "seeds"
RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
ANY = Reading("r", "rule", lambda t: Outcome(""), holds=lambda v: v > 0)


@pytest.mark.parametrize(("form", "passed", "units", "expected"), [
    ("existence", 1, 10, HOLDS), ("existence", 0, 10, FAILS),
    ("universal", 10, 10, HOLDS), ("universal", 9, 10, FAILS),
    ("typical", 6, 10, HOLDS), ("typical", 5, 10, FAILS),
    ("typical", 0, 0, UNTESTABLE), ("universal", 0, 0, UNTESTABLE),
])  # fmt: skip
def test_each_form_can_hold_and_fail(form, passed, units, expected):
    assert judge(form, ANY, Outcome("", passed, units)) == expected


def test_comparison_and_untestable_cells():
    assert judge("comparison", ANY, Outcome("", value=0.1)) == HOLDS
    assert judge("comparison", ANY, Outcome("", value=-0.1)) == FAILS
    assert judge("correlation", ANY, Outcome("", value=float("nan"))) == UNTESTABLE
    # a reason not to test wins over any count
    assert judge("existence", ANY, Outcome("", 5, 5, untestable="no model can represent a solution")) == UNTESTABLE


def _entry(key):
    return next(e for e in claims.REGISTRY if e.key == key)


def test_difficult_to_reach_is_not_testable_where_no_solution_is_representable():
    """The heads-only readout's d=1 model never produces the answer: 'difficult to reach' cannot fail there."""
    reach = _entry("reach").readings[0]
    dead = pd.DataFrame(dict(kind="minimal", both_acc=[0.0] * 4, answer_acc=[0.0] * 4))
    assert judge("typical", reach, reach.measure(dead)) == UNTESTABLE
    live = pd.DataFrame(dict(kind="minimal", both_acc=[0.0, 0.0, 0.0, 1.0], answer_acc=[0.5, 0.6, 0.4, 1.0]))
    assert judge("typical", reach, reach.measure(live)) == HOLDS
    easy = live.assign(both_acc=1.0)
    assert judge("typical", reach, reach.measure(easy)) == FAILS


def test_the_syntax_claim_needs_heads_that_carry_the_syntax():
    whole = _entry("aggregate").readings[0]
    base = dict(kind="primary", model_answer_acc=1.0, model_eos_acc=1.0, zeroed_answer_acc=0.5,
                uniform_whole_answer_acc=1.0, uniform_whole_eos_acc=0.7)  # fmt: skip
    no_heads_needed = pd.DataFrame([dict(base, zeroed_eos_acc=1.0)] * 3)
    assert judge("typical", whole, whole.measure(no_heads_needed)) == UNTESTABLE
    carried = pd.DataFrame([dict(base, zeroed_eos_acc=0.0)] * 3)
    assert judge("typical", whole, whole.measure(carried)) == HOLDS
    uniform_is_fine = pd.DataFrame([dict(base, zeroed_eos_acc=0.0, uniform_whole_eos_acc=1.0)] * 3)
    assert judge("typical", whole, whole.measure(uniform_is_fine)) == FAILS


def test_a_tip_implied_by_accuracy_is_not_testable():
    tip = _entry("tip").readings[0]
    rows = pd.DataFrame(dict(kind="primary", eq_answer_top=[True] * 3, ans_eos_top=[True] * 3, both_acc=[1.0] * 3))
    assert judge("universal", tip, tip.measure(rows)) == UNTESTABLE
    assert judge("universal", tip, tip.measure(rows.assign(both_acc=[1.0, 0.9, 1.0]))) == HOLDS


def test_biased_reads_successful_heads_where_failed_heads_pass_trivially():
    """Failed heads (signal about 0) pass any bias test: over every head the claim holds, over successful heads
    it fails (one row per head of the grid's primary models, `count01_heads`)."""
    successful, every = _entry("bias").readings[:2]
    heads = pd.DataFrame(dict(s_acc=[1.0] * 8 + [0.6] * 8, bias_45=[0.1] * 3 + [0.0] * 5 + [0.5] * 8,
                              signal_45=[0.3] * 8 + [0.01] * 8))  # fmt: skip
    assert judge("typical", every, every.measure(heads)) == HOLDS  # 11 of 16
    assert judge("typical", successful, successful.measure(heads)) == FAILS  # 3 of 8
    assert successful.favoured and not every.favoured
    loose = next(b for b in successful.bands if b.threshold.startswith("|bias")).at(
        10
    )  # a tenth of the signal: 3 of 8 still
    assert judge("typical", loose, loose.measure(heads)) == FAILS


def test_existence_claims_are_read_as_existence():
    """'a 2-head model which solves the task': one seed is enough (the old rule asked for every seed)."""
    some, every = _entry("perfect").readings
    rows = pd.DataFrame({"shape": ["2 heads, d_head 5"] * 4, "signal_all": [True, False, False, False]})
    entry = _entry("perfect")
    assert judge(claims.form_of(entry, some), some, some.measure(rows)) == HOLDS
    assert judge(claims.form_of(entry, every), every, every.measure(rows)) == FAILS


def test_a_strong_correlation_is_not_failed_for_being_stronger_than_the_paper():
    strong, value = _reading("r", "strong, y = answer accuracy"), _reading("r", "the value 0.72, y = answer accuracy")
    import numpy as np

    x = np.linspace(0, 1, 40)
    rows = pd.DataFrame(dict(kind="primary", weighted_s_acc=x, answer_acc=x + 0.05 * np.sin(17 * x)))
    assert judge("correlation", strong, strong.measure(rows)) == HOLDS  # r ~ 0.99
    assert judge("correlation", value, value.measure(rows)) == FAILS  # 0.72 is outside its interval


@pytest.mark.skipif(not SEEDS.is_dir(), reason=f"the source documents are not at {SEEDS}")
def test_every_registry_quote_is_verbatim_in_its_source():
    def text(name):
        return " ".join((SEEDS / name).read_text(encoding="utf-8").split())

    for entry in claims.REGISTRY:
        assert " ".join(entry.quote.split()) in text(entry.source), entry.key
    for quote, source, why in claims.UNTESTED:
        assert " ".join(quote.split()) in text(source) and why, quote[:40]


def _reading(key, name):
    return next(r for r in _entry(key).readings if r.name == name)


def test_the_noise_failure_signature_can_hold_and_fail():
    """On count01.md's heads and on the grid's heads: heads that attend to '2' (w02 < 3) separating worse holds,
    the reverse fails, and with no head on one side nothing can be compared; the cut of "significant attention"
    is banded."""
    for name in ("w02 > 10 heads separate better, count01.md's models", "w02 > 10 heads separate better"):
        reading = _reading("noise", name)
        heads = pd.DataFrame(dict(w02=[1.0, 2.0, 20.0, 30.0], s_acc=[0.8, 0.8, 1.0, 1.0]))
        assert judge("comparison", reading, reading.measure(heads)) == HOLDS
        assert judge("comparison", reading, reading.measure(heads.assign(s_acc=[1.0, 1.0, 0.9, 0.9]))) == FAILS
        assert judge("comparison", reading, reading.measure(heads.assign(w02=5.0))) == UNTESTABLE
        # w02 < 2 keeps only the first head
        cut = next(b for b in reading.bands if b.threshold.startswith("significant")).at(2)
        assert "over 1 with w02 < 2" in cut.measure(heads).text


def test_the_tip_has_a_reading_that_accuracy_does_not_imply():
    """'[EOS] climbs from second to first' can fail on models with perfect accuracy: [EOS] last at '='."""
    climbs = _reading("tip", "[EOS] climbs from second to first")
    perfect = pd.DataFrame(dict(kind="primary", both_acc=[1.0] * 3, eq_answer_top=True, ans_eos_top=True,
                                eq_eos_second=[True, True, True]))  # fmt: skip
    assert judge("universal", climbs, climbs.measure(perfect)) == HOLDS
    assert judge("universal", climbs, climbs.measure(perfect.assign(eq_eos_second=[True, False, True]))) == FAILS


def test_the_minimal_solution_exists_by_construction_or_by_training():
    hand = _reading("minimal", "hand-written weights")
    assert judge("existence", hand, hand.measure(pd.DataFrame(dict(both_acc=[1.0, 1.0, 1.0])))) == HOLDS
    assert judge("existence", hand, hand.measure(pd.DataFrame(dict(both_acc=[1.0, 0.5])))) == FAILS
    trained = _reading("minimal", "a trained run")
    runs = pd.DataFrame(dict(kind=["minimal"] * 4 + ["primary"], both_acc=[0.2, 0.3, 0.995, 0.1, 1.0]))
    assert judge("existence", trained, trained.measure(runs)) == HOLDS
    assert (
        judge("existence", trained, trained.measure(runs.assign(both_acc=0.5))) == FAILS
    )  # the primary run does not count


def test_split_attention_at_the_level_of_whole_orderings():
    """Two heads that put the same token first attend to it together: such a d_head 5 model fails 'only for
    d_head < 3'; a d_head 1 model with it shows the split exists there."""
    never5 = _reading("split", "never at d_head 5, whole orderings")
    seen1 = _reading("split", "seen at d_head 1, whole orderings (existence)")
    entry = _entry("split")
    grid = pd.DataFrame(
        {
            "shape": ["2 heads, d_head 5"] * 2 + ["2 heads, d_head 1"] * 2,
            "orderings": ["2>3>4>1 | 1>4>3>2", "3>2>4>1 | 1>2>4>3", "4>1>2>3 | 4>3>2>1", "1>2>3>4 | 4>3>2>1"],
        }
    )
    assert judge(claims.form_of(entry, never5), never5, never5.measure(grid)) == HOLDS
    assert judge(claims.form_of(entry, seen1), seen1, seen1.measure(grid)) == HOLDS
    shared5 = grid.assign(
        orderings=["2>3>4>1 | 2>4>3>1", "3>2>4>1 | 1>2>4>3", "4>1>2>3 | 3>4>2>1", "1>2>3>4 | 4>3>2>1"]
    )
    assert judge(claims.form_of(entry, never5), never5, never5.measure(shared5)) == FAILS
    assert judge(claims.form_of(entry, seen1), seen1, seen1.measure(shared5)) == FAILS


def test_the_pseudo_ensemble_readings_tell_redundant_models_from_divided_ones():
    """R3 (every pair of active heads redundant) fails on one model with a non-redundant pair; R2 holds while
    most pairs are; both read cooperation.md's per-model table, per ablation."""
    r3, r2 = _reading("finding", "R3, zero ablation"), _reading("finding", "R2, zero ablation")
    models = pd.DataFrame(dict(model=["a", "b", "c"], how="zero", active_pairs=[10, 10, 10], redundant=[10, 10, 8],
                               mechanism="redundant"))  # fmt: skip
    models["redundant_share"] = models.redundant / models.active_pairs
    assert judge("typical", r3, r3.measure(models)) == HOLDS  # 2 of 3 models
    assert judge("typical", r3, r3.measure(models.assign(redundant=[10, 8, 8]))) == FAILS
    divided = models.assign(redundant=[2, 3, 10])
    divided["redundant_share"] = divided.redundant / divided.active_pairs
    assert judge("typical", r2, r2.measure(divided)) == FAILS
    assert judge("typical", r2, r2.measure(models.assign(how="mean"))) == UNTESTABLE  # no model under zero ablation


def test_superposition_example_reads_the_example_model_and_the_seeds():
    assert _entry("superpose").readings[0].name == "the example model, the post's definition"  # the favoured reading
    assert _entry("superpose").readings[0].favoured and not _entry("superpose").readings[1].favoured
    defining = _entry("superpose").readings[0]
    answer = pd.DataFrame(dict(d_head=[5, 1], conditional_a=[1.0, 0.75], conditional_b=[0.6, 0.51],
                               shown_a=[0.44, 0.5], shown_b=[1.0, 0.66]))  # fmt: skip
    assert judge("existence", defining, defining.measure(answer)) == HOLDS
    assert judge("existence", defining, defining.measure(answer.assign(conditional_b=0.4))) == FAILS
    assert judge("existence", defining, defining.measure(answer.assign(shown_b=0.0))) == UNTESTABLE
    shipped = _reading("superpose", "the example model, mean ablation")
    some = _reading("superpose", "some d_head 5 seed, mean ablation")
    mech = pd.DataFrame(dict(d_head=5, how="mean", seed=[float("nan"), 0, 1, 2],
                             mechanism=["division", "division", "superposition", "undetermined"]))  # fmt: skip
    assert judge("existence", shipped, shipped.measure(mech)) == FAILS
    assert judge("existence", some, some.measure(mech)) == HOLDS
    assert judge("existence", shipped, shipped.measure(mech.assign(mechanism="superposition"))) == HOLDS
    assert judge("existence", some, some.measure(mech.assign(mechanism="division"))) == FAILS


def test_a_page_reading_has_one_cell_and_missing_tables_are_not_testable(tmp_path):
    from experiments.robustness.page import PAGE, default_verdicts, judge_cells

    entry = _entry("superpose")
    reading = entry.readings[1]
    mech = pd.DataFrame(dict(d_head=5, how="family", seed=[float("nan")], mechanism=["superposition"]))
    assert judge_cells({reading.table: mech}, entry, reading, ["default", "context 20"]) == {
        ("default", PAGE): ("holds", "1/1 shipped d_head 5 model (verdicts: 1 superposition)")
    }
    assert judge_cells({}, entry, reading, ["default"])[("default", PAGE)][0] == UNTESTABLE
    # no tables at all: every reading of every claim is "not testable here", none holds or fails by default
    said = default_verdicts(tmp_path / "robustness", "skip_pair")
    import re

    assert said and not any(re.search(r"\b(holds|fails)\b", v) for v in said.values())  # ("thresholds" may appear)


def test_a_page_cannot_judge_a_claim_the_registry_lacks():
    from experiments.robustness.page import REGISTRY_SAYS, with_registry
    from headcoop.display.pages import Claim

    quote = _entry("half").quote
    judged = with_registry([Claim("2", quote, "82%", REGISTRY_SAYS)], {quote: "comparison; ...: fails"})
    assert judged[0].verdict == "comparison; ...: fails"
    with pytest.raises(KeyError, match="no entry"):
        with_registry([Claim("2", "a sentence no registry entry quotes", "x", REGISTRY_SAYS)], {})


@pytest.mark.skipif(not (RESULTS / "robustness.md").exists(), reason="docs/results not regenerated")
def test_no_two_pages_give_one_quote_two_verdicts():
    """The claims tables of count01.md, skip_pair.md, cooperation.md (default setup, from the registry) agree
    on every quote they share, and robustness.md's rows cover every quote they judge."""
    import re

    verdicts: dict[str, set] = {}
    for page in ("count01", "skip_pair", "cooperation"):
        text = (RESULTS / f"{page}.md").read_text(encoding="utf-8")
        table = text[text.index("| section") :].split("\n\n")[0].splitlines()[2:]
        for row in table:
            cells = [c.strip() for c in row.strip("|").split("|")]
            verdicts.setdefault(cells[1], set()).add(cells[-1])
    shared = {q: v for q, v in verdicts.items() if len(v) > 1}
    assert not shared, shared
    robustness = " ".join((RESULTS / "robustness.md").read_text(encoding="utf-8").split())
    judged = [q for q, v in verdicts.items() if "registry" in next(iter(v))]
    assert len(judged) == len(verdicts) - 1  # all but the title question
    for quote in judged:
        assert " ".join(re.sub(r"\\\|", "|", quote).split()) in robustness, quote[:50]


def test_the_family_reading_abstains_where_the_readings_leave_models_undetermined():
    """Under the reading family a model whose word is undetermined cannot show the pseudo-ensemble either
    way: R1 and R2 leave it out, and are "not testable here" when every model is undetermined."""
    r1, r2 = _reading("finding", "R1, family"), _reading("finding", "R2, family")
    models = pd.DataFrame(dict(model=["a", "b"], how="family", active_pairs=[10, 10], redundant=[0, 0],
                               conflicting=[10, 9], mechanism="undetermined"))  # fmt: skip
    models["redundant_share"] = models.redundant / models.active_pairs
    assert judge("typical", r1, r1.measure(models)) == UNTESTABLE
    assert judge("typical", r2, r2.measure(models)) == UNTESTABLE
    decided = models.assign(mechanism=["redundant", "undetermined"], redundant=[9, 0], conflicting=[1, 9])
    decided["redundant_share"] = decided.redundant / decided.active_pairs
    assert judge("typical", r1, r1.measure(decided)) == HOLDS  # 1 of the 1 determined models
    few = decided.assign(redundant=[2, 0])
    few["redundant_share"] = few.redundant / few.active_pairs
    assert judge("typical", r2, r2.measure(few)) == FAILS


def _said(text: str) -> str:
    return " ".join(text.split())


def _summary_sentences() -> list[tuple[str, str]]:
    """(sentence, source) of every claim the sources' summary sections make: the summary's key outcome, key
    results, mechanism claims, quoted evidence anchors, design trade-offs and failure signatures; the abstract
    page's abstract finding and key results; the post's key takeaways (split into sentences)."""
    import re

    out = []
    summary = (SEEDS / claims.SUMMARY).read_text(encoding="utf-8")
    out.append((summary.split("- Key outcome: ", 1)[1].splitlines()[0], claims.SUMMARY))
    key_results = summary.split("## Key Results", 1)[1].split("\n## ", 1)[0]
    out += [(line[2:], claims.SUMMARY) for line in key_results.splitlines() if line.startswith("- ")]
    mechanisms = summary.split("## Why This Works", 1)[1].split("\n## ", 1)[0]
    out += [(line.split("Claim: ", 1)[1], claims.SUMMARY) for line in mechanisms.splitlines() if "- Claim: " in line]
    for line in mechanisms.splitlines():
        if re.match(r"\s*- \[(abstract|Section [\d.]+)\]", line):
            out += [(q, claims.SUMMARY) for q in re.findall(r'"([^"]+)"', line)]
    for heading in ("- Design tradeoffs:", "- Failure signatures:"):
        block = summary.split(heading, 1)[1].split("\n- ", 1)[0]
        out += [
            (re.sub(r"^\*\*[^*]+\*\*: ", "", line.strip()[2:]), claims.SUMMARY)
            for line in block.splitlines()
            if line.strip().startswith("- ")
        ]
    abstract = (SEEDS / claims.ABSTRACT).read_text(encoding="utf-8")
    out.append((re.search(r"Our work presents evidence that ([^.]+)\.", abstract).group(1), claims.ABSTRACT))
    findings = abstract.split("Key Results — What are the main findings?", 1)[1].split("Significance", 1)[0]
    out += [(line.strip()[2:], claims.ABSTRACT) for line in findings.splitlines() if line.strip().startswith("•")]
    post = (SEEDS / claims.POST).read_text(encoding="utf-8")
    takeaways = " ".join(post.split("Key Takeaways", 1)[1].split("Problem Details:", 1)[0].split())
    out += [(s, claims.POST) for s in re.split(r"(?<=[.!?])\s+(?=[A-Z])", takeaways) if s]
    return [(_said(s), source) for s, source in out]


@pytest.mark.skipif(not SEEDS.is_dir(), reason=f"the source documents are not at {SEEDS}")
def test_every_alias_is_verbatim_and_names_a_registry_row():
    keys = {e.key for e in claims.REGISTRY}
    for key, said in claims.ALSO.items():
        assert key in keys, key
        for quote, source in said:
            assert _said(quote) in _said((SEEDS / source).read_text(encoding="utf-8")), (key, quote[:50])


@pytest.mark.skipif(not SEEDS.is_dir(), reason=f"the source documents are not at {SEEDS}")
def test_every_claim_of_the_summary_sections_has_a_row_or_a_reason():
    """Every sentence of the sources' summary sections (`_summary_sentences`) holds the quote of a registry row, of
    a sentence that row also judges (claims.ALSO), or of an entry of the "no rule measures this" table
    (claims.UNTESTED); a new claim sentence in the sources without one fails here."""
    quotes = (
        [(e.quote, e.source) for e in claims.REGISTRY]
        + [(q, src) for said in claims.ALSO.values() for q, src in said]
        + [(q, src) for q, src, _ in claims.UNTESTED]
    )
    sentences = _summary_sentences()
    assert len(sentences) >= 30  # the parse found the sections
    missing = [
        s for s, source in sentences if not any(_said(q) in s or s in _said(q) for q, src in quotes if src == source)
    ]
    assert not missing, missing


def test_a_band_names_the_threshold_that_flips_a_verdict():
    """Count01.md's heads: at s_acc >= 0.95 half the heads are successful (holds); at 0.99 a fifth (fails): the
    summary row names the flip, and the page's table shows the verdict at every value of the band."""
    from experiments.robustness.page import band_text, flips, tried

    entry, reading = _entry("half"), _reading("half", "share of successful heads, count01.md's models")
    heads = pd.DataFrame(dict(s_acc=[1.0, 1.0, 0.96, 0.96, 0.96, 0.5, 0.5, 0.5, 0.5, 0.5]))
    tables = {reading.table: heads}
    said = flips(tables, entry, reading, ["default"])
    assert said == ["fails at successful: s_acc >= 0.99"]
    assert "0.99: fails" in band_text(tables, entry, reading, ["default"])
    assert tried(reading, said).startswith("flips:")
    calm = {reading.table: heads.assign(s_acc=[1.0] * 5 + [0.5] * 5)}  # the same share at every threshold
    assert flips(calm, entry, reading, ["default"]) == []
    assert "no successful: s_acc >= in 0.9, 0.99 flips it" in tried(reading, [])


def test_a_setup_that_flips_a_verdict_is_named_with_its_count():
    """The aggregation claim: not testable in the default setup ([EOS] needs no head), testable and failing under
    the heads-only readout: the flip carries the count."""
    from experiments.robustness.page import flips

    entry, reading = _entry("aggregate"), _entry("aggregate").readings[0]
    base = dict(kind="primary", steps=1000, model_answer_acc=1.0, model_eos_acc=1.0, zeroed_answer_acc=0.5,
                uniform_whole_answer_acc=1.0, uniform_whole_eos_acc=1.0)  # fmt: skip
    grid = pd.DataFrame(
        [dict(base, variant="default", zeroed_eos_acc=1.0)] * 3
        + [dict(base, variant="heads-only readout", zeroed_eos_acc=0.0)] * 3
    )
    said = flips({"grid": grid}, entry, reading, ["default", "heads-only readout"])
    assert len(said) == 1 and said[0].startswith("fails under heads-only readout (0/3 models lose accuracy")


@pytest.mark.parametrize(("key", "name", "column", "passing", "failing"), [
    ("fully_attended", "every pair, every solved model", "pairs_covered", 6, 5),
    ("least_favourite", "every head, d_head 5", "least_favourite_alone", 2, 1),
])  # fmt: skip
def test_the_new_skip_pair_rows_can_hold_and_fail(key, name, column, passing, failing):
    entry, reading = _entry(key), _reading(key, name)
    runs = pd.DataFrame(dict(n_heads=2, d_head=5, seed=[0, 1], signal_acc=1.0, relation="reversed",
                             **{column: [passing, passing]}))  # fmt: skip
    assert judge(entry.form, reading, reading.measure(runs)) == HOLDS
    assert judge(entry.form, reading, reading.measure(runs.assign(**{column: [passing, failing]}))) == FAILS
    unsolved = runs.assign(signal_acc=0.5)
    assert judge(entry.form, reading, reading.measure(unsolved)) == UNTESTABLE


def test_a_cover_implied_by_reversed_orderings_is_not_testable():
    reading = _reading("fully_attended", "given reversed orderings")
    runs = pd.DataFrame(dict(n_heads=2, d_head=5, seed=[0], signal_acc=1.0, relation="reversed", pairs_covered=[6]))
    assert judge("universal", reading, reading.measure(runs)) == UNTESTABLE


def test_orthogonal_storage_and_the_tradeoff_can_hold_and_fail():
    some = _reading("orthogonal", "some solved run with d_head >= 4")
    runs = pd.DataFrame(dict(n_heads=2, d_head=[4, 5, 1], signal_acc=1.0, value_cos_max=[0.1, 0.9, 1.0]))
    assert judge("existence", some, some.measure(runs)) == HOLDS
    assert judge("existence", some, some.measure(runs.assign(value_cos_max=0.9))) == FAILS
    trade = _reading("tradeoff", "smallest d_head falls with n_heads, every seed")
    grid = pd.DataFrame(
        [dict(n_heads=h, d_head=d, seed=0, signal_all=d >= 5 - h) for h in (1, 2, 3, 4) for d in range(1, 7)]
    )
    assert judge("comparison", trade, trade.measure(grid)) == HOLDS  # 1 head: d_head 4 ... 4 heads: d_head 1
    flat = grid.assign(signal_all=grid.d_head >= 2)
    assert judge("comparison", trade, trade.measure(flat)) == FAILS  # d_head 2 whatever the head count


def test_the_collapse_and_exploit_rows_can_hold_and_fail():
    imposed = _reading("collapse", "imposed extreme w01")
    band = pd.DataFrame(dict(others="model", w01=[0.001, 0.01, 1.0, 100.0, 1000.0], s_acc=[0.6, 0.6, 1.0, 0.6, 0.6]))
    assert judge("universal", imposed, imposed.measure(band)) == HOLDS
    assert judge("universal", imposed, imposed.measure(band.assign(s_acc=0.9))) == FAILS
    some = _reading("exploit", "some successful head under-read")
    heads = pd.DataFrame(dict(successful=True, s_acc=[1.0, 1.0], l_acc=[1.0, 0.8]))
    assert judge("existence", some, some.measure(heads)) == HOLDS
    assert judge("existence", some, some.measure(heads.assign(l_acc=1.0))) == FAILS


def test_every_summary_verdict_says_what_flips_it_or_what_was_tried():
    """Each reading in a page's verdict column carries a bracket: what flips it, or the setups and thresholds tried."""
    import re

    from experiments.robustness.page import default_verdicts

    for task in ("count01", "skip_pair"):
        for quote, said in default_verdicts(RESULTS / "robustness", task).items():
            entry = next(e for e in claims.REGISTRY if e.quote == quote)
            assert len(re.findall(r"\[(flips: |default setup only; |no setup tried flips it; )", said)) == len(
                entry.readings
            ), quote[:40]


def test_one_rule_an_undetermined_unit_never_makes_a_verdict_fail():
    """Issue 71: units the instrument leaves undetermined count neither way, for every claim alike: a verdict fails
    only where it would fail with all of them passing."""
    from experiments.claims import count

    reading = _reading("finding", "R0, same function by edits")
    assert judge("typical", reading, count(1, 9, "models", undecided=8)) == UNTESTABLE
    assert judge("typical", reading, count(1, 9, "models", undecided=3)) == FAILS  # 4 of 9 at best
    assert judge("typical", reading, count(5, 9, "models", undecided=4)) == HOLDS
    assert judge("universal", reading, count(8, 9, "models", undecided=1)) == UNTESTABLE
    assert judge("existence", reading, count(0, 2, "models", undecided=2)) == UNTESTABLE
    assert judge("existence", reading, count(0, 2, "models")) == FAILS


def test_the_pseudo_ensemble_claim_is_judged_on_the_papers_one_layer_models():
    reading = _reading("finding", "R0, same function by edits")
    assert reading.favoured and "on the counts" in reading.rule
    answer = pd.DataFrame(dict(layers=[1] * 9 + [2, 2], function_word=["same function on the counts (pseudo-ensemble)"]
                               * 6 + ["undetermined"] * 3 + ["different functions on the counts"] * 2))  # fmt: skip
    out = reading.measure(answer)
    assert (out.passed, out.units, out.undecided) == (6, 9, 3)
    assert out.text.startswith(
        "6/9 one-layer models (3 undetermined); past the paper, the two-layer models: 2 different"
    )
    assert judge("typical", reading, out) == HOLDS
