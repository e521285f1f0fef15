"""The install as an app sees it: one import name, no bare `model`/`export`/`runtime`, a runtime that
needs no torch, and an app with its own `runtime.py` and `model.py` that still reaches seq2onnx."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tiny import scratch, tiny_bundle

import seq2onnx


def _python(code: str, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_version_is_the_distributions():
    assert seq2onnx.__version__ == importlib.metadata.version("seq2onnx")
    proc = subprocess.run(
        [sys.executable, "-m", "seq2onnx.commands", "--version"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"seq2onnx {importlib.metadata.version('seq2onnx')}"


def test_no_bare_top_level_names_are_installed():
    # Run outside the checkout: there the folders model/, export/, runtime/ are on sys.path by accident.
    proc = _python(
        """
        import importlib.util, json
        names = ("model", "export", "runtime", "bench", "commands", "spec", "errors", "atomic")
        print(json.dumps({n: importlib.util.find_spec(n) is not None for n in names}))
        """,
        scratch("outside"),
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == dict.fromkeys(
        ("model", "export", "runtime", "bench", "commands", "spec", "errors", "atomic"), False
    )


@pytest.mark.slow
def test_the_wheel_holds_every_layer_and_the_spec_under_one_name(tmp_path):
    """What `pip install seq2onnx` unpacks: the package and its data files, nothing else at the top."""
    import zipfile

    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(root),
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    [wheel] = tmp_path.glob("seq2onnx-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"seq2onnx"}, tops
    for wanted in (
        "seq2onnx/spec/bundle.json",
        "seq2onnx/spec/cases/bundle-json.json",
        "seq2onnx/commands/main.py",
        "seq2onnx/bench/run.py",
        "seq2onnx/export/ctranslate2/convert.py",
        "seq2onnx/runtime/translator.py",
        "seq2onnx/errors.py",
        "seq2onnx/atomic.py",
    ):
        assert wanted in names, wanted
    assert not [n for n in names if "/tests/" in n or "node_modules" in n]


def test_an_app_with_its_own_runtime_and_model_modules_uses_seq2onnx():
    app = scratch("app")
    (app / "runtime.py").write_text("WHOSE = 'the app'\n")
    (app / "model.py").write_text("WHOSE = 'the app'\n")
    # The app imports its own modules by the names an installed bare package would shadow
    # (import_module spells the same import as `import runtime`).
    (app / "main.py").write_text(
        textwrap.dedent("""
        import importlib, json, sys
        model = importlib.import_module("model")
        runtime = importlib.import_module("runtime")
        from seq2onnx import Translator, TranslationResult
        t = Translator(sys.argv[1], device="cpu")
        r = t.translate_batch(["a small bird sleeps"], beam_size=2)
        print(json.dumps({"runtime": runtime.WHOSE, "model": model.WHOSE, "text": r[0].hypotheses[0],
                          "result_type": isinstance(r[0], TranslationResult)}))
        """)
    )
    proc = subprocess.run(
        [sys.executable, "main.py", str(tiny_bundle())], cwd=app, capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["runtime"] == out["model"] == "the app"
    assert out["text"] and out["result_type"]


_BLOCK_TRAINING_SIDE = """
    import importlib.abc, sys
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "onnx") or name.startswith(("seq2onnx.model", "seq2onnx.export")):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked: a runtime-only install lacks it)")
    sys.meta_path.insert(0, Block())
    """


@pytest.mark.slow
def test_translate_cli_runs_without_the_training_side():
    source = scratch("cli-no-torch") / "in.txt"
    source.write_text("a small bird sleeps\nthe cat dances in the box\n")
    proc = _python(
        textwrap.dedent(_BLOCK_TRAINING_SIDE)
        + textwrap.dedent("""
        from seq2onnx.commands.main import main
        code = main(["translate", sys.argv[1], "-i", sys.argv[2], "--beam", "2"])
        loaded = [m for m in sys.modules if m.split(".")[0] in ("torch", "onnx")
                  or m.startswith(("seq2onnx.model", "seq2onnx.export"))]
        print("STATUS", code, loaded)
        """),
        scratch("cwd"),
        str(tiny_bundle()),
        str(source),
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[-1] == "STATUS 0 []"
    assert len(lines) == 3 and all(lines[:2])


def test_the_parser_loads_no_numpy_and_the_runtime_commands_give_openblas_one_thread():
    """numpy's OpenBLAS spins a thread per core for ~0.1 s of CPU when it loads (optimisation-notes row 83):
    `seq2onnx --help` does not load numpy, and a runtime command loads it with one thread unless the user
    chose a number; a training command leaves the variable alone (torch may read it for its own BLAS)."""
    proc = _python(
        """
        import os, sys
        os.environ.pop("OPENBLAS_NUM_THREADS", None)
        from seq2onnx.commands.main import build_parser, run_command
        parser = build_parser()
        print("numpy loaded:", "numpy" in sys.modules)
        run_command(parser, ["evaluate", "/nonexistent/run"])
        print("evaluate:", os.environ.get("OPENBLAS_NUM_THREADS"))
        run_command(parser, ["translate", "/nonexistent/bundle"])
        print("translate:", os.environ.get("OPENBLAS_NUM_THREADS"))
        os.environ["OPENBLAS_NUM_THREADS"] = "3"
        run_command(parser, ["translate", "/nonexistent/bundle"])
        print("chosen:", os.environ.get("OPENBLAS_NUM_THREADS"))
        """,
        scratch("cwd"),
    )
    assert proc.stdout.splitlines() == [
        "numpy loaded: False",
        "evaluate: None",
        "translate: 1",
        "chosen: 3",
    ], proc.stdout + proc.stderr


def test_training_command_without_torch_names_the_extra():
    # A runtime-only install has seq2onnx.export (same distribution) but no torch.
    block_torch = _BLOCK_TRAINING_SIDE.replace(
        'or name.startswith(("seq2onnx.model", "seq2onnx.export"))', ""
    )
    proc = _python(
        textwrap.dedent(block_torch)
        + textwrap.dedent("""
        from seq2onnx.commands.main import main
        sys.exit(main(["train", "somewhere"]))
        """),
        scratch("cwd"),
    )
    assert proc.returncode == 1
    assert "pip install 'seq2onnx[train,cpu]'" in proc.stderr
    assert "Traceback" not in proc.stderr
