"""Real sizes: Hugging Face Marian and M2M100 models at their published sizes, random weights, imported and
timed.

    python scripts/hf_real_sizes.py --work DIR [--models marian,nllb] [--sentences 32]
                                       [--max-new-tokens 32] [--threads 2] [--skip-build] [--tiny]
                                       [--out DIR] [--repeat R]

Issue 25, item 6 (run once, not in CI). Two model directories are written with transformers' own
save_pretrained, random (seeded) weights from their configs:

- marian: OPUS-MT size (d_model 512, 6+6 layers, 8 heads, ffn 2048, vocabulary 58,101, about 74M
  parameters), OPUS-MT's conventions (</s> 0, <unk> 1, <pad> = decoder start = 58,100, swish, bad_words_ids
  [[58100]], renormalize_logits, forced_eos_token_id 0);
- nllb: NLLB-600M size as an M2M100 (d_model 1024, 12+12 layers, 16 heads, ffn 4096, vocabulary 256,206,
  about 615M parameters; <s> 0 <pad> 1 </s> 2 <unk> 3, decoder start 2, relu), M2M100Tokenizer's layout;
- mbart (asked for by name: --models mbart): mBART-50 many-to-many size (d_model 1024, 12+12 layers, 16 heads,
  ffn 4096, vocabulary 250,054, about 611M parameters; gelu, layernorm_embedding, learned positions),
  MBart50Tokenizer's layout, en_XX -> fr_XX forced (issue 35, item 7).

The tokenizers are a unigram SentencePiece model trained on English (the first column of
../shared/data/tatoeba-cmn-eng/cmn.txt when it exists, CC-BY 2.0 France, tatoeba.org; generated text
otherwise), with unused filler pieces appended so that the SentencePiece model and vocab.json have the
model's whole vocabulary: the embeddings and the output projection have their real sizes.

Each measurement runs in its own child process (hf_sizes_jobs.py SPEC), so that each has its own peak
resident set (VmHWM, which unlike ru_maxrss does not carry the parent's pages over the exec): our export to
an fp32 and an int8 bundle, CTranslate2's converter (TransformersConverter, fp32; its int8 is the fp32
model loaded with compute_type="int8", as CTranslate2 recommends), and one child per engine translating the
same source ids: PyTorch's model.generate (the reference), ours fp32 and int8, CTranslate2 fp32 and int8 at
intra_threads=THREADS and at 1 (the faster per row is compared, and named). Rows: greedy and beam 4, at
batch 1 (the first 8 sentences, one at a time) and batch 32 (the sentences in batches of 32); each row is
warmed up once (its first batch) and then timed over all its batches. tokens/s = generated target tokens
(the forced language token of M2M100 and the end token included, the decoder start excluded) / seconds.

Notes on options: --max-new-tokens is transformers' max_length less one (it counts the decoder start);
--ct2-mkl adds CTranslate2 fp32 with CT2_USE_MKL=1 as another setting in the per-row best (its default on AMD
is oneDNN; MKL's int8 measured 10-40x slower, so int8 never); --engines leaves out what the machine cannot
hold (an NLLB-3.3B CTranslate2 conversion holds two fp32 copies, over 24 GiB); int4's rows are in
report.json, not yet in report.md; --max-job-rss-gb kills a job (recording why) before the OOM killer does.

Results: OUT/report.json (every measurement, every output) and OUT/report.md (the tables), merged with the
other model's results when OUT already holds a report. Model directories are cached under --work.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from hf_sizes_common import (
    BATCH1_SENTENCES,
    SIZES,
    TINY,
    log,
    mem_available_gb,
    run_job,
    test_sentences,
    write_atomic,
)
from hf_sizes_report import fmt_load, markdown, summarise


# ----------------------------------------------------------------------------------------------- parent
def code_state() -> dict:
    """The checkout measured: HEAD and the files of the package changed from it (the importer and runtime
    under test)."""
    root = Path(__file__).resolve().parents[1]

    def git(*a):
        try:
            done = subprocess.run(["git", "-C", str(root), *a], capture_output=True, text=True, timeout=30)
            return done.stdout.rstrip()
        except (OSError, subprocess.SubprocessError):
            return ""

    status = git("status", "--porcelain", "--", "export", "runtime", "model")
    changed = [line[3:] for line in status.splitlines()]
    return {"head": git("log", "-1", "--format=%h %ci %s")[:200].strip(), "changed": changed}


def macs(size: dict) -> dict:
    """Multiply-adds of one decoder step at one row, from the config (not measured)."""
    d, L, F, V = size["d"], size["layers"], size["ffn"], size["vocab"]
    layers = L * (4 * d * d + 2 * d * d + 2 * d * F)  # self-attention q,k,v,o; cross q,o; feed-forward
    return {"layers": layers, "projection": d * V, "share": d * V / (layers + d * V)}


def run_model(name: str, size: dict, args, work: Path) -> dict:
    """One model measured: built (or reused), prepared, exported and converted, then every engine's rounds.

    Args:
        name: marian, nllb or mbart.
        size: its entry of SIZES (or TINY).
        args: the parsed command line.
        work: the working directory.

    Returns:
        The model's entry of report.json; a failed step is recorded under "errors" (and a failed build or
        preparation ends the measurement early).
    """
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    entry: dict = {
        "model": name,
        "size": size,
        "started": started,
        "load_start": os.getloadavg(),
        "sentences": args.sentences,
        "max_new_tokens": args.max_new_tokens,
        "threads": args.threads,
        "repeat": args.repeat,
        "batch1_sentences": args.batch1_sentences,
        "ct2_threads": args.ct2_threads,
        "ct2_mkl": args.ct2_mkl,
        "max_job_rss_gb": args.max_job_rss_gb,
        "errors": {},
    }
    entry["code"] = code_state()
    t_model = time.perf_counter()
    tag = f"{'tiny-' if args.tiny else ''}{name}"
    mdir = work / "models" / tag
    if not (mdir / "model.safetensors").is_file() and not _build(tag, size, mdir, args, work, entry):
        return entry
    entry["build"] = json.loads((mdir / "build.json").read_text())
    entry["model_dir"] = str(mdir)
    entry["weights_bytes"] = (mdir / "model.safetensors").stat().st_size
    out = work / "out" / tag
    out.mkdir(parents=True, exist_ok=True)
    prep = run_job(
        {
            "job": "prepare",
            "model_dir": str(mdir),
            "sentences": test_sentences(args.sentences),
            "vocab_out": str(out / "id_to_token.json"),
        },
        work,
        f"{tag}-prepare",
        args.job_timeout,
        args.max_job_rss_gb,
    )
    if "error" in prep:
        entry["errors"]["prepare"] = prep["error"]
        return entry
    prepared = out / "prepared.json"
    prepared.write_text(json.dumps(prep, ensure_ascii=False), encoding="utf-8")
    entry["source_lengths"] = {"mean": statistics.mean(prep["source_lens"]), "max": max(prep["source_lens"])}
    steps = _exports(tag, mdir, out, args, work, entry)
    for key, r in steps.items():
        if "error" in r:
            entry["errors"][key] = r["error"]
        else:
            log(
                f"{tag}: {key}: {r['seconds']:.1f} s, peak RSS {r['peak_rss_mb']:.0f} MB, "
                f"{r['bytes'] / 1e6:.0f} MB"
            )
    entry["steps"] = steps

    common = {
        "job": "engine",
        "prepared": str(prepared),
        "max_new_tokens": args.max_new_tokens,
        "model_dir": str(mdir),
        "batch1_sentences": args.batch1_sentences,
    }
    engines = _engines(steps, out, args)
    rounds = _rounds(tag, engines, common, args, work, entry)
    names = list(engines)
    entry["rounds"] = rounds
    entry.update(summarise(rounds, names, out / "id_to_token.json", args.max_new_tokens))
    entry["load_end"] = os.getloadavg()
    entry["wall_s"] = time.perf_counter() - t_model
    entry["macs"] = macs(size)
    return entry


def _build(tag: str, size: dict, mdir: Path, args, work: Path, entry: dict) -> bool:
    """Builds the model directory mdir in a job (random weights, seed 0), renamed into place when whole.

    Returns:
        Whether it was built; if not, entry["errors"]["build"] says why.

    Raises:
        SystemExit: --skip-build, and no model there.
    """
    if args.skip_build:
        raise SystemExit(
            f"error: --skip-build but {mdir} holds no built model; run once without --skip-build"
        )
    log(f"{tag}: building the model directory {mdir} (random weights, seed 0)")
    partial = work / "models" / f".{tag}.partial"
    import shutil

    shutil.rmtree(partial, ignore_errors=True)
    built = run_job(
        {"job": "build", "size": size, "out": str(partial)},
        work,
        f"{tag}-build",
        args.job_timeout,
        args.max_job_rss_gb,
    )
    if "error" in built:
        entry["errors"]["build"] = built["error"]
        return False
    (partial / "build.json").write_text(json.dumps(built))
    partial.rename(mdir)
    log(f"{tag}: built in {built['wall_s']:.0f} s, peak RSS {built['peak_rss_mb']:.0f} MB")
    return True


def _exports(tag: str, mdir: Path, out: Path, args, work: Path, entry: dict) -> dict:
    """Our fp32 and int8 exports and CTranslate2's conversion, each a job; or, with --skip-exports, the
    previous run's (OUT/steps.json).

    Returns:
        {"export_fp32", "export_int8", "ct2_convert"}: each job's result, or {"error": ...}.

    Raises:
        SystemExit: --skip-exports without a previous run's steps.json.
    """
    steps_file = out / "steps.json"
    if args.skip_exports:
        if not steps_file.is_file():
            raise SystemExit(
                f"error: --skip-exports but {steps_file} is missing; run once without --skip-exports"
            )
        steps = json.loads(steps_file.read_text())
        entry["steps_reused_from"] = f"{steps_file} ({time.ctime(steps_file.stat().st_mtime)})"
        log(f"{tag}: export and conversion results reused from {entry['steps_reused_from']}")
        return steps
    steps = {}
    for key, quantize in (("export_fp32", None), ("export_int8", "int8"), ("export_int4", "int4")):
        if "ours" not in args.engines or key[len("export_") :] not in args.variants:
            steps[key] = {"error": "not run (--engines / --variants)"}
            continue
        log(f"{tag}: {key}")
        steps[key] = run_job(
            {
                "job": "export",
                "model_dir": str(mdir),
                "out": str(out / key.replace("export_", "bundle-")),
                "quantize": quantize,
            },
            work,
            f"{tag}-{key}",
            args.job_timeout,
            args.max_job_rss_gb,
        )
    if "ct2" not in args.engines:
        steps["ct2_convert"] = {"error": "not run (--engines)"}
        steps_file.write_text(json.dumps(steps))
        return steps
    log(f"{tag}: CTranslate2 conversion (fp32)")
    steps["ct2_convert"] = run_job(
        {"job": "ct2_convert", "model_dir": str(mdir), "out": str(out / "ct2")},
        work,
        f"{tag}-ct2_convert",
        args.job_timeout,
        args.max_job_rss_gb,
    )
    steps_file.write_text(json.dumps(steps))
    return steps


def _engines(steps: dict, out: Path, args) -> dict:
    """The engines to time, by name: PyTorch, ours (each bundle exported) and CTranslate2 (per thread setting,
    fp32 and int8; with --ct2-mkl, fp32 on MKL too), each the engine job's settings."""
    engines = {"torch": dict(engine="torch", threads=args.threads)} if "torch" in args.engines else {}
    for variant in ("fp32", "int8", "int4"):
        if "error" not in steps.get(f"export_{variant}", {"error": "not exported"}):
            engines[f"ours-{variant}"] = dict(
                engine="ours", threads=args.threads, bundle=str(out / f"bundle-{variant}")
            )
        if "error" not in steps["ct2_convert"] and variant in args.variants and variant != "int4":
            for th in args.ct2_threads:
                engines[f"ct2-{variant}-t{th}"] = dict(
                    engine="ct2",
                    threads=th,
                    ct2_dir=str(out / "ct2"),
                    compute_type="float32" if variant == "fp32" else "int8",
                )
            if args.ct2_mkl and variant == "fp32" and "error" not in steps["ct2_convert"]:
                engines[f"ct2-{variant}-t{args.threads}-mkl"] = dict(
                    engine="ct2",
                    threads=args.threads,
                    ct2_dir=str(out / "ct2"),
                    env={"CT2_USE_MKL": "1"},
                    compute_type="float32" if variant == "fp32" else "int8",
                )
    return engines


def _rounds(tag: str, engines: dict, common: dict, args, work: Path, entry: dict) -> list[dict]:
    """--repeat rounds of every engine, each a job, the order rotated so that no engine always runs first.

    Returns:
        Per round, each engine's result (or {"error": ...}, also recorded in entry["errors"]).
    """
    rounds = []
    names = list(engines)
    for r in range(args.repeat):
        order = names[r % len(names) :] + names[: r % len(names)]  # rotate: no engine always first
        results = {}
        for e in order:
            log(f"{tag}: round {r + 1}/{args.repeat}: {e}")
            results[e] = run_job(
                {**common, **engines[e]}, work, f"{tag}-{e}-r{r}", args.job_timeout, args.max_job_rss_gb
            )
            if "error" in results[e]:
                entry["errors"][f"{e} (round {r + 1})"] = results[e]["error"]
        rounds.append(results)
    return rounds


def machine() -> str:
    cpu = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}"


def build_parser() -> argparse.ArgumentParser:
    """The command line (the module's docstring is its epilog: what each option changes)."""
    doc = __doc__.split("\n\n", 2)
    p = argparse.ArgumentParser(
        description=doc[0], epilog=doc[2], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--work", type=Path, help="models (cached), bundles, CTranslate2 models, WORK/jobs/*.log")
    p.add_argument(
        "--models", default="marian,nllb", help="a subset of " + ",".join(SIZES) + " (marian,nllb)"
    )
    p.add_argument("--sentences", type=int, default=32, help="test sentences (default 32), in batches of 32")
    p.add_argument("--max-new-tokens", type=int, default=32, help="per sentence, end token included (32)")
    p.add_argument("--threads", type=int, default=2, help="threads per engine (default 2)")
    p.add_argument("--repeat", type=int, default=1, help="rounds, order rotated: medians over rounds (1)")
    batch1 = f"sentences the batch-1 rows decode one at a time (default {BATCH1_SENTENCES})"
    p.add_argument("--batch1-sentences", type=int, default=BATCH1_SENTENCES, help=batch1)
    p.add_argument("--ct2-threads", help="CTranslate2 intra_threads tried, e.g. 2,1 (default: THREADS and 1)")
    p.add_argument("--ct2-mkl", action="store_true", help="also CTranslate2 fp32 with CT2_USE_MKL=1")
    p.add_argument("--engines", default="torch,ours,ct2", help="a subset of torch,ours,ct2 (default all)")
    p.add_argument(
        "--variants", default="fp32,int8", help="our bundles: a subset of fp32,int8,int4 (fp32,int8)"
    )
    p.add_argument("--skip-exports", action="store_true", help="reuse the last exports and their figures")
    p.add_argument("--render-only", action="store_true", help="rewrite OUT/report.md from OUT/report.json")
    p.add_argument("--skip-build", action="store_true", help="never build: WORK/models must hold the models")
    p.add_argument("--tiny", action="store_true", help="64-wide configs: the whole pipeline in minutes")
    p.add_argument("--out", type=Path, help="report.json and .md (default WORK/results[-tiny]; merged)")
    p.add_argument("--job-timeout", type=float, default=3600, help="seconds before a job is killed (3600)")
    rss = "kill a job whose resident set passes this (default: 85%% of the memory available at the start)"
    p.add_argument("--max-job-rss-gb", type=float, help=rss)
    return p


def _models(args) -> list[str]:
    """--models as a list."""
    return [m.strip() for m in args.models.split(",") if m.strip()]


def _check_args(p: argparse.ArgumentParser, args) -> None:
    """Refuses (p.error) a missing --work, an unknown model, a setting out of range; resolves --ct2-threads
    and the default --max-job-rss-gb."""
    if args.work is None:
        p.error("--work DIR is required")
    models = _models(args)
    bad = [m for m in models if m not in SIZES]
    if bad or not models:
        p.error(f"--models: unknown {bad or models}; choose from {', '.join(SIZES)}")
    if (
        args.sentences < 1
        or args.max_new_tokens < 2
        or args.threads < 1
        or args.repeat < 1
        or args.batch1_sentences < 1
    ):
        p.error("--sentences, --batch1-sentences, --threads and --repeat must be >= 1, --max-new-tokens >= 2")
    try:
        args.ct2_threads = [int(x) for x in (args.ct2_threads or f"{args.threads},1").split(",")]
        args.ct2_threads = sorted(set(args.ct2_threads), reverse=True)
        assert args.ct2_threads and min(args.ct2_threads) >= 1
    except (ValueError, AssertionError):
        p.error(f"--ct2-threads {args.ct2_threads}: give positive integers separated by commas, e.g. 2,1")
    args.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if not args.engines or set(args.engines) - {"torch", "ours", "ct2"}:
        p.error(f"--engines {','.join(args.engines)}: choose from torch, ours, ct2")
    if not args.variants or set(args.variants) - {"fp32", "int8", "int4"}:
        p.error(
            f"--variants {','.join(args.variants)}: choose from fp32, int8, int4 (ours only: CTranslate2 "
            "has no CPU int4)"
        )
    if args.max_job_rss_gb is None:
        args.max_job_rss_gb = 0.85 * mem_available_gb()


def _render_only(report: dict, report_path: Path, out: Path) -> int:
    """--render-only: the summaries again from the raw rounds, report.json and report.md rewritten."""
    if not report["models"]:
        raise SystemExit(f"error: --render-only: no report at {report_path}")
    # the summaries again, from the raw rounds (older reports lack some)
    for entry in report["models"].values():
        if entry.get("rounds") and entry.get("model_dir"):
            mdir = Path(entry["model_dir"])
            table = mdir.parents[1] / "out" / mdir.name / "id_to_token.json"
            entry.update(summarise(entry["rounds"], list(entry["rounds"][0]), table, entry["max_new_tokens"]))
    write_atomic(report_path, json.dumps(report, indent=1))
    write_atomic(out / "report.md", markdown(report))
    print(markdown(report))
    return 0


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    _check_args(p, args)
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    out = (args.out or work / ("results-tiny" if args.tiny else "results")).resolve()
    report_path = out / "report.json"
    report = json.loads(report_path.read_text()) if report_path.is_file() else {"models": {}}
    if args.render_only:
        return _render_only(report, report_path, out)
    report["machine"] = machine()
    log(
        f"load average at start {fmt_load(os.getloadavg())}; {mem_available_gb():.1f} GB available, a child "
        f"is killed over {args.max_job_rss_gb:.1f} GB; work {work}; results {out}"
    )
    for name in _models(args):
        entry = run_model(name, (TINY if args.tiny else SIZES)[name], args, work)
        entry["command"] = " ".join([Path(sys.executable).name, *sys.argv])
        report["models"][name] = entry
        write_atomic(report_path, json.dumps(report, indent=1))
        write_atomic(out / "report.md", markdown(report))
    print(markdown(report))
    log(f"done; load average {fmt_load(os.getloadavg())}; {out / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
