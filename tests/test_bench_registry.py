"""bench/engines/: the engine registry. A registered class is an engine by name, for make_runner and the
timing loop; an unknown name is refused with the known ones; a taken name cannot be registered twice."""

from __future__ import annotations

import pytest

from seq2onnx.bench import engines


class FakeRunner(engines.Runner):
    """Answers each sentence with its source ids reversed, so that the outputs are known."""

    kind = "fake"
    variants = {"fake-cpu-fp32": ("cpu", "fp32"), "fake-cpu-int8": ("cpu", "int8")}

    def run(self, indices, beam):
        return [self.sources[i][::-1][: self.limits[i]] for i in indices]

    def describe(self):
        return f"fake ({self.device}, {self.precision}), {self.threads} threads"


@pytest.fixture
def fake():
    engines.register(FakeRunner)
    try:
        yield FakeRunner
    finally:
        engines.unregister(FakeRunner)


def _job(engine: str, **extra) -> dict:
    sources = [[5, 6, 7], [8, 9], [4]]
    return {
        "engine": engine,
        "sources": sources,
        "limits": [2, 5, 5],
        "threads": 3,
        "eos_id": 2,
        "order": [2, 1, 0],
        "configs": [[1, 1], [4, 2]],
        "repeat": 2,
        **extra,
    }


def test_registered_engine_is_picked_by_name(fake):
    assert engines.ENGINES["fake-cpu-int8"] == ("fake", "cpu", "int8")
    runner = engines.make_runner(_job("fake-cpu-int8"))
    assert type(runner) is FakeRunner and (runner.device, runner.precision) == ("cpu", "int8")
    result = engines.run_engine(_job("fake-cpu-int8"))
    assert result["description"] == "fake (cpu, int8), 3 threads"
    assert [(c["beam"], c["batch"]) for c in result["configs"]] == [(1, 1), (4, 2)]
    for config in result["configs"]:
        assert config["outputs"] == [[7, 6], [9, 8], [4]]
        assert len(config["pass_seconds"]) == 2
    assert result["configs"][0]["latencies_ms"] is not None
    assert result["configs"][1]["batch_latencies_ms"] is not None


def test_unregister_removes_the_names(fake):
    engines.unregister(fake)
    assert "fake-cpu-fp32" not in engines.ENGINES and "fake" not in engines.RUNNERS
    engines.register(fake)  # the fixture unregisters it again


def test_unknown_engine_is_refused_naming_the_known_ones():
    known = "torch, torch-batched, onnx-cpu-fp32"
    with pytest.raises(ValueError, match=rf"unknown engine 'onnx-tpu-fp8'; choose among {known}"):
        engines.make_runner(_job("onnx-tpu-fp8"))


def test_parallel_refused_for_an_engine_without_it(fake):
    with pytest.raises(ValueError, match="fake-cpu-fp32 has no parallel setting"):
        engines.make_runner(_job("fake-cpu-fp32", parallel=2))


def test_a_taken_name_cannot_be_registered_again(fake):
    class Clash(engines.Runner):
        kind = "clash"
        variants = {"onnx-cpu-fp32": ("cpu", "fp32")}

    with pytest.raises(ValueError, match=r"already registered"):
        engines.register(Clash)
    assert engines.ENGINES["onnx-cpu-fp32"] == ("onnx", "cpu", "fp32") and "clash" not in engines.RUNNERS


def test_the_engines_and_their_order_are_the_bench_s():
    """The registry gives the names and the order that the bench's rows and tables have always had."""
    assert list(engines.ENGINES) == [
        "torch",
        "torch-batched",
        "onnx-cpu-fp32",
        "onnx-cpu-int8",
        "onnx-cuda-fp32",
        "onnx-cuda-fp16",
        "ct2-cpu-fp32",
        "ct2-cpu-int8",
        "ct2-cuda-fp32",
        "ct2-cuda-fp16",
    ]
    assert {kind for kind, _, _ in engines.ENGINES.values()} == set(engines.RUNNERS)
