"""tests/build_cache.py's machine cache: a trained fixture is kept between test runs while the sources that
decide it are unchanged, built afresh when one changes, never kept when the cache is off, and one build per
name stays in the cache."""

from __future__ import annotations

import build_cache
from tiny import scratch


def _builder(calls: list):
    def build(out):
        calls.append(out)
        (out / "step-1").mkdir(parents=True)
        (out / "weights").write_text(f"build {len(calls)}")
        (out / "last").symlink_to("step-1")  # a run's links stay links (a bundle records what they name)

    return build


def _fresh_run_root(monkeypatch):
    """Another test run's shared root: build_once's per-run reuse does not hide the machine cache."""
    monkeypatch.setattr(build_cache, "ROOT", scratch("run-root"))


def test_a_kept_build_is_copied_until_a_source_changes(monkeypatch):
    work = scratch("machine-cache")
    monkeypatch.setenv("SEQ2ONNX_TEST_CACHE", str(work / "cache"))
    source = work / "builder.py"
    source.write_text("steps = 300\n")
    calls: list = []
    _fresh_run_root(monkeypatch)
    first = build_cache.build_once("fixture", _builder(calls), keep_by=[source])
    assert (first / "weights").read_text() == "build 1" and len(calls) == 1

    _fresh_run_root(monkeypatch)  # the next run copies the kept build: no second build
    again = build_cache.build_once("fixture", _builder(calls), keep_by=[source])
    assert again != first and (again / "weights").read_text() == "build 1" and len(calls) == 1
    assert (again / "last").is_symlink() and (again / "last").resolve() == again / "step-1"

    source.write_text("steps = 301\n")  # the builder changed: built afresh, and only the new build kept
    _fresh_run_root(monkeypatch)
    changed = build_cache.build_once("fixture", _builder(calls), keep_by=[source])
    assert (changed / "weights").read_text() == "build 2" and len(calls) == 2
    kept = sorted(p.name for p in (work / "cache").iterdir())
    assert len(kept) == 1 and kept[0].startswith("fixture-"), kept


def test_off_builds_every_run_and_no_sources_means_not_kept(monkeypatch):
    work = scratch("machine-cache")
    source = work / "builder.py"
    source.write_text("x\n")
    calls: list = []
    monkeypatch.setenv("SEQ2ONNX_TEST_CACHE", "off")
    for _ in range(2):
        _fresh_run_root(monkeypatch)
        build_cache.build_once("fixture", _builder(calls), keep_by=[source])
    assert len(calls) == 2

    monkeypatch.setenv("SEQ2ONNX_TEST_CACHE", str(work / "cache"))
    for _ in range(2):
        _fresh_run_root(monkeypatch)
        build_cache.build_once("fixture", _builder(calls))  # an export: rebuilt in every run, never kept
    assert len(calls) == 4 and not (work / "cache").exists()
