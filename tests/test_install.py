"""Both packages installed as their users install them, away from the source tree, translating the tiny
bundle.

- The wheel with `[cpu]` in a venv of its own (no torch): its `seq2onnx translate` and its import.
  .ci/run builds that venv before the suite, runs the runtime's tests in it (conftest.py, --runtime-only)
  and names it in SEQ2ONNX_RUNTIME_VENV; elsewhere this test builds one (pip may take the wheels of
  numpy, sentencepiece and onnxruntime from its cache).
- The npm tarball of js/ (`npm pack`) installed into an empty directory: its `bin` and its import.
Both must give the Python runtime's translations in this process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ENV, REPO
from node_host import JS, NODE, skip_reason

SENTENCES = ["the cat dances in the box", "a small bird sleeps", "three old kings carry the red boxes"]
BEAM = 2
NPM = shutil.which("npm")


@pytest.fixture(scope="module")
def expected(translator) -> list[str]:
    """The translations of SENTENCES by the runtime of this checkout, in this process."""
    return [r.hypotheses[0] for r in translator.translate_batch(SENTENCES, beam_size=BEAM)]


def _run(command: list, cwd: Path, env: dict, stdin: str | None = None, timeout: float = 600) -> str:
    proc = subprocess.run(
        [str(c) for c in command],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=timeout,
    )
    assert proc.returncode == 0, (
        f"{command[:3]} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    )
    return proc.stdout


def _runtime_venv(tmp_path: Path) -> Path:
    """.ci/run's venv (the wheel with [cpu]), or a new one like it."""
    if os.environ.get("SEQ2ONNX_RUNTIME_VENV"):
        return Path(os.environ["SEQ2ONNX_RUNTIME_VENV"])
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            REPO,
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            tmp_path / "wheel",
        ],
        REPO,
        ENV,
    )
    [wheel] = (tmp_path / "wheel").glob("seq2onnx-*.whl")
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv], tmp_path, ENV)
    _run([venv / "bin" / "python", "-m", "pip", "install", "-q", f"{wheel}[cpu]"], tmp_path, ENV)
    return venv


@pytest.mark.slow
def test_the_wheel_with_cpu_translates_without_torch_or_the_source_tree(bundle, expected, tmp_path):
    import seq2onnx

    venv = _runtime_venv(tmp_path)
    app = tmp_path / "app"
    app.mkdir()
    # A clean environment: nothing of the checkout or of the test venv on the paths.
    env = {k: v for k, v in ENV.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{venv / 'bin'}:/usr/bin:/bin"
    probe = """
import importlib.metadata, importlib.util, json, seq2onnx
print(json.dumps({"file": seq2onnx.__file__, "version": seq2onnx.__version__,
                  "torch": importlib.util.find_spec("torch") is not None,
                  "url": json.loads(importlib.metadata.distribution("seq2onnx")
                                    .read_text("direct_url.json"))}))
"""
    found = json.loads(_run([venv / "bin" / "python", "-c", probe], app, env))
    assert found["torch"] is False, "torch is in the [cpu] venv: the runtime-only run proves nothing"
    assert Path(found["file"]).resolve().is_relative_to(venv.resolve()), found["file"]
    # Installed from a wheel, not editable.
    assert "archive_info" in found["url"] and found["url"]["url"].endswith(".whl"), found["url"]
    assert found["version"] == seq2onnx.__version__
    command = _run(
        [venv / "bin" / "seq2onnx", "translate", bundle, "--beam", BEAM],
        app,
        env,
        stdin="".join(s + "\n" for s in SENTENCES),
    )
    assert command.splitlines() == expected
    code = (
        "import json, sys\nfrom seq2onnx import Translator\nt = Translator(sys.argv[1], device='cpu')\n"
        f"rs = t.translate_batch({SENTENCES!r}, beam_size={BEAM})\n"
        "print(json.dumps([r.hypotheses[0] for r in rs]))"
    )
    assert json.loads(_run([venv / "bin" / "python", "-c", code, bundle], app, env)) == expected


@pytest.mark.slow
def test_the_npm_tarball_translates_through_its_bin_and_its_import(bundle, expected, tmp_path):
    if NODE is None or NPM is None:
        pytest.skip(
            skip_reason("the npm package")
            if NODE is None
            else "npm is not installed: install npm (Debian: apt-get install npm) to test the npm package"
        )
    # npm pack runs in a copy of js/ and spec/, so that the checkout never holds the prepack's js/spec/.
    stage = tmp_path / "stage"
    shutil.copytree(JS, stage / "js", ignore=shutil.ignore_patterns("node_modules"))
    shutil.copytree(REPO / "spec", stage / "spec")
    env = {**ENV, "npm_config_update_notifier": "false"}
    [packed] = json.loads(_run([NPM, "pack", "--json", "--pack-destination", tmp_path], stage / "js", env))
    files = {f["path"] for f in packed["files"]}
    assert {"package.json", "bin/seq2onnx-js.mjs", "src/index.js", "spec/bundle.json"} <= files, sorted(files)
    assert not [f for f in files if f.startswith(("test/", "node_modules/"))], sorted(files)
    assert not (stage / "js" / "spec").exists()  # postpack removed the copy
    app = tmp_path / "app"
    app.mkdir()
    # onnxruntime-node's install script would fetch CUDA binaries on linux-x64; the CPU build is inside it.
    # (npm 11 runs no install scripts unless allowed; older npm does.)
    env["ONNXRUNTIME_NODE_INSTALL"] = "skip"
    _run(
        [NPM, "install", "--no-audit", "--no-fund", "--prefer-offline", tmp_path / packed["filename"]],
        app,
        env,
    )
    installed = app / "node_modules" / packed["name"]
    assert not (installed / "test").exists() and (installed / "spec" / "bundle.json").is_file()
    stdin = "".join(s + "\n" for s in SENTENCES)
    bin_out = _run(
        [app / "node_modules" / ".bin" / "seq2onnx-js", "translate", bundle, "--beam", BEAM],
        app,
        env,
        stdin=stdin,
    )
    assert bin_out.splitlines() == expected
    code = (
        f"import {{ Translator }} from {json.dumps(packed['name'])};\n"
        "const t = await Translator.load(process.argv[1]);\n"
        f"const rs = await t.translateBatch({json.dumps(SENTENCES)}, {{ beamSize: {BEAM} }});\n"
        "console.log(JSON.stringify(rs.map((r) => r.hypotheses[0])));\nawait t.release();\n"
    )
    assert json.loads(_run([NODE, "--input-type=module", "-e", code, bundle], app, env)) == expected
