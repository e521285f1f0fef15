"""The package's longest functions, and its lines over the line-length limit: a maintainer's tool.

    python scripts/longest_functions.py [-n 20] [--width 110] [--all]

Reads the sources with `ast` (nothing is imported) and prints the N longest functions and methods
of the package (the root modules, runtime/, model/, export/, serve/, bench/, commands/), each as
`file:line  length  name`, where the length runs from the `def` line to the function's last line,
nested functions counted in their parent too. Then the count of lines longer than --width
characters, per file. With --all, tests/ and scripts/ are read as well.

This is the "before and after" of issue 38: the size the linter's complexity rules (C901, PLR0912,
PLR0915 in pyproject.toml) keep in check is the function's, not the file's.
"""
from __future__ import annotations

import argparse
import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("runtime", "model", "export", "serve", "bench", "commands")
EXTRA = ("tests", "scripts")


@dataclass(frozen=True)
class Function:
    path: str  # relative to the checkout
    line: int  # the `def` line
    length: int  # lines, `def` to the last line of the body
    name: str  # qualified: Class.method, outer.inner


def source_files(include_extra: bool) -> list[Path]:
    """The package's .py files (and tests/ and scripts/ with `include_extra`), sorted."""
    files = list(ROOT.glob("*.py"))
    for folder in PACKAGES + (EXTRA if include_extra else ()):
        files += (ROOT / folder).rglob("*.py")
    return sorted(p for p in files if ".venv" not in p.parts)


def functions(path: Path) -> list[Function]:
    """Every function and method defined in `path`, at any depth."""
    rel = str(path.relative_to(ROOT))
    found: list[Function] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                found.append(Function(rel, child.lineno, child.end_lineno - child.lineno + 1, name))
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text(encoding="utf-8")), "")
    return found


def long_lines(path: Path, width: int) -> int:
    """How many of the lines of `path` are longer than `width` characters."""
    return sum(len(line) > width for line in path.read_text(encoding="utf-8").splitlines())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=20, help="how many functions to print (default 20)")
    parser.add_argument("--width", type=int, default=110, help="the line-length limit (default 110)")
    parser.add_argument("--all", action="store_true", help="read tests/ and scripts/ as well")
    args = parser.parse_args(argv)

    files = source_files(args.all)
    everything = [f for path in files for f in functions(path)]
    everything.sort(key=lambda f: (-f.length, f.path, f.line))
    print(f"{len(everything)} functions in {len(files)} files; the {args.n} longest:")
    for f in everything[: args.n]:
        print(f"  {f.path + ':' + str(f.line):<40} {f.length:>4}  {f.name}")
    over = {str(p.relative_to(ROOT)): n for p in files if (n := long_lines(p, args.width))}
    print(f"\n{sum(over.values())} lines over {args.width} characters, in {len(over)} files:")
    for path, n in sorted(over.items(), key=lambda item: (-item[1], item[0])):
        print(f"  {path:<40} {n:>4}")


if __name__ == "__main__":
    main()
