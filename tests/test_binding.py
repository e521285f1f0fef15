"""runtime/binding.py: the one module that binds the graphs. The fused decoder's inputs are named once
(fused_inputs) for translate_batch's step loop and the serving rounds alike."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from seq2onnx.runtime import bundle as names
from seq2onnx.runtime.binding import fused_binding, fused_inputs
from seq2onnx.runtime.translator import Translator
from seq2onnx.runtime.rounds import rounds_runner
from test_layers import PACKAGES

ROOT = Path(__file__).resolve().parents[1]


def _arrays(rows: int, positions: int = 4) -> dict:
    return dict(
        tokens=np.zeros((rows, 1), np.int64),
        step=np.zeros(1, np.int32),
        top_k=np.ones(1, np.int64),
        beam_width=np.ones(1, np.int32),
        indirection=np.zeros((rows, 1, positions), np.int32),
    )


def test_fused_inputs_name_row_start_and_the_encoder_outputs_only_when_given():
    plain = fused_inputs(**_arrays(2))
    assert set(plain) == {names.TOKENS, names.STEP, names.TOP_K, names.BEAM_WIDTH, names.CACHE_INDIRECTION}
    cross = [np.zeros((2, 1, 3, 4), np.float32) for _ in range(4)]  # 2 layers, key then value
    full = fused_inputs(
        **_arrays(2), row_start=np.zeros(2, np.int32), src_mask=np.ones((2, 3), bool), cross=cross
    )
    assert set(full) - set(plain) == {names.ROW_START, names.SRC_MASK, *names.cross_names(2)}
    assert all(full[name] is array for name, array in zip(names.cross_names(2), cross))


def test_a_fused_binding_binds_every_input_and_runs_in_place(translator):
    """Every input of decoder_fused.onnx is named by fused_inputs; the run writes the caller's arrays: the
    cache at position 0 (bound as past and present alike) and the outputs."""
    t = translator
    assert t.decoder_variant == names.FUSED
    spec, session = t.spec, t.decoder
    src_mask, cross = t.graphs.encode(np.array([[5, 6, t.eos_id]], np.int64), np.array([3], np.int64))
    inputs = fused_inputs(**_arrays(1), row_start=np.zeros(1, np.int32), src_mask=src_mask, cross=cross)
    past = set(names.past_names(spec.n_layers))  # the cache: bound apart, as past and present alike
    assert set(inputs) | past == {i.name for i in session.get_inputs()} and not past & set(inputs)
    inputs[names.TOKENS][0, 0] = t.start_id
    shape = (1, spec.n_heads, 4, spec.head_dim)
    cache = [np.zeros(shape, np.float32) for _ in range(2 * spec.n_layers)]
    out = {names.TOPK_LOG_PROBS: np.zeros((1, 1), np.float32), names.TOPK_IDS: np.full((1, 1), -1, np.int64)}
    binding, held = fused_binding(session, inputs, cache, out)
    assert held[names.SRC_MASK] is src_mask  # the encoder's OrtValue, bound as it is
    session.run_with_iobinding(binding)
    assert all(np.any(c[0, :, 0] != 0) and not np.any(c[0, :, 1:]) for c in cache)
    assert 0 <= out[names.TOPK_IDS][0, 0] < spec.tgt_vocab and out[names.TOPK_LOG_PROBS][0, 0] < 0


def _io_binding_sites(root: Path) -> list[str]:
    """Each `.io_binding(` call in the package's modules (its folders as test_layers names them: not a build
    directory's copies), as "path:line"."""
    folders = [root / name for name in PACKAGES if (root / name).is_dir()]
    paths = [*root.glob("*.py"), *(path for folder in folders for path in folder.rglob("*.py"))]
    sites = []
    for path in sorted(paths):
        rel = path.relative_to(root).as_posix()
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(r"\.io_binding\(", line.split("#")[0]):
                sites.append(f"{rel}:{n}")
    return sites


def test_only_runtime_binding_makes_io_bindings(tmp_path):
    """One module binds every graph (issue 56): no other module of the package calls io_binding(); a call
    planted elsewhere is found."""
    sites = _io_binding_sites(ROOT)
    assert sites and {s.split(":")[0] for s in sites} == {"runtime/binding.py"}, sites
    (tmp_path / "serve").mkdir()
    (tmp_path / "serve" / "rounds.py").write_text("def f(session):\n    return session.io_binding()\n")
    assert _io_binding_sites(tmp_path) == ["serve/rounds.py:2"]


@pytest.mark.parametrize("rounds", ["fused", "standard"])
def test_the_serving_rounds_drive_the_translators_own_graph_object(bundle, rounds):
    """translate_batch and the serving rounds run one object per decoder graph: the rounds are given the
    Translator's FusedGraph (the one its steps drive) or its StandardGraph, and bind nothing themselves."""
    t = Translator(bundle, device="cpu")
    runner = rounds_runner(t, rounds)
    want = t.graphs.decoder_graph if rounds == "fused" else t.graphs.standard_graph
    assert runner.graph is want and want.variant == rounds
    assert (t.graphs.decoder_graph is t.graphs.standard_graph) == (t.decoder_variant == "standard")
