"""Saving and loading models: a folder with `weights.safetensors` and `headcoop.json`.

`load("count01")`, `load("skip-pair")` and `load("skip-pair-dhead1")` return the
checkpoints shipped inside the package; anything else is a path.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import hashlib
import inspect
import json
import math
import os
import re
import shutil
import socket
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from transformer_lens import HookedTransformer, HookedTransformerConfig

from headcoop.checks import check_device, check_finite
from headcoop.owners import pid_alive
from headcoop.tasks import task_from_dict
from headcoop.tasks.base import Task, build_model, hold_entries

WEIGHTS = "weights.safetensors"
META = "headcoop.json"
FORMAT = 1  # the layout this code writes; load reads exactly these formats
READABLE_FORMATS = (1,)
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
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("headcoop")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "unknown"


# --- the folder: what may be replaced, and how ------------------------------------------------------

_RESERVED = {"format", "headcoop_version", "config", "dtype", "task", "frozen", "train", "metrics", "history",
             "weights_sha256"}  # fmt: skip
_DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}
_HOST = hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]


def _leftover_pattern(name: str) -> re.Pattern:
    """Sibling folders of a save of `name` in progress: `.NAME.tmp-HOST-PID-RANDOM` (the new checkpoint being
    written) and `.NAME.old-HOST-PID-RANDOM` (the old one, between the two renames of the fallback swap)."""
    return re.compile(r"^\.%s\.(tmp|old)-([0-9a-f]{8})-(\d+)-[A-Za-z0-9_]+$" % re.escape(name))


def clean_leftovers(path: str | os.PathLike) -> list[Path]:
    """Tidy what a killed save of `path` left beside it; returns the folders removed or restored.

    A temporary folder whose writer (a process on this machine) is gone is deleted; an old checkpoint
    moved aside by a killed swap is moved back when `path` is missing, else deleted. Folders of writers
    still running, or on another machine sharing the disk, are left alone.
    """
    path = Path(os.path.abspath(path))
    if not path.parent.is_dir():
        return []
    pattern, touched = _leftover_pattern(path.name), []
    for entry in sorted(path.parent.iterdir()):
        match = pattern.match(entry.name)
        if not match or match.group(2) != _HOST or pid_alive(int(match.group(3))):
            continue
        if match.group(1) == "old" and not path.exists():
            os.rename(entry, path)
        else:
            shutil.rmtree(entry, ignore_errors=True)
        touched.append(entry)
    return touched


def _replaceable(path: Path) -> bool:
    """False for a missing folder, True for an empty one or one holding only a headcoop checkpoint's files;
    ValueError naming what is in the way otherwise (a file, or a folder with other files)."""
    if not path.exists() and not path.is_symlink():
        for parent in path.parents:
            if parent.exists():
                if not parent.is_dir():
                    raise ValueError(f"cannot save to {str(path)!r}: {str(parent)!r} is a file, not a folder")
                break
        return False
    if not path.is_dir():
        raise ValueError(f"cannot save to {str(path)!r}: it is a file; give a new folder name")
    others = sorted(e.name for e in path.iterdir() if e.name not in (META, WEIGHTS))
    if others:
        shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        raise ValueError(
            f"cannot save to {str(path)!r}: the folder holds files that are not a headcoop checkpoint ({shown}); "
            "hc.save writes only into a new folder, an empty one, or one holding a checkpoint and nothing else"
        )
    return True


def _exchange(a: Path, b: Path) -> bool:
    """Swap two folders in one atomic step (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    libc = _libc()
    if libc is None:
        return False
    if libc.renameat2(-100, os.fsencode(a), -100, os.fsencode(b), 2) == 0:  # AT_FDCWD, RENAME_EXCHANGE
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EXDEV):
        return False
    raise OSError(err, f"cannot swap {a} and {b}: {os.strerror(err)}")


@functools.cache
def _libc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.renameat2  # noqa: B018 (glibc >= 2.28)
    except (OSError, AttributeError):
        return None
    return libc


def _install(tmp: Path, path: Path, replace: bool) -> None:
    """Put the finished checkpoint folder `tmp` at `path`: `path` always holds the old checkpoint or the new."""
    if not replace:
        os.rename(tmp, path)  # atomic; fails if a folder appeared at `path` meanwhile
        return
    if not any(path.iterdir()):
        # An empty folder (maybe the working directory): keep it, move the files in; the JSON last,
        # since a folder without it is not a checkpoint.
        for name in (WEIGHTS, META):
            os.replace(tmp / name, path / name)
        tmp.rmdir()
        return
    if _exchange(tmp, path):
        shutil.rmtree(tmp)
        return
    # No atomic swap on this system: move the old checkpoint aside first. A kill between the two
    # renames leaves it at `.NAME.old-...`, and the next save or load of `path` moves it back.
    old = path.with_name(tmp.name.replace(".tmp-", ".old-", 1))
    os.rename(path, old)
    os.rename(tmp, path)
    shutil.rmtree(old, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def sha256_of(file: Path) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _check_path_arg(path) -> Path:
    if isinstance(path, bytes) or not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {path!r} ({type(path).__name__})")
    if isinstance(path, str) and not path.strip():
        raise ValueError("path is an empty string; give a folder name")
    return Path(os.path.abspath(path))


def check_save_target(path: str | os.PathLike) -> Path:
    """The absolute folder `save` would write, checked without writing anything: ValueError when it is a
    file, lies under a file, is empty, or holds files that are not a headcoop checkpoint."""
    path = _check_path_arg(path)
    _replaceable(path)
    return path


def _metadata(model: HookedTransformer, metrics: dict | None, extra: dict[str, Any]) -> dict[str, Any]:
    reserved = sorted(set(extra) & _RESERVED)
    if reserved:
        raise ValueError(f"hc.save: {reserved} are written by hc.save itself; give your metadata other names")
    task = getattr(model, "task", None)
    if task is not None:
        if not isinstance(task, Task):
            raise TypeError(f"model.task must be a headcoop Task (or None), got {type(task).__name__}")
        task.check_model(model, "hc.save")
        if metrics is None:
            metrics = task.evaluate(model)
    if metrics is not None and not isinstance(metrics, dict):
        raise TypeError(f"metrics must be a dict (or None), got {type(metrics).__name__}")
    meta = {
        "format": FORMAT,
        "headcoop_version": _version(),
        "config": config_to_dict(model.cfg),
        "dtype": str(model.cfg.dtype).removeprefix("torch."),
        "task": task.to_dict() if task is not None else None,
        "frozen": [n for n, p in model.named_parameters() if not p.requires_grad],
        "train": getattr(model, "train_settings", None),
        "metrics": metrics,
        "history": getattr(model, "history", None),
        **extra,
    }
    for key, value in meta.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError) as err:
            raise TypeError(f"hc.save: {key}={value!r} cannot be written as JSON ({err})") from None
    if meta["dtype"] not in _DTYPES:
        raise ValueError(f"hc.save: dtype {model.cfg.dtype} is not one headcoop can restore ({sorted(_DTYPES)})")
    return meta


def save(model: HookedTransformer, path: str | os.PathLike, metrics: dict | None = None, **extra: Any) -> Path:
    """Write `model` to the folder `path` (weights.safetensors + headcoop.json); returns the folder.

    The JSON holds the config, dtype, the task and its parameters, the training settings, `metrics`
    (default: the task's evaluation), the headcoop version, the SHA-256 of the weights file and `extra`.
    `path` must be a new folder, an empty one, or one holding a headcoop checkpoint and nothing else;
    anything else is a ValueError naming what is in the way, and nothing is written. Replacing a
    checkpoint is atomic: `path` holds the old or the new one at every moment. A killed save leaves a
    hidden `.NAME.tmp-*` folder beside `path` that the next save or load of `path` removes.
    ValueError for NaN/inf weights.
    """
    if not isinstance(model, HookedTransformer):
        raise TypeError(f"hc.save takes a HookedTransformer, got {type(model).__name__}")
    path = _check_path_arg(path)
    check_finite(model, "hc.save")
    clean_leftovers(path)
    replace = _replaceable(path)
    meta = _metadata(model, metrics, extra)
    weights = {n: p.detach().to("cpu").contiguous() for n, p in model.named_parameters()}
    path.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{path.name}.tmp-{_HOST}-{os.getpid()}-"
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=path.parent))
    try:
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700; a checkpoint is shared like any folder
        save_file(weights, str(tmp / WEIGHTS))
        meta["weights_sha256"] = sha256_of(tmp / WEIGHTS)
        (tmp / META).write_text(json.dumps(meta, indent=1))
        for name in (WEIGHTS, META):
            os.chmod(tmp / name, 0o666 & ~_umask())
        _install(tmp, path, replace)
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if err.errno == errno.ENOSPC:
            raise OSError(errno.ENOSPC, f"no space left on the device to save {path}; nothing was replaced") from None
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def resolve(name_or_path: str | os.PathLike) -> Path:
    """The folder of a shipped checkpoint name, or the given path; FileNotFoundError if absent.

    A bare shipped name ("count01") means the shipped model, with a warning when a checkpoint folder of
    that name also sits in the working directory; "./count01" (or a Path) always means the folder.
    """
    if isinstance(name_or_path, bytes) or not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(
            f"expected a shipped name or a checkpoint folder, got {name_or_path!r} ({type(name_or_path).__name__})"
        )
    if isinstance(name_or_path, str) and name_or_path in SHIPPED:
        path = SHIPPED_DIR / name_or_path
        local = Path(name_or_path)
        if (local / META).is_file():
            warnings.warn(
                f"{name_or_path!r} names a shipped model and a checkpoint folder here; loading the shipped "
                f"model (pass './{name_or_path}' for the folder)",
                stacklevel=3,
            )
    else:
        path = Path(name_or_path)
        clean_leftovers(path)
    if not (path / META).is_file() or not (path / WEIGHTS).is_file():
        missing = [f for f in (META, WEIGHTS) if not (path / f).is_file()]
        raise FileNotFoundError(
            f"no headcoop checkpoint at {str(path)!r} (missing {', '.join(missing)}); "
            f"shipped names are {sorted(SHIPPED)}"
        )
    return path


def read_meta(name_or_path: str | os.PathLike) -> dict[str, Any]:
    """The checkpoint's JSON; ValueError if it is damaged or of a format this headcoop cannot read."""
    return _read_meta(resolve(name_or_path))


def _read_meta(path: Path) -> dict[str, Any]:
    try:
        meta = json.loads((path / META).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"damaged checkpoint metadata {path / META}: {err}") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("config"), dict):
        raise ValueError(f"damaged checkpoint metadata {path / META}: no 'config' object")
    expected = {"task": dict, "frozen": list, "train": dict, "metrics": dict, "history": list}
    for key, kind in expected.items():
        if meta.get(key) is not None and not isinstance(meta[key], kind):
            raise ValueError(
                f"damaged checkpoint metadata {path / META}: {key!r} should be a {kind.__name__} (or null), "
                f"got {type(meta[key]).__name__}"
            )
    fmt = meta.get("format")
    if isinstance(fmt, bool) or fmt not in READABLE_FORMATS:
        raise ValueError(
            f"checkpoint {path} has format {fmt!r}; this headcoop ({_version()}) reads formats {list(READABLE_FORMATS)}"
        )
    return meta


def _verify_weights(path: Path, meta: dict[str, Any]) -> None:
    """ValueError unless the weights file's SHA-256 is the one the JSON records (a warning where an
    older checkpoint records none)."""
    recorded = meta.get("weights_sha256")
    if recorded is None:
        warnings.warn(f"checkpoint {path} records no weights checksum, so its weights cannot be verified; "
                      "save it again to add one", stacklevel=3)  # fmt: skip
        return
    actual = sha256_of(path / WEIGHTS)
    if actual != recorded:
        raise ValueError(
            f"damaged checkpoint {path}: the weights file's SHA-256 is {actual[:16]}..., but {META} records "
            f"{str(recorded)[:16]}...; the weights are not the ones saved with this metadata"
        )


def load(name_or_path: str | os.PathLike, device: str | None = None) -> HookedTransformer:
    """Restore a saved model exactly (values and dtype), its task attached as `model.task` (when it had one).

    FileNotFoundError for a missing checkpoint; ValueError for a damaged file, weights whose checksum
    does not match the JSON, an unknown format, or a config that does not match the weights (naming
    the parameter).
    """
    device = check_device(device)
    path = resolve(name_or_path)
    meta = _read_meta(path)
    _verify_weights(path, meta)
    dtype_name = meta.get("dtype", "float32")
    if dtype_name not in _DTYPES:
        raise ValueError(f"checkpoint {path} has dtype {dtype_name!r}; known dtypes are {sorted(_DTYPES)}")
    try:
        cfg = HookedTransformerConfig(**meta["config"], device=device, dtype=_DTYPES[dtype_name])
    except (TypeError, ValueError, AssertionError) as err:
        raise ValueError(f"checkpoint config in {path / META} is invalid: {err}") from None
    try:
        weights = load_file(str(path / WEIGHTS))
    except (SafetensorError, OSError, ValueError) as err:
        raise ValueError(f"damaged weights file {path / WEIGHTS}: {err}") from None

    try:
        task = task_from_dict(meta["task"]) if meta.get("task") else None
    except (TypeError, ValueError) as err:
        raise ValueError(f"checkpoint task in {path / META} is invalid: {err}") from None
    model = build_model(cfg, seed=0)
    frozen = meta.get("frozen")
    if task is not None:
        task.check_model(model, f"checkpoint {path}")
        if frozen is None:  # written before checkpoints listed their frozen parameters: the task's rule
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
        if tensor.dtype != expected[name].dtype:
            raise ValueError(
                f"checkpoint weight {name!r} is {tensor.dtype} but the checkpoint's dtype is {dtype_name} ({path})"
            )
    with torch.no_grad():
        for name, tensor in weights.items():
            expected[name].copy_(tensor)
    unknown = [name for name in frozen or [] if name not in expected]
    if unknown:
        raise ValueError(f"damaged checkpoint metadata {path / META}: frozen names {unknown} are not parameters")
    if frozen is not None:  # exactly as saved: frozen parameters frozen, every other one trainable
        for name, param in expected.items():
            param.requires_grad_(name not in frozen)
    if task is not None:  # entries the task holds at zero (Count01's heads-only readout) stay held
        held = task.held_entries(model)
        moved = [name for name, mask in held.items() if bool(expected[name].detach()[mask].any())]
        if moved:
            raise ValueError(f"checkpoint {path} has non-zero entries in {moved}, which its task holds at zero")
        hold_entries(expected, held)
    model.task = task
    model.eval()
    model.history = meta.get("history") or []
    model.train_settings = meta.get("train")
    model.checkpoint_meta = meta
    return model
