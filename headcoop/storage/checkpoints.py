"""Saving and loading models: a folder with `weights.safetensors` and `headcoop.json`.

`load("count01")`, `load("skip-pair")` and `load("skip-pair-dhead1")` return the
checkpoints shipped inside the package; anything else is a path.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import inspect
import json
import math
import os
import re
import shutil
import socket
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from headcoop.checks import check_finite, usable_device, weight_shapes
from headcoop.models.tl import HookedTransformer, HookedTransformerConfig, attach, require_hooked_transformer
from headcoop.storage.folders import exchange
from headcoop.storage.owners import pid_alive, this_owner
from headcoop.tasks import task_from_dict
from headcoop.tasks.base import Task, build_model, hold_entries

WEIGHTS = "weights.safetensors"
META = "headcoop.json"
FORMAT = 1  # the layout this code writes; load reads exactly these formats
READABLE_FORMATS = (1,)
SHIPPED_DIR = Path(__file__).parents[1] / "checkpoints"  # headcoop/checkpoints: the shipped models
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
DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}
_HOST = hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]


def _leftover_pattern(name: str) -> re.Pattern:
    """Sibling folders of a save of `name` in progress: `.NAME.tmp-HOST-PID-RANDOM` (the new checkpoint being
    written) and `.NAME.old-HOST-PID-RANDOM` (the old one, between the two renames of the fallback swap)."""
    return re.compile(r"^\.%s\.(tmp|old)-([0-9a-f]{8})-(\d+)-[A-Za-z0-9_]+$" % re.escape(name))


_SAFETENSORS_TMP = re.compile(r"\.tmp[A-Za-z0-9_]{6}")  # the file safetensors writes through, then renames
MARKER = ".headcoop-save"  # written first into every temporary folder: its writer's owner string


def _made_by_headcoop(folder: Path) -> bool:
    """Whether `folder` (a real folder, no symlink) is one a save made: empty (just created), holding the
    temporary-folder marker, or holding nothing but a headcoop checkpoint's regular files with a valid
    format field. A user's folder that only happens to match the name pattern is none of these."""
    if folder.is_symlink() or not folder.is_dir():
        return False
    try:
        entries = list(folder.iterdir())
    except OSError:
        return False
    names = {e.name for e in entries}
    if any(e.is_symlink() or not e.is_file() for e in entries):
        return False
    if MARKER in names:  # a save in progress, maybe killed inside safetensors' own write (its `.tmpXXXXXX`)
        return all(n in (META, WEIGHTS, MARKER) or _SAFETENSORS_TMP.fullmatch(n) for n in names)
    if not names <= {META, WEIGHTS}:
        return False
    return not names or (META in names and is_checkpoint_meta(folder / META))


def is_checkpoint_meta(file: Path) -> bool:
    """Whether `file` is a regular file holding a headcoop checkpoint's JSON (an integer `format` field and a
    `config` object): the mark of a folder `hc.save` wrote, which it may replace."""
    if file.is_symlink() or not file.is_file():
        return False
    try:
        meta = json.loads(file.read_text())
    except (OSError, ValueError):
        return False
    fmt = meta.get("format") if isinstance(meta, dict) else None
    return isinstance(fmt, int) and not isinstance(fmt, bool) and isinstance(meta.get("config"), dict)


def clean_leftovers(path: str | os.PathLike) -> list[Path]:
    """Tidy what a killed save of `path` left beside it; returns the folders removed or restored.

    A temporary folder whose writer (a process on this machine) is gone is deleted; an old checkpoint
    moved aside by a killed swap is moved back when `path` is missing, else deleted. Only folders a save
    made are touched (`_made_by_headcoop`: a marker file, empty, or a checkpoint's files); a user's folder
    that matches the name pattern, folders of writers still running, or of another machine sharing the
    disk, are left alone.
    """
    path = Path(os.path.abspath(path))
    if not path.parent.is_dir():
        return []
    pattern, touched = _leftover_pattern(path.name), []
    try:
        entries = sorted(path.parent.iterdir())
    except PermissionError:  # a folder this user may not list: nothing of ours to tidy can be found there
        return []
    for entry in entries:
        match = pattern.match(entry.name)
        if not match or match.group(2) != _HOST or pid_alive(int(match.group(3))):
            continue
        if not _made_by_headcoop(entry):
            continue
        if match.group(1) == "old" and not path.exists():
            os.rename(entry, path)
        else:
            shutil.rmtree(entry, ignore_errors=True)
        touched.append(entry)
    return touched


def _writable(folder: Path, path: Path, role: str) -> None:
    """PermissionError, before anything is written, when this process cannot create or remove entries in
    `folder` (a read-only folder, or one of another user)."""
    if not os.access(folder, os.W_OK | os.X_OK):
        raise PermissionError(
            f"cannot save to {str(path)!r}: {role} {str(folder)!r} is not writable by this user; nothing was written"
        )


def _replaceable(path: Path) -> bool:
    """False for a missing folder, True for an empty one or one holding only a headcoop checkpoint's files
    (regular files, the JSON with its format field); ValueError naming what is in the way otherwise (a
    file, a symlink, a folder with other files, or files of these names that headcoop did not write);
    PermissionError where the folder or its parent cannot be written."""
    if path.is_symlink():
        raise ValueError(
            f"cannot save to {str(path)!r}: it is a symbolic link (to {os.readlink(path)!r}); hc.save replaces only "
            "folders it made itself: give the real folder or a new name"
        )
    if not path.exists():
        for parent in path.parents:
            if parent.exists():
                if not parent.is_dir():
                    raise ValueError(f"cannot save to {str(path)!r}: {str(parent)!r} is a file, not a folder")
                _writable(parent, path, "the folder")
                break
        return False
    if not path.is_dir():
        raise ValueError(f"cannot save to {str(path)!r}: it is a file, not a folder; give a new folder name")
    entries = list(path.iterdir())
    others = sorted(e.name for e in entries if e.name not in (META, WEIGHTS))
    if others:
        shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        raise ValueError(
            f"cannot save to {str(path)!r}: the folder holds files that are not a headcoop checkpoint ({shown}); "
            "hc.save writes only into a new folder, an empty one, or one holding a checkpoint and nothing else"
        )
    odd = [e.name for e in entries if e.is_symlink() or not e.is_file()]
    if odd:
        raise ValueError(
            f"cannot save to {str(path)!r}: {', '.join(sorted(odd))} there is not a regular file (a folder, a link or a "
            "special file), so it is not a checkpoint hc.save wrote; nothing was written"
        )
    if entries and not is_checkpoint_meta(path / META):
        why = "is not a headcoop checkpoint's JSON" if (path / META).exists() else f"is missing beside {WEIGHTS}"
        raise ValueError(
            f"cannot save to {str(path)!r}: its {META} {why}, so the folder is not a checkpoint hc.save wrote; "
            "nothing was written (move your files or choose a new folder)"
        )
    _writable(path, path, "the checkpoint folder")
    _writable(path.parent, path, "the folder")
    return True


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
    if exchange(tmp, path):
        try:
            _remove_checkpoint(tmp)  # now the old checkpoint
        except OSError:
            exchange(tmp, path)  # the old one back where it was; the caller removes the new one in tmp
            raise
        return
    # No atomic swap on this system: move the old checkpoint aside first. A kill between the two
    # renames leaves it at `.NAME.old-...`, and the next save or load of `path` moves it back.
    old = path.with_name(tmp.name.replace(".tmp-", ".old-", 1))
    os.rename(path, old)
    os.rename(tmp, path)
    try:
        _remove_checkpoint(old)
    except OSError:
        os.rename(path, tmp)
        os.rename(old, path)
        raise


def _remove_checkpoint(folder: Path) -> None:
    """Delete a checkpoint folder's own files, then the folder: an OSError (a read-only folder) leaves it whole
    enough to put back, and nothing but a checkpoint's files is ever deleted."""
    if not os.access(folder, os.W_OK | os.X_OK):
        raise PermissionError(errno.EACCES, f"{str(folder)!r} is not writable by this user")
    for name in (MARKER, WEIGHTS, META):  # the JSON last: a leftover of a kill here is still marked as ours
        with contextlib.suppress(FileNotFoundError):
            os.unlink(folder / name)
    folder.rmdir()


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
    if "\x00" in os.fspath(path):
        raise ValueError(f"path {os.fspath(path)!r} holds a NUL character, which no file name may hold")
    path = Path(os.path.abspath(path))
    # the longest name save writes beside it: the temporary folder .NAME.tmp-HOST-PID-XXXXXXXX
    longest = len(f".{path.name}.tmp-{_HOST}-{os.getpid()}-xxxxxxxx".encode())
    limit = _name_max(path.parent)
    if longest > limit:
        raise ValueError(f"the folder name {path.name[:40]!r}... is {len(path.name.encode())} bytes long; with the temporary "
                         f"folder's suffix it exceeds this file system's {limit}-byte limit on a name: give a "
                         f"name under {limit - (longest - len(path.name.encode()))} bytes")  # fmt: skip
    return path


def _name_max(folder: Path) -> int:
    """The file system's longest file name in bytes at `folder` (or its nearest existing parent); 255 when unknown."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return int(os.pathconf(folder, "PC_NAME_MAX"))
    except (OSError, ValueError):
        return 255


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
        "dtype": str(_weights_dtype(model)).removeprefix("torch."),
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
    if meta["dtype"] not in DTYPES:
        raise ValueError(f"hc.save: dtype {meta['dtype']} is not one headcoop can restore ({sorted(DTYPES)})")
    return meta


def _weights_dtype(model: HookedTransformer) -> torch.dtype:
    """The dtype the weights have (after `model.double()`, say, whatever `cfg.dtype` still claims); ValueError
    for a model whose parameters mix dtypes, which a checkpoint cannot restore."""
    dtypes = {name: p.dtype for name, p in model.named_parameters()}
    kinds = sorted({str(d) for d in dtypes.values()})
    if len(kinds) > 1:
        first = {kind: next(n for n, d in dtypes.items() if str(d) == kind) for kind in kinds}
        raise ValueError(f"hc.save: the model's parameters mix dtypes ({first}); cast it with model.to(dtype) first")
    return next(iter(dtypes.values()), model.cfg.dtype)


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
    _weights_dtype(model)  # mixed dtypes: refused before anything runs
    clean_leftovers(path)
    replace = _replaceable(path)
    meta = _metadata(model, metrics, extra)
    weights = {n: p.detach().to("cpu").contiguous() for n, p in model.named_parameters()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OSError(err.errno, f"cannot save to {str(path)!r}: cannot create its folder ({err.strerror}); "
                                 "nothing was written") from None  # fmt: skip
    prefix = f".{path.name}.tmp-{_HOST}-{os.getpid()}-"
    try:
        tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=path.parent))
    except OSError as err:
        raise OSError(err.errno, f"cannot save to {str(path)!r}: {err.strerror} in {str(path.parent)!r}; "
                                 "nothing was written") from None  # fmt: skip
    try:
        (tmp / MARKER).write_text(this_owner())  # first: a temporary folder headcoop made is marked as such
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700; a checkpoint is shared like any folder
        save_file(weights, str(tmp / WEIGHTS))
        meta["weights_sha256"] = sha256_of(tmp / WEIGHTS)
        (tmp / META).write_text(json.dumps(meta, indent=1))
        for name in (WEIGHTS, META):
            os.chmod(tmp / name, 0o666 & ~_umask())
        os.unlink(tmp / MARKER)  # (a complete checkpoint is marked by its JSON's format field)
        try:
            _install(tmp, path, replace)
        except OSError as err:
            if replace or err.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            # Another process made the first save into this new folder at the same moment: replace its
            # checkpoint (the last writer wins; both are whole) or, if something else appeared, refuse.
            _install(tmp, path, _replaceable(path))
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if err.errno == errno.ENOSPC:
            raise OSError(errno.ENOSPC, f"no space left on the device to save {path}; nothing was replaced") from None
        raise OSError(err.errno, f"cannot save to {str(path)!r}: {err.strerror or err}; the folder holds what it "
                                 "held before") from None  # fmt: skip
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
    if path.is_dir() and not os.access(path, os.R_OK | os.X_OK):
        raise PermissionError(errno.EACCES, f"cannot read the checkpoint folder {str(path)!r}: permission denied for "
                                            "this user (it needs read and execute permission)")  # fmt: skip
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


# --- what load accepts: the config checked against the weights before anything is built ---------------

_FIELD_TYPES = {f.name: str(f.type) for f in dataclasses.fields(HookedTransformerConfig)}
_MASK_BYTES = 4 << 30  # TransformerLens builds an n_ctx x n_ctx causal mask per layer: at most 4 GiB of them


def check_config_fields(config: dict[str, Any], where: str) -> None:
    """ValueError naming a config field of the wrong type or value: an int field holding a string, a float
    or a bool ("d_model": "8"), a number field holding NaN or inf, an unknown field. `where` opens the
    message ("checkpoint config in X is invalid")."""
    unknown = sorted(set(config) - set(_FIELD_TYPES))
    if unknown:
        raise ValueError(f"{where}: unknown config fields {unknown}")
    for key, value in config.items():
        kind = _FIELD_TYPES[key]
        if value is None and kind.startswith("Optional"):
            continue
        if kind.removeprefix("Optional[").rstrip("]") == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(
                    f"{where}: config field {key!r} must be an int, got {value!r} ({type(value).__name__})"
                )
            if value < -1:  # (-1 is TransformerLens's "derive it", as in d_vocab_out)
                raise ValueError(f"{where}: config field {key!r} must be >= -1, got {value!r}")
        elif kind in ("float", "Optional[float]", "Union[float, int]", "Optional[Union[float, int]]"):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(
                    f"{where}: config field {key!r} must be a number, got {value!r} ({type(value).__name__})"
                )
            if not math.isfinite(value):
                raise ValueError(f"{where}: config field {key!r} must be finite, got {value!r}")
        elif kind == "bool" and not isinstance(value, bool):
            raise ValueError(f"{where}: config field {key!r} must be true or false, got {value!r}")
        elif kind == "str" and not isinstance(value, str):
            raise ValueError(f"{where}: config field {key!r} must be a string, got {value!r}")


def check_config_shapes(config: dict[str, Any], shapes: dict[str, tuple[int, ...]], where: str) -> None:
    """ValueError, before any model is built, where the config's sizes disagree with the weights' shapes
    (`shapes`: parameter name -> shape, as the weights file's header gives them): the number of layers,
    d_model, d_vocab, d_vocab_out, n_ctx, n_heads and d_head. A config of n_layers 10^6 or d_vocab 10^9
    beside small weights would otherwise hang or try to allocate tens of GB."""

    def need(field: str, actual: int, source: str) -> None:
        if config.get(field) != actual:
            raise ValueError(f"{where}: the weights do not match its config: the config says {field}="
                             f"{config.get(field)!r}, but the weights' {source} gives {actual}")  # fmt: skip

    blocks = {int(m.group(1)) for name in shapes if (m := re.match(r"blocks\.(\d+)\.", name))}
    need("n_layers", len(blocks), "number of blocks")
    if "embed.W_E" in shapes:
        need("d_vocab", shapes["embed.W_E"][0], "embed.W_E")
        need("d_model", shapes["embed.W_E"][1], "embed.W_E")
    if "unembed.W_U" in shapes:
        d_vocab_out = config.get("d_vocab_out", -1)
        if d_vocab_out not in (-1, shapes["unembed.W_U"][1]):
            need("d_vocab_out", shapes["unembed.W_U"][1], "unembed.W_U")
    if "pos_embed.W_pos" in shapes:
        need("n_ctx", shapes["pos_embed.W_pos"][0], "pos_embed.W_pos")
    elif isinstance(config.get("n_ctx"), int) and config["n_ctx"] ** 2 * max(1, len(blocks)) > _MASK_BYTES:
        raise ValueError(f"{where}: the config's n_ctx={config['n_ctx']} would need causal masks of "
                         f"{config['n_ctx'] ** 2 * len(blocks) / 2**30:.0f} GiB; the weights hold no positional "
                         "embedding to check it against, and headcoop loads models up to 4 GiB of masks")  # fmt: skip
    if "blocks.0.attn.W_Q" in shapes and len(shapes["blocks.0.attn.W_Q"]) == 3:
        need("n_heads", shapes["blocks.0.attn.W_Q"][0], "blocks.0.attn.W_Q")
        need("d_head", shapes["blocks.0.attn.W_Q"][2], "blocks.0.attn.W_Q")


def load(name_or_path: str | os.PathLike, device: str | None = None) -> HookedTransformer:
    """Restore a saved model exactly (values and dtype), its task attached as `model.task` (when it had one).

    FileNotFoundError for a missing checkpoint; ValueError for a damaged file, weights whose checksum
    does not match the JSON, an unknown format, or a config that does not match the weights (naming
    the parameter).
    """
    require_hooked_transformer("hc.load")
    device = usable_device(device)  # a device this machine lacks is named before any read
    path = resolve(name_or_path)
    for name in (META, WEIGHTS):
        if not os.access(path / name, os.R_OK):
            raise PermissionError(errno.EACCES, f"cannot read the checkpoint file {str(path / name)!r}: "
                                                "permission denied for this user")  # fmt: skip
    meta = _read_meta(path)
    _verify_weights(path, meta)
    dtype_name = meta.get("dtype", "float32")
    if dtype_name not in DTYPES:
        raise ValueError(f"checkpoint {path} has dtype {dtype_name!r}; known dtypes are {sorted(DTYPES)}")
    check_config_fields(meta["config"], f"checkpoint config in {path / META} is invalid")
    check_config_shapes(meta["config"], weight_shapes(path / WEIGHTS), f"checkpoint {path}")
    try:
        cfg = HookedTransformerConfig(**meta["config"], device=device, dtype=DTYPES[dtype_name])
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
        hold_entries(dict(expected), held)
    model.eval()
    attach(model, task=task, history=meta.get("history") or [], train_settings=meta.get("train"), checkpoint_meta=meta)
    return model
