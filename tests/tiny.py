"""Tiny trained models and bundles shared by the test files, built once per test run.

Not a conftest fixture on purpose: several test files import these builders. build_cache keeps each
variant to one build per run, whichever pytest-xdist worker asks first, and an lru_cache to one lookup
per process.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
from pathlib import Path

from build_cache import ROOT as _ROOT
from build_cache import build_once


def tiny_run(pre_norm: bool = False, tie: bool = True, steps: int = 300) -> Path:
    """A run directory with a small model trained briefly on the generated corpus (a few seconds)."""
    return _run(bool(pre_norm), bool(tie), int(steps))


def tiny_bundle(pre_norm: bool = False, tie: bool = True, quantize: str | None = None) -> Path:
    """The bundle exported from tiny_run(pre_norm, tie)."""
    return _bundle(bool(pre_norm), bool(tie), quantize)


# lru_cache keys on how arguments are passed (f() and f(False) differ): normalise first.
@functools.lru_cache(maxsize=None)
def _run(pre_norm: bool, tie: bool, steps: int) -> Path:
    import torch  # here, not at the top: the runtime-only run (conftest.py) imports this module without torch

    import seq2onnx
    from seq2onnx.model.train import TrainOptions, train

    # What decides the run's bytes (build_cache.py keeps it between test runs while these are unchanged): the
    # trainer (model/ and the package's root modules it imports) and this file's options.
    package = Path(seq2onnx.__file__).parent
    sources = [
        *(package / "model").rglob("*.py"),
        package / "atomic.py",
        package / "errors.py",
        Path(__file__),
    ]

    torch.set_num_threads(1)  # tiny models run fastest on one thread; on 2 shared cores more threads thrash

    def build(out: Path) -> None:
        train(
            TrainOptions(
                out=str(out),
                generated_pairs=3000,
                valid_size=50,
                test_size=50,
                vocab_size=120,
                max_len=40,
                d_model=32,
                n_heads=4,
                layers=2,
                d_ff=64,
                dropout=0.0,
                pre_norm=pre_norm,
                tie_embeddings=tie,
                max_tokens=1500,
                warmup=100,
                lr=2.0,
                max_steps=steps,
                eval_every=steps,
                bleu_sentences=10,
                seed=3,
                device="cpu",
                progress=False,
            )
        )

    return build_once(f"run-pre{int(pre_norm)}-tie{int(tie)}-{steps}", build, keep_by=sources)


@functools.lru_cache(maxsize=None)
def _bundle(pre_norm: bool, tie: bool, quantize: str | None) -> Path:
    name = f"bundle-pre{int(pre_norm)}-tie{int(tie)}-{quantize or 'fp32'}"
    prebuilt = os.environ.get("SEQ2ONNX_TEST_BUNDLES")  # the runtime-only run: built beforehand with torch
    if prebuilt:
        if not (Path(prebuilt) / name).is_dir():
            raise FileNotFoundError(
                f"SEQ2ONNX_TEST_BUNDLES={prebuilt} has no {name}: build it with "
                "`PYTHONPATH=tests python -m helpers DIR` (tests/helpers.py)"
            )
        return Path(prebuilt) / name
    from seq2onnx.export.bundle import export_bundle

    run = tiny_run(pre_norm, tie)
    return build_once(name, lambda out: export_bundle(run / "last", out, quantize=quantize))


def scratch(name: str) -> Path:
    """A fresh directory under the shared temporary root."""
    path = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=_ROOT))
    return path


def copy_bundle(bundle: Path, name: str) -> Path:
    """A copy of a bundle in a fresh scratch directory, for tests that damage or edit it."""
    dest = scratch(name) / "bundle"
    shutil.copytree(bundle, dest)
    return dest


def edit_bundle_json(path: Path, edit) -> None:
    """Applies edit(meta) to the bundle's bundle.json in place (hashes are not rewritten)."""
    meta = json.loads((path / "bundle.json").read_text())
    edit(meta)
    (path / "bundle.json").write_text(json.dumps(meta))


def restate_size(path: Path, key: str) -> None:
    """bundle.json's files.<key>.size set to the file's size now: a test that rewrote that file (a graph
    saved again) and loads it with check_hashes=False; the size is checked at every load (runtime/bundle.py)."""

    def edit(meta):
        entry = meta["files"][key]
        entry["size"] = (path / entry["path"]).stat().st_size

    edit_bundle_json(path, edit)
