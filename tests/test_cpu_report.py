"""tests/cpu_report.py (`pytest --cpu-report`): each kind of process named as the summary lists it, and a busy
child below the sampler found with its CPU."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cpu_report import CURRENT_DIR, FileCpu, note_file, kind, sample


@pytest.mark.parametrize(
    "comm, argv, expected",
    [
        (
            "python",
            ["/v/bin/python", "-u", "-c", "import sys;exec(eval(sys.stdin.readline()))"],
            "pytest worker (xdist)",
        ),
        ("python", ["/v/bin/python", "-m", "seq2onnx.commands", "translate", "B"], "seq2onnx translate"),
        (
            "python3.11",
            ["python3", "-W", "ignore", "-m", "seq2onnx.bench.engines", "x"],
            "python -m seq2onnx.bench.engines",
        ),
        ("python", ["/v/bin/python", "-B", "-c", "print(1)"], "python -c"),
        (
            "python",
            ["python", "-c", "\nimport sys\nfrom seq2onnx.model.train import train"],
            "python -c (seq2onnx.model.train)",
        ),
        ("python", ["/v/bin/python", "scripts/hf_sizes_jobs.py", "spec.json"], "python hf_sizes_jobs.py"),
        ("node", ["node", "/r/js/bin/seq2onnx-js.mjs", "translate"], "node seq2onnx-js.mjs"),
        ("chromium", ["/usr/lib/chromium/chromium", "--type=renderer"], "chromium"),
        ("ray::IDLE", ["ray::IDLE"], "ray IDLE"),
        ("ray::MapWorke", ["ray::MapWorker(MapBatches(TranslateBatches))"], "ray MapWorker"),
    ],
)
def test_each_kind_is_named(comm, argv, expected):
    assert kind(comm, argv) == expected


def test_a_busy_child_is_found_with_its_cpu_and_charged_to_the_test_file(tmp_path, monkeypatch):
    # 0.6 s of the child's own CPU (not of wall time, which a loaded machine stretches), then it waits, so
    # that the sample after its line sees all of it
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\nwhile time.process_time() < 0.6: pass\nprint(1, flush=True)\ntime.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    monkeypatch.setenv(CURRENT_DIR, str(tmp_path))
    note_file("tests/test_x.py::test_y")  # this process runs tests/test_x.py, the child is below it
    seen, files = {}, FileCpu(str(tmp_path))
    try:
        sample(os.getpid(), seen, files)  # before the child's work: the file gets what comes after
        assert child.stdout.readline() == "1\n"
        sample(os.getpid(), seen, files)
    finally:
        child.kill()
        child.wait()
    kinds = {name: cpu for name, cpu in seen.values()}
    assert kinds.get("python -c (time)", 0) >= 0.5, seen
    assert 0.5 <= files["tests/test_x.py"] and set(files) == {"tests/test_x.py"}, files
