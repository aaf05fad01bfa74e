"""Write docs/results/robustness.md from the grid tables in docs/results/robustness/: per claim, under which
setups (variant x training length) it holds and under which it fails. Every number is read from a table
run_all wrote; every claim, its logical form, its readings and their rules are in the claim registry,
`experiments/claims.py`.

    python -m experiments.robustness.page [--out FOLDER]
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path

import pandas as pd

from experiments.claims import (
    ALSO,
    FAILS,
    HOLDS,
    PAGE,
    UNTESTABLE,
    UNTESTED,
    ClaimEntry,
    Outcome,
    Reading,
    entries,
    form_of,
    judge,
    page_tables,
)
from experiments.cooperation import answers
from experiments.robustness.common import COUNT01_VARIANTS, DEFAULT_OUT, SKIP_PAIR_VARIANTS, Settings
from headcoop.display.pages import Claim, Section, Table, Text, render

HERE = Path(__file__).resolve().parent
FULL = Settings()  # the sizes run_all uses without --quick, named in the rules' words


ALL_LENGTHS = "every training length"


def lengths(tables: dict[str, pd.DataFrame], reading: Reading) -> list:
    """The columns of a reading's cells: its table's training lengths, one column over all of them, or (a
    reading of a task page's tables) the page's models."""
    if reading.on_page:
        return [PAGE]
    if reading.table not in tables:
        return [ALL_LENGTHS]
    return sorted(int(n) for n in tables[reading.table].steps.unique()) if reading.per_length else [ALL_LENGTHS]


def judge_cells(tables: dict[str, pd.DataFrame], entry: ClaimEntry, reading: Reading, variants: list[str]) -> dict:
    """{(variant, length): (verdict, text)} of one reading over the grid; a reading of a task page's tables
    has one cell, ("default", PAGE)."""
    form = form_of(entry, reading)
    if reading.on_page:
        table = tables.get(reading.table)
        out = (
            reading.measure(table)
            if table is not None
            else Outcome("not measured", untestable=f"{reading.table}.csv not found (run that page's run_all)")
        )
        return {
            ("default", PAGE): (judge(form, reading, out), out.text + (f"; {out.untestable}" if out.untestable else ""))
        }
    if reading.table not in tables:
        return {(v, ALL_LENGTHS): (UNTESTABLE, "not measured: no robustness grid tables") for v in variants}
    table = tables[reading.table]
    cells = {}
    for variant in variants:
        for n in lengths(tables, reading):
            picked = table[table.variant == variant]
            picked = picked if n == ALL_LENGTHS else picked[picked.steps == n]
            out = reading.measure(picked)
            said = judge(form, reading, out)
            cells[(variant, n)] = (said, out.text + (f"; {out.untestable}" if out.untestable else ""))
    return cells


def verdict(cells: dict, steps: list) -> str:
    """ "holds under X; fails under Y; not testable under Z", naming a training length only where the
    lengths of a setup disagree."""
    if steps == [PAGE]:  # one cell: the default setup, measured on a task page's own models
        return f"{next(iter(cells.values()))[0]} (default setup only)"
    by_variant: dict[str, dict] = {}
    for (variant, n), (said, _) in cells.items():
        by_variant.setdefault(variant, {})[n] = said
    parts = {HOLDS: [], FAILS: [], UNTESTABLE: []}
    for variant, said in by_variant.items():
        for kind in parts:
            here = [n for n in steps if said[n] == kind]
            if here:
                parts[kind].append(
                    variant if len(here) == len(steps) else f"{variant} ({', '.join(map(str, here))} steps)"
                )
    if not parts[FAILS] and not parts[UNTESTABLE]:
        return "holds under every setup tried"
    if not parts[HOLDS] and not parts[UNTESTABLE]:
        return "fails under every setup tried"
    words = {HOLDS: "holds under", FAILS: "fails under", UNTESTABLE: "not testable under"}
    return "; ".join(f"{words[k]} {'; '.join(v)}" for k, v in parts.items() if v)


def _short(text: str) -> str:
    """The count or number that leads an outcome's text ("0/3 models lose accuracy (...)" -> "0/3 models lose accuracy")."""
    return text.split(" (")[0].split("; ")[0]


def band_text(tables: dict[str, pd.DataFrame], entry: ClaimEntry, reading: Reading, variants: list[str]) -> str:
    """The reading's verdict at each other value of each threshold band, over the same cells ("" when the rule
    has no threshold; its `fixed` reason when the threshold is not banded)."""
    if not reading.bands:
        return f"Threshold not banded: {reading.fixed}." if reading.fixed else ""
    steps, out = lengths(tables, reading), []
    for band in reading.bands:
        parts = [f"{band.default:g} (the rule's): {verdict(judge_cells(tables, entry, reading, variants), steps)}"]
        for value in band.others:
            parts.append(f"{value:g}: {verdict(judge_cells(tables, entry, band.at(value), variants), steps)}")
        out.append(f"Threshold band ({band.threshold}): " + "; ".join(parts) + ".")
    return " ".join(out)


def flips(tables: dict[str, pd.DataFrame], entry: ClaimEntry, reading: Reading, variants: list[str]) -> list[str]:
    """What flips the reading's verdict in the default setup: each other setup whose verdict differs (with its
    count), and each other threshold of each band at which the default setup's verdict differs."""
    cells = judge_cells(tables, entry, reading, variants)
    default = {said for (v, _), (said, _) in cells.items() if v == "default"}
    out = []
    for variant in variants[1:]:
        here = [(said, text) for (v, _), (said, text) in cells.items() if v == variant]
        if here and {said for said, _ in here} != default:
            out.append(
                f"{' / '.join(dict.fromkeys(said for said, _ in here))} under {variant} "
                f"({'; '.join(dict.fromkeys(_short(text) for _, text in here))})"
            )
    for band in reading.bands:
        for value in band.others:
            at = {said for said, _ in judge_cells(tables, entry, band.at(value), ["default"]).values()}
            if at != default:
                out.append(f"{' / '.join(sorted(at))} at {band.threshold} {value:g}")
    return out


def tried(reading: Reading, flipped: list[str]) -> str:
    """What was tried on a reading and what flips it, for a summary row."""
    if flipped:
        return "flips: " + "; ".join(flipped)
    setups = "default setup only" if reading.on_page else "no setup tried flips it"
    if reading.bands:
        return f"{setups}; " + "; ".join(
            f"no {b.threshold} in {', '.join(f'{v:g}' for v in b.others)} flips it" for b in reading.bands
        )
    return f"{setups}; threshold not banded: {reading.fixed}" if reading.fixed else f"{setups}; no threshold"


def _section(number: str, title: str, tables: dict[str, pd.DataFrame], task: str, variants) -> Section:
    blocks, claims = [], []
    for entry in entries(task):
        also = "; ".join(f'"{quote}" ({SOURCES[source]})' for quote, source in ALSO.get(entry.key, ()))
        blocks.append(Text(f"**\"{entry.quote}\"** ({SOURCES[entry.source]}). Logical form: **{entry.form}** "
                           f"({FORM_WORDS[entry.form]})." + (f" {entry.note}" if entry.note else "")
                           + (f" Said again, and judged by this row: {also}." if also else "")))  # fmt: skip
        rows, lines = [], []
        for reading in entry.readings:
            cells = judge_cells(tables, entry, reading, variants)
            steps = lengths(tables, reading)
            name = reading.name + (" (favoured)" if reading.favoured else "")
            form = form_of(entry, reading)
            for variant in [v for v in variants if (v, steps[0]) in cells]:
                row = {
                    "reading": name,
                    "setup": variant + (f" ({reading.table.split('/')[0]}.md)" if reading.on_page else ""),
                }
                for n in steps:
                    said, text = cells[(variant, n)]
                    row[n if n == ALL_LENGTHS else f"{n} steps"] = f"{said} ({text})"
                rows.append(row)
            said = verdict(cells, steps)
            held = sum(v == HOLDS for v, _ in cells.values())
            untestable = sum(v == UNTESTABLE for v, _ in cells.values())
            band = band_text(tables, entry, reading, variants)
            lines.append(
                f"- *{name}*{'' if form == entry.form else f' (read as {form})'}: {reading.rule}. "
                + (f"Favoured because {reading.favoured}. " if reading.favoured else "")
                + f"Verdict: {said}."
                + (f" {band}" if band else "")
            )
            claims.append(Claim(number, entry.quote,
                                f"{name}: holds in {held} of {len(cells)} cells"
                                + (f", {untestable} not testable" if untestable else ""), said))  # fmt: skip
        blocks += [Text("Readings:\n" + "\n".join(lines)), Table(pd.DataFrame(rows))]
    return Section(title, tuple(blocks), claims=tuple(claims))


SOURCES = {
    "count01-paper-summary.md": "a summary of arXiv 2502.06923 (its words; quoted text in it is the paper's)",
    "count01-paper-abstract.md": "the abstract of arXiv 2502.06923 (its arXiv page)",
    "ov-coherent-skip-pair-post.md": "the post *An OV-Coherent Toy Model of Attention Head Superposition*",
}
FORM_WORDS = {
    "existence": "holds when at least one unit passes",
    "universal": "holds when every unit passes",
    "typical": "holds when more than half of the units pass",
    "comparison": "holds by the reading's test on one number",
    "correlation": "holds by the reading's test on r",
}


def load(folder: Path, task: str, strict: bool = True) -> dict[str, pd.DataFrame]:
    """The grid tables of `task` ("count01" or "skip_pair") in `folder` (a results folder's robustness/), by
    the names rules use, and the task pages' tables its readings read, from folder's parent (those missing
    are left out: their readings are not testable here). `strict=False`: missing grid tables are left out too."""
    names = {reading.table for entry in entries(task) for reading in entry.readings} | {"grid"}
    grid = {n for n in names if "/" not in n}
    missing = [f"{task}_{n}.csv" for n in sorted(grid) if not (folder / f"{task}_{n}.csv").exists()]
    if missing and strict:
        raise FileNotFoundError(f"{folder} lacks {', '.join(missing)}: run python -m experiments.robustness.run_all")
    grid = {n for n in grid if (folder / f"{task}_{n}.csv").exists()}
    return {**{n: pd.read_csv(folder / f"{task}_{n}.csv") for n in grid}, **page_tables(folder.parent, names - grid)}


def _listed(values: pd.Series, sep: str = ", ") -> str:
    return sep.join(str(v) for v in sorted(values.unique()))


def _default_readings(folder: Path, task: str) -> dict[str, tuple[str, list[dict]]]:
    """{quote: (form, one dict per reading: name, favoured, form it is read as, said, flipped, tried)} of every
    registry claim of `task` in the default setup (`default_verdicts`)."""
    tables = load(folder, task, strict=False)
    variants = list(COUNT01_VARIANTS if task == "count01" else SKIP_PAIR_VARIANTS)
    out = {}
    for entry in entries(task):
        parts = []
        for reading in entry.readings:
            cells = judge_cells(tables, entry, reading, ["default"])
            by_length = {n: said for (_, n), (said, _) in cells.items()}
            shown = [text for (_, n), (_, text) in cells.items() if n in (PAGE, ALL_LENGTHS)]
            if len(set(by_length.values())) == 1:
                said = next(iter(by_length.values()))
            else:
                said = ", ".join(f"{v} at {n} steps" for n, v in by_length.items())
            flipped = flips(tables, entry, reading, variants)
            parts.append(dict(name=reading.name, favoured=bool(reading.favoured), form=form_of(entry, reading),
                              said=said, flipped=flipped, tried=tried(reading, flipped),
                              number=shown[0].split("; ")[0] if len(shown) == 1 else ""))  # fmt: skip
        out[entry.quote] = (entry.form, parts)
    return out


def default_verdicts(folder: Path, task: str) -> dict[str, str]:
    """{quote: verdict} of every registry claim of `task` in the default setup, per reading, from the grid
    tables in `folder` and the task pages' tables beside it (a reading whose tables are missing is "not
    testable here": not measured): what every page shows in full below its summary, so it says what
    robustness.md says of the same setup."""
    out = {}
    for quote, (form, parts) in _default_readings(folder, task).items():
        shown = []
        for p in parts:
            read_as = "" if p["form"] == form else f" (read as {p['form']})"
            shown.append(f"{p['name']}{' (favoured)' if p['favoured'] else ''}{read_as}: {p['said']} [{p['tried']}]")
        out[quote] = f"{form}; " + "; ".join(shown) + " (registry, default setup of robustness.md)"
    return out


def short_verdicts(folder: Path, task: str) -> dict[str, str]:
    """{quote: one sentence} for a summary cell: the claim's form, its favoured reading (else its first) and
    that reading's verdict, what flips it (the setups and thresholds, without their counts), and how the
    other readings say; `default_verdicts` gives every reading in full."""
    out = {}
    for quote, (form, parts) in _default_readings(folder, task).items():
        main = next((p for p in parts if p["favoured"]), parts[0])
        which = "favoured" if main["favoured"] else "first"
        flips_at = [re.sub(r"^(holds|fails|holds / fails|fails / holds|not testable here) (under|at) ", "", f).split(" (")[0]
                    for f in main["flipped"]]  # fmt: skip
        # the number that decides the verdict (issue 71), where the reading reads one cell
        number = f" ({main['number'][:90]})" if main.get("number") else ""
        sentence = f"{form}; {which} reading ({main['name']}): {main['said']}{number}"
        if flips_at:
            sentence += f", flips under {', '.join(flips_at)}"
        else:
            sentence += (
                ", default setup only"
                if main["tried"].startswith("default setup only")
                else ", no setup tried flips it"
            )
        others = Counter(p["said"] for p in parts if p is not main)
        if others:
            sentence += "; the other readings: " + ", ".join(f"{said} {n}" for said, n in others.most_common())
        out[quote] = sentence + " (registry)."
    return out


REGISTRY_SAYS = "(the claim registry's verdict)"  # a page's Claim.verdict that with_registry must fill


def registry_rows(folder: Path, task: str, shown: list[Claim]) -> list[Claim]:
    """A summary row for every registry claim of `task` that no section of the page shows (`shown`), measured
    by its favoured reading (else its first) in the default setup: the page's claims table then lists every claim
    the registry judges. Their section is robustness.md, where the rules are."""
    tables = load(folder, task, strict=False)
    quotes = {c.source for c in shown}
    rows = []
    for entry in entries(task):
        if entry.quote in quotes:
            continue
        reading = next((r for r in entry.readings if r.favoured), entry.readings[0])
        cells = judge_cells(tables, entry, reading, ["default"])
        text = "; ".join(
            text if n in (PAGE, ALL_LENGTHS) or len(cells) == 1 else f"{n} steps: {text}"
            for (_, n), (_, text) in cells.items()
        )
        rows.append(Claim("robustness.md", entry.quote, f"{reading.name}: {text}", REGISTRY_SAYS))
    return rows


def with_registry(claims: list[Claim], verdicts: dict[str, str], short: dict[str, str] | None = None) -> list[Claim]:
    """The page's claims with the registry's verdict for every quote the registry judges (the page's own
    measurement stays in `measured`): the one-sentence `short` verdict in the summary cell and every reading
    in `detail`, or the full verdict alone without `short`. A claim whose verdict is REGISTRY_SAYS and whose
    quote has no registry entry is an error: a page never judges a claim by rules of its own."""
    short = short or {}
    out = [Claim(c.section, c.source, c.measured, short.get(c.source, verdicts[c.source]),
                 verdicts[c.source] if c.source in short else "") if c.source in verdicts else c
           for c in claims]  # fmt: skip
    missing = [c.source for c in out if c.verdict == REGISTRY_SAYS]
    if missing:
        raise KeyError(f"the claim registry (experiments/claims.py) has no entry for {missing}")
    return out


def _untested() -> Section:
    """Claims with no verdict, and why (the registry's UNTESTED)."""
    frame = pd.DataFrame([{"claim": q, "source": src, "why no verdict": why} for q, src, why in UNTESTED])
    return Section(
        "3. Claims with no verdict here",
        (Text("Claims of the sources that no rule here measures, each with the reason:"), Table(frame)),
    )


def build(out: Path = DEFAULT_OUT) -> Path:
    """Render OUT/robustness.md from OUT/robustness/*.csv; returns its path."""
    tables = out / "robustness"
    count01_tables, skip_pair_tables = load(tables, "count01"), load(tables, "skip_pair")
    count01, skip_pair = count01_tables["grid"], skip_pair_tables["grid"]
    table1, ensemble = count01_tables["table1"], count01_tables["ensemble"]
    short = ensemble[ensemble.kind == "primary-short"]
    timing = json.loads((tables / "timing.json").read_text())
    sections = [
        _section("1", "1. Count01 claims across setups", count01_tables, "count01", list(COUNT01_VARIANTS)),
        _section("2", "2. SkipPair claims across setups", skip_pair_tables, "skip_pair", list(SKIP_PAIR_VARIANTS)),
        _untested(),
    ]  # fmt: skip
    page = render(
        "page.md.j2", HERE,
        title="Robustness: which claims survive the setup the sources leave open",
        source_name="source", answers=answers.from_tables(out, ("count01", "compete", "skip_pair"), "cooperation.md"),
        claims=[c for s in sections for c in s.claims],
        claims_note="One row per claim and reading; *measured here* counts the cells (setup variant x training "
        "length, or setup alone where a claim is about a set of models of every length) in which the reading "
        "holds, and those where it cannot be tested; the verdict names them (a training length is named only where "
        "the lengths disagree). Each claim is judged by its logical form; the reading its wording favours is marked. "
        "Claims, forms, readings and rules: `experiments/claims.py`.",
        sections=sections,
        timing=timing,
        seeds=dict(primary=_listed(count01[count01.kind == "primary"].seed), minimal=_listed(count01[count01.kind == "minimal"].seed),
                   skip_pair=_listed(skip_pair.seed), count01_steps=_listed(count01.steps, " and "),
                   skip_pair_steps=_listed(skip_pair.steps, " and "), table1_steps=_listed(table1.steps, " and "),
                   table1=_listed(table1.seed), early_steps=_listed(short.steps), early=_listed(short.seed),
                   ensemble_models=int(ensemble.groupby("variant").size().iloc[0])),
        count01_variants=COUNT01_VARIANTS, skip_pair_variants=SKIP_PAIR_VARIANTS,
    )  # fmt: skip
    target = out / "robustness.md"
    target.write_text(page, encoding="utf-8")
    return target


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results folder (default docs/results)")
    print(build(parser.parse_args().out))


def across_setups(folder: Path, task: str) -> Section | None:
    """For the task's own page ("count01" or "skip_pair"): one row per claim and reading the grid tests, with
    where it holds, fails and cannot be tested, from the claim registry; None when `folder` holds no grid
    tables."""
    if not (folder / f"{task}_grid.csv").exists():
        return None
    tables = load(folder, task)
    variants = list(COUNT01_VARIANTS) if task == "count01" else list(SKIP_PAIR_VARIANTS)
    rows = []
    for entry in entries(task):
        for reading in entry.readings:
            cells = judge_cells(tables, entry, reading, variants)
            rows.append({"claim": entry.quote, "form": form_of(entry, reading),
                         "reading": reading.name + (" (favoured)" if reading.favoured else ""),
                         "across setups": verdict(cells, lengths(tables, reading))})  # fmt: skip
    steps = sorted(int(n) for n in tables["grid"].steps.unique())
    text = (f"The claims below were also measured under every setup variant the source leaves open ({', '.join(variants[1:])}), "
            f"at {' and '.join(map(str, steps))} training steps"
            + (f" (Table 1 at {' and '.join(map(str, sorted(int(n) for n in tables['table1'].steps.unique())))})" if task == "count01" else "")
            + ", each under every reading the claim registry (`experiments/claims.py`) gives it; `robustness.md` has "
            "the rules and the numbers per setup. These verdicts are the registry's, the same on every page:")  # fmt: skip
    return Section("Across setups (from robustness.md)", (Text(text), Table(pd.DataFrame(rows))))
