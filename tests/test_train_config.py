"""One training configuration: TrainConfig validates once and is what train, train_many, sweep, the CLI and
the checkpoint JSON share; older checkpoints (without `schedule`) still load and still resume sweeps."""

import json

import pytest

import headcoop as hc
from headcoop.cli import main
from headcoop.training.loop import lr_at

TINY = dict(n_heads=2, d_model=4, d_head=2)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(steps=0), ValueError, "steps must be >= 1, got 0"),
        (dict(lr=-1.0), ValueError, "lr must be > 0.0"),
        (dict(warmup=2.5), TypeError, "warmup must be an int"),
        (dict(schedule="linear"), ValueError, r"unknown schedule 'linear'; valid values are \['cosine', 'constant'\]"),
        (dict(seed="1"), TypeError, "seed must be an int"),
    ],
)
def test_validated_once_with_errors_naming_the_value(kwargs, error, message):
    with pytest.raises(error, match=message):
        hc.TrainConfig(**kwargs)


def test_frozen_and_round_trips():
    config = hc.TrainConfig(steps=10, schedule="constant")
    with pytest.raises(AttributeError):
        config.steps = 3
    assert hc.TrainConfig.from_dict(config.to_dict()) == config
    old = {"steps": 10, "batch_size": 256, "lr": 0.01, "weight_decay": 0.0, "warmup": 100, "seed": 0}
    assert hc.TrainConfig.from_dict(old).schedule == "cosine"
    with pytest.raises(ValueError, match=r"unknown training settings \['momentum'\]"):
        hc.TrainConfig.from_dict({**old, "momentum": 0.9})


def test_schedules():
    assert [round(lr_at(s, 10, 1.0, 2, "constant"), 3) for s in range(4)] == [0.5, 1.0, 1.0, 1.0]
    config = hc.TrainConfig(steps=10, lr=1.0, warmup=2)
    assert config.lr_at(9) < config.lr_at(2) == 1.0 and config.lr_at(9) >= 0.1


def test_keywords_override_the_config_and_train_records_it():
    task = hc.Count01(max_len=6)
    base = hc.TrainConfig(steps=4, batch_size=8, warmup=1, seed=3)
    model = hc.train(task, task.model(seed=0, **TINY), config=base, steps=5, progress=False)
    assert model.train_settings == dict(base.to_dict(), steps=5)
    (many,) = hc.train_many(task, [TINY], config=base, seeds=[7], progress=False)
    assert many.train_settings == dict(base.to_dict(), seed=7)
    with pytest.raises(TypeError, match="config must be a hc.TrainConfig"):
        hc.train(task, task.model(seed=0, **TINY), config={"steps": 3})


def test_a_sweep_folder_written_before_schedule_existed_still_resumes(tmp_path):
    task = hc.Count01(max_len=6)
    settings = dict(steps=3, batch_size=8, warmup=1, progress=False)
    table = hc.sweep(task, {"n_heads": [1]}, [0], tmp_path, **settings)
    meta_file = tmp_path / table["name"][0] / "headcoop.json"
    meta = json.loads(meta_file.read_text())
    del meta["train"]["schedule"]  # as older headcoop wrote it
    meta_file.write_text(json.dumps(meta))
    again = hc.sweep(task, {"n_heads": [1]}, [0], tmp_path, **settings)
    assert list(again["status"]) == ["finished before"]
    assert hc.load(tmp_path / table["name"][0]).train_settings["steps"] == 3


def test_train_cli_has_the_sweep_flags(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["train", "count01", "--heads", "2", "--d-model", "4", "--steps", "3", "--batch-size", "8",
                 "--warmup", "1", "--weight-decay", "0.01", "--schedule", "constant", "--positional", "--no-progress",
                 "--seed", "4", "--out", str(out)])  # fmt: skip
    assert code == 0
    model = hc.load(out)
    assert model.train_settings == dict(steps=3, batch_size=8, lr=0.01, weight_decay=0.01, warmup=1,
                                        schedule="constant", seed=4)  # fmt: skip
    assert model.task.positional
    assert main(["train", "skip-pair", "--positional", "--out", str(tmp_path / "x")]) == 2
    assert "--positional applies to count01 only" in capsys.readouterr().err
