"""Saving and loading models: a folder with `weights.safetensors` and `headcoop.json`.

`load("count01")`, `load("skip-pair")` and `load("skip-pair-dhead1")` return the
checkpoints shipped inside the package; anything else is a path.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from transformer_lens import HookedTransformer, HookedTransformerConfig

from headcoop.tasks import task_from_dict
from headcoop.tasks.base import build_model

WEIGHTS = "weights.safetensors"
META = "headcoop.json"
FORMAT = 1
SHIPPED_DIR = Path(__file__).parent / "checkpoints"
SHIPPED = {
    "count01": "Count01, 1 layer, d_model 32, 16 heads, d_head 2 (the paper's primary configuration)",
    "skip-pair": "SkipPair, 1 layer, 2 heads, d_head 5 (the post's model)",
    "skip-pair-dhead1": "SkipPair, 1 layer, 2 heads, d_head 1",
}
_CONFIG_KEYS = set(inspect.signature(HookedTransformerConfig).parameters) - {"device", "dtype", "n_devices", "seed"}


def _json_safe(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, (int, str, bool, type(None)))


def config_to_dict(cfg: HookedTransformerConfig) -> dict[str, Any]:
    """The constructor arguments of `cfg` that JSON can hold."""
    return {k: v for k, v in cfg.to_dict().items() if k in _CONFIG_KEYS and _json_safe(v)}


def _version() -> str:
    from headcoop import __version__

    return __version__


def save(model: HookedTransformer, path: str | os.PathLike, metrics: dict | None = None, **extra: Any) -> Path:
    """Write `model` to the folder `path` (weights.safetensors + headcoop.json), atomically.

    The JSON holds the config, the task and its parameters, the training settings,
    `metrics` (default: the task's evaluation) and the headcoop version. Returns the folder.
    """
    path = Path(path)
    task = getattr(model, "task", None)
    if metrics is None and task is not None:
        metrics = task.evaluate(model)
    meta = {
        "format": FORMAT,
        "headcoop_version": _version(),
        "config": config_to_dict(model.cfg),
        "task": task.to_dict() if task is not None else None,
        "frozen": [n for n, p in model.named_parameters() if not p.requires_grad],
        "train": getattr(model, "train_settings", None),
        "metrics": metrics,
        "history": getattr(model, "history", None),
        **extra,
    }
    weights = {n: p.detach().to("cpu").contiguous() for n, p in model.named_parameters()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        save_file(weights, str(tmp / WEIGHTS))
        (tmp / META).write_text(json.dumps(meta, indent=1))
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def resolve(name_or_path: str | os.PathLike) -> Path:
    """The folder of a shipped checkpoint name, or the given path; FileNotFoundError if absent."""
    if isinstance(name_or_path, str) and name_or_path in SHIPPED:
        path = SHIPPED_DIR / name_or_path
    else:
        path = Path(name_or_path)
    if not (path / META).is_file() or not (path / WEIGHTS).is_file():
        missing = [f for f in (META, WEIGHTS) if not (path / f).is_file()]
        raise FileNotFoundError(
            f"no headcoop checkpoint at {str(path)!r} (missing {', '.join(missing)}); "
            f"shipped names are {sorted(SHIPPED)}"
        )
    return path


def read_meta(name_or_path: str | os.PathLike) -> dict[str, Any]:
    """The checkpoint's JSON; ValueError if it is damaged."""
    path = resolve(name_or_path)
    try:
        meta = json.loads((path / META).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"damaged checkpoint metadata {path / META}: {err}") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("config"), dict):
        raise ValueError(f"damaged checkpoint metadata {path / META}: no 'config' object")
    return meta


def load(name_or_path: str | os.PathLike, device: str | None = None) -> HookedTransformer:
    """Restore a saved model exactly, its task attached as `model.task` (when it had one).

    FileNotFoundError for a missing checkpoint; ValueError for a damaged file or a
    config that does not match the weights (naming the parameter).
    """
    path = resolve(name_or_path)
    meta = read_meta(path)
    try:
        cfg = HookedTransformerConfig(**meta["config"], device=device)
    except (TypeError, ValueError, AssertionError) as err:
        raise ValueError(f"checkpoint config in {path / META} is invalid: {err}") from None
    try:
        weights = load_file(str(path / WEIGHTS))
    except (SafetensorError, OSError, ValueError) as err:
        raise ValueError(f"damaged weights file {path / WEIGHTS}: {err}") from None

    task = task_from_dict(meta["task"]) if meta.get("task") else None
    model = build_model(cfg, seed=0)
    if task is not None:
        task.prepare(model)
    expected = dict(model.named_parameters())
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    if missing or unexpected:
        raise ValueError(
            f"checkpoint weights do not match its config: missing {missing}, unexpected {unexpected} ({path})"
        )
    for name, tensor in sorted(weights.items()):
        if tensor.shape != expected[name].shape:
            raise ValueError(
                f"checkpoint weight {name!r} has shape {tuple(tensor.shape)} but the config needs "
                f"{tuple(expected[name].shape)} ({path})"
            )
    with torch.no_grad():
        for name, tensor in weights.items():
            expected[name].copy_(tensor)
    for name in meta.get("frozen", []):
        if name in expected:
            expected[name].requires_grad_(False)
    model.eval()
    model.history = meta.get("history") or []
    model.train_settings = meta.get("train")
    model.checkpoint_meta = meta
    return model
