"""The command line, run in-process."""

import json

import pytest

from headcoop.cli import main


def test_help_mentions_commands(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "train" in out and "eval" in out and "count01" in out


def test_train_then_eval(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "count01", "--heads", "2", "--d-model", "4", "--d-head", "2", "--steps", "10", "--out", str(out)]) == 0
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
