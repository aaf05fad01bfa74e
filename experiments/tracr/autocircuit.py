"""auto-circuit's published reference circuits for Tracr `reverse` and `xproportion`, read at bench time from
the installed auto-circuit package (1.0.1: `pip install --no-deps auto-circuit==1.0.1`; its source is parsed,
not imported, so none of its dependencies are needed), in hc.edges' names. Nothing of it is copied here.

auto-circuit names edges "Resid Start->A3.0.V", "MLP 2->A3.0.Q", "A3.0->Resid End": Resid Start is the
embeddings (both hc.edges writers, embed and pos_embed), Resid End the logits, A3.0 head 0 of layer 3, MLP 2
the MLP of layer 2. Its `*_official_edges` / `*_true_edges` functions give the circuit to keep under resample
ablation, its `*_acdc_edges` the one under zero ablation (its docstrings)."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

FILES = {"reverse": "reverse_official.py", "xproportion": "xproportion_official.py"}


def _package() -> Path | None:
    spec = importlib.util.find_spec("auto_circuit")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def version() -> str | None:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as v

    try:
        return v("auto-circuit")
    except PackageNotFoundError:
        return None


def _node(name: str) -> list[str]:
    name = name.strip()
    if name == "Resid Start":
        return ["embed", "pos_embed"]
    if name == "Resid End":
        return ["logits"]
    m = re.fullmatch(r"A(\d+)\.(\d+)", name)
    if m:
        return [f"L{m[1]}H{m[2]}"]
    m = re.fullmatch(r"MLP (\d+)", name)
    if m:
        return [f"MLP{m[1]}"]
    raise ValueError(f"unknown auto-circuit node {name!r}")


def to_edges(name: str) -> list[tuple[str, str, str]]:
    """One auto-circuit edge name as hc.edges (writer, reader, via) triples."""
    src, dst = name.split("->")
    via = "direct"
    m = re.fullmatch(r"(.+)\.([QKV])", dst.strip())
    if m:
        dst, via = m[1], m[2].lower()
    readers = _node(dst)
    if via == "direct" and readers != ["logits"]:
        via = "in"
    return [(w, r, via) for w in _node(src) for r in readers]


def reference_circuits() -> dict[str, dict[str, list[tuple[str, str, str]]]] | None:
    """{program: {function name: edges}} from the installed package; None when auto-circuit is not installed."""
    root = _package()
    if root is None:
        return None
    out: dict[str, dict] = {}
    for program, file in FILES.items():
        path = root / "metrics" / "official_circuits" / "circuits" / "tracr" / file
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
            names = [node.targets[0].slice.value for node in ast.walk(fn)
                     if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Subscript)
                     and isinstance(node.targets[0].value, ast.Name) and node.targets[0].value.id == "edges_present"]  # fmt: skip
            out.setdefault(program, {})[fn.name] = sorted({e for n in names for e in to_edges(n)})
    return out
