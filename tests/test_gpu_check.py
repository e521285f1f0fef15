"""scripts/gpu_check.sh and gpu_pack.sh (issue 39) here: the CPU mode runs every step of the GPU check,
the copies per step are recorded as on CUDA, and a pack is joined, checked and installed as on the GPU
machine, or refused naming the part to carry again."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

import pytest

from gpu_copies import memcpy_nodes, step_copies_of
from tiny import scratch, tiny_bundle

from seq2onnx.runtime import bundle as fmt
from seq2onnx.runtime.devices import cuda_usable

ROOT = Path(__file__).resolve().parents[1]
CHECK, PACK = ROOT / "scripts" / "gpu_check.sh", ROOT / "scripts" / "gpu_pack.sh"


def _env(**extra) -> dict:
    return dict(os.environ, PYTHON=sys.executable, **extra)


@pytest.mark.slow
def test_cpu_mode_runs_every_step():
    out, work = scratch("gpu-check-out"), scratch("gpu-check-work")
    done = subprocess.run(
        ["bash", str(CHECK), "--cpu"],
        capture_output=True,
        text=True,
        timeout=1500,
        env=_env(OUT=str(out), GPU_CHECK_WORK=str(work)),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["logs.tar.xz", "summary.md"]
    summary = (out / "summary.md").read_text()
    steps = ("env", "train", "export-fp32", "export-fp16", "tests", "verify-fp32", "verify-fp16", "bench")
    table = re.findall(r"^\| ([\w-]+) \| ([^|]+) \|", summary, re.M)
    assert table == [("step", "status")] + [(s, "ok") for s in steps], summary
    for s in steps:
        assert f"## {s}\n" in summary, s
    with tarfile.open(out / "logs.tar.xz") as tar:
        names = set(tar.getnames())
        read = lambda name: tar.extractfile(name).read()  # noqa: E731
        assert {f"logs/{s}.log" for s in steps} <= names, names
        verify = {b: json.loads(read(f"verify-{b}.json")) for b in ("fp32", "fp16")}
        bench, tests = json.loads(read("bench.json")), ET.fromstring(read("tests.xml"))
    assert {b: (v["passed"], v["provider"]) for b, v in verify.items()} == {b: (True, "CPU") for b in verify}
    assert verify["fp16"]["variant"] == "float16" and verify["fp32"]["sentences"] == 24
    assert {(row["engine"], row["search"], row["batch"]) for row in bench["rows"]} >= {
        ("onnx-cpu-fp32", "greedy", 1),
        ("onnx-cpu-fp32", "beam4", 32),
        ("torch", "greedy", 1),
    }
    # the gpu-marked tests ran: here each skipped with its one-line reason (on a GPU machine they pass)
    cases = list(tests.iter("testcase"))
    bad = [c for c in cases if c.find("failure") is not None or c.find("error") is not None]
    assert len(cases) == 8 and not bad, bad
    if not cuda_usable()[0]:
        skipped = [c.find("skipped").get("message", "") for c in cases if c.find("skipped") is not None]
        assert len(skipped) == 8 and all("\n" not in m and "CUDA" in m for m in skipped), skipped


@pytest.mark.parametrize("beam", [1, 4])
def test_copies_per_step_on_the_cpu_provider(beam):
    """The record tests/test_gpu.py holds CUDA to, here on the CPU provider: per step only the new tokens,
    the step, the cache indices and k are bound from the host, the cache is fed back, the top-k read."""
    from seq2onnx.runtime.session_tuning import SessionTuning
    from seq2onnx.runtime.translator import Translator

    t = Translator(tiny_bundle(), device="cpu", _tuning=SessionTuning(decoder="standard"))
    got = step_copies_of(t, [[5, 6, 7, 8], [9, 10, 11, 12]], beam)
    assert got["inputs_from_host"] == sorted([fmt.TOKENS, fmt.STEP, fmt.CACHE_INDICES, fmt.TOP_K]), got
    assert got["inputs_fed_back"] == sorted(fmt.past_names(t.n_layers)) and got["same_bindings_every_step"]
    assert got["outputs_read"] == sorted([fmt.TOPK_LOG_PROBS, fmt.TOPK_IDS]) and got["steps"] == [8, 24]
    assert memcpy_nodes(tiny_bundle(), "cpu")["MemcpyToHost"] == 0  # the CPU provider copies nothing


def _dummy_wheel(directory: Path) -> Path:
    """A pure-Python wheel of ~600 KB that xz cannot shrink (random bytes), so that it splits in parts."""
    whl = directory / "gpucheckdummy-0.1-py3-none-any.whl"
    dist = "gpucheckdummy-0.1.dist-info"
    files = {
        "gpucheckdummy/__init__.py": b"VALUE = 41 + 1\n",
        "gpucheckdummy/blob.bin": os.urandom(600_000),
        f"{dist}/METADATA": b"Metadata-Version: 2.1\nName: gpucheckdummy\nVersion: 0.1\n",
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
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
    env = _env(
        GPU_PACK_OUT=str(pack),
        GPU_PACK_ANY="1",
        PART_BYTES="250000",
        GPU_DATA=str(tmp / "none.txt"),
        GPU_PACK_XZ=xz,
    )
    made = subprocess.run(
        ["bash", str(PACK), str(_dummy_wheel(tmp))],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=env,
    )
    assert made.returncode == 0, made.stdout + made.stderr
    assert sorted(p.name for p in pack.iterdir() if p.is_dir()) == ["1", "2", "3"], made.stdout
    assert "call 3: carry" in made.stdout
    manifest = (pack / "1" / "MANIFEST").read_text()
    assert manifest == (pack / "3" / "MANIFEST").read_text() and "parts 3" in manifest
    assert f"compression {'xz' if xz == '1' else 'none'}" in manifest

    def install():
        return subprocess.run(
            ["bash", str(PACK), "--install", str(pack), str(target)],
            capture_output=True,
            text=True,
            timeout=300,
            env=_env(),
        )

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
