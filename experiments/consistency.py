"""No page contradicts itself (issue 60): one instrument writes every table a claim is read from, the answer
sentence and the summary row of one claim state the same word with the same share, every number an answer
quotes is on the page in the section its evidence link reaches, and each table folder records the commit that
generated it.

    python -m experiments.consistency          # prints every contradiction found (none: exit 0)

`contradictions(results)` returns them as sentences; the tests run it on docs/results and on copies with a
stale table put back.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "results"
# the pages that show the SkipPair answer and the registry's summary row of its superposition claim
ANSWER_PAGES = ("cooperation.md", "skip_pair.md", "robustness.md")
# what writes the instrument's tables (the words, the games they read, the models, the experiments' calls):
# a table folder generated before a change here is stale; page rendering and the claim registry read tables
INSTRUMENT = ("headcoop/analysis/mechanisms", "headcoop/analysis/games", "headcoop/tasks",
              "experiments/cooperation/exp_mechanisms.py", "experiments/cooperation/common.py",
              "experiments/cooperation/planted.py")  # fmt: skip
# what computes the numbers every other results folder holds (issue 71): the library below the report and the
# experiment's own measurement modules; the files that only render a page (`RENDERING`) do not count
COMPUTE = ("headcoop/analysis", "headcoop/tasks", "headcoop/models", "headcoop/training", "headcoop/studies",
           "headcoop/storage/checkpoints.py", "headcoop/checkpoints", "experiments/shared.py", "experiments/cli.py")  # fmt: skip
INSTRUMENTS = {
    "cooperation": INSTRUMENT,
    "planted": INSTRUMENT,
    "count01": COMPUTE + ("experiments/count01",),
    "skip_pair": COMPUTE + ("experiments/skip_pair",),
    "robustness": COMPUTE + ("experiments/robustness", "experiments/count01", "experiments/skip_pair"),
    "circuits": COMPUTE + ("experiments/groundtruth", "experiments/tracr"),
    "attribution": COMPUTE + ("experiments/attribution",),
}
RENDERING = ("page.py", "page.md.j2", "quotes.py", "figures.py", ".ipynb")  # a page's text, not its numbers
FOLDERS = tuple(INSTRUMENTS)
GENERATED = "generated.json"
SHIPPED = re.compile(r"shipped d_head 5 model: ([a-z ,]+?) \((\d+)% of votes")
# the registry's verdict on the favoured reading (robustness.md's grid counts, "holds in 0 of 1 cells", are not one)
VERDICT = re.compile(
    r"the example model, the post's definition \(favoured\): (holds|fails|not testable here)(?! in \d)"
)
LEADS = {"Yes": "holds", "No": "fails", "Undetermined": "not testable here", "On a knife edge": "not testable here"}


def same_call(results: Path) -> list[str]:
    """The answer's table and the registry's table hold one call for the shipped SkipPair models: the same
    word, vote and favoured word (`skip_pair_answer.csv` against the family rows of the shipped models in
    `skip_pair_mechanisms.csv`)."""
    folder = results / "cooperation"
    answer, mech = pd.read_csv(folder / "skip_pair_answer.csv"), pd.read_csv(folder / "skip_pair_mechanisms.csv")
    out = []
    for row in answer.itertuples():
        other = mech[mech.seed.isna() & (mech.d_head == row.d_head) & (mech.how == "family")]
        if len(other) != 1:
            out.append(
                f"skip_pair_mechanisms.csv has {len(other)} family rows for the shipped d_head {row.d_head} model"
            )
            continue
        o = other.iloc[0]
        for column in ("mechanism", "agreement", "favoured", "favoured_share"):
            mine, theirs = getattr(row, column, None), o.get(column)
            numbers = isinstance(mine, float) and isinstance(theirs, float)
            same = abs(mine - theirs) <= 1e-9 if numbers else mine == theirs
            if not same:
                out.append(f"d_head {row.d_head}: skip_pair_answer.csv says {column} {mine}, skip_pair_mechanisms.csv "
                           f"(the claim registry's table) says {theirs}")  # fmt: skip
    return out


def one_verdict(page: Path) -> list[str]:
    """On one page: every statement of the shipped d_head 5 model's word and vote agrees with the answer's,
    and the registry's verdict on its favoured reading is the answer's lead (Yes: holds, No: fails,
    Undetermined or a knife edge: not testable here)."""
    text = page.read_text(encoding="utf-8")
    answer = next((line for line in text.splitlines() if line.startswith("- **The SkipPair post asks**")), None)
    if answer is None:
        return []
    found = SHIPPED.search(answer)
    if found is None:
        return [f"{page.name}: the SkipPair answer states no word and vote for the shipped d_head 5 model"]
    out = []
    for other in SHIPPED.finditer(text):
        if (other.group(1), other.group(2)) != found.groups():
            out.append(f"{page.name}: the answer says {found.group(1)} ({found.group(2)}% of votes), another place on "
                       f"the page says {other.group(1)} ({other.group(2)}% of votes)")  # fmt: skip
    lead = re.search(r"\*\*Found:\*\* ([A-Za-z ]+?),", answer)
    verdicts = set(VERDICT.findall(text))
    want = LEADS.get(lead.group(1)) if lead else None
    if want is None:
        out.append(f"{page.name}: the SkipPair answer's lead is not one of {sorted(LEADS)}")
    elif verdicts and verdicts != {want}:
        out.append(f"{page.name}: the answer leads '{lead.group(1)}' but the registry's favoured reading says "
                   f"{', '.join(sorted(verdicts))}")  # fmt: skip
    return out


def _section(text: str, anchor: str) -> str:
    """The text of the section whose heading gives `anchor` (GitHub's anchors), up to the next heading."""
    from headcoop.display.pages import anchor as anchor_of

    out, inside = [], False
    for line in text.splitlines():
        if line.startswith("#"):
            inside = anchor_of(line.lstrip("#").strip()).lstrip("#") == anchor
            continue
        if inside:
            out.append(line)
    return "\n".join(out)


def _numbers(text: str) -> list[tuple[str, float, int]]:
    """(as written, value, decimals shown) of the percentages and decimals of a sentence (integers, counts of
    models and heads, are read from the tables' rows, not matched one by one)."""
    out = []
    for m in re.finditer(r"(?<![\w.])([+-]?\d+(?:\.\d+)?)%", text):
        digits = len(m.group(1).split(".")[1]) if "." in m.group(1) else 0
        out.append((m.group(0), float(m.group(1)) / 100, digits + 2))
    for m in re.finditer(r"(?<![\w.%])([+-]?\d+\.\d+)(?![\d%])", text):
        out.append((m.group(0), float(m.group(1)), len(m.group(1).split(".")[1])))
    return out


def numbers_on_page(page: Path) -> list[str]:
    """Every percentage and decimal an answer on `page` quotes is in the section its evidence link reaches on
    the same page, as a value that rounds to it (a table cell or its text)."""
    text = page.read_text(encoding="utf-8")
    out = []
    for line in text.splitlines():
        found = re.match(r"- \*\*(.+?)\*\* .*?\*\*Found:\*\* (.*)\(\[evidence\]\(#([\w-]+)\)\)\s*$", line)
        if not found:
            continue
        section = _section(text, found.group(3))
        shown = [float(x) for x in re.findall(r"(?<![\w.])[+-]?\d+\.\d+(?:e[+-]?\d+)?", section)]  # decimals only
        shown += [float(x) / 100 for x in re.findall(r"(?<![\w.])([+-]?\d+(?:\.\d+)?)%", section)]
        for written, value, decimals in _numbers(found.group(2)):
            tol = 0.5 * 10**-decimals + 1e-12
            if not any(abs(v - value) <= tol for v in shown):
                out.append(f"{page.name}: '{found.group(1)}' quotes {written}, which no table or text of its evidence "
                           f"section (#{found.group(3)}) holds")  # fmt: skip
    return out


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True).stdout.strip()


def started(folder: str = "cooperation") -> dict:
    """Where the generating code stands as a run starts (call it first): HEAD's commit and whether the
    instrument's files of the results folder `folder` (`INSTRUMENTS`) differ from it (a process runs the code it
    imported, so the start is what counts)."""
    paths = INSTRUMENTS[folder]
    try:
        dirty = [line for line in _git("status", "--porcelain", "--", *paths).splitlines()
                 if not _rendering(line.split()[-1])]  # fmt: skip
        return dict(commit=_git("rev-parse", "HEAD"), instrument=list(paths), dirty=bool(dirty))
    except (OSError, subprocess.CalledProcessError):  # no git, or not a checkout: the record says so
        return dict(commit=None, instrument=list(paths), dirty=True)


def _rendering(path: str) -> bool:
    """Whether a file only renders a page (its text, not its numbers)."""
    return any(path.endswith(end) for end in RENDERING)


def record(folder: Path, start: dict) -> Path:
    """Write `generated.json` in a table folder: `started()` of the run that wrote its tables."""
    path = folder / GENERATED
    path.write_text(json.dumps(start, indent=1) + "\n")
    return path


def generated_at_head(folder: Path) -> list[str]:
    """A table folder's record names a commit of this repository's history, from a clean tree, and the
    instrument's code is the same at HEAD (the tables are today's instrument's; `_code`: a change of format or
    comments alone is no change)."""
    path = folder / GENERATED
    if not path.exists():
        return [f"{folder.name}: no {GENERATED} (the commit that generated its tables is not recorded)"]
    info = json.loads(path.read_text())
    if not info.get("commit"):
        return [f"{folder.name}: generated outside a git checkout (no commit recorded)"]
    if info.get("dirty"):
        return [f"{folder.name}: generated from a tree whose instrument files were not committed"]
    try:
        _git("merge-base", "--is-ancestor", info["commit"], "HEAD")
    except subprocess.CalledProcessError:
        return [f"{folder.name}: generated at {info['commit'][:10]}, which is not in HEAD's history"]
    paths = INSTRUMENTS.get(folder.name, INSTRUMENT)
    changed = [path for path in _git("diff", "--name-only", info["commit"], "HEAD", "--", *paths).splitlines()
               if not _rendering(path) and _code(info["commit"], path) != _code("HEAD", path)]  # fmt: skip
    return [f"{folder.name}: generated at {info['commit'][:10]}; the instrument changed since: "
            + ", ".join(changed[:5])] if changed else []  # fmt: skip


def _code(commit: str, path: str) -> str | None:
    """A file's code at `commit` as its syntax tree (formatting and comments do not count; docstrings do: the
    words' rules are one), its text for a file that is not Python, None where it does not exist."""
    try:
        text = _git("show", f"{commit}:{path}")
    except subprocess.CalledProcessError:
        return None
    if not path.endswith(".py"):
        return text
    import ast

    try:
        return ast.dump(ast.parse(text))
    except SyntaxError:
        return text


SUMMARY_PAGES = ("cooperation.md", "count01.md", "skip_pair.md")  # pages with a claims summary table
COUNT01_ANSWER = re.compile(r"same function on the counts in (\d+) of (\d+) one-layer models")
COUNT01_REGISTRY = re.compile(r"R0, same function by edits \(favoured\): (holds|fails|not testable here)(?! in \d)")


def summary_verdicts(page: Path) -> dict[str, str]:
    """{quote: verdict cell} of a page's claims summary table (the rows under "## Summary: ...")."""
    text = page.read_text(encoding="utf-8")
    part = text.split("\n## Summary:", 1)
    if len(part) < 2:
        return {}
    out = {}
    for line in part[1].split("\n## ", 1)[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0] not in ("section", "") and not set(cells[0]) <= set(":-"):
            out[cells[1]] = cells[3]
    return out


def one_verdict_per_claim(results: Path) -> list[str]:
    """Every claim the summary tables of several pages show has one verdict cell on all of them (one registry,
    one rule), and the Count01 answer's count agrees with the registry's favoured reading of its claim."""
    seen: dict[str, tuple[str, str]] = {}
    out = []
    for name in SUMMARY_PAGES:
        if not (results / name).exists():
            continue
        for quote, verdict in summary_verdicts(results / name).items():
            if quote in seen and seen[quote][1] != verdict:
                out.append(f"{name} gives '{quote[:60]}' the verdict '{verdict[:80]}', {seen[quote][0]} gives "
                           f"'{seen[quote][1][:80]}'")  # fmt: skip
            seen.setdefault(quote, (name, verdict))
    for name in ANSWER_PAGES:
        if not (results / name).exists():
            continue
        text = (results / name).read_text(encoding="utf-8")
        answer = next((line for line in text.splitlines() if line.startswith("- **The Count01 paper asks**")), "")
        found, said = COUNT01_ANSWER.search(answer), COUNT01_REGISTRY.findall(text)
        if not found or not said:
            continue
        same, n = int(found.group(1)), int(found.group(2))
        lead = re.search(r"\*\*Found:\*\* ([A-Za-z -]+?):", answer)
        want = {"A pseudo-ensemble": "holds", "Not a pseudo-ensemble": "fails", "Undetermined": "not testable here"}
        if lead and want.get(lead.group(1)) not in set(said):
            out.append(f"{name}: the Count01 answer leads '{lead.group(1)}' ({same} of {n}) but the registry's "
                       f"favoured reading says {', '.join(sorted(set(said)))}")  # fmt: skip
    return out


def contradictions(results: Path = RESULTS, folders: tuple[str, ...] = FOLDERS) -> list[str]:
    """Every contradiction found under `results` (docs/results), as sentences; [] where none."""
    out = same_call(results)
    for name in ANSWER_PAGES:
        if (results / name).exists():
            out += one_verdict(results / name)
    out += one_verdict_per_claim(results)
    out += numbers_on_page(results / "cooperation.md")
    for folder in folders:
        out += generated_at_head(results / folder)
    return out


if __name__ == "__main__":
    found = contradictions()
    print("\n".join(found) or "no contradiction found")
    sys.exit(1 if found else 0)
