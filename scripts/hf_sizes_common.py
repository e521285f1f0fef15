"""Sizes, test text and helpers shared by hf_real_sizes.py and its jobs (hf_sizes_jobs.py), and run_job:
the parent's side, which gpu_sizes.py and serve_wrk.py use too."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

T0 = time.perf_counter()
TATOEBA = Path(__file__).resolve().parents[2] / "shared" / "data" / "tatoeba-cmn-eng" / "cmn.txt"
BATCH1_SENTENCES = 8
ROWS = [("greedy", 1, 1), ("greedy", 1, 32), ("beam4", 4, 1), ("beam4", 4, 32)]  # (search, beam, batch)
M2M_LANGS, M2M_MADEUP = 100, 8  # M2M100Tokenizer's language tokens and num_madeup_words after vocab.json

SIZES = {  # family, d_model, layers (each side), heads, ffn, vocabulary, SentencePiece pieces trained
    "marian": dict(family="marian", d=512, layers=6, heads=8, ffn=2048, vocab=58101, spm=8000),
    "nllb": dict(family="m2m100", d=1024, layers=12, heads=16, ffn=4096, vocab=256206, spm=8000),
    # mBART-50 many-to-many (facebook/mbart-large-50-many-to-many-mmt): about 611M parameters
    "mbart": dict(family="mbart", d=1024, layers=12, heads=16, ffn=4096, vocab=250054, spm=8000),
    # facebook/nllb-200-1.3B and -3.3B's configs: about 1.37B and 3.34B parameters, 5.5 and 13.4 GB fp32
    "nllb-1.3b": dict(family="m2m100", d=1024, layers=24, heads=16, ffn=8192, vocab=256206, spm=8000),
    "nllb-3.3b": dict(family="m2m100", d=2048, layers=24, heads=32, ffn=8192, vocab=256206, spm=8000),
}
TINY = {
    "marian": dict(family="marian", d=64, layers=2, heads=4, ffn=256, vocab=3000, spm=1000),
    "nllb": dict(family="m2m100", d=64, layers=2, heads=4, ffn=256, vocab=3000, spm=1000),
    "mbart": dict(family="mbart", d=64, layers=2, heads=4, ffn=256, vocab=3000, spm=1000),
    "nllb-1.3b": dict(family="m2m100", d=64, layers=3, heads=4, ffn=256, vocab=3000, spm=1000),
    "nllb-3.3b": dict(family="m2m100", d=128, layers=3, heads=8, ffn=256, vocab=3000, spm=1000),
}
MBART_LANGS = 52  # MBart50Tokenizer's language codes, after the pieces and before <mask>
# The multilingual families' languages: (tokenizer's src_lang, target token, translate_batch's target_lang)
LANGS = {"m2m_100": ("en", "__fr__", "fr"), "mbart": ("en_XX", "fr_XX", "fr_XX")}


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:8.1f}s] {msg}", file=sys.stderr, flush=True)


def memory_mb() -> dict:
    """VmRSS and VmHWM (peak) of this process, MB; ru_maxrss too (KB on Linux)."""
    import resource

    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1]) / 1024
    return {
        "rss_mb": out.get("VmRSS"),
        "peak_rss_mb": out.get("VmHWM"),
        "ru_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


# -------------------------------------------------------------------------------------------- parent
def child_rss_gb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 0.0


def run_job(spec: dict, work: Path, name: str, timeout: float, max_rss_gb: float = float("inf")) -> dict:
    """Runs one job in a child process; returns its result, or {"error": ...} with the end of its stderr."""
    jobs = work / "jobs"
    jobs.mkdir(parents=True, exist_ok=True)
    spec = dict(spec, result=str(jobs / f"{name}.result.json"), label=name)
    spec_path = jobs / f"{name}.spec.json"
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    Path(spec["result"]).unlink(missing_ok=True)
    Path(spec["result"] + ".peak").unlink(missing_ok=True)
    log_path = jobs / f"{name}.log"
    t = time.perf_counter()
    killed, seen = None, 0.0
    with open(log_path, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("hf_sizes_jobs.py")), str(spec_path)],
            stdout=err,
            stderr=subprocess.STDOUT,
            env={**os.environ, **spec.get("env", {})},
        )
        try:
            while proc.poll() is None:
                time.sleep(0.25)
                seen = max(seen, child_rss_gb(proc.pid))
                if time.perf_counter() - t > timeout:
                    killed = f"killed by this script: timed out after {timeout:.0f} s"
                elif seen > max_rss_gb:
                    killed = (
                        f"killed by this script: resident set {seen:.1f} GB, over --max-job-rss-gb "
                        f"{max_rss_gb:.1f} (protecting the machine from the OOM killer)"
                    )
                if killed:
                    proc.kill()
                    proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    wall = time.perf_counter() - t
    text = log_path.read_text(errors="replace")
    for line in text.splitlines():
        if line.endswith(" s)") and "tokens/s" in line:
            log(line.strip())
    if proc.returncode != 0 or not Path(spec["result"]).is_file():
        why = killed or f"exit {proc.returncode}"
        lines = [x.strip() for x in text.strip().splitlines() if x.strip() and "tokens/s (" not in x]
        raised = [x for x in lines if x.split(":")[0].endswith(("Error", "Exception", "Interrupt"))]
        error = f"{why}: " + (raised[-1] if raised else " | ".join(lines[-3:])) if lines else why
        log(f"{name}: FAILED after {wall:.0f} s ({error[:600]}); log: {log_path}")
        peak_file = Path(spec["result"] + ".peak")
        where = json.loads(peak_file.read_text()) if peak_file.is_file() else None
        return {
            "error": error,
            "log": str(log_path),
            "wall_s": wall,
            "peak_rss_seen_gb": seen,
            "peak_where": where,
        }
    result = json.loads(Path(spec["result"]).read_text(encoding="utf-8"))
    result["wall_s"] = wall
    return result


def mem_available_gb() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    return 16.0


# ---------------------------------------------------------------------------------------------- text
_WORDS = (
    "the a this my your his her our one two three old new big small good little long great red blue "
    "green man woman child dog cat house car book tree city river friend teacher student father mother "
    "day night time year water school work room door table street music letter apple garden train is "
    "was will can must should sees likes finds reads writes takes gives makes knows wants needs buys "
    "opens closes carries quickly slowly often never always today yesterday tomorrow here there in on "
    "at with under near behind before after because and but or if when where why how very really not "
    "also still already"
).split()


def english_corpus() -> tuple[list[str], str]:
    """Unique English sentences to train SentencePiece on and pick test sentences from, and where they come
    from."""
    if TATOEBA.is_file():
        seen: dict[str, None] = {}
        with open(TATOEBA, encoding="utf-8-sig") as f:
            for line in f:
                col = line.split("\t")[0].strip()
                if col:
                    seen.setdefault(col, None)
        return list(seen), f"{TATOEBA} (first column; CC-BY 2.0 France, tatoeba.org)"
    rng = random.Random(0)
    seen = {}
    while len(seen) < 20000:
        s = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 22)))
        seen.setdefault(s[0].upper() + s[1:] + ".", None)
    return list(seen), "generated (no Tatoeba file at ../shared/data/tatoeba-cmn-eng/cmn.txt)"


def test_sentences(n: int) -> list[str]:
    """n English sentences of 8-25 words, spread evenly over the corpus (deterministic)."""
    corpus, _ = english_corpus()
    pool = [s for s in corpus if 8 <= len(s.split()) <= 25]
    if len(pool) < n:
        raise SystemExit(
            f"error: only {len(pool)} sentences of 8-25 words in the corpus; ask for "
            f"--sentences {len(pool)} or fewer"
        )
    step = len(pool) / n
    return [pool[int(i * step)] for i in range(n)]


class GpuMemory:
    """The GPU's used memory, sampled every 20 ms in a thread, less what was used when it started.

    Each engine runs alone in a child process of its own, so the device's used memory (NVML, or nvidia-smi
    where pynvml is absent) less the baseline is that process's: its CUDA context, weights, caches and its
    allocator's pool, whatever the engine (torch's own counters see torch's allocations only). On a machine
    without an NVIDIA GPU every figure is None.
    """

    def __init__(self):
        import threading

        self._read = self._reader()
        self.base = self._read() if self._read else None
        self.peak = self.base
        self._stop = threading.Event()
        if self._read:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()

    @staticmethod
    def _reader():
        """A function returning device 0's used memory in MB, or None where there is no NVIDIA GPU."""
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            return lambda: pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20
        except Exception:  # no pynvml, or no driver: try the command line
            pass
        import shutil
        import subprocess

        if not shutil.which("nvidia-smi"):
            return None
        cmd = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "--id=0"]
        return lambda: float(
            subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.split()[0]
        )

    def _run(self):
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self._read())

    def now_mb(self) -> float | None:
        """Used now, less the baseline (MB)."""
        return None if self._read is None else self._read() - self.base

    def peak_mb(self) -> float | None:
        """The largest sample so far, less the baseline (MB)."""
        return None if self._read is None else max(self.peak, self._read()) - self.base

    def close(self) -> None:
        self._stop.set()
