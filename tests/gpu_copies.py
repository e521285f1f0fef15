"""Host<->device copies per decoder step, counted three ways (docs/gpu.md, "Copies per step"): the IO
binding's inputs and outputs as each run binds them, the Memcpy nodes onnxruntime puts into the decoder
graph, and on CUDA the copies CUPTI sees (torch.profiler). Each is per step, from two runs of forced
lengths, so that what the encoder and the first step copy once per batch cancels. Used by tests/test_gpu.py
(on CUDA) and tests/test_gpu_check.py (the same record on the CPU provider)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from seq2onnx.runtime import bundle as fmt


class _Recording:
    """An IOBinding that notes how each input is bound and where each output goes. An input is "array" (a
    numpy array: copied up at every run on CUDA), "fed back" (an OrtValue this session's previous run
    output: it never left the device) or "value" (another OrtValue, e.g. the encoder's)."""

    def __init__(self, binding, fed: dict):
        self.binding, self._fed, self.inputs, self.outputs = binding, fed, {}, {}

    def __getattr__(self, name):
        return getattr(self.binding, name)

    def bind_cpu_input(self, name, array):
        self.inputs[name] = ("array", "cpu", int(array.nbytes))
        return self.binding.bind_cpu_input(name, array)

    def bind_ortvalue_input(self, name, value):
        how = "fed back" if id(value) in self._fed.get("ids", ()) else "value"
        self.inputs[name] = (how, value.device_name().lower(), 0)
        return self.binding.bind_ortvalue_input(name, value)

    def bind_input(self, name, device_type, *args, **kwargs):
        self.inputs[name] = ("value", str(device_type).lower(), 0)
        return self.binding.bind_input(name, device_type, *args, **kwargs)

    def bind_output(self, name, device_type="cpu", *args, **kwargs):
        self.outputs[name] = str(device_type).lower()
        return self.binding.bind_output(name, device_type, *args, **kwargs)

    def bind_ortvalue_output(self, name, value):
        self.outputs[name] = value.device_name().lower()
        return self.binding.bind_ortvalue_output(name, value)

    def get_outputs(self):
        values = self.binding.get_outputs()
        self._fed["ids"] = {id(v) for v in values}  # what the next run may bind again without a copy
        return values


def _record_bindings(session, runs: list) -> None:
    """Makes session (this instance only) append {"inputs", "outputs"} to runs at every bound run."""
    make, run, fed = session.io_binding, session.run_with_iobinding, {}

    def run_with_iobinding(binding, run_options=None):
        if isinstance(binding, _Recording):
            runs.append({"inputs": dict(binding.inputs), "outputs": dict(binding.outputs)})
            binding = binding.binding
        return run(binding, run_options)

    session.io_binding, session.run_with_iobinding = (lambda: _Recording(make(), fed)), run_with_iobinding


def step_copies_of(translator, sources: list, beam: int, lengths=(8, 24), cupti: bool = False) -> dict:
    """Host<->device copies per decoder step of translator, from two runs of forced lengths.

    No sentence ends before L - 1 tokens nor after L, so none leaves the batch; the difference between the
    runs, over their difference in steps, is what one step costs.

    Returns:
        For a step in the middle of the search: the inputs bound from host arrays (copied up each step on
        CUDA) and their bytes, those fed back from the previous step, those bound once per batch, the
        outputs the search reads and those fed back (with the devices of each); with cupti, CUDA's
        HtoD/DtoH/DtoD copies and kernels per step.
    """
    runs: list = []
    _record_bindings(translator.decoder, runs)
    per_run, counts = [], []
    for length in lengths:
        start = len(runs)

        def work(length=length):
            translator.translate_batch(
                sources, beam_size=beam, max_decoding_length=length, min_decoding_length=length - 1
            )

        counts.append(_cupti_count(work) if cupti else work())
        per_run.append(runs[start:])
    steps = [len(r) for r in per_run]
    mid, after = per_run[1][-2], per_run[1][-1]  # two steps in the middle: after's inputs say what mid fed
    inputs = after["inputs"]
    present = set(mid["outputs"]) & set(fmt.present_names(translator.n_layers))
    out = {
        "steps": steps,
        "inputs_from_host": sorted(k for k, v in inputs.items() if v[0] == "array"),
        "upload_bytes_per_step": sum(v[2] for v in inputs.values() if v[0] == "array"),
        "inputs_fed_back": sorted(k for k, v in inputs.items() if v[0] == "fed back"),
        "inputs_per_batch": sorted(k for k, v in inputs.items() if v[0] == "value"),
        "input_devices": sorted({v[1] for v in inputs.values() if v[0] != "array"}),
        "outputs_read": sorted(k for k in after["outputs"] if k not in present),
        "outputs_read_devices": sorted({v for k, v in after["outputs"].items() if k not in present}),
        "outputs_fed_back_devices": sorted({v for k, v in after["outputs"].items() if k in present}),
        "same_bindings_every_step": all(
            r["inputs"] == inputs and r["outputs"] == after["outputs"] for r in per_run[1][1:]
        ),
    }
    if cupti:
        out["cupti"] = {k: (counts[1][k] - counts[0][k]) / (steps[1] - steps[0]) for k in counts[0]}
    return out


def _cupti_count(work) -> dict:
    """Runs work under torch.profiler (CUDA activity from CUPTI) and counts its copies by direction."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        work()
        torch.cuda.synchronize()
    counts = {"htod": 0, "dtoh": 0, "dtod": 0, "kernels": 0}
    for e in prof.events():
        name = e.name.lower()
        if "memcpy" in name:
            for key in [k for k in ("htod", "dtoh", "dtod") if k in name][:1]:
                counts[key] += 1
        elif "cuda" in str(getattr(e, "device_type", "")).lower():
            counts["kernels"] += 1
    return counts


def memcpy_nodes(bundle: Path, device: str) -> dict:
    """Counts the Memcpy nodes onnxruntime inserts into the decoder graph on device (each runs every step)."""
    import onnx

    from seq2onnx.runtime.devices import providers_for
    from seq2onnx.runtime.ort_install import import_onnxruntime

    ort = import_onnxruntime()
    opts = ort.SessionOptions()
    with tempfile.TemporaryDirectory(prefix="gpu-copies-") as tmp:
        saved = Path(tmp) / "decoder-optimized.onnx"
        opts.optimized_model_filepath = str(saved)
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        ort.InferenceSession(str(bundle / fmt.DECODER_FILE), opts, providers=providers_for(device))
        kinds = [n.op_type for n in onnx.load(str(saved), load_external_data=False).graph.node]
    return {k: kinds.count(k) for k in ("MemcpyFromHost", "MemcpyToHost")} | {"nodes": len(kinds)}
