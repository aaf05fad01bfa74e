"""The claim registry (experiments/claims.py): each logical form can hold and can fail, a cell where the
measurement could not have come out the other way is "not testable here", and every quote is verbatim."""

from pathlib import Path

import pandas as pd
import pytest

from experiments import claims
from experiments.claims import FAILS, HOLDS, UNTESTABLE, Outcome, Reading, judge

SEEDS = Path(__file__).resolve().parents[2] / "shared" / "seeds"
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
    successful, every = _entry("bias").readings
    rows = pd.DataFrame(dict(kind="primary", heads=[16], successful=[8], biased=[12], biased_successful=[3]))
    assert judge("typical", every, every.measure(rows)) == HOLDS
    assert judge("typical", successful, successful.measure(rows)) == FAILS
    assert successful.favoured and not every.favoured


def test_existence_claims_are_read_as_existence():
    """'a 2-head model which solves the task': one seed is enough (the old rule asked for every seed)."""
    some, every = _entry("perfect").readings
    rows = pd.DataFrame({"shape": ["2 heads, d_head 5"] * 4, "signal_all": [True, False, False, False]})
    entry = _entry("perfect")
    assert judge(claims.form_of(entry, some), some, some.measure(rows)) == HOLDS
    assert judge(claims.form_of(entry, every), every, every.measure(rows)) == FAILS


def test_a_strong_correlation_is_not_failed_for_being_stronger_than_the_paper():
    strong, _, _, value = _entry("r").readings
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


def test_the_noise_failure_signature_can_hold_and_fail():
    from experiments.count01.page import _noise_claim

    heads = pd.DataFrame(dict(w02=[1.0, 2.0, 20.0, 30.0], s_acc=[0.8, 0.8, 1.0, 1.0], successful=[False, False, True, True]))
    assert _noise_claim(heads).verdict == "holds"
    assert _noise_claim(heads.assign(s_acc=[1.0, 1.0, 0.9, 0.9])).verdict == "fails"
    assert _noise_claim(heads.assign(w02=5.0)).verdict == "not testable here"
