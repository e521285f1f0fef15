"""`seq2onnx translate-dataset` (commands/translate_dataset.py) on a local 2-CPU Ray instance, against
Translator.translate_batch and `seq2onnx translate` on the same input."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import pytest

from extras import require

ray = require("ray", "scale")

import pyarrow as pa  # noqa: E402  (ray[data] brings pyarrow)
import pyarrow.parquet as pq  # noqa: E402

from seq2onnx.model.corpus import generate_pairs  # noqa: E402
from seq2onnx.commands import dataset_io  # noqa: E402
from seq2onnx.commands import translate_dataset as dataset  # noqa: E402
from seq2onnx.runtime.bundle import BundleError  # noqa: E402
from seq2onnx.errors import CommandError  # noqa: E402
from seq2onnx.runtime.translator import Translator  # noqa: E402
from build_cache import exclusive  # noqa: E402
from helpers import cli_here  # noqa: E402
from tiny import scratch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# A few hundred generated sentences, with the edge cases of `seq2onnx translate`'s line handling.
LINES = [s for s, _ in generate_pairs(200, seed=11)]
LINES[3:3] = ["", "   ", "漢字 ☃ 🙂", "a\u2028line with a separator inside", "\x0cform feed"]


@pytest.fixture(scope="module")
def local_ray():
    """A fresh local instance with 2 CPUs ("local": never a cluster that RAY_ADDRESS or `ray start` left)."""
    with exclusive("ray"):  # never beside test_serve_ray.py's instances
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING")
        yield ray
        ray.shutdown()


@pytest.fixture(scope="module")
def greedy(bundle) -> list[str]:
    """LINES translated in one process with --beam 1 (greedy keeps the Ray runs short; the bundle's
    default beam is compared with `seq2onnx translate` in the first test)."""
    translator = Translator(bundle, device="cpu", intra_threads=1)
    return [r.hypotheses[0] for r in translator.translate_batch(LINES, beam_size=1)]


def run(*argv: str) -> int:
    """The command as the seq2onnx parser will run it (the driver reuses the fixture's Ray instance)."""
    parser = argparse.ArgumentParser(prog="seq2onnx")
    dataset.add(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["translate-dataset", *map(str, argv)])
    return args.func(args)


def write_text(path: Path, lines: list[str], newline: str = "\n") -> Path:
    path.write_bytes("".join(line + newline for line in lines).encode("utf-8"))
    return path


@pytest.mark.slow
def test_text_output_is_byte_identical_to_seq2onnx_translate(local_ray, bundle, capsys):
    d = scratch("ds-text")
    source = write_text(d / "in.txt", LINES, newline="\r\n")  # CRLF: the \r must go, as in translate
    (d / "out.txt").write_text("keep me\n")  # refused before any Ray work, then replaced with --force
    with pytest.raises(CommandError, match="exists; pass --force"):
        run(bundle, source, d / "out.txt")
    assert (d / "out.txt").read_text() == "keep me\n"
    assert (
        run(bundle, source, d / "out.txt", "--workers", 2, "--lines-per-task", 40, "--json", "--force") == 0
    )
    stats = json.loads(capsys.readouterr().out)
    assert stats["lines"] == len(LINES) and stats["workers"] == 2
    proc = cli_here("translate", bundle, "--device", "cpu", "--threads", 1, "-i", source, "-o", d / "cli.txt")
    assert proc.returncode == 0, proc.stderr
    assert (d / "out.txt").read_bytes() == (d / "cli.txt").read_bytes()
    assert len((d / "out.txt").read_text(encoding="utf-8").split("\n")[:-1]) == len(LINES)
    assert not [p.name for p in d.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.slow
def test_parquet_column_in_parquet_out_keeps_order_and_nulls(local_ray, bundle, greedy):
    d = scratch("ds-parquet")
    texts = LINES[:60] + [None] + LINES[60:90]
    pq.write_table(pa.table({"id": list(range(len(texts))), "text": texts}), d / "in.parquet")
    assert (
        run(
            bundle,
            d / "in.parquet",
            d / "out.parquet",
            "--column",
            "text",
            "--beam",
            1,
            "--lines-per-task",
            16,
        )
        == 0
    )
    assert (
        pq.read_table(d / "out.parquet").column("translation").to_pylist()
        == greedy[:60] + [None] + greedy[60:90]
    )


def test_jsonl_column_is_read_in_order_with_its_nulls(tmp_path):
    with open(tmp_path / "in.jsonl", "w", encoding="utf-8") as f:
        for i, line in enumerate(LINES[:50]):
            f.write(json.dumps({"n": i, "src": None if i == 7 else line}) + "\n")
    texts = dataset_io.read_source(tmp_path / "in.jsonl", "jsonl", "src").to_pylist()
    assert texts == LINES[:7] + [None] + LINES[8:50]


@pytest.mark.slow
def test_killed_worker_is_restarted_and_its_block_retried(local_ray, bundle, greedy):
    d = scratch("ds-crash")
    marker = str(d / "crashed")

    class CrashOnce(dataset.TranslateBatches):
        """Kills its own process on the first block past row 100 (once in the whole run: the marker
        file is created exclusively), mid-run, after both actors have translated blocks."""

        def __call__(self, batch):
            if batch.column("index")[0].as_py() >= 100:
                try:
                    os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
                except FileExistsError:
                    pass
                else:
                    os._exit(1)
            return super().__call__(batch)

    # A class defined in a function is pickled by value, so the actors get it without importing tests/.
    source = pa.array(LINES, pa.string())
    stats = dataset.translate_dataset(
        bundle, source, d / "out.txt", workers=2, lines_per_task=20, actor_class=CrashOnce, beam_size=1
    )
    assert Path(marker).exists(), "no worker was killed: the test proved nothing"
    assert stats["lines"] == len(LINES)
    assert (d / "out.txt").read_text(encoding="utf-8").split("\n")[:-1] == greedy


@pytest.mark.slow
def test_bundle_a_worker_cannot_read_fails_before_work_starts(local_ray, bundle, monkeypatch):
    d = scratch("ds-nobundle")
    source = write_text(d / "in.txt", LINES[:10])
    # A bundle that exists here but not where the workers run: the driver's own check is bypassed,
    # so only the remote check (a fresh import in a worker process) can catch it.
    missing = d / "only-on-the-driver"
    monkeypatch.setattr(dataset, "read_bundle", lambda *a, **k: None)
    started = []
    monkeypatch.setattr(dataset, "translate_dataset", lambda *a, **k: started.append(1))
    with pytest.raises(
        CommandError,
        match=r"a Ray worker cannot read the bundle .*only-on-the-driver.*not a bundle directory",
    ):
        run(missing, source, d / "out.txt")
    assert not started and not (d / "out.txt").exists()


@pytest.mark.slow
def test_unreadable_bundle_here_fails_before_ray_work(local_ray, tmp_path):
    source = write_text(tmp_path / "in.txt", LINES[:3])
    with pytest.raises(BundleError, match="not a bundle directory"):
        run(tmp_path / "nope", source, tmp_path / "out.txt")
    assert not (tmp_path / "out.txt").exists()


@pytest.mark.slow
def test_translator_error_on_a_worker_ends_the_job_with_its_reason(local_ray, bundle):
    d = scratch("ds-long")
    source = write_text(d / "in.txt", ["the cat sleeps", "the cat " * 400])
    with pytest.raises(
        RuntimeError,
        match=r"failed on a Ray worker: ValueError: in input rows 1\.\.1 .*positions.*out.txt was not written",
    ):
        run(bundle, source, d / "out.txt", "--workers", 1)
    assert not (d / "out.txt").exists() and not list(d.glob(".*.tmp"))


def test_missing_ray_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(CommandError, match=r"pip install 'seq2onnx\[scale\]'"):
        dataset.import_ray()


@pytest.mark.slow
def test_input_errors_name_the_column(tmp_path):
    pq.write_table(pa.table({"a": ["x"], "b": [1]}), tmp_path / "t.parquet")
    with pytest.raises(CommandError, match=r"columns are \['a', 'b'\]"):
        dataset_io.read_source(tmp_path / "t.parquet", "parquet", "c")
    with pytest.raises(CommandError, match="choose the one to translate with --column"):
        dataset_io.read_source(tmp_path / "t.parquet", "parquet", None)
    with pytest.raises(CommandError, match="holds int64, not text"):
        dataset_io.read_source(tmp_path / "t.parquet", "parquet", "b")
    with pytest.raises(CommandError, match="applies to Parquet or JSONL"):
        dataset_io.read_source(write_text(tmp_path / "t.txt", ["x"]), "text", "a")


def test_writer_refuses_rows_out_of_order(tmp_path):
    block = lambda start, n: pa.table({"index": list(range(start, start + n)), "translation": ["t"] * n})
    with dataset_io.Writer(tmp_path / "o.txt", "text") as w:
        w.write(block(0, 3))
        with pytest.raises(RuntimeError, match="expected index 3, got \\[5\\]"):
            w.write(block(5, 2))
        with pytest.raises(RuntimeError, match="expected index 3, got \\[0\\]"):
            w.write(block(0, 3))  # a retried block delivered twice
