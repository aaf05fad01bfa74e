"""Issue 60: no results page holds two verdicts for one claim. The check (`experiments.consistency`) passes on
docs/results and fails when a stale table, a stale page line or a changed number is put back; the answer's
table is reproduced by the code at HEAD (a sampled row in the fast tier, the rest in the slow tier)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from experiments import consistency
from experiments.consistency import RESULTS, contradictions, numbers_on_page, one_verdict, same_call


def test_no_page_contradicts_itself():
    assert contradictions(RESULTS) == []


def test_no_table_cell_on_a_results_page_is_over_300_characters():
    """Legibility (issue 60): a longer text is clipped on the page (`headcoop.display.pages.clip`) and whole in the CSV."""
    from headcoop.display.pages import MAX_CELL

    long = []
    for page in sorted(RESULTS.glob("*.md")):
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if line.startswith("|") and not set(line) <= set("|:- "):  # the alignment row is no cell
                long += [f"{page.name}:{n} ({len(c.strip())})" for c in line.strip().strip("|").split("|")
                         if len(c.strip()) > MAX_CELL]  # fmt: skip
    assert long == []


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """docs/results' cooperation tables and the pages that show the SkipPair answer, copied."""
    shutil.copytree(RESULTS / "cooperation", tmp_path / "cooperation")
    for page in (*consistency.ANSWER_PAGES,):
        shutil.copy(RESULTS / page, tmp_path / page)
    return tmp_path


def test_a_stale_registry_table_is_caught(copy: Path):
    """The earlier instrument's row for the shipped model (78% of readings, no favoured word) put back into the
    registry's table: the answer's table and the registry's no longer hold one call."""
    path = copy / "cooperation" / "skip_pair_mechanisms.csv"
    table = pd.read_csv(path)
    at = table.index[table.seed.isna() & (table.d_head == 5) & (table.how == "family")]
    table.loc[at, "agreement"] = 0.7760416666666666
    table.to_csv(path, index=False)
    found = same_call(copy)
    assert len(found) == 1 and "agreement" in found[0] and "0.776" in found[0]


def test_a_stale_page_line_is_caught(copy: Path):
    """A summary cell from the earlier instrument ("78% of votes") beside today's answer, and a registry
    verdict that does not match the answer's lead."""
    page = copy / "cooperation.md"
    text = page.read_text(encoding="utf-8")
    text += "\n| 2 | stale | the shipped d_head 5 model: undetermined (78% of votes; zero 79%) | x |\n"
    text += "\nthe example model, the post's definition (favoured): fails [default setup only]\n"
    page.write_text(text, encoding="utf-8")
    found = one_verdict(page)
    assert any("78% of votes" in f for f in found) and any("registry's favoured reading says" in f for f in found)


def test_a_number_the_tables_do_not_hold_is_caught(copy: Path):
    page = copy / "cooperation.md"
    text = page.read_text(encoding="utf-8")
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("- **The SkipPair post asks**"))
    lines[at] = lines[at].replace("Found:** ", "Found:** 0.4321 of it, ", 1)
    page.write_text("\n".join(lines), encoding="utf-8")
    found = numbers_on_page(page)
    assert len(found) == 1 and "0.4321" in found[0]


def _reproduced(d_head: int) -> None:
    import headcoop as hc
    from experiments.cooperation.common import Settings
    from experiments.cooperation.exp_mechanisms import skip_pair_row

    name = "skip-pair" if d_head == 5 else "skip-pair-dhead1"
    row = skip_pair_row(hc.cooperation(hc.load(name), draws=Settings().draws, progress=False))
    saved = pd.read_csv(RESULTS / "cooperation" / "skip_pair_answer.csv").set_index("d_head").loc[d_head]
    for column, value in row.items():
        if column == "summary":
            continue
        want = saved[column]
        if isinstance(value, str) or isinstance(want, str):
            assert str(value) == str(want) or (pd.isna(want) and value == ""), (column, value, want)
        elif pd.isna(want):
            assert pd.isna(value), (column, value)
        else:
            assert value == pytest.approx(float(want), abs=1e-6), (column, value, want)


def test_the_answer_table_is_reproduced_at_head():
    """A sampled row: the shipped d_head 5 model's answer, recomputed by today's code, equals the CSV."""
    _reproduced(5)


@pytest.mark.slow
def test_the_rest_of_the_answer_tables_is_reproduced_at_head():
    """The d_head 1 row, and Count01's shipped row (the default call on the table's 512 strings)."""
    import headcoop as hc
    from experiments.cooperation.common import Settings
    from experiments.cooperation.exp_mechanisms import answer_row

    _reproduced(1)
    task = hc.Count01()
    s = Settings()
    result = hc.cooperation(hc.load("count01"), inputs=task.sample(s.n_inputs, seed=3), draws=s.draws, max_exact=2,
                            progress=False)  # fmt: skip
    row = answer_row(result, model="shipped", layers=1, how="family")
    saved = pd.read_csv(RESULTS / "cooperation" / "count01_answer.csv").set_index("model").loc["shipped"]
    for column in (
        "function_word",
        "deciding_heads",
        "edit_cos_min",
        "edit_one_direction",
        "noise_cos_min",
        "same_word",
        "r_min",
        "mechanism",
        "agreement",
        "largest_matters_full_zero",
        "largest_matters_full_mean",
    ):
        value, want = row[column], saved[column]
        if isinstance(value, str):
            assert value == want, (column, value, want)
        else:
            assert float(value) == pytest.approx(float(want), abs=1e-6), (column, value, want)


def test_every_results_folder_records_the_code_that_generated_it():
    """Issue 71: all seven folders, each with its generated.json at a commit whose instrument equals HEAD's."""
    assert set(consistency.FOLDERS) == {"cooperation", "planted", "count01", "skip_pair", "robustness", "circuits",
                                        "attribution"}  # fmt: skip
    for folder in consistency.FOLDERS:
        assert (RESULTS / folder / consistency.GENERATED).exists(), folder
        assert consistency.generated_at_head(RESULTS / folder) == [], folder


def test_a_claim_with_two_verdicts_on_two_pages_is_caught(tmp_path: Path):
    """One registry, one rule: a summary cell changed on one page is a contradiction with the other pages."""
    for page in consistency.SUMMARY_PAGES + consistency.ANSWER_PAGES:
        if (RESULTS / page).exists() and not (tmp_path / page).exists():
            shutil.copy(RESULTS / page, tmp_path / page)
    assert consistency.one_verdict_per_claim(tmp_path) == []
    shared = set(consistency.summary_verdicts(tmp_path / "count01.md")) & set(
        consistency.summary_verdicts(tmp_path / "cooperation.md"))  # fmt: skip
    quote = sorted(shared)[0]
    page = tmp_path / "count01.md"
    verdict = consistency.summary_verdicts(page)[quote]
    page.write_text(page.read_text(encoding="utf-8").replace(verdict, "typical; favoured reading (R9): holds", 1))
    found = consistency.one_verdict_per_claim(tmp_path)
    assert len(found) == 1 and quote[:40] in found[0]


def test_a_count01_answer_the_registry_does_not_share_is_caught(tmp_path: Path):
    for page in consistency.ANSWER_PAGES:
        shutil.copy(RESULTS / page, tmp_path / page)
    page = tmp_path / "cooperation.md"
    text = page.read_text(encoding="utf-8")
    line = next(x for x in text.splitlines() if x.startswith("- **The Count01 paper asks**"))
    lead = line.split("**Found:** ", 1)[1].split(":", 1)[0]
    other = "Not a pseudo-ensemble" if lead == "A pseudo-ensemble" else "A pseudo-ensemble"
    page.write_text(text.replace(f"**Found:** {lead}:", f"**Found:** {other}:", 1), encoding="utf-8")
    found = consistency.one_verdict_per_claim(tmp_path)
    assert any("the Count01 answer leads" in x for x in found), found
