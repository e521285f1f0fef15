"""gpu_check.py's outputs: summary.md (every step's table), results.json and logs.tar.xz."""

from __future__ import annotations

import io
import json
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scaffold import fmt, md_table  # noqa: E402

STEPS = ("env", "train", "export", "tests", "verify", "parity", "copies", "bench", "torch")  # in order


def fmt_num(x, digits: int = 0) -> str:
    return fmt(x, f",.{digits}f")


def summary(results: dict, mode: str, seconds: float) -> str:
    """The Markdown report of every step: what summary.md holds."""
    r = {k: (results.get(k, {}).get("result") or {}) for k in STEPS}
    lines = [f"# GPU check ({mode} mode): {seconds:.0f} s", ""]
    lines += md_table(
        ["step", "status", "seconds", "why not ok"],
        [[k, v["status"], fmt_num(v.get("seconds"), 1), v.get("reason") or ""] for k, v in results.items()],
    )
    env = r["env"]
    lines += [
        "",
        "## Environment",
        "",
        f"python {env.get('python')}, torch {env.get('torch')} (CUDA {env.get('torch_cuda')},"
        f" GPU: {env.get('gpu', 'none')}), onnxruntime {env.get('onnxruntime')} "
        f"({', '.join(env.get('onnxruntime_distributions', []))}), providers {env.get('providers')}, "
        f"ctranslate2 {env.get('ctranslate2')}",
        "",
    ]
    lines += [f"    {x}" for x in env.get("nvidia_smi", [])]
    t = r["train"]
    lines += ["", "## Training", ""] + md_table(
        ["device", "precision", "steps", "train s", "steps/s", "tokens/s", "valid BLEU", "data"],
        [
            [
                env.get("gpu", "cpu"),
                t.get("precision"),
                fmt_num(t.get("steps")),
                fmt_num(t.get("train_seconds"), 1),
                fmt_num(t.get("steps_per_s"), 1),
                fmt_num(t.get("tokens_per_s")),
                fmt_num(t.get("valid_bleu"), 1),
                t.get("data"),
            ]
        ],
    )
    tests = r["tests"]
    lines += [
        "",
        "## GPU tests (`pytest -m gpu tests/test_gpu.py`)",
        "",
        f"counts: {tests.get('counts')}",
        "",
    ]
    lines += md_table(
        ["test", "status", "message"],
        [[c["name"], c["status"], c["message"]] for c in tests.get("cases", [])],
    )
    lines += ["", "## verify"]
    for name, v in r["verify"].items():
        verdict = "PASSED" if v["passed"] else "FAILED"
        lines += [
            "",
            f"### {name}: {verdict} on {v['provider']}, {v['sentences']} sentences",
            "",
            "```",
            v["table"],
            "```",
        ]
    p = r["parity"]
    if p:
        f16 = p["fp16_greedy"]
        lines += [
            "",
            f"## Parity ({p['device']}, {p['decoder']} decoder, {p['sentences']} test sentences)",
            "",
        ]
        lines += md_table(
            ["check", "result", "goal"],
            [
                [
                    "fp32 greedy token ids = PyTorch",
                    f"{p['fp32_beam1']['identical']}/{p['fp32_beam1']['of']}",
                    "all",
                ],
                [
                    "fp32 beam 4 token ids = PyTorch",
                    f"{p['fp32_beam4']['identical']}/{p['fp32_beam4']['of']}",
                    "all",
                ],
                [
                    "fp16 greedy = fp32 greedy",
                    f"{f16['agree_with_fp32']}/{f16['of']} ({100 * f16['rate']:.1f}%)",
                    ">= 99%",
                ],
                [
                    "BLEU fp32 - fp16 (greedy)",
                    f"{f16['bleu_fp32']:.2f} - {f16['bleu_fp16']:.2f} = {f16['bleu_drop']:.2f}",
                    "<= 0.3",
                ],
                [
                    "non-finite scores (fp32 greedy, beam 4, fp16)",
                    f"{p['fp32_beam1']['non_finite_scores']}, "
                    f"{p['fp32_beam4']['non_finite_scores']}, {f16['non_finite_scores']}",
                    "0",
                ],
            ],
        )
    c = r["copies"]
    if c:
        lines += [
            "",
            "## Host <-> device copies per decoder step (standard decoder)",
            "",
            "Inputs bound from host arrays are copied up at every step on CUDA; outputs placed on the "
            "host are copied down; values fed back (each step's cache into the next) and those bound "
            "once per batch stay where they are. CUPTI counts what CUDA did: the difference of two "
            "runs "
            "of forced lengths over their difference in steps.",
            "",
        ]
        rows = []
        for key, v in c.items():
            if key.endswith("_memcpy_nodes") or key == "tf32_probe":
                continue
            cu = v.get("cupti")
            rows.append(
                [
                    key,
                    v["rows"],
                    v["device"],
                    f"{', '.join(v['inputs_from_host'])} ({v['upload_bytes_per_step']} B)",
                    f"{len(v['inputs_fed_back'])} + {len(v['inputs_per_batch'])} on {v['input_devices']}",
                    f"{', '.join(v['outputs_read'])} on {v['outputs_read_devices']}",
                    f"{len(v['outputs_fed_back'])} on {v['outputs_fed_back_devices']}",
                    v["same_bindings_every_step"],
                    "n/a"
                    if not cu
                    else f"{cu['htod']:.2f} / {cu['dtoh']:.2f} / {cu['dtod']:.2f} "
                    f"({cu['kernels']:.0f} kernels)",
                    v.get("cupti_error", ""),
                ]
            )
        lines += md_table(
            [
                "bundle, search",
                "rows",
                "device",
                "up each step: host arrays",
                "inputs fed back + per batch",
                "read by the search",
                "outputs fed back",
                "same every step",
                "CUPTI per step: HtoD / DtoH / DtoD",
                "note",
            ],
            rows,
        )
        nodes = "; ".join(f"{k.split('_')[0]}: {v}" for k, v in c.items() if k.endswith("_memcpy_nodes"))
        lines += ["", f"Memcpy nodes onnxruntime put into the decoder graph (each runs every step): {nodes}"]
        lines += [
            "",
            "fp32 encoder outputs, max abs difference from the CPU provider, with onnxruntime's "
            f"CUDA default and with use_tf32=0: {c.get('tf32_probe')}",
        ]
    b = r["bench"]
    if b:
        lines += ["", "## seq2onnx bench", "", "```", b["report"].strip(), "```"]
    tr = r["torch"]
    if tr:
        lines += ["", f"## PyTorch reference decoder on {tr['device']}", ""]
        by = {(x["search"], x["batch"]): x["tokens_per_s"] for x in tr["rows"]}
        rows = [[x["engine"], x["search"], x["batch"], fmt_num(x["tokens_per_s"])] for x in tr["rows"]]
        for row in (b or {}).get("rows", []):
            ref = by.get((row["search"], row["batch"]))
            if row["engine"] != "torch" and ref and row["tokens_per_s"]:
                rows.append(
                    [
                        row["engine"],
                        row["search"],
                        row["batch"],
                        f"{fmt_num(row['tokens_per_s'])} "
                        f"({row['tokens_per_s'] / ref:.2f}x torch-{tr['device']})",
                    ]
                )
        lines += md_table(["engine", "search", "batch", "tokens/s"], rows)
    return "\n".join(lines) + "\n"


def write_outputs(out: Path, work: Path, results: dict, mode: str, seconds: float) -> str:
    """Writes summary.md, results.json and logs.tar.xz into out (each atomically); returns the summary."""
    from seq2onnx import atomic

    text = summary(results, mode, seconds)
    atomic.write_file(out / "summary.md", text)
    atomic.write_file(
        out / "results.json",
        json.dumps({"mode": mode, "seconds": seconds, "steps": results}, indent=1, default=str) + "\n",
    )
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tar:
        for f in (
            sorted(work.glob("*.json"))
            + sorted(work.glob("*.txt"))
            + sorted(work.glob("*.xml"))
            + sorted((work / "logs").glob("*.log"))
        ):
            tar.add(f, arcname=str(f.relative_to(work)))
    atomic.write_file(out / "logs.tar.xz", buf.getvalue())
    return text
