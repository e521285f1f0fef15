"""Whether this CPU's onnxruntime int8 products saturate, asked of onnxruntime itself.

An int8 bundle multiplies uint8 activation codes by int8 weights (export/quantize.py). onnxruntime's
u8 x s8 kernel for x86 CPUs without VNNI (SSE4.1, AVX2, AVX-512 without VNNI) adds pairs of products
in signed 16 bits (vpmaddubsw), which saturate for large codes: the product is then wrong, by a lot
(onnxruntime documents this as the u8s8 saturation issue). Its session option
`session.x64quantprecision = 1` rewrites int8 weights as uint8 (w + 128, the zero point moved with
them: the same products) so that the exact u8 x u8 kernel runs -- but it does so on every x86 CPU,
VNNI included, where the u8 x s8 kernel is exact already and about 2x faster (docs/optimisation-notes.md,
row 27). So the runtime asks once per process, at the first load of an int8 bundle: it multiplies
255 x 127 over 64 terms with the default kernel, and only where the answer is wrong does the same rewrite
itself, where it can, by flipping one bit of each weight in place (runtime/exact_int8.py), and sets the
option for what is left.

onnxruntime applies that rewrite among its 'extended' graph optimisations: with 'basic' or none the
option does nothing, so the runtime refuses an int8 bundle at those levels where the probe says the
kernel saturates (runtime/sessions.py: open_sessions).

The probe graph is written here byte by byte (the runtime does not depend on the onnx package): one
MatMulInteger, A uint8 [rows, 64] as input, B int8 [64, 16] = 127 as initializer (shapes the
kernel meets in a decoder step, not a vector product that another code path might take).
"""

from __future__ import annotations

import functools
import threading

import numpy as np

PRECISION_KEY = "session.x64quantprecision"  # onnxruntime's kOrtSessionOptionsAvx2PrecisionMode
_K, _N = 64, 16
_UINT8, _INT8, _INT32 = 2, 3, 6  # TensorProto.DataType


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, value) -> bytes:
    """One protobuf field: an int as a varint (wire type 0), bytes or str length-delimited (type 2)."""
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    data = value.encode() if isinstance(value, str) else value
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _value_info(name: str, elem_type: int, dims: list) -> bytes:
    shape = b"".join(_field(1, _field(2, d) if isinstance(d, str) else _field(1, d)) for d in dims)
    return _field(1, name) + _field(2, _field(1, _field(1, elem_type) + _field(2, shape)))


def _tensor(name: str, elem_type: int, dims: list[int], raw: bytes) -> bytes:
    return b"".join(_field(1, d) for d in dims) + _field(2, elem_type) + _field(8, name) + _field(9, raw)


def probe_model() -> bytes:
    """Returns the probe graph's ONNX bytes.

    y (rows, 16) int32 = MatMulInteger(a (rows, 64) uint8, B = 127).
    """
    node = (
        b"".join(_field(1, n) for n in ("a", "b"))
        + _field(2, "y")
        + _field(3, "probe")
        + _field(4, "MatMulInteger")
    )
    graph = (
        _field(1, node)
        + _field(2, "u8s8_probe")
        + _field(5, _tensor("b", _INT8, [_K, _N], np.full(_K * _N, 127, np.int8).tobytes()))
        + _field(11, _value_info("a", _UINT8, ["rows", _K]))
        + _field(12, _value_info("y", _INT32, ["rows", _N]))
    )
    return _field(1, 8) + _field(8, _field(1, "") + _field(2, 17)) + _field(7, graph)  # IR 8, opset 17


_PROBING = threading.Lock()  # the sessions a Translator makes at once ask together: one probe answers both


def u8s8_saturates(ort) -> bool:
    """Tells whether onnxruntime's default u8 x s8 product is wrong on this CPU (asked once per process,
    whichever threads ask).

    Args:
        ort: the onnxruntime module.

    Returns:
        True where 255 x 127 summed over 64 terms does not come out exact (x86 without VNNI), and
        where the probe cannot run at all (a build without MatMulInteger): the option then costs
        nothing, as such a build runs no int8 bundle, and a float32 bundle still loads.
    """
    with _PROBING:
        return _probe(ort)


@functools.lru_cache(maxsize=None)
def _probe(ort) -> bool:
    """u8s8_saturates' answer, found by running the probe graph once per onnxruntime module."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(probe_model(), options, providers=["CPUExecutionProvider"])
        y = session.run(None, {"a": np.full((4, _K), 255, np.uint8)})[0]
    except Exception:  # onnxruntime raises its own types
        return True
    return not np.array_equal(y, np.full((4, _N), _K * 255 * 127, np.int32))


def precision_entries(ort) -> dict[str, str]:
    """Returns the session config entries that make int8 products exact here: {} where they are already.

    Args:
        ort: the onnxruntime module.
    """
    return {PRECISION_KEY: "1"} if u8s8_saturates(ort) else {}
