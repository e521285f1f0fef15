"""Load time, ours against CTranslate2: fresh processes, a warm page cache, the clock started before imports.

    python scripts/load_time.py --bundle B [--ct2 DIR[:TYPE,...]] [--spm DIR] [--old PYTHONPATH] [--rounds 5]

Ours is `Translator(bundle)` as an app loads it (hashes checked, tokenizers made); `--ct2 DIR:float32,int8`
is `ctranslate2.Translator` at each compute type, and with `--spm DIR` also DIR's source.spm and target.spm,
which an app translating text loads too. `--old P` loads each bundle with PYTHONPATH=P as well (another
checkout). The loads alternate round by round; medians are printed.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import scaffold as sc  # noqa: E402


def child(spec: dict) -> float:
    start = time.perf_counter()
    if spec["engine"] == "ours":
        from seq2onnx.runtime.translator import Translator

        Translator(spec["path"], device="cpu", intra_threads=spec["threads"])
        return time.perf_counter() - start
    import ctranslate2
    import sentencepiece as spm

    ctranslate2.Translator(
        spec["path"], device="cpu", compute_type=spec["type"], intra_threads=spec["threads"]
    )
    for name in ("source.spm", "target.spm") if spec["spm"] else ():
        spm.SentencePieceProcessor(model_file=str(Path(spec["spm"]) / name))
    return time.perf_counter() - start


def main(argv=None) -> int:
    p = sc.parser(__doc__)
    p.add_argument("--bundle", action="append", default=[], type=Path, help="a bundle (repeatable)")
    p.add_argument(
        "--ct2", action="append", default=[], help="DIR[:TYPE,...] a CTranslate2 model (repeatable)"
    )
    p.add_argument("--spm", help="a directory of source.spm and target.spm: CTranslate2 loads them too")
    p.add_argument("--old", help="also load each bundle with this PYTHONPATH (another checkout's package)")
    p.add_argument("--threads", type=int, default=2, help="intra-op threads for every engine (default 2)")
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    specs = {}
    for b, pp in ((b, pp) for b in args.bundle for pp in ("", args.old) if pp is not None):
        specs[f"ours {b.name}{' (old)' if pp else ''}"] = dict(engine="ours", path=str(b), pythonpath=pp)
    for path, _, types in (entry.partition(":") for entry in args.ct2):
        for ct, spm in (
            (ct, spm) for ct in (types or "float32").split(",") for spm in dict.fromkeys((None, args.spm))
        ):
            specs[f"ct2 {Path(path).name} {ct}{' +spm' if spm else ''}"] = dict(
                engine="ct2", path=path, type=ct, spm=spm
            )
    times: dict[str, list[float]] = {name: [] for name in specs}
    for r in range(args.rounds):
        for name, spec in specs.items():
            for f in (x for x in Path(spec["path"]).rglob("*") if x.is_file()):
                f.read_bytes()  # warm: neither engine pays the disk
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | (
                {"PYTHONPATH": spec["pythonpath"]} if spec.get("pythonpath") else {}
            )
            argv = [sys.executable, __file__, "--child", json.dumps({**spec, "threads": args.threads})]
            out = subprocess.run(argv, capture_output=True, text=True, env=env)
            if out.returncode:
                raise SystemExit(f"{name}: the load failed:\n{out.stderr[-2000:]}")
            times[name].append(float(out.stdout.split()[-1]))
        sc.log(f"round {r + 1}: " + ", ".join(f"{n} {t[-1]:.2f}" for n, t in times.items()))
    for name, t in times.items():
        print(f"{name}: median {statistics.median(t):.3f} s ({', '.join(f'{x:.2f}' for x in t)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
