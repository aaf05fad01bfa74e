"""The rules the tree keeps (issue 46), read from the code with `ast` (nothing imported): no import circles, no
upward imports between layers, no private name imported across modules, every analysis choice set in
`analysis/vocabulary.py`, attention arithmetic in `analysis/engine/kernels.py`, and no function over 80 lines
without a one-line reason in its docstring (a line starting "Long:")."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "headcoop"

# Layers, lowest first: a module may import its own layer and the ones below, never one above (docs/architecture.md).
LAYERS = [
    ("base", ["headcoop.paths", "headcoop.checks", "headcoop.threads", "headcoop.analysis.vocabulary"]),
    ("display", ["headcoop.display"]),
    ("models", ["headcoop.models"]),
    ("tasks", ["headcoop.tasks"]),
    ("storage", ["headcoop.storage"]),
    ("engine", ["headcoop.analysis.engine"]),
    ("weights", ["headcoop.analysis.weights"]),
    ("nodes", ["headcoop.analysis.nodes"]),
    ("edges", ["headcoop.analysis.edges"]),
    ("games", ["headcoop.analysis.games"]),
    ("mechanisms", ["headcoop.analysis.mechanisms"]),
    ("pairs", ["headcoop.analysis.pairs"]),
    ("studies", ["headcoop.studies"]),
    ("training", ["headcoop.training"]),
    ("reporting", ["headcoop.reporting"]),
    ("cli", ["headcoop.cli", "headcoop.__main__"]),
]


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        name = ".".join(rel.parts)
        out[name.removesuffix(".__init__")] = path
    return out


MODULES = _modules()
TREES = {name: ast.parse(path.read_text()) for name, path in MODULES.items()}


def _imports(name: str) -> list[tuple[str, str]]:
    """(module imported, name imported) for every `from headcoop... import x` / `import headcoop...` in a module."""
    package = name if MODULES[name].name == "__init__.py" else name.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(TREES[name]):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - (node.level - 1)] + ([base] if base else []))
            if base.startswith("headcoop"):
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    found.append((full if full in MODULES else base, alias.name))
        elif isinstance(node, ast.Import):
            found += [(a.name, "") for a in node.names if a.name.startswith("headcoop")]
    return [(target, what) for target, what in found if target in MODULES and target != name]


def _layer(name: str) -> int | None:
    best = None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and (best is None or len(prefix) > best[1]):
                best = (index, len(prefix))
    return None if best is None else best[0]


def test_every_module_has_a_layer():
    assert [n for n in MODULES if n != "headcoop" and _layer(n) is None and not n.startswith("headcoop.analysis")
            or n == "headcoop.analysis.__init__"] == []  # fmt: skip


def test_no_import_circles():
    graph = {name: {t for t, _ in _imports(name)} for name in MODULES}
    index, low, stack, on, circles, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1 and not all(MODULES[m].name == "__init__.py" for m in part):
                circles.append(sorted(part))

    for v in graph:
        if v not in index:
            strong(v)
    assert circles == []


def test_no_upward_imports():
    upward = []
    for name in MODULES:
        here = _layer(name)
        for target, _ in _imports(name):
            there = _layer(target)
            if here is not None and there is not None and there > here:
                upward.append(f"{name} ({LAYERS[here][0]}) imports {target} ({LAYERS[there][0]})")
    assert upward == []


def test_no_private_name_crosses_a_module():
    crossing = [f"{name} imports {what} from {target}" for name in MODULES for target, what in _imports(name)
                if what.startswith("_") and not what.startswith("__")]  # fmt: skip
    assert crossing == []


def test_every_analysis_choice_set_lives_in_the_vocabulary():
    """A `Name = Literal[...]` choice set in analysis/ is defined in analysis/vocabulary.py only."""
    outside = []
    for name, tree in TREES.items():
        if not name.startswith("headcoop.analysis") or name == "headcoop.analysis.vocabulary":
            continue
        for node in tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Subscript):
                if getattr(node.value.value, "id", None) == "Literal":
                    outside.append(f"{name}: {ast.unparse(node.targets[0])}")
    assert outside == []


def test_attention_arithmetic_lives_in_the_kernels():
    """The softmax of attention scores is taken in engine/kernels.py only (every other module calls it)."""
    found = []
    for name, path in MODULES.items():
        if name.startswith("headcoop.analysis") and name != "headcoop.analysis.engine.kernels":
            text = path.read_text()
            if "softmax(" in text and ("attn_scores" in text or "scores" in text) and "def softmax" not in text:
                for number, line in enumerate(text.splitlines(), 1):
                    if ".softmax(" in line and "scores" in line:
                        found.append(f"{name}:{number}")
    assert found == []


def code_lines(node) -> int:
    """A function's lines of code, its docstring left out (as ../shared/tools/house_rules.py counts them)."""
    lines = node.end_lineno - node.lineno + 1
    first = node.body[0] if node.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        lines -= first.end_lineno - first.lineno + 1
    return lines


def test_long_functions_say_why():
    """A function over 80 lines of code says why in a "Long:" line of its docstring; none is over 120."""
    long, too_long = [], []
    for name, tree in TREES.items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and code_lines(node) > 80:
                doc = ast.get_docstring(node) or ""
                if not any(line.strip().startswith("Long:") for line in doc.splitlines()):
                    long.append(f"{name}.{node.name} ({code_lines(node)} lines)")
                if code_lines(node) > 120:
                    too_long.append(f"{name}.{node.name} ({code_lines(node)} lines)")
    assert long == [] and too_long == []


@pytest.mark.parametrize("rule", ["circles", "upward"])
def test_the_rules_can_fail(rule, tmp_path):
    """The readers above see a planted violation (so the tests above can fail)."""
    global MODULES, TREES
    saved = MODULES, TREES
    try:
        MODULES = dict(MODULES)
        TREES = dict(TREES)
        if rule == "circles":
            MODULES["headcoop.fake_a"], MODULES["headcoop.fake_b"] = tmp_path / "a.py", tmp_path / "b.py"
            TREES["headcoop.fake_a"] = ast.parse("from headcoop.fake_b import x")
            TREES["headcoop.fake_b"] = ast.parse("from headcoop.fake_a import y")
            with pytest.raises(AssertionError):
                test_no_import_circles()
        else:
            TREES["headcoop.analysis.engine.copies"] = ast.parse("from headcoop.analysis.nodes.patching import patch")
            with pytest.raises(AssertionError):
                test_no_upward_imports()
    finally:
        MODULES, TREES = saved


def test_no_import_circles_in_the_experiments():
    """Issue 64: experiments/ had one circle (groundtruth/page.py and tracr/page.py imported each other); the
    figure helper both use now lives in experiments/shared.py. Imports inside functions count too."""
    root = PACKAGE.parent / "experiments"
    names = {".".join(p.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__"): p
             for p in root.rglob("*.py")}  # fmt: skip
    graph = {}
    for name, path in names.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("experiments"):
                targets |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in names else node.module
                            for a in node.names}  # fmt: skip
            elif isinstance(node, ast.Import):
                targets |= {a.name for a in node.names if a.name.startswith("experiments")}
        graph[name] = {t for t in targets if t in names and t != name and not name.startswith(t + ".")}

    def reaches(start, goal, seen):
        for nxt in graph[start]:
            if nxt == goal or (nxt not in seen and (seen.add(nxt) or reaches(nxt, goal, seen))):
                return True
        return False

    circles = sorted(n for n in graph if reaches(n, n, set()))
    assert circles == []
