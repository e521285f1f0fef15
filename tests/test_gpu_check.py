"""scripts/gpu_check.sh and gpu_pack.sh (issue 39) here: the CPU mode runs every step of the GPU check,
and a pack is joined, checked and installed as on the GPU machine, or refused naming the part to carry
again."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from tiny import scratch

from seq2onnx.runtime import bundle as fmt
from seq2onnx.runtime.devices import cuda_usable

ROOT = Path(__file__).resolve().parents[1]
CHECK, PACK = ROOT / "scripts" / "gpu_check.sh", ROOT / "scripts" / "gpu_pack.sh"


def _env(**extra) -> dict:
    return dict(os.environ, PYTHON=sys.executable, **extra)


@pytest.mark.slow
def test_cpu_mode_runs_every_step():
    out, work = scratch("gpu-check-out"), scratch("gpu-check-work")
    done = subprocess.run(["bash", str(CHECK), "--cpu"], capture_output=True, text=True, timeout=900,
                          env=_env(OUT=str(out), GPU_CHECK_WORK=str(work)))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["logs.tar.xz", "results.json", "summary.md"]
    steps = json.loads((out / "results.json").read_text())["steps"]
    every = ("env", "train", "export", "tests", "verify", "parity", "copies", "bench", "torch")
    assert {k: v["status"] for k, v in steps.items()} == {k: "ok" for k in every}, steps
    r = {k: v["result"] for k, v in steps.items()}
    assert r["train"]["steps"] == 150 and r["train"]["tokens_per_s"] > 0
    # the gpu-marked tests ran: here each skipped with its one-line reason (on a GPU machine they pass)
    tests = r["tests"]
    assert len(tests["cases"]) == 8 and tests["counts"]["failure"] == tests["counts"]["error"] == 0
    if not cuda_usable()[0]:
        assert tests["counts"]["skipped"] == 8
        one_line = all("\n" not in c["message"] and "CUDA" in c["message"] for c in tests["cases"])
        assert one_line, tests["cases"]
    assert {k: (v["passed"], v["provider"]) for k, v in r["verify"].items()} == {"fp32": (True, "CPU"),
                                                                                 "fp16": (True, "CPU")}
    p = r["parity"]
    assert p["fp32_beam1"]["identical"] == p["fp32_beam4"]["identical"] == p["sentences"] == 24
    assert p["fp16_greedy"]["rate"] >= 0.99 and p["fp32_beam4"]["non_finite_scores"] == 0
    for key in ("fp32_beam1", "fp32_beam4", "fp16_beam1", "fp16_beam4"):
        c = r["copies"][key]
        assert c["inputs_from_host"] == sorted([fmt.TOKENS, fmt.STEP, fmt.CACHE_INDICES, fmt.TOP_K]), c
        assert c["inputs_fed_back"] == sorted(fmt.past_names(2)) and c["same_bindings_every_step"], c
        assert c["outputs_read"] == sorted([fmt.TOPK_LOG_PROBS, fmt.TOPK_IDS]), c
        assert c["steps"] == [8, 24], c  # forced lengths: no sentence left the batch
    assert r["copies"]["fp32_memcpy_nodes"]["MemcpyToHost"] == 0  # the CPU provider copies nothing
    assert {(row["engine"], row["search"], row["batch"]) for row in r["bench"]["rows"]} >= {
        ("onnx-cpu-fp32", "greedy", 1), ("onnx-cpu-fp32", "beam4", 32), ("torch", "greedy", 1)}
    assert [row["search"] for row in r["torch"]["rows"]] == ["greedy", "greedy", "beam4", "beam4"]
    summary = (out / "summary.md").read_text()
    for heading in ("## Training", "## GPU tests", "### fp32: PASSED on CPU", "### fp16: PASSED on CPU",
                    "## Parity", "## Host <-> device copies", "## seq2onnx bench", "## PyTorch reference"):
        assert heading in summary, heading
    with tarfile.open(out / "logs.tar.xz") as tar:
        names = set(tar.getnames())
    assert {f"logs/{s}.log" for s in steps} <= names and "bench.json" in names and "verify-fp16.json" in names


def _dummy_wheel(directory: Path) -> Path:
    """A pure-Python wheel of ~600 KB that xz cannot shrink (random bytes), so that it splits in parts."""
    whl = directory / "gpucheckdummy-0.1-py3-none-any.whl"
    dist = "gpucheckdummy-0.1.dist-info"
    files = {"gpucheckdummy/__init__.py": b"VALUE = 41 + 1\n", "gpucheckdummy/blob.bin": os.urandom(600_000),
             f"{dist}/METADATA": b"Metadata-Version: 2.1\nName: gpucheckdummy\nVersion: 0.1\n",
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                              b"Tag: py3-none-any\n"}
    files[f"{dist}/RECORD"] = "".join(f"{n},,\n" for n in [*files, f"{dist}/RECORD"]).encode()
    with zipfile.ZipFile(whl, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return whl


@pytest.mark.slow
@pytest.mark.parametrize("xz", ["1", "0"])  # 0: the wheel split as published (nvidia-cublas-cu12's pack)
def test_pack_is_joined_checked_and_installed(xz):
    tmp = scratch(f"gpu-pack-xz{xz}")
    pack, target = tmp / "pack", tmp / "target"
    env = _env(GPU_PACK_OUT=str(pack), GPU_PACK_ANY="1", PART_BYTES="250000", GPU_DATA=str(tmp / "none.txt"),
               GPU_PACK_XZ=xz)
    made = subprocess.run(["bash", str(PACK), str(_dummy_wheel(tmp))], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env=env)
    assert made.returncode == 0, made.stdout + made.stderr
    assert sorted(p.name for p in pack.iterdir() if p.is_dir()) == ["1", "2", "3"], made.stdout
    assert "call 3: carry" in made.stdout
    manifest = (pack / "1" / "MANIFEST").read_text()
    assert manifest == (pack / "3" / "MANIFEST").read_text() and "parts 3" in manifest
    assert f"compression {'xz' if xz == '1' else 'none'}" in manifest

    def install():
        return subprocess.run(["bash", str(CHECK), "--install-only", str(pack), str(target)],
                              capture_output=True, text=True, timeout=300, env=_env())

    done = install()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 part(s), every sha256 checked" in done.stdout
    assert (target / "gpucheckdummy" / "__init__.py").read_text() == "VALUE = 41 + 1\n"

    part = next((pack / "2").glob("wheel.xz.*"))
    data = bytearray(part.read_bytes())
    data[100] ^= 0xFF
    part.write_bytes(bytes(data))
    done = install()
    assert done.returncode == 2 and f"carry {pack}/2 again" in done.stdout, done.stdout
    assert "damaged" in done.stdout

    for f in (pack / "1").iterdir():
        f.unlink()
    done = install()
    assert done.returncode == 2 and f"part 1 of 3 is missing ({pack}/1)" in done.stdout, done.stdout
