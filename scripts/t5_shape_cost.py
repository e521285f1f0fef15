"""What a MADLAD-400-3B-shaped T5 costs to export and run, measured on a few of its layers (issue 61).

    python scripts/t5_shape_cost.py --tokenizer DIR --work DIR [--layers 2,4] [--sentences 8]

Run by hand, not in CI. For each layer count L, a T5ForConditionalGeneration with google/madlad400-3b-mt's
config.json (d_model 1024, 16 heads x d_kv 128, d_ff 8192 gated-GELU, vocabulary 256,000, an lm_head of
its own (transformers 5 ties it at construction: untied here), 32 buckets to distance 128) but L+L layers,
random weights, is saved with save_pretrained beside
--tokenizer's spiece.model and tokenizer files (any T5 SentencePiece tokenizer: the shape is what is
measured, and the model's ids beyond the tokenizer's are rows no token names). Then, each in its own
process under /usr/bin/time -v (its "Maximum resident set size"):

- `seq2onnx export` (fp32) and CTranslate2's `ct2-transformers-converter` (float32): peak RSS, wall time,
  size on disk;
- a load and a greedy decode of --sentences sentences to 64 tokens at batch 1, one thread, with our
  Translator and ctranslate2.Translator: load seconds, peak RSS, generated tokens per second.

`--export-only` stops after the export: the bundle's size beside the fp32 weights' (safetensors), no
CTranslate2, no decode; `--vocab` shrinks the vocabulary (256,000), so that a few layers weigh more than
the two 256,000-row tables and a check of the bundle's size per layer takes a minute, not ten.

The per-layer cost is the difference between two layer counts; docs/t5.md extrapolates it to 32+32.
Results: WORK/shape_cost.json. Keep L small: the 2+2 model is 2.7 GB of fp32 weights, 4+4 3.4 GB.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

MADLAD_3B = dict(
    vocab_size=256000,
    d_model=1024,
    d_kv=128,
    num_heads=16,
    d_ff=8192,
    feed_forward_proj="gated-gelu",
    relative_attention_num_buckets=32,
    relative_attention_max_distance=128,
    tie_word_embeddings=False,
    layer_norm_epsilon=1e-6,
    dropout_rate=0.0,
    decoder_start_token_id=0,
    pad_token_id=0,
    eos_token_id=1,
)
TEXT = "The weather is nice today, so we are going to walk to the station together."

DECODE = r"""
import json, sys, time
engine, path, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
t = time.perf_counter()
if engine == "ours":
    from seq2onnx.runtime.translator import Translator
    tr = Translator(path, device="cpu", intra_threads=1)
else:
    import ctranslate2, sentencepiece
    tr = ctranslate2.Translator(path, device="cpu", intra_threads=1)
    sp = sentencepiece.SentencePieceProcessor(model_file=sys.argv[4])
load = time.perf_counter() - t
tokens, t = 0, time.perf_counter()
for i in range(n):
    text = f"{i}. " + sys.argv[5]
    if engine == "ours":
        r = tr.translate_batch([text], beam_size=1, max_decoding_length=64)[0]
        tokens += len(r.token_ids[0]) + 1
    else:
        r = tr.translate_batch([sp.encode(text, out_type=str) + ["</s>"]], beam_size=1,
                               max_decoding_length=64, min_decoding_length=0)[0]
        tokens += len(r.hypotheses[0]) + 1
print(json.dumps({"load_s": load, "tokens": tokens, "decode_s": time.perf_counter() - t}))
"""


def timed(cmd: list[str]) -> dict:
    """Runs cmd under /usr/bin/time -v: wall seconds, peak RSS (GB) and the last stdout line."""
    t = time.perf_counter()
    proc = subprocess.run(["nice", "/usr/bin/time", "-v", *cmd], capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"error: {' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr).group(1))
    lines = proc.stdout.strip().splitlines()
    return {
        "wall_s": time.perf_counter() - t,
        "peak_rss_gb": rss * 1024 / 1e9,
        "stdout": lines[-1] if lines else "",
    }


def size_gb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e9


def build(layers: int, tokenizer: Path, out: Path, vocab: int = MADLAD_3B["vocab_size"]) -> dict:
    """The random-weight model of `layers`+`layers` layers, saved; its parameter count."""
    config = {**MADLAD_3B, "vocab_size": vocab}
    code = (
        "import sys, torch; from transformers import T5Config, T5ForConditionalGeneration\n"
        "torch.manual_seed(0)\n"
        f"c = T5Config(**{config!r}, num_layers={layers}, num_decoder_layers={layers})\n"
        "m = T5ForConditionalGeneration(c).eval()\n"
        "m.lm_head.weight = torch.nn.Parameter(torch.randn_like(m.lm_head.weight) * c.d_model ** -0.5)\n"
        "m.save_pretrained(sys.argv[1]); print(sum(p.numel() for p in m.parameters()))\n"
    )
    shutil.rmtree(out, ignore_errors=True)
    result = timed([sys.executable, "-c", code, str(out)])
    for name in ("spiece.model", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tokenizer / name).is_file():
            shutil.copyfile(tokenizer / name, out / name)
    (out / "generation_config.json").write_text(
        json.dumps({"decoder_start_token_id": 0, "eos_token_id": 1, "pad_token_id": 0, "max_length": 64})
    )
    return {"parameters": int(result["stdout"]), "build_peak_rss_gb": result["peak_rss_gb"]}


def measure(layers: int, args) -> dict:
    model, bundle, ct2 = (args.work / f"{name}-{layers}" for name in ("model", "bundle", "ct2"))
    row = {"layers": layers, "vocab": args.vocab, **build(layers, args.tokenizer, model, args.vocab)}
    row["model_gb"] = size_gb(model)
    cli = Path(sys.executable).parent
    row["export"] = timed([str(cli / "seq2onnx"), "export", str(model), str(bundle), "--force"])
    print(json.dumps({"layers": layers, "export": row["export"]}), flush=True)  # each stage as it ends
    if args.export_only:
        weights = sum(p.stat().st_size for p in model.glob("*.safetensors"))
        row.update(bundle_gb=size_gb(bundle), fp32_weights_gb=weights / 1e9)
        row["bundle_over_weights"] = row["bundle_gb"] / row["fp32_weights_gb"]
        print(json.dumps(row), flush=True)
        shutil.rmtree(model)
        shutil.rmtree(bundle)
        return row
    row["ct2_convert"] = timed(
        [str(cli / "ct2-transformers-converter"), "--model", str(model), "--output_dir", str(ct2), "--force"]
    )
    row["bundle_gb"], row["ct2_gb"] = size_gb(bundle), size_gb(ct2)
    print(json.dumps({k: v for k, v in row.items() if k != "export"}), flush=True)
    shutil.rmtree(model)  # the decodes need only the bundle and the CTranslate2 model
    for engine, path in (("ours", bundle), ("ct2", ct2)):
        r = timed(
            [
                sys.executable,
                "-c",
                DECODE,
                engine,
                str(path),
                str(args.sentences),
                str(args.tokenizer / "spiece.model"),
                TEXT,
            ]
        )
        row[engine] = {**json.loads(r["stdout"]), "peak_rss_gb": r["peak_rss_gb"]}
        row[engine]["tokens_per_s"] = row[engine]["tokens"] / row[engine]["decode_s"]
        print(json.dumps({"layers": layers, engine: row[engine]}), flush=True)
    print(json.dumps(row), flush=True)
    shutil.rmtree(bundle)
    shutil.rmtree(ct2)
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokenizer", type=Path, required=True, help="a T5 model directory with spiece.model")
    p.add_argument("--work", type=Path, required=True, help="scratch directory (models are deleted after)")
    p.add_argument("--layers", default="2,4", help="comma-separated encoder (= decoder) layer counts")
    p.add_argument("--sentences", type=int, default=8, help="sentences decoded by each engine")
    p.add_argument("--vocab", type=int, default=MADLAD_3B["vocab_size"], help="vocabulary size (MADLAD's)")
    p.add_argument("--export-only", action="store_true", help="the export and the bundle's size alone")
    args = p.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    rows = [measure(int(n), args) for n in args.layers.split(",")]
    (args.work / "shape_cost.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
