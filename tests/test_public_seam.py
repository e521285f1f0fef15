"""Outside runtime/, the runtime is driven through its public seam only (issue 36).

serve/, export/, commands/, bench/ and scripts/ reach no private member of a runtime object (`x._name`
or getattr(x, "_name") where x is not self or cls, and _name is a private name that runtime/ defines) and
import no private name from seq2onnx.runtime: the runtime's public API (Translator.plan, search,
decoder_step, encode, detokenize, ...; runtime/plan.py) is what they drive, so that the runtime may change
its internals without breaking the server or the benchmarks. No type is inferred, the name decides: a
private name that runtime/ does not define (sys._current_frames, a benchmark's own helper) is not the
runtime's.
"""

from __future__ import annotations

import ast
import functools
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("serve", "export", "commands", "bench", "scripts")
# Reaches into the runtime in files another change owned when the seam was made: each has its public
# replacement already, and goes when its file is next edited (then its entry goes too).
PENDING: dict[tuple[str, str], str] = {}
ACCESSORS = ("getattr", "setattr", "hasattr", "delattr")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _is_self(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


@functools.lru_cache(maxsize=None)
def runtime_private_names() -> frozenset[str]:
    """Every private name runtime/ defines: its functions, classes, methods, attributes (self._x = ...),
    class fields and module names (local variables too: more names only make the check stricter)."""
    names = set()
    for path in (ROOT / "runtime").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return frozenset(n for n in names if _private(n))


def private_reaches(source: str, runtime_names: frozenset[str] | None = None) -> list[tuple[int, str]]:
    """Returns (line, expression) of each reach into the runtime's privates in a module's source.

    A reach is an attribute `x._name` (read, written or deleted) or getattr/setattr/hasattr/delattr(x,
    "_name"), where x is anything but the names self and cls and _name is one of runtime_names (default:
    runtime_private_names()); or an import of a private name or module of seq2onnx.runtime. Dunders
    (`__name__`) are not private.
    """
    runtime_names = runtime_private_names() if runtime_names is None else runtime_names
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in runtime_names and not _is_self(node.value):
            found.append((node.lineno, ast.unparse(node)))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ACCESSORS
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in runtime_names
            and not _is_self(node.args[0])
        ):
            found.append((node.lineno, ast.unparse(node)))
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").startswith("seq2onnx.runtime")
        ):
            for alias in node.names:
                if _private(alias.name) or any(_private(part) for part in node.module.split(".")):
                    found.append((node.lineno, f"from {node.module} import {alias.name}"))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if alias.name.startswith("seq2onnx.runtime") and any(_private(p) for p in parts):
                    found.append((node.lineno, f"import {alias.name}"))
    return sorted(found)


def _modules() -> list[Path]:
    return sorted(
        p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts
    )


def test_no_module_outside_the_runtime_reaches_a_private_member():
    reaches = []
    for path in _modules():
        rel = path.relative_to(ROOT).as_posix()
        for line, expression in private_reaches(path.read_text(encoding="utf-8")):
            if (rel, expression) not in PENDING:
                reaches.append(f"{rel}:{line}: {expression}")
    assert not reaches, (
        "private members reached outside runtime/ (use the Translator's public seam, "
        "runtime/plan.py):\n" + "\n".join(reaches)
    )


def test_the_pending_reaches_have_public_replacements():
    from seq2onnx.runtime.fused_step import FusedStep

    assert isinstance(FusedStep.cache, property)


def test_the_runtime_s_private_names_are_known():
    known = runtime_private_names()
    assert {"_decode", "_sessions", "_spares", "_cache", "_Forced", "_regroup"} <= known
    assert "_current_frames" not in runtime_private_names()  # the standard library's: not the runtime's


@pytest.mark.parametrize(
    "planted, expression",
    [
        ("def f(translator):\n    return translator._spares.pop()\n", "translator._spares"),
        ("def f(engine):\n    engine.translator._decode = None\n", "engine.translator._decode"),
        ("def f(step):\n    return step.inner._cache\n", "step.inner._cache"),
        ("def f(t):\n    return getattr(t, '_sessions')\n", "getattr(t, '_sessions')"),
        ("from seq2onnx.runtime.plan import _regroup\n", "from seq2onnx.runtime.plan import _regroup"),
        ("from seq2onnx.runtime._hidden import x\n", "from seq2onnx.runtime._hidden import x"),
        ("import seq2onnx.runtime._hidden\n", "import seq2onnx.runtime._hidden"),
    ],
)
def test_a_planted_private_reach_is_caught(planted, expression):
    assert [e for _, e in private_reaches(planted)] == [expression]


def test_self_cls_dunders_and_public_names_are_not_reaches():
    clean = (
        "import sys\n"
        "from seq2onnx.runtime.translator import Translator as _T\n"
        "class A:\n"
        "    def f(self, t):\n"
        "        self._decode = t.decoder_step\n"
        "        return (cls._cache, t.__class__, getattr(t, 'plan'), getattr(self, '_sessions'),\n"
        "                sys._current_frames())\n"
    )
    assert private_reaches(clean) == []


def test_a_planted_reach_in_a_module_of_the_package_fails_the_check(tmp_path, monkeypatch):
    """The check over the package's files, run on a copy of serve/ with one private reach planted."""
    fake = tmp_path / "root"
    shutil.copytree(ROOT / "serve", fake / "serve", ignore=shutil.ignore_patterns("__pycache__"))
    for folder in FOLDERS[1:]:
        (fake / folder).mkdir()
    batcher = fake / "serve" / "batcher.py"
    planted = "\n\ndef planted(t):\n    return t._spares\n"
    batcher.write_text(batcher.read_text(encoding="utf-8") + planted, encoding="utf-8")
    runtime_private_names()  # read from the real runtime/ before ROOT moves (the copy has none)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", fake)
    with pytest.raises(AssertionError, match=r"serve/batcher.py:\d+: t._spares"):
        test_no_module_outside_the_runtime_reaches_a_private_member()
