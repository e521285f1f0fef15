"""gpu_check.py's copies step (step_copies): host<->device copies per decoder step, counted three ways.

The IO binding's inputs and outputs as each run binds them (_Recording), the Memcpy nodes onnxruntime puts
into the decoder graph (memcpy_nodes), and on CUDA the copies CUPTI sees (torch.profiler); each per step,
from two runs of forced lengths so that the per-batch copies cancel. tf32_probe is a diagnosis beside them.
"""

from __future__ import annotations

import tempfile
from pathlib import Path


class _Recording:
    """An IOBinding that notes how each input is bound and where each output goes (the rest is the binding's).

    An input is "array" (a numpy array: copied up at every run on CUDA), "fed back" (an OrtValue that this
    session's previous run output: it never left the device) or "value" (another OrtValue, e.g. the
    encoder's).
    """

    def __init__(self, binding, fed: dict):  # binding: the IOBinding recorded
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


def record_bindings(session, runs: list) -> None:
    """Makes session note, at every run_with_iobinding, how each input is bound and each output placed.

    Args:
        session: an onnxruntime InferenceSession (its methods are replaced on this instance only).
        runs: gets one {"inputs": {name: (how, device, bytes)}, "outputs": {name: device}} per run; an
            input is "fed back" when it is the very value that the run before output.
    """
    make, run, fed = session.io_binding, session.run_with_iobinding, {}

    def io_binding():
        return _Recording(make(), fed)

    def run_with_iobinding(binding, run_options=None):
        if isinstance(binding, _Recording):
            runs.append({"inputs": dict(binding.inputs), "outputs": dict(binding.outputs)})
            binding = binding.binding
        return run(binding, run_options)

    session.io_binding, session.run_with_iobinding = io_binding, run_with_iobinding


def step_copies_of(translator, sources: list, beam: int, lengths=(8, 24), cupti: bool = False) -> dict:
    """Host<->device copies per decoder step of translator, from two runs of forced lengths.

    No sentence ends before L - 1 tokens nor after L (min and max decoding length), so none leaves the
    batch, and the difference between the runs at L2 and L1, divided by their difference in steps, is what
    one step costs, whatever the encoder and the first step copy once per batch.

    Args:
        translator: a Translator (its decoder session gets recorded).
        sources: the batch (ids or texts).
        beam: beam size.
        lengths: the two forced lengths.
        cupti: also count the copies CUDA made (torch.profiler over CUPTI: the whole process's, so
            onnxruntime's too).

    Returns:
        dict: for a step in the middle of the search, the inputs bound from host arrays (copied up each
        step on CUDA) and their bytes, the inputs fed back from the previous step, those bound once per
        batch, the outputs read by the search and the outputs fed back (with the device of each), and
        (cupti) CUDA's HtoD/DtoH
        copies and kernels per step.
    """
    runs: list = []
    record_bindings(translator.decoder, runs)
    per_run, cuda_counts = [], []
    for length in lengths:
        start = len(runs)

        def work(length=length):
            translator.translate_batch(
                sources, beam_size=beam, max_decoding_length=length, min_decoding_length=length - 1
            )

        cuda_counts.append(_cupti_count(work) if cupti else work())
        per_run.append(runs[start:])
    steps = [len(r) for r in per_run]
    mid, after = per_run[1][-2], per_run[1][-1]  # two steps in the middle: after's inputs say what mid fed
    fed_back = {k for k, v in after["inputs"].items() if v[0] == "fed back"}
    present = set(mid["outputs"]) & set(_present_names(translator))
    same = all(r["inputs"] == after["inputs"] and r["outputs"] == after["outputs"] for r in per_run[1][1:])
    out = {
        "beam": beam,
        "rows": len(sources),
        "steps": steps,
        "device": translator.device,
        "inputs_from_host": sorted(k for k, v in after["inputs"].items() if v[0] == "array"),
        "upload_bytes_per_step": sum(v[2] for v in after["inputs"].values() if v[0] == "array"),
        "inputs_fed_back": sorted(fed_back),
        "inputs_per_batch": sorted(k for k, v in after["inputs"].items() if v[0] == "value"),
        "input_devices": sorted({v[1] for v in after["inputs"].values() if v[0] != "array"}),
        "outputs_read": sorted(k for k in after["outputs"] if k not in present),
        "outputs_read_devices": sorted({v for k, v in after["outputs"].items() if k not in present}),
        "outputs_fed_back": sorted(present),
        "outputs_fed_back_devices": sorted({v for k, v in after["outputs"].items() if k in present}),
        "same_bindings_every_step": same,
    }
    if cupti:
        d = steps[1] - steps[0]
        out["cupti"] = {k: (cuda_counts[1][k] - cuda_counts[0][k]) / d for k in cuda_counts[0]}
        out["cupti_runs"] = cuda_counts
    return out


def _present_names(translator) -> list[str]:
    from seq2onnx.runtime import bundle as fmt

    return fmt.present_names(translator.n_layers)


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
            key = next((k for k in ("htod", "dtoh", "dtod") if k in name), None)
            if key:
                counts[key] += 1
        elif getattr(e, "device_type", None) is not None and "cuda" in str(e.device_type).lower():
            counts["kernels"] += 1
    return counts


def memcpy_nodes(bundle: Path, device: str) -> dict:
    """Counts the Memcpy nodes onnxruntime inserts into the decoder graph here (each runs every step)."""
    import onnx

    from seq2onnx.runtime import bundle as fmt
    from seq2onnx.runtime.ort_install import import_onnxruntime
    from seq2onnx.runtime.devices import providers_for

    ort = import_onnxruntime()
    opts = ort.SessionOptions()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        saved = Path(tmp) / "decoder-optimized.onnx"
        opts.optimized_model_filepath = str(saved)
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        ort.InferenceSession(str(bundle / fmt.DECODER_FILE), opts, providers=providers_for(device))
        kinds = [n.op_type for n in onnx.load(str(saved), load_external_data=False).graph.node]
    return {
        "MemcpyFromHost": kinds.count("MemcpyFromHost"),
        "MemcpyToHost": kinds.count("MemcpyToHost"),
        "nodes": len(kinds),
    }


def tf32_probe(translator, bundle: Path, sources: list) -> dict:
    """The encoder's outputs on this provider, with onnxruntime's CUDA default (TF32 matrix products allowed
    on Ampere and later) and with use_tf32=0, each against the CPU provider: whether TF32 is what separates
    CUDA fp32 from PyTorch (the runtime passes use_tf32=0: runtime/devices.providers_for)."""
    import numpy as np

    from seq2onnx.runtime import bundle as fmt
    from seq2onnx.runtime.ort_install import import_onnxruntime

    ort = import_onnxruntime()
    src, lengths = translator.sources.pad(sources)
    feeds = {fmt.SRC_IDS: src, fmt.SRC_LENGTHS: lengths}
    path = str(bundle / fmt.ENCODER_FILE)
    cpu = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
    out = {}
    for label, providers in (
        ("default", ["CUDAExecutionProvider"]),
        ("use_tf32=0", [("CUDAExecutionProvider", {"use_tf32": "0"})]),
    ):
        if translator.device != "cuda":
            providers = ["CPUExecutionProvider"]
        got = ort.InferenceSession(path, providers=providers + ["CPUExecutionProvider"]).run(None, feeds)
        out[label] = max(
            float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0
            for a, b in zip(got, cpu)
        )
    return out


def sources(ckpt: str, n: int):
    """The checkpoint's model, tokenizer, n test pairs and their source ids (every gpu_check.py step's)."""
    from seq2onnx.export.parity import test_sentences
    from seq2onnx.model import checkpoint

    model, tok, ckpt_dir = checkpoint.load(ckpt)
    pairs = test_sentences(ckpt_dir, n)
    return model, tok, pairs, [tok.encode_source(src)[: model.cfg.max_positions] for src, _ in pairs]


def step_copies(ctx: dict) -> dict:
    """gpu_check.py's copies step: both bundles' copies per step (greedy and beam 4), Memcpy nodes, TF32."""
    from seq2onnx.runtime.translator import Translator

    work, s = Path(ctx["work"]), ctx["sizes"]
    _, _, _, srcs = sources(str(work / "run" / "best"), s["copies_rows"])
    cupti = ctx["mode"] == "gpu"
    out = {}
    for name in ("fp32", "fp16"):
        t = Translator(work / name, device=s["device"], _tuning=_standard())
        for beam in (1, 4):
            try:
                out[f"{name}_beam{beam}"] = step_copies_of(t, srcs, beam, cupti=cupti)
            except Exception as e:  # CUPTI may be unusable there: the binding's record still stands
                if not cupti:
                    raise
                out[f"{name}_beam{beam}"] = step_copies_of(t, srcs, beam) | {"cupti_error": repr(e)[:300]}
        try:
            out[f"{name}_memcpy_nodes"] = memcpy_nodes(work / name, t.device)
        except Exception as e:
            out[f"{name}_memcpy_nodes"] = {"error": repr(e)[:300]}
    try:
        out["tf32_probe"] = tf32_probe(Translator(work / "fp32", device=s["device"]), work / "fp32", srcs)
    except Exception as e:  # a diagnosis, not a check: its failure is reported, the step stands
        out["tf32_probe"] = {"error": repr(e)[:300]}
    return out


def _standard():
    from seq2onnx.runtime.options import SessionTuning

    return SessionTuning(decoder="standard")
