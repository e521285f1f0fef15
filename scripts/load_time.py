"""Load time, ours against CTranslate2, each from a warm page cache, in alternating fresh processes.

    python scripts/load_time.py --bundle B [--bundle B2 ...] --ct2 DIR [--compute-type float32,int8]
        [--threads 2] [--rounds 3] [--cache-dir DIR]

Each load is its own process (`--child`): the time from before `Translator(...)` (ours, hashes checked, as an
app loads it) or `ctranslate2.Translator(...)` to its return, after one pass over the model's files so that
neither engine pays the disk. The engines alternate round by round; the median per engine is printed, with
the ratio to CTranslate2's best compute type. With --cache-dir, each bundle is also loaded with that session
cache (runtime/session_cache.py; Translator's cache_dir), filled by one untimed load before the rounds.
--phases times one load's phases instead (the private copy, its sha256, the sessions).
hf_real_sizes.py's load column times the same call inside its
engine jobs, where the page cache holds whatever the job before left.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path


def _warm(path: Path) -> None:
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        with open(f, "rb") as handle:
            while handle.read(16 << 20):
                pass


def _child(spec: dict) -> float:
    start = time.perf_counter()
    if spec["engine"] == "ours":
        from seq2onnx.runtime.translator import Translator

        Translator(spec["path"], device="cpu", intra_threads=spec["threads"], cache_dir=spec.get("cache_dir"))
    else:
        import ctranslate2

        ctranslate2.Translator(
            spec["path"], device="cpu", compute_type=spec["compute_type"], intra_threads=spec["threads"]
        )
    return time.perf_counter() - start


def phases(bundle: str, threads: int) -> str:
    """One Translator load in this process, each phase's start and end from the constructor's start: the
    private copy of weights.bin (runtime/weights.py, in its thread), its sha256, each session, the verify."""
    from seq2onnx.runtime import weights
    from seq2onnx.runtime.translator import Translator

    events = []

    def timed(owner, name, label):
        wrapped = getattr(owner, name)

        def call(*args, **kwargs):
            events.append((time.perf_counter(), f"{label} start"))
            try:
                return wrapped(*args, **kwargs)
            finally:
                events.append((time.perf_counter(), f"{label} end"))

        setattr(owner, name, call)

    for owner, name, label in (
        (weights, "fill", "copy"),
        (weights, "_checksum", "sha256"),
        (weights.WeightsFile, "open_session", "session"),
        (weights.WeightsFile, "verify", "verify"),
    ):
        timed(owner, name, label)
    start = time.perf_counter()
    Translator(bundle, device="cpu", intra_threads=threads)
    events.append((time.perf_counter(), "Translator end"))
    return "; ".join(f"{what} {t - start:.3f}" for t, what in sorted(events))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bundle", action="append", default=[], type=Path, help="a bundle (repeatable)")
    p.add_argument("--ct2", type=Path, help="a CTranslate2 model directory")
    p.add_argument(
        "--compute-type", default="float32,int8", help="CTranslate2 compute types (default float32,int8)"
    )
    p.add_argument("--threads", type=int, default=2, help="intra-op threads for both engines (default 2)")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    p.add_argument("--cache-dir", type=Path, help="also time each bundle loaded with this session cache")
    p.add_argument(
        "--phases",
        action="store_true",
        help="time the phases of one load of the first --bundle, in this process",
    )
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.phases:
        print(phases(str(args.bundle[0]), args.threads))
        return 0
    if args.child:
        print(json.dumps({"seconds": _child(json.loads(args.child))}))
        return 0
    if not args.bundle and not args.ct2:
        p.error("give --bundle and/or --ct2")
    specs = {
        f"ours {b.name}": {"engine": "ours", "path": str(b), "threads": args.threads} for b in args.bundle
    }
    if args.cache_dir:
        for b in args.bundle:
            spec = {
                "engine": "ours",
                "path": str(b),
                "threads": args.threads,
                "cache_dir": str(args.cache_dir),
            }
            subprocess.run(
                [sys.executable, __file__, "--child", json.dumps(spec)], check=True, capture_output=True
            )  # fills the cache: the first load makes its entries
            specs[f"ours {b.name} cached"] = spec
    if args.ct2:
        for ct in args.compute_type.split(","):
            specs[f"ct2 {ct}"] = {
                "engine": "ct2",
                "path": str(args.ct2),
                "compute_type": ct,
                "threads": args.threads,
            }
    times: dict[str, list[float]] = {name: [] for name in specs}
    for r in range(args.rounds):
        for name, spec in specs.items():
            _warm(Path(spec["path"]))
            if spec.get("cache_dir"):
                _warm(Path(spec["cache_dir"]))
            out = subprocess.run(
                [sys.executable, __file__, "--child", json.dumps(spec)],
                capture_output=True,
                text=True,
                check=True,
            )
            times[name].append(json.loads(out.stdout.strip().splitlines()[-1])["seconds"])
            print(f"round {r + 1}: {name}: {times[name][-1]:.2f} s", flush=True)
    ct2 = {n: statistics.median(t) for n, t in times.items() if n.startswith("ct2")}
    for name, t in times.items():
        med = statistics.median(t)
        ratio = f", {med / min(ct2.values()):.2f}x CTranslate2's fastest" if ct2 else ""
        print(f"{name}: median {med:.2f} s over {len(t)} ({', '.join(f'{x:.2f}' for x in t)}){ratio}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
