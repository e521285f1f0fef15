"""Fixtures shared by the test files: tiny random models, and the tiny trained bundle with a Translator.

tests/tiny.py builds the tiny trained runs and bundles once per test session (cached on disk);
these fixtures hand them to the tests.

`pytest --runtime-only` runs the runtime's tests (RUNTIME_FILES) where only `seq2onnx[cpu]` is
installed, as an app installs it: nothing here imports torch at the top, and the bundles come
prebuilt (SEQ2ONNX_TEST_BUNDLES, tests/tiny.py). .ci/run runs it in a venv without torch, so a
torch import that reaches the runtime fails CI.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

# One thread for the runtime's sessions here (intra_threads 0 reads it: runtime/session_tuning.py) and for every
# child process a test starts (the `seq2onnx` command, a verify, a server), unless the test sets it: torch,
# CTranslate2 and onnxruntime otherwise start a thread per core in each, and on a machine the workers keep busy
# an onnxruntime pool thread spinning beside a tiny model's step costs as much CPU as the step (helpers.ENV
# sets it too). Where a test asks for more threads (bench's sweep), OpenMP's idle threads sleep rather than
# spin: torch and CTranslate2 both use libgomp, which reads this when it loads, so before torch is imported.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# torch is absent in the runtime-only run. pytest-xdist's controller runs no test, so it does not import it
# (~2.5 s before it starts the workers): pytest_configure does, in the processes that run tests.
HAVE_TORCH = importlib.util.find_spec("torch") is not None

# The runtime's test files: they import neither torch nor the training side at the top, and need
# only tiny_bundle()'s prebuilt bundles (fp32 and int8). Keep a new runtime test file in this list.
RUNTIME_FILES = (
    "test_bad_bundles.py",
    "test_bundle_spec.py",
    "test_bundle_trust.py",
    "test_fuzz.py",
    "test_runtime_api.py",
    "test_runtime_memory.py",
    "test_runtime_search.py",
    "test_session_cache.py",
    "test_session_load.py",
    "test_translate_cli.py",
)
# Their tests that need the training side ([train]), left out of the runtime-only run: the PyTorch oracle
# (model/search.py), or onnx to build a graph. (onnx stays out of that venv: the runtime must not need it.)
NEEDS_TRAIN = (
    "test_runtime_search.py::test_beam_equals_torch_oracle",
    "test_runtime_search.py::test_beam_one_equals_greedy_and_greedy_equals_oracle",
    "test_runtime_memory.py::test_cpu_sessions_keep_no_copy_of_their_graph",
)


def pytest_addoption(parser):
    parser.addoption(
        "--runtime-only",
        action="store_true",
        help="run only the runtime's tests (conftest.RUNTIME_FILES), in a venv with "
        "seq2onnx[cpu] and no torch; the tiny bundles come from SEQ2ONNX_TEST_BUNDLES "
        "(see .ci/run)",
    )
    parser.addoption(
        "--cpu-report",
        action="store_true",
        help="after the run, the CPU of every kind of process below it (the workers, each seq2onnx command, "
        "node, Chromium, Ray's workers), sampled from /proc: where the suite's time goes on a "
        "CPU-bound machine (tests/cpu_report.py)",
    )


_NOTE_FILES = False  # whether this process names each test file it runs for --cpu-report


def pytest_configure(config):
    global _NOTE_FILES
    controller = getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput")
    _NOTE_FILES = bool(config.getoption("--cpu-report") and not controller)
    if config.getoption("--cpu-report") and not hasattr(config, "workerinput"):
        from cpu_report import CpuReport

        config._seq2onnx_cpu = CpuReport()
    if HAVE_TORCH and not controller:  # tiny models run fastest on one thread; on 2 shared cores more thrash
        import torch

        torch.set_num_threads(1)
    # pytest-xdist's controller: fix the run's id now, so that it knows the directory its workers share
    # (build_cache.py) and removes it when the run ends.
    if controller:
        import uuid

        config.option.testrunuid = config.option.testrunuid or uuid.uuid4().hex
        if not config.getoption("--runtime-only") and HAVE_TORCH and _whole_suite(config):
            _prebuild(config)
    if not config.getoption("--runtime-only"):
        return
    # Without these the run would prove nothing, or would fail on every test with a less clear error.
    if HAVE_TORCH:
        raise pytest.UsageError(
            "--runtime-only: torch is installed here, so the run cannot show that "
            "the runtime needs none; run it in a venv with only seq2onnx[cpu] (.ci/run)"
        )
    if not os.environ.get("SEQ2ONNX_TEST_BUNDLES"):
        raise pytest.UsageError(
            "--runtime-only: SEQ2ONNX_TEST_BUNDLES is not set; build the tiny bundles "
            "with torch first: PYTHONPATH=tests python -m helpers DIR (as .ci/run does)"
        )


def _whole_suite(config) -> bool:
    """A run of every test file (`pytest`, `pytest tests`, any -m): not of chosen files, ids or -k names."""
    from pathlib import Path

    tests, here = Path(__file__).resolve().parent, Path(config.invocation_params.dir)
    paths = [(here / arg.split("::")[0]).resolve() for arg in config.args]
    chosen = config.option.keyword or config.option.collectonly
    return not chosen and all(p == tests or p in tests.parents for p in paths)


def _prebuild(config) -> None:
    """Starts the tiny trained bundle's build (tests/tiny.py) while the workers still collect.

    Most workers' first tests need that bundle. Built by the first of them, the others would wait ~15 s
    for it with their core idle; started here, it runs beside their collection (~10 s of CPU each). The
    child takes the build's lock as a worker would (build_cache.py), so a worker that asks sooner builds it
    itself and the child then finds it built; a child that fails leaves the build to the workers, whose
    tests then show the error.
    """
    import subprocess
    import sys

    tests = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTEST_XDIST_TESTRUNUID=config.option.testrunuid)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [tests, env.get("PYTHONPATH")]))
    config._seq2onnx_prebuild = subprocess.Popen(
        [sys.executable, "-c", "import tiny; tiny.tiny_bundle()"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def pytest_runtest_logstart(nodeid, location):
    if _NOTE_FILES:  # --cpu-report in a worker, or in a -n0 run
        from cpu_report import note_file

        note_file(nodeid)


def pytest_terminal_summary(terminalreporter, config):
    report = getattr(config, "_seq2onnx_cpu", None)
    if report is not None:
        report.stop()
        terminalreporter.section("CPU by kind of process (--cpu-report)")
        for line in report.lines():
            terminalreporter.write_line(line)


def pytest_unconfigure(config):
    prebuild = getattr(config, "_seq2onnx_prebuild", None)
    if prebuild is not None:  # a run stopped early: the build is no longer wanted
        prebuild.kill()
        prebuild.wait()
    run = getattr(config.option, "testrunuid", None)
    if run and not hasattr(config, "workerinput"):
        import shutil

        from build_cache import shared_root_of_run

        shutil.rmtree(shared_root_of_run(run), ignore_errors=True)


def pytest_ignore_collect(collection_path, config):
    if config.getoption("--runtime-only") and collection_path.suffix == ".py":
        return collection_path.name.startswith("test_") and collection_path.name not in RUNTIME_FILES
    return None


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: half as many workers again as cores (3 on 2 cores). Many tests wait on a child process, a
    server or a Ray job; a spare worker fills those waits (the suite: 530-571 s at 3 workers on 2 cores,
    589 s at 2). The fast subset (`-m "not slow"`) seldom waits: one worker per core (68-96 s at 2 workers, median
    88, against 84-105 s at 3, median 96, five runs each: the third worker's collection and contention cost
    more CPU, 109-157 s against 148-184, than it fills)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if config.getoption("markexpr", "").replace(" ", "") == "notslow":
        return max(2, cores)
    return max(2, cores * 3 // 2)


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runtime-only"):
        kept = [item for item in items if not item.nodeid.split("[")[0].endswith(NEEDS_TRAIN)]
        if len(kept) < len(items):
            config.hook.pytest_deselected(items=[item for item in items if item not in kept])
            items[:] = kept
    items[:] = _longest_first(items)


def _longest_first(items: list) -> list:
    """The files in the order xdist hands them out (--no-loadscope-reorder): the longest first, so that the
    run does not end on one worker with a long file while the others wait.

    A file's length is guessed from its marks: files with `slow` tests first, and of those the ones with the
    fewest tests first (a few slow tests in a file are one long scenario each: the GPU scripts' CPU mode,
    the hosts' fuzzing, the wheel's install, kill and resume), then the other files, the largest first.
    xdist's own order (the most tests first) put those scenarios last: the run ended with one worker busy
    and two idle for ~25 s (docs/benchmarks.md, "The order of the files"). The tests of a file keep their
    order.
    """
    files: dict[str, list] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::")[0], []).append(item)

    def length(tests: list) -> tuple:
        slow = sum(1 for t in tests if t.get_closest_marker("slow"))
        return (0, len(tests)) if slow else (1, -len(tests))

    return [item for tests in sorted(files.values(), key=length) for item in tests]


def _tiny_model(seed: int = 0, **overrides):
    from seq2onnx.model.config import ModelConfig
    from seq2onnx.model.transformer import Transformer

    fields = dict(
        src_vocab_size=40,
        tgt_vocab_size=30,
        d_model=16,
        n_heads=2,
        n_encoder_layers=2,
        n_decoder_layers=2,
        d_ff=32,
        dropout=0.0,
        max_positions=64,
    )
    fields.update(overrides)
    import torch

    torch.manual_seed(seed)
    return Transformer(ModelConfig(**fields)).eval()


@pytest.fixture
def make_model():
    """Factory: make_model(seed=0, **ModelConfig overrides) -> a random Transformer in eval mode."""
    return _tiny_model


@pytest.fixture(scope="session")
def bundle():
    """The tiny trained model's fp32 bundle (both decoders), shared read-only: copy it to edit it."""
    from tiny import tiny_bundle

    return tiny_bundle()


@pytest.fixture(scope="module")
def translator(bundle):
    """A Translator of the tiny bundle on the CPU, one per test module."""
    from seq2onnx.runtime.translator import Translator

    return Translator(bundle, device="cpu")


# In CI (CI=true, as .ci/run runs) the JavaScript host must be tested: a test that would skip for a
# missing node or js/node_modules fails instead, so that a CI machine without them cannot pass.
_JS_SKIPS = ("node is not installed", "npm is not installed", "js/node_modules is missing")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        reason = str(report.longrepr[2]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if any(s in reason for s in _JS_SKIPS):
            report.outcome = "failed"
            report.longrepr = f"CI requires the JavaScript host, but: {reason}"
