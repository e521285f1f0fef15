"""What hf_real_sizes.py and its jobs (hf_sizes_jobs.py) share: the models' sizes, the test text, memory
figures, and run_job, the parent's side of a job (serve_wrk.py uses it too)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from scaffold import log, rss_mb
from seq2onnx.atomic import write_file

TATOEBA = Path(__file__).resolve().parents[2] / "shared" / "data" / "tatoeba-cmn-eng" / "cmn.txt"
ROWS = [("greedy", 1, 1), ("greedy", 1, 32), ("beam4", 4, 1), ("beam4", 4, 32)]  # (search, beam, batch)
M2M_LANGS, M2M_MADEUP = 100, 8  # M2M100Tokenizer's language tokens and num_madeup_words after vocab.json
MBART_LANGS = 52  # MBart50Tokenizer's language codes, after the pieces and before <mask>
# The multilingual families' languages: (tokenizer's src_lang, target token, translate_batch's target_lang)
LANGS = {"m2m_100": ("en", "__fr__", "fr"), "mbart": ("en_XX", "fr_XX", "fr_XX")}


def _size(family, d, layers, heads, ffn, vocab, spm):
    return dict(family=family, d=d, layers=layers, heads=heads, ffn=ffn, vocab=vocab, spm=spm)


SIZES = {  # family, d_model, layers (each side), heads, ffn, vocabulary, SentencePiece pieces trained
    "marian": _size("marian", 512, 6, 8, 2048, 58101, 8000),  # OPUS-MT, about 74M parameters
    "nllb": _size("m2m100", 1024, 12, 16, 4096, 256206, 8000),  # NLLB-600M as an M2M100
    "mbart": _size("mbart", 1024, 12, 16, 4096, 250054, 8000),  # mBART-50 many-to-many, about 611M
    # facebook/nllb-200-1.3B and -3.3B's configs: about 1.37B and 3.34B parameters, 5.5 and 13.4 GB fp32
    "nllb-1.3b": _size("m2m100", 1024, 24, 16, 8192, 256206, 8000),
    "nllb-3.3b": _size("m2m100", 2048, 24, 32, 8192, 256206, 8000),
}
TINY = {  # 64 wide: the whole pipeline in minutes
    "marian": _size("marian", 64, 2, 4, 256, 3000, 1000),
    "nllb": _size("m2m100", 64, 2, 4, 256, 3000, 1000),
    "mbart": _size("mbart", 64, 2, 4, 256, 3000, 1000),
    "nllb-1.3b": _size("m2m100", 64, 3, 4, 256, 3000, 1000),
    "nllb-3.3b": _size("m2m100", 128, 3, 8, 256, 3000, 1000),
}


def strip(row: list[int], eos: int, pad: int) -> list[int]:
    """A generate() row as our token_ids: no decoder start, no end token and nothing after it."""
    ids = row[1:]
    if eos in ids:
        return ids[: ids.index(eos)]
    while ids and ids[-1] == pad:
        ids.pop()
    return ids


def memory_mb() -> dict:
    """VmRSS and VmHWM (peak) of this process, MB (VmHWM, unlike ru_maxrss, starts afresh at the exec)."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1]) / 1024
    return {"rss_mb": out.get("VmRSS"), "peak_rss_mb": out.get("VmHWM")}


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def mem_available_gb() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    return 16.0


def run_job(spec: dict, work: Path, name: str, timeout: float, max_rss_gb: float = float("inf")) -> dict:
    """Runs one job (`hf_sizes_jobs.py SPEC`) in a child process, killed past `timeout` seconds or
    `max_rss_gb` resident (before the OOM killer); returns its result, or {"error": ...} with why and the end
    of its log (WORK/jobs/NAME.log)."""
    jobs = work / "jobs"
    jobs.mkdir(parents=True, exist_ok=True)
    spec = dict(spec, result=str(jobs / f"{name}.result.json"), label=name)
    spec_path, log_path, result = jobs / f"{name}.spec.json", jobs / f"{name}.log", Path(spec["result"])
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    result.unlink(missing_ok=True)
    t, killed, seen = time.perf_counter(), None, 0.0
    with open(log_path, "w") as err:
        argv = [sys.executable, str(Path(__file__).with_name("hf_sizes_jobs.py")), str(spec_path)]
        env = {**os.environ, **spec.get("env", {})}
        proc = subprocess.Popen(argv, stdout=err, stderr=subprocess.STDOUT, env=env)
        try:
            while proc.poll() is None and not killed:
                time.sleep(0.25)
                seen = max(seen, rss_mb(proc.pid) / 1024)
                if time.perf_counter() - t > timeout:
                    killed = f"killed by this script: timed out after {timeout:.0f} s"
                elif seen > max_rss_gb:
                    killed = f"killed by this script: resident set {seen:.1f} GB, over {max_rss_gb:.1f} GB"
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    wall = time.perf_counter() - t
    if proc.returncode == 0 and result.is_file():
        return json.loads(result.read_text(encoding="utf-8")) | {"wall_s": wall}
    lines = [x.strip() for x in log_path.read_text(errors="replace").splitlines() if x.strip()]
    raised = [x for x in lines if x.split(":")[0].endswith(("Error", "Exception", "Interrupt"))]
    why = killed or f"exit {proc.returncode}"
    error = f"{why}: " + (raised[-1] if raised else " | ".join(lines[-3:])) if lines else why
    log(f"{name}: FAILED after {wall:.0f} s ({error[:600]}); log: {log_path}")
    return {"error": error, "log": str(log_path), "wall_s": wall, "peak_rss_seen_gb": seen}


_WORDS = (
    "the a this my your his her our one two three old new big small good little long great red blue "
    "green man woman child dog cat house car book tree city river friend teacher student father mother "
    "day night time year water school work room door table street music letter apple garden train is "
    "was will can must should sees likes finds reads writes takes gives makes knows wants needs buys "
    "opens closes carries quickly slowly often never always today yesterday tomorrow here there in on "
    "at with under near behind before after because and but or if when where why how very really not"
).split()


def english_corpus() -> tuple[list[str], str]:
    """Distinct English sentences to train SentencePiece on and draw test sentences from, and their origin:
    Tatoeba's first column where ../shared has it (CC-BY 2.0 France, tatoeba.org), generated text else."""
    if TATOEBA.is_file():
        with open(TATOEBA, encoding="utf-8-sig") as f:
            seen = dict.fromkeys(c for c in (line.split("\t")[0].strip() for line in f) if c)
        return list(seen), f"{TATOEBA} (first column; CC-BY 2.0 France, tatoeba.org)"
    rng, seen = random.Random(0), {}
    while len(seen) < 20000:
        s = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 22)))
        seen.setdefault(s[0].upper() + s[1:] + ".", None)
    return list(seen), "generated (no Tatoeba file at ../shared/data/tatoeba-cmn-eng/cmn.txt)"


def test_sentences(n: int) -> list[str]:
    """n English sentences of 8-25 words, spread evenly over the corpus (deterministic)."""
    pool = [s for s in english_corpus()[0] if 8 <= len(s.split()) <= 25]
    if len(pool) < n:
        raise SystemExit(
            f"error: {len(pool)} sentences of 8-25 words in the corpus: ask --sentences {len(pool)}"
        )
    return [pool[int(i * len(pool) / n)] for i in range(n)]


class GpuMemory:
    """Device 0's used memory (NVML, else nvidia-smi), sampled every 20 ms in a thread, less its value at
    the start. Each engine runs alone in a process of its own, so the rise is that engine's: its CUDA
    context, weights, caches and allocator's pool. Every figure is None without an NVIDIA GPU."""

    def __init__(self):
        import threading

        self._read = self._reader()
        self.base = self.peak = self._read() if self._read else None
        self._stop = threading.Event()
        if self._read:
            threading.Thread(target=self._run, daemon=True).start()

    @staticmethod
    def _reader():
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            return lambda: pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20
        except Exception:  # no pynvml, or no driver: try the command line
            import shutil

            cmd = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "--id=0"]
            run = subprocess.run
            return (
                (lambda: float(run(cmd, capture_output=True, text=True, timeout=10).stdout.split()[0]))
                if (shutil.which("nvidia-smi"))
                else None
            )

    def _run(self):
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self._read())

    def now_mb(self) -> float | None:
        return None if self._read is None else self._read() - self.base

    def peak_mb(self) -> float | None:
        return None if self._read is None else max(self.peak, self._read()) - self.base

    def close(self) -> None:
        self._stop.set()


def write_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_file(path, json.dumps(data, default=str))
