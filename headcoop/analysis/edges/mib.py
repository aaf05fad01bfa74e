"""Export a circuit in the file format the MIB leaderboard's circuit-localization track reads: EAP-IG's graph
JSON (`Graph.to_json` / `Graph.from_json` in hannamw/EAP-IG, `src/eap/graph.py`, which MIB's evaluation loads).

The file holds `cfg` (n_layers, n_heads, parallel_attn_mlp, d_model), `nodes` ({name: {"in_graph": bool}}) and
`edges` ({name: {"score": float, "in_graph": bool}}). Node names: "input" (the embeddings: hc.edges' "embed" and
"pos_embed" together), "a{layer}.h{head}", "m{layer}", "logits"; edge names "parent->child", with "<q>", "<k>" or
"<v>" after a head child ("input->a0.h3<q>", "a0.h3->m0", "m11->logits"). An edge from the embeddings scores
the sum of hc.edges' embed and pos_embed scores, and is in the circuit when either is.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from headcoop.analysis.edges.graph import graph, reader_name, writer_name
from headcoop.analysis.edges.scores import EdgeResult
from headcoop.paths import check_out_file
from headcoop.storage.owners import parse_pid, pid_alive


def _node(name: str) -> str:
    if name in ("embed", "pos_embed"):
        return "input"
    if name == "logits":
        return "logits"
    if name.startswith("MLP"):
        return f"m{name[3:]}"
    layer, head = name[1:].split("H")
    return f"a{layer}.h{head}"


def mib_graph(edges: EdgeResult, circuit=None, model=None) -> dict:
    """The EAP-IG / MIB graph dictionary of an EdgeResult (scores: the exact value where verified, else the
    estimate), with `circuit` (an hc.circuit, or None: no edge) marking in_graph. `model` gives the cfg."""
    if not isinstance(edges, EdgeResult):
        raise TypeError(f"the MIB export takes an EdgeResult (hc.edges), got {type(edges).__name__}")
    if model is None or not hasattr(model, "cfg"):
        raise ValueError(f"the MIB export needs the model the edges were scored on (for the file's cfg), got "
                         f"{type(model).__name__}: pass model=, the HookedTransformer hc.edges ran on")  # fmt: skip
    kv = model.cfg.n_key_value_heads
    if kv is not None and kv != model.cfg.n_heads:
        raise ValueError(
            "MIB's graph format names one q, k and v input per head; this grouped-query model shares "
            f"k and v inputs ({kv} key/value heads for {model.cfg.n_heads} query heads): no export"
        )
    frame = edges.to_dataframe()
    mine = set(zip(frame.writer, frame.reader, frame.via))
    if mine != {(writer_name(w), *reader_name(r)) for w, r in graph(model)[2]}:
        raise ValueError(f"these edges were not scored on this model: its graph has {len(graph(model)[2])} edges, the "
                         f"EdgeResult {len(frame)} with other names; pass the model hc.edges ran on")  # fmt: skip
    score = frame.exact.where(frame.exact.notna(), frame.score)
    bad = ~np.isfinite(score.to_numpy(dtype=float))
    if bad.any():
        first = frame[bad].iloc[0]
        raise ValueError(f"{int(bad.sum())} edge scores are NaN or inf (first: {first.writer} -> {first.reader} "
                         f"{first.via}, {score[bad].iloc[0]}): JSON has no such number and MIB could not read the file; "
                         "score the edges with a finite metric (its clean and corrupt values differ)")  # fmt: skip
    if circuit is not None and not isinstance(getattr(circuit, "edges", None), (set, frozenset, list, tuple)):
        raise TypeError(f"circuit= takes an hc.circuit (or None: no edge in the graph), got {type(circuit).__name__}")
    kept = set(circuit.edges) if circuit is not None else set()
    unknown = sorted(kept - mine)
    if unknown:
        raise ValueError(f"the circuit has edges that are not in the graph: {unknown[:3]} (writer, reader, via names "
                         "as hc.edges gives them)")  # fmt: skip
    out_edges: dict[str, dict] = {}
    for (w, r, via), s in zip(zip(frame.writer, frame.reader, frame.via), score):
        parent, child = _node(w), _node(r)
        name = f"{parent}->{child}" + (f"<{via}>" if via in ("q", "k", "v") else "")
        entry = out_edges.setdefault(name, {"score": 0.0, "in_graph": False})
        entry["score"] += float(s)
        entry["in_graph"] = entry["in_graph"] or (w, r, via) in kept
    nodes = {"input": {"in_graph": True}}
    cfg = model.cfg
    for lay in range(cfg.n_layers):
        for h in range(cfg.n_heads):
            nodes[f"a{lay}.h{h}"] = {"in_graph": False}
        nodes[f"m{lay}"] = {"in_graph": False}
    nodes["logits"] = {"in_graph": True}
    for name, entry in out_edges.items():
        if entry["in_graph"]:
            parent, child = name.split("->")
            nodes[parent]["in_graph"] = True
            nodes[child.split("<")[0]]["in_graph"] = True
    return {"cfg": {"n_layers": cfg.n_layers, "n_heads": cfg.n_heads, "parallel_attn_mlp": bool(cfg.parallel_attn_mlp),
                    "d_model": cfg.d_model},
            "nodes": nodes, "edges": out_edges}  # fmt: skip


def export_mib(edges: EdgeResult, path: str | os.PathLike, model, circuit=None, overwrite: bool = False) -> Path:
    """Write the MIB / EAP-IG graph JSON of `edges` (and `circuit`) to `path`; returns the path. An existing file
    is an error unless overwrite=True; the file is written whole or not at all."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a file name (str or Path), got {type(path).__name__}")
    if not isinstance(overwrite, bool):
        raise TypeError(f"overwrite must be True or False, got {overwrite!r}")
    path = Path(path)
    if path.exists() and path.is_dir() and not path.is_symlink():
        raise IsADirectoryError(f"{str(path)!r} is a folder; give a file name such as circuit.json")
    # a FIFO, a device, a dangling link or a path under a regular file is never written, and named
    path = check_out_file(path, "the MIB export")
    if path.exists() and not overwrite:
        raise FileExistsError(f"{str(path)!r} exists; pass overwrite=True to replace it")
    data = json.dumps(mib_graph(edges, circuit, model), allow_nan=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{path.name}.mib-*.tmp"):  # what a killed export left
        pid = parse_pid(stale.name.rsplit("-", 1)[1][: -len(".tmp")])  # a malformed pid: not ours, left alone
        if pid is not None and not pid_alive(pid):
            stale.unlink(missing_ok=True)
    # the file's mode: the one it replaces, else what the user's umask gives a new file
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o666 & ~_umask()
    tmp = path.with_name(f".{path.name}.mib-{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "w") as f:
            f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except PermissionError as err:
        Path(tmp).unlink(missing_ok=True)
        raise PermissionError(
            err.errno, f"cannot write {str(path)!r}: {err.strerror} in {str(path.parent)!r}"
        ) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


__all__ = ["export_mib", "mib_graph"]
