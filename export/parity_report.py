"""verify's report in words: the checks that decide it as a table, the measurements that do not, and which
integer kernel multiplies an int8 bundle on this CPU."""

from __future__ import annotations

from dataclasses import dataclass

import onnxruntime as ort

from seq2onnx.runtime.u8s8_probe import precision_entries


@dataclass
class Check:
    """One row of verify's report: a measured value against its bound.

    Attributes:
        tier: "tensor", "tokens" or "text".
        name: what was measured.
        value: the measurement.
        bound: the tolerance it is held to.
        passed: value within bound.
        detail: more numbers, for the report.
        decoder: "standard" or "fused": the decoder graph checked ("" for the encoder).
    """

    tier: str  # tensor | tokens | text
    name: str
    value: float
    bound: float
    passed: bool
    detail: str = ""
    decoder: str = ""  # "standard" or "fused": the decoder graph checked ("" for the encoder)


def int8_products(meta: dict) -> str | None:
    """Says which integer kernel this CPU's onnxruntime multiplies an int8 bundle with.

    See runtime/u8s8_probe.py.

    Args:
        meta: bundle.json.

    Returns:
        The kernel in words for verify's report; None for a bundle that is not int8 (int4's MatMulNBits
        quantizes its activations inside its own kernel).
    """
    if meta.get("quantization") != "int8":
        return None
    if precision_entries(ort):
        return "u8 x u8 (this CPU's u8 x s8 kernel saturates: the int8 weights read as uint8)"
    return "u8 x s8 (exact on this CPU)"


def _value_and_bound(c: dict) -> tuple[str, str]:
    if c["tier"] == "tokens" or "identical" in c["name"]:  # a share of sentences
        bound = f"{c['bound']:.0%}" if round(c["bound"] * 100, 6).is_integer() else f"{c['bound']:.1%}"
        return f"{c['value']:.1%}", f">= {bound}"
    if c["tier"] == "text":
        return f"{c['value']:.2f}", f"<= {c['bound']:.1f}"
    return f"{c['value']:.2e}", f"<= {c['bound']:.1e}"


def format_report(report: dict) -> str:
    """Formats verify's report as a table.

    First the checks that decide the verdict, each with its bound and result, then (for
    reduced-precision bundles) the tensor differences as plain measurements, with no bound and no
    result, since they decide nothing.

    Args:
        report: what `verify` returned.

    Returns:
        The text, ending with PASSED or FAILED.
    """
    judged = [c for c in report["checks"] if c["judged"]]
    measured = [c for c in report["checks"] if not c["judged"]]
    lines = [
        f"verify {report['bundle']} against {report['checkpoint']}",
        f"variant {report['variant']}, {report['provider']} provider, {report['sentences']} test sentences, "
        f"decoders: {', '.join(report.get('decoders', ['standard']))}",
    ]
    if report.get("int8_products"):
        lines.append(f"int8 products: {report['int8_products']}")
    if report.get("tensor_sentences", report["sentences"]) < report["sentences"]:
        lines.append(
            f"tiers: tensors on the first {report['tensor_sentences']} sentences; "
            f"tokens and BLEU on all {report['sentences']}"
        )
    if any(c["tier"] == "tensor" for c in judged):
        lines.append(
            "tensors: max abs difference from the checkpoint evaluated in float64; "
            "bound: the tolerance (x max|x| for K/V and cache), "
            "or 2 x PyTorch fp32's own difference where that is larger"
        )
    lines.append(f"{'tier':<7} {'decoder':<8} {'check':<42} {'value':>10} {'bound':>10}  result")
    for c in judged:
        value, bound = _value_and_bound(c)
        lines.append(
            f"{c['tier']:<7} {c.get('decoder') or '-':<8} {c['name']:<42} {value:>10} {bound:>10}  "
            f"{'ok' if c['passed'] else 'FAIL'}  {c['detail']}"
        )
    if measured:
        lines.append(
            f"measurements (not checks: this {report['variant']} bundle is judged by the checks "
            "above), max abs difference from the checkpoint evaluated in float64:"
        )
        for c in measured:
            value = _value_and_bound(c)[0]
            lines.append(
                f"{c['tier']:<7} {c.get('decoder') or '-':<8} {c['name']:<42} {value:>10}  {c['detail']}"
            )
    lines.append("PASSED" if report["passed"] else "FAILED: see the checks marked FAIL")
    return "\n".join(lines)
