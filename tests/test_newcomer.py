"""A newcomer's afternoon (issue 77): what `import headcoop` shows, and old import paths that point to the new."""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path

import pytest

import headcoop as hc


def test_dir_shows_the_api_and_the_version_only():
    shown = dir(hc)
    assert "__version__" in shown and "cooperation" in shown and "function_bench" in shown
    for helper in ("annotations", "importlib", "TL_MISSING", "MOVED", "_LAZY"):
        assert helper not in shown, helper
    version = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]["version"]
    assert hc.__version__ == version


@pytest.mark.parametrize("old, new", [("headcoop.foreign", "headcoop.storage.foreign"),
                                      ("headcoop.fast_train", "headcoop.training.fast"),
                                      ("headcoop.analysis.patching", "headcoop.analysis.nodes.patching")])  # fmt: skip
def test_a_moved_module_names_where_it_went(old, new):
    with pytest.raises(ModuleNotFoundError, match=f"{old} moved to {new}: import it from there"):
        importlib.import_module(old)
    assert importlib.import_module(new) is not None
    with pytest.raises(ModuleNotFoundError, match="No module named 'headcoop.never_was'"):
        importlib.import_module("headcoop.never_was")  # an unknown name stays Python's own error


def test_the_reports_advice_runs_as_printed(tmp_path):
    """The line a left-out section offers ("Run it with ... (after <setup>)") runs as printed: the model by its
    shipped name, the inputs from the prompts file the report read (was: `headcoop` unbound, `tokenizer`
    undefined, 'PROMPTS.json')."""
    import json

    from headcoop.reporting.page import _setup_code
    from headcoop.storage.foreign import read_prompts

    task = hc.Count01()
    batch = task.sample(4, seed=0)
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps(dict(clean=batch.tokens[:, :6].tolist(), corrupt=batch.tokens[:, :6].tolist(),
                                       answer=[4] * 4, wrong=[5] * 4)))  # fmt: skip
    for own, given in ((True, None), (False, read_prompts(prompts))):
        space: dict = {}
        exec(_setup_code("count01", own, given), space)  # noqa: S102 - the page's own line, as a user would run it
        assert len(space["clean"]) == (256 if own else 4) and "model" in space  # the task's default, or the file's


def test_the_changelog_lists_every_moved_module_with_its_new_place():
    from pathlib import Path

    from headcoop import MOVED

    rows = [line for line in (Path(__file__).resolve().parents[1] / "CHANGELOG.md").read_text().splitlines()
            if line.startswith("| `headcoop.")]  # fmt: skip
    for old, new in MOVED.items():
        row = [r for r in rows if f"`{old}`" in r.split("|")[1]]
        assert len(row) == 1, f"CHANGELOG.md has no row for {old}"
        target = row[0].split("|")[2]
        assert f"`{new}`" in target or f"`{new.rsplit('.', 1)[0]}.*`" in target, (old, new, target)
