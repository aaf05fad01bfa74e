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
import importlib
import json
import math
import os
import shutil
import uuid
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from safetensors.torch import load_file, save_file
from transformer_lens import FactoredMatrix

from headcoop.plot import Displayed

FORMAT = "headcoop-result"
VERSION = 1
META = "result.json"
TENSORS = "tensors.safetensors"


class Result(Displayed):
    """What every analysis result shares: its notebook display (`headcoop.plot.Displayed`) and `save`."""

    def save(self, path: str | os.PathLike) -> Path:
        """Write this result to the folder `path` (tables as parquet, tensors as safetensors, the rest as JSON;
        never a pickle); `hc.load_result(path)` reads it back. Returns the path."""
        return save_result(self, path)


def save_result(result, path: str | os.PathLike) -> Path:
    """Write `result` (any headcoop analysis result) to the folder `path`; returns the path. A folder that
    exists must be empty or hold a headcoop result (replaced, with a message); anything else is refused."""
    if not dataclasses.is_dataclass(result) or not type(result).__module__.startswith("headcoop."):
        raise TypeError(f"save_result takes a headcoop analysis result, got {type(result).__name__}")
    path = Path(path)
    replacing = _check_target(path)
    writer = _Writer()
    fields = writer.encode(result, "result")
    staging = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.partial")
    staging.mkdir(parents=True)
    try:
        meta = {"format": FORMAT, "version": VERSION, "headcoop": _version(), "value": fields}
        (staging / META).write_text(json.dumps(meta, indent=1, allow_nan=True), encoding="utf-8")
        save_file(writer.tensors, str(staging / TENSORS))
        for name, frame in writer.frames.items():
            frame.to_parquet(staging / name)
        if replacing:
            old = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.old")
            os.replace(path, old)
            os.replace(staging, path)
            shutil.rmtree(old)
            print(f"replaced the headcoop result at {path}")
        else:
            if path.exists():
                path.rmdir()  # empty, checked above
            os.replace(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return path


def load_result(path: str | os.PathLike):
    """The result saved at `path` by `result.save` (ValueError naming what is wrong with a folder that is not
    one, or is damaged)."""
    path = Path(path)
    meta_file = path / META
    if not meta_file.is_file():
        raise ValueError(f"{path} holds no {META}: it is not a saved headcoop result (result.save(path) writes one)")
    try:
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
    except ValueError as err:
        raise ValueError(f"{meta_file} is damaged: {err}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{meta_file} is not a headcoop result (its format is {meta.get('format') if isinstance(meta, dict) else meta!r})")
    if meta.get("version") != VERSION:
        raise ValueError(f"{path} was saved in result format {meta.get('version')}; this headcoop reads format {VERSION}")
    try:
        tensors = load_file(str(path / TENSORS)) if (path / TENSORS).is_file() else {}
    except Exception as err:  # safetensors raises its own error types for a damaged file
        raise ValueError(f"{path / TENSORS} is damaged: {err}") from None
    return _Reader(path, tensors).decode(meta["value"])


def _check_target(path: Path) -> bool:
    """True when `path` holds a headcoop result to replace; ValueError when it holds anything else."""
    if not path.exists():
        return False
    if not path.is_dir():
        raise ValueError(f"{path} is a file; a result is saved as a folder: give a new folder name")
    entries = list(path.iterdir())
    if not entries:
        return False
    try:
        is_result = json.loads((path / META).read_text(encoding="utf-8")).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        is_result = False
    ours = {META, TENSORS}
    if not is_result or any(e.name not in ours and not (e.name.startswith("table-") and e.suffix == ".parquet")
                            for e in entries):  # fmt: skip
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
            return {"__frozenset__" if isinstance(value, frozenset) else "__set__": [self.encode(v, where) for v in items]}
        if isinstance(value, dict):
            return {"__dict__": [[self.encode(k, where), self.encode(v, where)] for k, v in value.items()]}
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            cls = type(value)
            if not cls.__module__.startswith("headcoop."):
                raise TypeError(f"{where}: {cls.__name__} is not a headcoop class, so it cannot be saved")
            fields = {f.name: self.encode(getattr(value, f.name), f"{where}.{f.name}") for f in dataclasses.fields(value)}
            return {"__dataclass__": f"{cls.__module__}:{cls.__qualname__}", "fields": fields}
        raise TypeError(f"{where}: a {type(value).__name__} cannot be saved as a result (tensors, tables, numbers, "
                        "strings and containers of them can)")  # fmt: skip


class _Reader:
    def __init__(self, folder: Path, tensors: dict[str, torch.Tensor]):
        self.folder, self.tensors = folder, tensors

    def tensor(self, key: str) -> torch.Tensor:
        if key not in self.tensors:
            raise ValueError(f"{self.folder / TENSORS} lacks the tensor {key!r} that {META} names: the folder is damaged")
        return self.tensors[key]

    def decode(self, value):
        if isinstance(value, list):
            return [self.decode(v) for v in value]
        if not isinstance(value, dict):
            return value
        if "__float__" in value:
            return float(value["__float__"])
        if "__tensor__" in value:
            return self.tensor(value["__tensor__"])
        if "__ndarray__" in value:
            return self.tensor(value["__ndarray__"]).numpy()
        if "__list_array__" in value:
            return np.array(self.decode(value["__list_array__"]), dtype=object)
        if "__frame__" in value:
            file = self.folder / value["__frame__"]
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
            fields = {name: self.decode(v) for name, v in value["fields"].items()}
            return cls(**fields)
        raise ValueError(f"{self.folder / META} holds a value this headcoop does not know: {str(value)[:80]}")


def _hashable(key):
    return tuple(_hashable(k) for k in key) if isinstance(key, list) else key


def _headcoop_class(name: str) -> type:
    """The class `module:qualname`, only from headcoop's own modules (a result file cannot import others)."""
    module, _, qualname = name.partition(":")
    if not module.startswith("headcoop.") or not qualname:
        raise ValueError(f"a saved result names the class {name!r}, which is not headcoop's: refusing to load it")
    try:
        cls = importlib.import_module(module)
        for part in qualname.split("."):
            cls = getattr(cls, part)
    except (ImportError, AttributeError):
        raise ValueError(f"a saved result names the class {name!r}, which this headcoop does not have") from None
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise ValueError(f"a saved result names {name!r}, which is not a result class")
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
