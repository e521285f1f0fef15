"""hf_real_sizes.py's sizes, test text and small helpers, shared by its parent and its jobs."""
from __future__ import annotations

import os
import random
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
    return {"rss_mb": out.get("VmRSS"), "peak_rss_mb": out.get("VmHWM"),
            "ru_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------- text
_WORDS = ("the a this my your his her our one two three old new big small good little long great red blue "
          "green man woman child dog cat house car book tree city river friend teacher student father mother "
          "day night time year water school work room door table street music letter apple garden train is "
          "was will can must should sees likes finds reads writes takes gives makes knows wants needs buys "
          "opens closes carries quickly slowly often never always today yesterday tomorrow here there in on "
          "at with under near behind before after because and but or if when where why how very really not "
          "also still already").split()


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
        raise SystemExit(f"error: only {len(pool)} sentences of 8-25 words in the corpus; ask for "
                         f"--sentences {len(pool)} or fewer")
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
        return lambda: float(subprocess.run(cmd, capture_output=True, text=True,
                                            timeout=10).stdout.split()[0])

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
