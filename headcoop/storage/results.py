"""Keeping results: `result.save(path)` and `hc.load_result(path)` for every analysis result.

    result = hc.patch(model)
    result.save("runs/patch-L0")               # a folder
    same = hc.load_result("runs/patch-L0")     # a PatchResult again: repr, tables and plots as before

A result is a folder of plain files, never a pickle:
- `result.json`: the format, headcoop's version, the result's class, and its fields; numbers, strings and
  nested values in JSON, tensors and tables by reference;
- `tensors.safetensors`: every tensor field (numpy arrays come back as numpy arrays);
- `table-N.parquet`: every pandas DataFrame field, index and dtypes kept (columns holding lists, tuples,
  dicts or sets are stored as JSON text and decoded again).

Loading only rebuilds classes defined in headcoop's own modules, so a result file cannot run code.
`save` writes a new folder beside the target and swaps it in; it replaces only a folder that holds a
headcoop result (it says so), never one holding anything else.
"""

from __future__ import annotations

import dataclasses
import errno
import importlib
import json
import math
import os
import re
import stat
import uuid
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from safetensors.torch import load_file, save_file
from transformer_lens import FactoredMatrix

from headcoop.display.plot import Displayed
from headcoop.storage.folders import exchange
from headcoop.storage.owners import parse_pid, pid_alive, this_owner

FORMAT = "headcoop-result"
VERSION = 1
META = "result.json"
TENSORS = "tensors.safetensors"


# The result classes `hc.load_result` may build, by class name: every Result subclass defined in headcoop's own
# modules registers itself here when its module is imported. A result file names a class; nothing else is built.
REGISTRY: dict[str, type] = {}
# The modules that define result classes, imported (and nothing else) when a file names a class not yet
# registered; tests/test_results.py checks the list against the package.
RESULT_MODULES = (
    "headcoop.analysis.nodes.patching",
    "headcoop.analysis.nodes.attribution",
    "headcoop.analysis.nodes.dla",
    "headcoop.analysis.nodes.probes",
    "headcoop.analysis.weights.qkov",
    "headcoop.analysis.weights.composition",
    "headcoop.analysis.edges.path_patching",
    "headcoop.analysis.edges.scores",
    "headcoop.analysis.edges.faithfulness",
    "headcoop.analysis.edges.stability",
    "headcoop.analysis.edges.ablation",
    "headcoop.analysis.games.interactions",
    "headcoop.analysis.mechanisms.result",
    "headcoop.analysis.pairs.result",
    "headcoop.studies.count01",
    "headcoop.studies.skip_pair",
)


class Result(Displayed):
    """What every analysis result shares: its notebook display (`headcoop.display.plot.Displayed`) and `save`."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.__module__.startswith("headcoop."):
            REGISTRY[cls.__qualname__] = cls

    def save(self, path: str | os.PathLike) -> Path:
        """Write this result to the folder `path` (tables as parquet, tensors as safetensors, the rest as JSON;
        never a pickle); `hc.load_result(path)` reads it back. Returns the path."""
        return save_result(self, path)


def _step(name: str) -> None:
    """Called between the steps of a save (a seam for tests/test_results.py, which kills a child process at each)."""


MARKER = ".headcoop-result-save"  # written first into a save's temporary folder: its writer's owner string


def save_result(result, path: str | os.PathLike) -> Path:
    """Write `result` (any headcoop analysis result) to the folder `path`; returns the path. A folder that
    exists must be empty or hold a headcoop result (replaced, with a message) and nothing its result.json does not
    name; anything else is refused. At every moment `path` holds the old result or the new one: the new one is
    written beside it (`.NAME.partial-...`) and swapped in atomically where the system can, else the old one is
    moved aside (`.NAME.old-...`) for the two renames, and the next save or load of `path` puts it back if a
    kill came between them. Leftovers of a killed save are removed by the next save or load of `path`."""
    if not dataclasses.is_dataclass(result) or not type(result).__module__.startswith("headcoop."):
        raise TypeError(f"save_result takes a headcoop analysis result, got {type(result).__name__}")
    if isinstance(path, bytes) or not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"a result is saved to a folder given as a str or Path, got {path!r} ({type(path).__name__})")
    path = Path(path)
    try:
        path.is_symlink()  # a name too long, or one with a NUL, is refused here by the system
    except (OSError, ValueError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise OSError(
            getattr(err, "errno", None) or errno.EINVAL, f"cannot save a result to {str(path)!r}: {reason}"
        ) from None
    clean_leftovers(path)
    replacing = _check_target(path)
    writer = _Writer()
    fields = writer.encode(result, "result")
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    staging = path.with_name(f".{path.name}.partial-{tag}")
    try:
        staging.mkdir(parents=True)
    except (OSError, ValueError) as err:  # a read-only folder, a path under a file, a name too long or with NUL
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise OSError(
            getattr(err, "errno", None) or errno.EINVAL,
            f"cannot save a result to {str(path)!r}: {reason} (in {str(path.parent)!r})",
        ) from None
    _LIVE.add(tag)  # this process's own save in progress: not a leftover (another thread's save may look)
    try:
        (staging / MARKER).write_text(this_owner())
        _step("staged")
        meta = {"format": FORMAT, "version": VERSION, "headcoop": _version(), "value": fields}
        save_file(writer.tensors, str(staging / TENSORS))
        # safetensors writes through a private temporary file (0600): give it the mode every other file takes
        os.chmod(staging / TENSORS, stat.S_IMODE((staging / MARKER).stat().st_mode))
        for name, frame in writer.frames.items():
            frame.to_parquet(staging / name)
        (staging / META).write_text(json.dumps(meta, indent=1, allow_nan=True), encoding="utf-8")  # last: complete
        (staging / MARKER).unlink()
        _step("written")
        if replacing:
            _swap_in(staging, path, tag)
            print(f"replaced the headcoop result at {path}")
        else:
            try:
                if path.exists():
                    path.rmdir()  # empty, checked above
                os.rename(staging, path)
            except OSError as err:  # another save of the same new path finished first
                if err.errno not in (errno.ENOTEMPTY, errno.EEXIST) or _named_files(path) is None:
                    raise
                _swap_in(staging, path, tag)
                print(f"replaced the headcoop result another save wrote at {path} meanwhile")
        _step("done")
    except BaseException:
        if staging.exists():
            _remove_result(staging, staging=True)
        raise
    finally:
        _LIVE.discard(tag)
    return path


_LIVE: set[str] = set()  # the tags of this process's saves in progress (its threads' own folders)


def _swap_in(staging: Path, path: Path, tag: str) -> None:
    """Put the finished folder `staging` at `path`, which holds a result: an atomic swap, or the old result moved
    aside between two renames; then the old result's own files are removed."""
    if exchange(staging, path):
        _step("swapped")
        _remove_result(staging)  # now the old result: only the files its result.json names
        return
    old = path.with_name(f".{path.name}.old-{tag}")
    os.rename(path, old)
    _step("moved aside")
    os.rename(staging, path)
    _step("swapped")
    _remove_result(old)


def _named_files(folder: Path) -> set[str] | None:
    """The files a result folder's result.json names (itself, the tensors, its tables); None if it holds none."""
    try:
        meta = json.loads((folder / META).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        return None
    tables = set(re.findall(r'"__frame__": "(table-\d+\.parquet)"', json.dumps(meta.get("value"))))
    return {META, TENSORS} | tables


def _remove_result(folder: Path, staging: bool = False) -> None:
    """Delete a result folder headcoop wrote: the files its result.json names (for a save's own temporary folder,
    which may not have its result.json yet: the files a save writes, and its marker), then the folder if that
    left it empty. A file it does not name is left in place, and so is the folder."""
    named = _named_files(folder) or set()
    for entry in list(folder.iterdir()):
        ours = entry.name in named or entry.name == MARKER or (staging and (
            entry.name in (META, TENSORS) or re.fullmatch(r"table-\d+\.parquet", entry.name)
            or _SAFETENSORS_TMP.fullmatch(entry.name)))  # the file safetensors writes through, then renames  # fmt: skip
        if ours and entry.is_file() and not entry.is_symlink():
            entry.unlink()
    try:
        folder.rmdir()
    except OSError:
        pass


_SAFETENSORS_TMP = re.compile(r"\.tmp[A-Za-z0-9_]{6}")
_LEFTOVER = re.compile(r"^\.(?P<name>.+)\.(?P<kind>partial|old)-(?P<tag>(?P<pid>\d+)-[0-9a-f]{8})$")


def clean_leftovers(path: str | os.PathLike) -> list[Path]:
    """Tidy what a killed save of `path` left beside it; returns the folders removed or restored: an old result
    moved aside is moved back when `path` holds no result, else removed; a temporary folder whose writer (a
    process on this machine) is gone is removed. Only headcoop's own files in folders of its own naming are
    touched; a writer still running is left alone."""
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        return []
    touched = []
    for entry in sorted(parent.iterdir()):
        match = _LEFTOVER.match(entry.name)
        if not match or match["name"] != path.name or entry.is_symlink() or not entry.is_dir():
            continue
        pid = parse_pid(match["pid"])
        if pid is None or (pid_alive(pid) and pid != os.getpid()):  # a malformed pid: not ours to judge
            continue
        if match["tag"] in _LIVE:
            continue  # a save of another thread of this process, still running
        if match["kind"] == "old" and _named_files(entry) is not None and not (path / META).is_file():
            if path.is_dir() and not any(path.iterdir()):
                path.rmdir()
            if not path.exists():
                os.rename(entry, path)
                print(f"restored the headcoop result at {path} from a save that was killed")
                touched.append(path)
                continue
        _remove_result(entry, staging=match["kind"] == "partial")
        touched.append(entry)
    return touched


def load_result(path: str | os.PathLike):
    """The result saved at `path` by `result.save` (ValueError naming what is wrong with a folder that is not
    one, or is damaged)."""
    if isinstance(path, bytes) or not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"load_result takes the folder a result was saved to (a str or Path), got {path!r} "
                        f"({type(path).__name__})")  # fmt: skip
    path = Path(path)
    try:
        clean_leftovers(path)
    except PermissionError:  # a killed writer's leftover in a folder this user cannot write: it is not the result
        pass
    meta_file = path / META
    if not meta_file.is_file():
        raise ValueError(f"{path} holds no {META}: it is not a saved headcoop result (result.save(path) writes one)")
    try:
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as err:
        raise ValueError(f"{meta_file} is damaged: {err}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(
            f"{meta_file} is not a headcoop result (its format is {meta.get('format') if isinstance(meta, dict) else meta!r})"
        )
    if meta.get("version") != VERSION:
        raise ValueError(
            f"{path} was saved in result format {meta.get('version')}; this headcoop reads format {VERSION}"
        )
    if "value" not in meta:
        raise ValueError(f"{meta_file} has no 'value' field: the folder is damaged")
    if (path / TENSORS).is_file() and not os.access(path / TENSORS, os.R_OK):
        raise PermissionError(errno.EACCES, f"cannot read {str(path / TENSORS)!r}: permission denied for this user")
    try:
        tensors = load_file(str(path / TENSORS)) if (path / TENSORS).is_file() else {}
    except Exception as err:  # safetensors raises its own error types for a damaged file
        raise ValueError(f"{path / TENSORS} is damaged: {err}") from None
    try:
        value = _Reader(path, tensors).decode(meta["value"])
    except RecursionError:
        raise ValueError(
            f"{meta_file} nests its values too deeply to be a headcoop result: the folder is damaged"
        ) from None
    except (TypeError, KeyError, IndexError, AttributeError) as err:  # a value of the wrong kind somewhere in the file
        raise ValueError(
            f"{meta_file} is damaged: a value it holds is not what its field takes ({type(err).__name__}: "
            f"{str(err)[:160]})"
        ) from None
    if not dataclasses.is_dataclass(value) or not type(value).__module__.startswith("headcoop."):
        raise ValueError(f"{meta_file} holds a bare {type(value).__name__}, not a headcoop result: the folder is "
                         "damaged or was not written by result.save")  # fmt: skip
    return value


def _check_target(path: Path) -> bool:
    """True when `path` holds a headcoop result to replace; ValueError when it holds anything else."""
    if path.is_symlink():
        raise ValueError(f"{path} is a symbolic link{'' if path.exists() else ' to nothing'}; give the folder itself "
                         "(headcoop replaces only a folder it wrote, never what a link points to)")  # fmt: skip
    if not path.exists():
        return False
    if not path.is_dir():
        raise ValueError(f"{path} is a file; a result is saved as a folder: give a new folder name")
    entries = list(path.iterdir())
    if not entries:
        return False
    named = _named_files(path)
    if named is None or any(e.name not in named or e.is_symlink() or not e.is_file() for e in entries):
        raise ValueError(f"{path} holds files that are not a headcoop result ({', '.join(sorted(e.name for e in entries)[:4])}); "
                         "headcoop will not replace them: give a new folder")  # fmt: skip
    return True


def _version() -> str:
    import headcoop

    return headcoop.__version__


class _Writer:
    """Encodes values as JSON, collecting tensors and tables under generated names."""

    def __init__(self):
        self.tensors: dict[str, torch.Tensor] = {}
        self.frames: dict[str, pd.DataFrame] = {}

    def encode(self, value, where: str):
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, (int, np.integer)):
            return int(value)
        if isinstance(value, (float, np.floating)):
            value = float(value)
            return value if math.isfinite(value) else {"__float__": repr(value)}
        if isinstance(value, torch.Tensor):
            key = f"t{len(self.tensors)}"
            self.tensors[key] = value.detach().cpu().contiguous().clone()
            return {"__tensor__": key}
        if isinstance(value, np.ndarray):
            if value.dtype == object:
                return {"__list_array__": self.encode(value.tolist(), where)}
            key = f"t{len(self.tensors)}"
            self.tensors[key] = torch.from_numpy(np.ascontiguousarray(value)).clone()
            return {"__ndarray__": key}
        if isinstance(value, pd.DataFrame):
            name = f"table-{len(self.frames)}.parquet"
            frame, encoded = _frame_for_parquet(value)
            self.frames[name] = frame
            return {"__frame__": name, "json_columns": encoded}
        if isinstance(value, pd.Series):
            return {"__series__": self.encode(value.to_frame(name=value.name if value.name is not None else 0), where),
                    "unnamed": value.name is None}  # fmt: skip
        if isinstance(value, FactoredMatrix):
            return {"__factored__": [self.encode(value.A, where), self.encode(value.B, where)]}
        if isinstance(value, tuple):
            return {"__tuple__": [self.encode(v, where) for v in value]}
        if isinstance(value, list):
            return [self.encode(v, where) for v in value]
        if isinstance(value, (set, frozenset)):
            items = sorted(value, key=repr)
            return {
                "__frozenset__" if isinstance(value, frozenset) else "__set__": [self.encode(v, where) for v in items]
            }
        if isinstance(value, dict):
            return {"__dict__": [[self.encode(k, where), self.encode(v, where)] for k, v in value.items()]}
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            cls = type(value)
            if not cls.__module__.startswith("headcoop."):
                raise TypeError(f"{where}: {cls.__name__} is not a headcoop class, so it cannot be saved")
            fields = {
                f.name: self.encode(getattr(value, f.name), f"{where}.{f.name}") for f in dataclasses.fields(value)
            }
            return {"__dataclass__": f"{cls.__module__}:{cls.__qualname__}", "fields": fields}
        raise TypeError(f"{where}: a {type(value).__name__} cannot be saved as a result (tensors, tables, numbers, "
                        "strings and containers of them can)")  # fmt: skip


class _Reader:
    def __init__(self, folder: Path, tensors: dict[str, torch.Tensor]):
        self.folder, self.tensors = folder, tensors

    def tensor(self, key: str) -> torch.Tensor:
        if key not in self.tensors:
            raise ValueError(
                f"{self.folder / TENSORS} lacks the tensor {key!r} that {META} names: the folder is damaged"
            )
        return self.tensors[key]

    def decode(self, value):
        if isinstance(value, list):
            return [self.decode(v) for v in value]
        if not isinstance(value, dict):
            return value
        if "__float__" in value:  # the non-finite floats JSON cannot hold, as repr writes them
            if value["__float__"] not in ("nan", "inf", "-inf"):
                raise ValueError(f"{self.folder / META} holds {{'__float__': {value['__float__']!r}}}: a saved "
                                 "non-finite number is 'nan', 'inf' or '-inf'; the folder is damaged")  # fmt: skip
            return float(value["__float__"])
        if "__tensor__" in value:
            return self.tensor(value["__tensor__"])
        if "__ndarray__" in value:
            return self.tensor(value["__ndarray__"]).numpy()
        if "__list_array__" in value:
            return np.array(self.decode(value["__list_array__"]), dtype=object)
        if "__frame__" in value:
            if not isinstance(value["__frame__"], str) or not re.fullmatch(r"table-\d+\.parquet", value["__frame__"]):
                raise ValueError(f"{self.folder / META} names the table {value['__frame__']!r}: a result's tables are "
                                 "table-N.parquet inside its own folder; refusing to read it")  # fmt: skip
            file = self.folder / value["__frame__"]
            if file.is_symlink() or not file.is_file():
                raise ValueError(f"{file} is {'a link' if file.is_symlink() else 'missing or not a file'}: a result's "
                                 "tables are regular files inside its own folder; refusing to read it")  # fmt: skip
            try:
                frame = pd.read_parquet(file)
            except Exception as err:  # pyarrow raises its own error types for a damaged file
                raise ValueError(f"{file} is missing or damaged: {err}") from None
            for column in value["json_columns"]:
                frame[column] = [_from_json(v) for v in frame[column]]
            return frame
        if "__series__" in value:
            frame = self.decode(value["__series__"])
            series = frame.iloc[:, 0]
            return series.rename(None) if value["unnamed"] else series
        if "__factored__" in value:
            a, b = (self.decode(v) for v in value["__factored__"])
            return FactoredMatrix(a, b)
        if "__tuple__" in value:
            return tuple(self.decode(v) for v in value["__tuple__"])
        if "__frozenset__" in value:
            return frozenset(self.decode(v) for v in value["__frozenset__"])
        if "__set__" in value:
            return set(self.decode(v) for v in value["__set__"])
        if "__dict__" in value:
            return {_hashable(self.decode(k)): self.decode(v) for k, v in value["__dict__"]}
        if "__dataclass__" in value:
            cls = _headcoop_class(value["__dataclass__"])
            if not isinstance(value.get("fields"), dict):
                raise ValueError(f"{self.folder / META}: the {cls.__name__} it holds has no 'fields' object")
            known = {f.name for f in dataclasses.fields(cls)}
            unknown = sorted(set(value["fields"]) - known)
            if unknown:
                raise ValueError(f"{self.folder / META}: {cls.__name__} has no field {unknown[0]!r} (it has "
                                 f"{', '.join(sorted(known))})")  # fmt: skip
            fields = {name: self.decode(v) for name, v in value["fields"].items()}
            try:
                return cls(**fields)
            except TypeError as err:
                raise ValueError(f"{self.folder / META}: cannot build its {cls.__name__}: {err}") from None
        raise ValueError(f"{self.folder / META} holds a value this headcoop does not know: {str(value)[:80]}")


def _hashable(key):
    return tuple(_hashable(k) for k in key) if isinstance(key, list) else key


def _headcoop_class(name: str) -> type:
    """The result class a file names ("module:Qualname"), from the registry of headcoop's own result classes only
    (`REGISTRY`, by class name: a file saved before a class moved to another module still loads). Nothing
    outside it is imported or built."""
    if not isinstance(name, str) or ":" not in name:
        raise ValueError(f"a saved result names the class {name!r}, which is not a headcoop result class: refusing it")
    qualname = name.partition(":")[2]
    if qualname not in REGISTRY:
        for module in RESULT_MODULES:
            importlib.import_module(module)
    cls = REGISTRY.get(qualname)
    if cls is None or not dataclasses.is_dataclass(cls):
        raise ValueError(f"a saved result names the class {name!r}, which is not one of headcoop's result classes "
                         f"({', '.join(sorted(REGISTRY)[:6])}, ...): refusing to build it")  # fmt: skip
    return cls


_CONTAINERS = (list, tuple, dict, set, frozenset, np.ndarray)


def _frame_for_parquet(frame: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The frame with every object column holding containers stored as JSON text (listed), so parquet keeps
    lists, tuples, sets and dicts exactly."""
    out, encoded = frame.copy(), []
    for column in out.columns:
        if out[column].dtype == object and any(isinstance(v, _CONTAINERS) for v in out[column]):
            out[column] = [_to_json(v) for v in out[column]]
            encoded.append(column)
    if not all(isinstance(c, str) for c in out.columns):
        raise TypeError(f"a table with non-text column names {list(out.columns)[:4]} cannot be saved as parquet")
    return out, encoded


def _to_json(value) -> str:
    def tag(v):
        if isinstance(v, tuple):
            return {"__tuple__": [tag(x) for x in v]}
        if isinstance(v, (set, frozenset)):
            return {"__set__": [tag(x) for x in sorted(v, key=repr)]}
        if isinstance(v, dict):
            return {"__dict__": [[tag(k), tag(x)] for k, x in v.items()]}
        if isinstance(v, list):
            return [tag(x) for x in v]
        if isinstance(v, np.ndarray):
            return {"__array__": tag(v.tolist())}
        if isinstance(v, (np.integer,)):
            return int(v)
        if isinstance(v, (np.floating,)):
            return float(v)
        return v

    return json.dumps(tag(value), allow_nan=True)


def _from_json(text):
    if not isinstance(text, str):
        return text

    def untag(v):
        if isinstance(v, list):
            return [untag(x) for x in v]
        if isinstance(v, dict):
            if "__tuple__" in v:
                return tuple(untag(x) for x in v["__tuple__"])
            if "__set__" in v:
                return set(untag(x) for x in v["__set__"])
            if "__dict__" in v:
                return {_hashable(untag(k)): untag(x) for k, x in v["__dict__"]}
            if "__array__" in v:
                return np.array(untag(v["__array__"]))
        return v

    return untag(json.loads(text))
