"""A training run's resume state (experiments/groundtruth/resume.py, issue 76 item 1): one whole state on disk at
every moment of a save, and a state that is not whole or not this run's refused by name, never half-used."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from experiments.groundtruth import resume
from experiments.groundtruth.resume import load_state, save_state


def run(seed: int = 0, width: int = 4):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(3, width), torch.nn.Linear(width, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, opt, {"data": torch.Generator().manual_seed(seed)}


def trained(steps: int = 2):
    model, opt, gens = run()
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(5, 3, generator=gens["data"])).pow(2).sum().backward()
        opt.step()
    return model, opt, gens


def test_a_saved_state_resumes_whole(tmp_path):
    model, opt, gens = trained()
    save_state(tmp_path / "s", model, opt, gens, dict(step=2, config="c"))
    fresh, fresh_opt, fresh_gens = run(seed=1)
    meta = load_state(tmp_path / "s", fresh, fresh_opt, fresh_gens)
    assert meta == dict(step=2, config="c")
    for a, b in zip(model.parameters(), fresh.parameters()):
        assert torch.equal(a, b)
    assert torch.equal(fresh_opt.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
    assert torch.equal(fresh_gens["data"].get_state(), gens["data"].get_state())


@pytest.mark.parametrize("killed_after", ["old_aside", "old_removed_before_new_in"])
def test_a_save_killed_at_any_moment_leaves_a_whole_state_that_is_read(tmp_path, killed_after):
    folder = tmp_path / "s"
    model, opt, gens = trained()
    save_state(folder, model, opt, gens, dict(step=2))
    model2, opt2, gens2 = trained(3)
    save_state(folder, model2, opt2, gens2, dict(step=3))  # the next save, then "killed" midway by hand:
    tmp, old = folder.with_name("s.tmp"), folder.with_name("s.old")
    shutil.copytree(folder, tmp)
    if killed_after == "old_aside":  # the previous state renamed aside, the new one not yet in
        os.replace(folder, old)
        expected = 3  # the new whole copy beside it is the newest
    else:  # the previous run was itself killed with only .old whole; then the new one was written: only .tmp
        shutil.rmtree(folder)
        expected = 3
    meta = load_state(folder, *run(seed=5))
    assert meta["step"] == expected
    save_state(folder, model2, opt2, gens2, dict(step=4))  # and the next save keeps a whole state throughout
    assert load_state(folder, *run(seed=6))["step"] == 4
    assert not tmp.exists() and not old.exists()


def test_the_previous_state_survives_until_the_new_one_is_in(tmp_path, monkeypatch):
    folder = tmp_path / "s"
    model, opt, gens = trained()
    save_state(folder, model, opt, gens, dict(step=2))
    shutil.move(folder, folder.with_name("s.old"))  # as a kill between the two renames leaves it
    real = os.replace

    def killed(src, dst):  # the kill comes as the new state is renamed in
        if str(dst) == str(folder):
            raise KeyboardInterrupt
        return real(src, dst)

    monkeypatch.setattr(resume.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        save_state(folder, *trained(3), dict(step=3))
    monkeypatch.setattr(resume.os, "replace", real)
    assert load_state(folder, *run(seed=5))["step"] in (2, 3)  # a whole state: never none


def test_a_state_without_its_optimizer_moments_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "s"
    save_state(folder, *trained(), dict(step=2))
    tensors = {k: v for k, v in load_file(str(folder / "state.safetensors")).items() if not k.startswith("opt/")}
    save_file(tensors, str(folder / "state.safetensors"))
    with pytest.raises(ValueError, match="not whole"):
        load_state(folder, *run())
    meta = json.loads((folder / "state.json").read_text())
    del meta["tensors"]  # a state of the older format, without its list of tensors
    (folder / "state.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="optimizer's moments"):
        load_state(folder, *run())


@pytest.mark.parametrize(
    "damage, match",
    [
        (lambda f: (f / "state.json").write_text("[1, 2]"), "not a training state"),
        (lambda f: (f / "state.json").write_text(json.dumps({"step": 2})), "not a training state"),
        (lambda f: (f / "state.json").write_text("{"), "damaged"),
        (lambda f: (f / "state.safetensors").unlink(), "damaged"),
    ],
)
def test_a_damaged_state_is_refused_by_name(tmp_path, damage, match):
    folder = tmp_path / "s"
    save_state(folder, *trained(), dict(step=2))
    damage(folder)
    with pytest.raises(ValueError, match=match) as err:
        load_state(folder, *run())
    assert str(folder) in str(err.value)


def test_another_models_state_is_refused(tmp_path):
    folder = tmp_path / "s"
    save_state(folder, *trained(), dict(step=2))
    with pytest.raises(ValueError, match="not this run's"):
        load_state(folder, *run(width=5))


def test_a_users_file_at_the_states_path_is_named_and_left(tmp_path):
    folder = tmp_path / "s"
    folder.write_text("my notes")
    with pytest.raises(ValueError, match="not a training state folder"):
        load_state(folder, *run())
    with pytest.raises(ValueError, match="not a training state folder"):
        save_state(folder, *trained(), dict(step=2))
    assert folder.read_text() == "my notes"


def test_checkpoint_s_nan_is_refused():
    from experiments.groundtruth import siit

    with pytest.raises(ValueError, match="checkpoint_s"):
        siit.train("hist", siit.Recipe(checkpoint_s=float("nan")), log=lambda *_: None)
