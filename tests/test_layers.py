"""The package's layers, read from the sources: who may import whom, no import circle, no oversize file.

Layers, bottom up (docs/architecture.md): the leaf modules at the package root (errors.py,
atomic.py), then runtime/ (the torch-free library an app embeds: it imports nothing outside
itself) and model/ (the PyTorch side: only itself and the leaves), then export/ (model, runtime),
serve/ (the HTTP server: runtime and the leaves, never torch), bench/ (all of those), and commands/
on top, which nothing imports. Every import counts, at the top of a module or inside a function.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("runtime", "model", "export", "serve", "bench", "commands")
LEAVES = {"seq2onnx.errors", "seq2onnx.atomic"}
# What each layer may import besides itself and the standard library / third-party packages.
ALLOWED = {
    "runtime": set(),
    "model": {"leaves"},
    "export": {"leaves", "model", "runtime"},
    "serve": {"leaves", "runtime"},  # torch-free: a service installs seq2onnx[serve,cpu]
    "bench": {"leaves", "model", "runtime", "export", "serve"},
    "commands": {"leaves", "model", "runtime", "export", "serve", "bench"},
    "root": {"leaves", "runtime"},  # seq2onnx/__init__.py: the lazy Translator
}
# A backstop only: the size that matters is a function's, which ruff's C901, PLR0912 and PLR0915
# measure (pyproject.toml, issue 38); a file past this has more than one job.
MAX_LINES = 450


def _modules() -> dict[str, Path]:
    found = {"seq2onnx": ROOT / "__init__.py"}
    for path in ROOT.glob("*.py"):
        if path.name != "__init__.py":
            found[f"seq2onnx.{path.stem}"] = path
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(("seq2onnx", *parts))
            found[name.removesuffix(".__init__")] = path
    return found


@functools.lru_cache(maxsize=None)
def _tree(path: Path) -> ast.Module:
    """A file's syntax tree, parsed once per process: four tests here read every file of the package."""
    return ast.parse(path.read_text(encoding="utf-8"))


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that `name` imports (resolved to modules, not names in them)."""
    is_package = path.name == "__init__.py"
    out = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")[: len(name.split(".")) - node.level + is_package]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [f"{module}.{a.name}" for a in node.names] + [module]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            package_itself = target == "seq2onnx" and len(targets) > 1  # `from seq2onnx import x` counts x
            if target.startswith("seq2onnx") and target != name and not package_itself:
                out.add(target)
    return out


def _layer(module: str) -> str:
    if module in LEAVES:
        return "leaves"
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in PACKAGES else "root"


@functools.lru_cache(maxsize=None)
def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def test_the_scan_sees_the_package():
    graph = _graph()
    assert {"seq2onnx.runtime.translator", "seq2onnx.commands.main", "seq2onnx.model.train"} <= set(graph)
    # a known edge, so that a scan that found nothing would fail here
    assert "seq2onnx.runtime.bundle" in graph["seq2onnx.runtime.translator"]
    assert "seq2onnx.model.checkpoint" in graph["seq2onnx.export.bundle"]
    assert "seq2onnx.serve.engine" in graph["seq2onnx.serve.app"]


def test_each_layer_imports_only_the_layers_below_it():
    bad = []
    for module, targets in _graph().items():
        layer = _layer(module)
        if layer == "leaves":
            bad += [(module, t) for t in targets]  # leaves import nothing of the package
            continue
        for target in targets:
            other = _layer(target)
            if other != layer and other not in ALLOWED[layer]:
                bad.append((module, target))
    listed = ", ".join(f"{a} -> {b}" for a, b in bad)
    assert not bad, f"imports against the layers (module -> import): {listed}"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_circle():
    cycles = _cycles(_graph())
    assert not cycles, f"import circles: {cycles}"


def test_the_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("path", sorted(_modules().values()), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_file_over_the_size_limit(path):
    lines = len(path.read_text(encoding="utf-8").splitlines())
    where = path.relative_to(ROOT)
    assert lines <= MAX_LINES, f"{where} has {lines} lines (limit {MAX_LINES}): split it by job"


# Functions are split by job too (issue 56): def to last line, docstring included.
MAX_FUNCTION_LINES = 60


def _long_functions(path: Path, root: Path = ROOT) -> list[tuple[str, int, str, int]]:
    """(file, line, name, length) of each function or method in `path` over MAX_FUNCTION_LINES."""
    where = path.relative_to(root).as_posix()
    out = []
    for node in ast.walk(_tree(path)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                out.append((where, node.lineno, node.name, length))
    return out


def test_no_function_over_the_size_limit():
    bad = [f for path in sorted(_modules().values()) for f in _long_functions(path)]
    listed = "; ".join(f"{file}:{line} {name} has {n} lines" for file, line, name, n in bad)
    assert not bad, f"functions over {MAX_FUNCTION_LINES} lines (def to end): {listed}; split them by job"


def test_the_function_scan_finds_a_long_one(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "m.py").write_text(f"def short():\n    pass\n\n\ndef f():\n{body}\n", encoding="utf-8")
    found = _long_functions(tmp_path / "m.py", tmp_path)
    assert [(file, line, name, n) for file, line, name, n in found] == [
        ("m.py", 5, "f", MAX_FUNCTION_LINES + 1)
    ]
