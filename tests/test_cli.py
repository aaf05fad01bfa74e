"""The command line, run in-process."""

import json

import pytest

import headcoop as hc
from headcoop.cli import main


def test_help_mentions_commands(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "train" in out and "eval" in out and "count01" in out


def test_train_then_eval(tmp_path, capsys):
    out = tmp_path / "run"
    assert (
        main(
            ["train", "count01", "--heads", "2", "--d-model", "4", "--d-head", "2", "--steps", "10", "--out", str(out)]
        )
        == 0
    )
    assert (out / "weights.safetensors").exists()
    capsys.readouterr()
    assert main(["eval", str(out), "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert "answer_acc" in metrics


def test_eval_shipped(capsys):
    assert main(["eval", "skip-pair"]) == 0
    assert "signal_acc" in capsys.readouterr().out


def test_eval_missing_is_a_clean_error(tmp_path, capsys):
    assert main(["eval", str(tmp_path / "nothing")]) == 2
    assert "no headcoop checkpoint" in capsys.readouterr().err


@pytest.mark.parametrize("argv, says", [
    (["report", "no-such-folder"], "neither a shipped name"),
    (["report", "count01", "--budget", "-1"], "--budget must be 0 (no limit) or more"),
    (["report", "count01", "--sections", "patchng"], "unknown report sections ['patchng']"),
    (["report", "count01", "--heads", "L0H1", "head3"], "--heads takes head names such as L0H1"),
    (["report", "count01", "--examples", "0"], "--examples must be 1 or more"),
    (["report", "count01", "--prompts", "missing.json"], "--prompts 'missing.json' is not a file"),
    (["report", "count01", "--tokenizer", "missing.json"], "--tokenizer 'missing.json' is not a file"),
])  # fmt: skip
def test_report_refuses_bad_arguments_before_importing_torch(argv, says, tmp_path):
    """Issue 51: the cheap arguments of `headcoop report` are checked before torch or TransformerLens is
    imported (under load the import alone took a minute), each with a message naming the bad value."""
    import subprocess
    import sys

    code = ("import sys; from headcoop.cli import main; rc = main(sys.argv[1:]); "
            "assert rc == 2, rc; assert 'torch' not in sys.modules and 'transformer_lens' not in sys.modules, 'imported'")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert says in done.stderr, done.stderr


def test_report_checks_agree_with_the_code():
    """The command line's light copies of the report's sections and of the files that mark a model folder are
    those of the code they stand for."""
    from headcoop import cli
    from headcoop.reporting.page import _sections
    from headcoop.storage.checkpoints import META
    from headcoop.storage.foreign import CONFIG
    from headcoop.studies import study_for

    assert (cli.META, cli.CONFIG) == (META, CONFIG)
    assert tuple(a for a, _, _ in _sections(hc.SkipPair()) if a != "preferences") == cli.REPORT_SECTIONS
    own = {a for task in (hc.Count01(), hc.SkipPair()) for a, _ in study_for(task).sections}
    assert own == set(cli.STUDY_SECTIONS)
    assert "Hugging Face model folder" in cli.build_parser()._subparsers._group_actions[0].choices["report"].description
    assert "{" not in cli.build_parser()._subparsers._group_actions[0].choices["report"].description
