"""A training run's state on disk, so that a run stopped at any moment resumes from its last checkpoint with
the same command: the model's and optimizer's tensors and the random generators' states in one safetensors
file, everything else (step, history, the recipe) in JSON; written to a temporary folder and swapped in, so a
run killed while writing leaves the previous checkpoint whole. No pickle."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

TENSORS, META = "state.safetensors", "state.json"


def state_folder(out: Path, name: str) -> Path:
    """Where program `name`'s unfinished run keeps its state (removed when the run finishes)."""
    return out / f".{name}.resume"


def drop_unpassed(out: Path, name: str, log=print) -> None:
    """Once NAME passed its gate, remove OUT/NAME.unpassed, an earlier run's model that did not, where that folder
    holds a headcoop checkpoint and nothing else (anything else in it is left, and said)."""
    from headcoop.storage.checkpoints import META, WEIGHTS, is_checkpoint_meta

    folder = out / f"{name}.unpassed"
    if not folder.is_dir() or folder.is_symlink():
        return
    names = {e.name for e in folder.iterdir()}
    if names <= {META, WEIGHTS} and is_checkpoint_meta(folder / META):
        shutil.rmtree(folder)
        log(f"removed {folder} (superseded by {out / name}, which passed its gate)")
    else:
        log(f"left {folder}: it holds files that are not a headcoop checkpoint ({', '.join(sorted(names))})")


def _refuse_foreign(folder: Path) -> None:
    """ValueError where `folder`, or a temporary or previous copy beside it, is not a folder (a user's file
    at the state's path is never replaced or read as a state)."""
    for path in (folder, _tmp(folder), _old(folder)):
        if path.is_symlink() or (path.exists() and not path.is_dir()):
            raise ValueError(f"{path} is not a training state folder (a file or a link is there); it is left as it is: "
                             f"move it away to train")  # fmt: skip


def _tmp(folder: Path) -> Path:
    return folder.with_name(folder.name + ".tmp")


def _old(folder: Path) -> Path:
    return folder.with_name(folder.name + ".old")


def save_state(folder: Path, model, optimizer, generators: dict, meta: dict) -> None:
    """Write the run's state to `folder`, so that one whole state is on disk at every moment: the new state is
    written beside it (its JSON last, itself swapped in whole), the previous one renamed aside, the new one
    renamed in, and only then the previous one removed."""
    _refuse_foreign(folder)
    tensors = {f"model/{k}": v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    opt = optimizer.state_dict()
    for index, slots in opt["state"].items():
        for key, value in slots.items():
            tensors[f"opt/{index}/{key}"] = torch.as_tensor(value).contiguous().clone()
    for name, gen in generators.items():
        tensors[f"gen/{name}"] = gen.get_state()
    tmp, old = _tmp(folder), _old(folder)
    shutil.rmtree(tmp, ignore_errors=True)  # an unfinished write of ours: the whole state is folder (or old)
    tmp.mkdir(parents=True)
    save_file(tensors, str(tmp / TENSORS))
    text = json.dumps(dict(meta, param_groups=opt["param_groups"], tensors=sorted(tensors)), indent=1)
    (tmp / (META + ".part")).write_text(text)
    os.replace(tmp / (META + ".part"), tmp / META)  # the JSON marks the new state whole
    if folder.exists():
        shutil.rmtree(old, ignore_errors=True)  # folder is whole: the older copy is not needed
        os.replace(folder, old)
    os.replace(tmp, folder)
    shutil.rmtree(old, ignore_errors=True)


def load_state(folder: Path, model, optimizer, generators: dict) -> dict | None:
    """Restore a run from `folder` into model, optimizer and generators; its JSON state, or None when there is
    none. Where a run was killed while saving, the newest whole copy is read (the new one beside the folder,
    else the previous one). A state that is not whole or not this run's (damaged files, missing optimizer or
    generator tensors, another model's weights) is refused by name (delete it to start over)."""
    _refuse_foreign(folder)
    found = next((f for f in (folder, _tmp(folder), _old(folder)) if (f / META).is_file()), None)
    if found is None:
        return None

    def refuse(why: str) -> ValueError:
        return ValueError(f"the training state in {found} {why}; delete the folder to start over")

    try:
        meta = json.loads((found / META).read_text())
        tensors = load_file(str(found / TENSORS))
    except Exception as err:  # safetensors' own error type, JSON's, the file system's
        raise refuse(f"is damaged ({type(err).__name__}: {err})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("param_groups"), list) or "step" not in meta:
        raise refuse(f"is damaged: {META} is not a training state (a {type(meta).__name__} without step and "
                     f"param_groups)")  # fmt: skip
    listed = meta.pop("tensors", None)
    if listed is not None and sorted(tensors) != sorted(listed):
        missing = sorted(set(listed) - set(tensors))
        raise refuse(f"is not whole: {len(missing)} of its tensors are missing (first: {missing[:3]})")
    params = [i for group in meta["param_groups"] for i in group.get("params", [])]
    has_opt = {int(k.split("/")[1]) for k in tensors if k.startswith("opt/")}
    if meta["step"] and set(params) - has_opt:
        raise refuse(f"is not whole: the optimizer's moments of {len(set(params) - has_opt)} of {len(params)} "
                     f"parameters are missing (resuming would restart them silently)")  # fmt: skip
    for name in generators:
        if f"gen/{name}" not in tensors:
            raise refuse(f"is not whole: the random generator {name!r} is missing")
    try:
        model.load_state_dict({k[len("model/") :]: v for k, v in tensors.items() if k.startswith("model/")})
    except RuntimeError as err:
        raise refuse(
            f"is not this run's: its weights do not fit this model ({str(err).splitlines()[0][:200]})"
        ) from None
    state: dict = {}
    for key, value in tensors.items():
        if key.startswith("opt/"):
            _, index, slot = key.split("/")
            state.setdefault(int(index), {})[slot] = value
    try:
        optimizer.load_state_dict({"state": state, "param_groups": meta.pop("param_groups")})
        for name, gen in generators.items():
            gen.set_state(tensors[f"gen/{name}"])
    except (ValueError, RuntimeError, TypeError, KeyError) as err:
        raise refuse(
            f"is not this run's: its optimizer or generators do not fit ({type(err).__name__}: {err})"
        ) from None
    return meta
