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


def save_state(folder: Path, model, optimizer, generators: dict, meta: dict) -> None:
    """Write the run's state to `folder` (replacing the previous checkpoint only once the new one is whole)."""
    tensors = {f"model/{k}": v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    opt = optimizer.state_dict()
    for index, slots in opt["state"].items():
        for key, value in slots.items():
            tensors[f"opt/{index}/{key}"] = torch.as_tensor(value).contiguous().clone()
    for name, gen in generators.items():
        tensors[f"gen/{name}"] = gen.get_state()
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(tensors, str(tmp / TENSORS))
    (tmp / META).write_text(json.dumps(dict(meta, param_groups=opt["param_groups"]), indent=1))
    old = folder.with_name(folder.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if folder.exists():
        os.replace(folder, old)
    os.replace(tmp, folder)
    shutil.rmtree(old, ignore_errors=True)


def load_state(folder: Path, model, optimizer, generators: dict) -> dict | None:
    """Restore a run from `folder` into model, optimizer and generators; its JSON state, or None when there is
    none. A damaged state is an error naming the folder (delete it to start over)."""
    if not (folder / META).exists():
        old = folder.with_name(folder.name + ".old")  # killed between the two replaces: the previous one is whole
        if (old / META).exists():
            folder = old
        else:
            return None
    try:
        meta = json.loads((folder / META).read_text())
        tensors = load_file(str(folder / TENSORS))
    except Exception as err:  # safetensors' own error type, JSON's, the file system's
        raise ValueError(f"the training state in {folder} is damaged ({err}); delete the folder to start over") from err
    model.load_state_dict({k[len("model/") :]: v for k, v in tensors.items() if k.startswith("model/")})
    state: dict = {}
    for key, value in tensors.items():
        if key.startswith("opt/"):
            _, index, slot = key.split("/")
            state.setdefault(int(index), {})[slot] = value
    optimizer.load_state_dict({"state": state, "param_groups": meta.pop("param_groups")})
    for name, gen in generators.items():
        gen.set_state(tensors[f"gen/{name}"])
    return meta
