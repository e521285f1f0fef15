"""What the scripts share: their parser and common options, the Tatoeba sentences, a server process on
127.0.0.1 awaited until it translates, a process's RSS, the output folder, Markdown tables and progress lines.

A script imports it as a sibling: `sys.path.insert(0, str(Path(__file__).resolve().parent))`, which also
holds when a test loads the script by path."""

from __future__ import annotations

import argparse
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_DATA = HERE.parents[1] / "shared" / "data" / "tatoeba-cmn-eng" / "cmn.txt"
PATH = "/v1/translate"
T0 = time.perf_counter()


def log(message: str) -> None:
    """A progress line on stderr: the script, the clock and the seconds since it started."""
    stamp = f"{Path(sys.argv[0]).stem} {time.strftime('%H:%M:%S')} {time.perf_counter() - T0:7.1f}s"
    print(f"[{stamp}] {message}", file=sys.stderr, flush=True)


def beam_label(beam: int) -> str:
    return "greedy" if beam == 1 else f"beam{beam}"


def read_sentences(path: Path, col: int, n: int, seed: int = 0) -> list[str]:
    """Returns n distinct non-empty texts of column `col` of a TSV (Tatoeba's format), shuffled with `seed`.

    Raises:
        ValueError: the file is missing, a line lacks the column, or it has fewer than n texts (naming the
            fix).
    """
    if not path.is_file():
        raise ValueError(f"{path} does not exist: pass --data with a TSV of sentences (Tatoeba's cmn.txt)")
    seen: dict[str, None] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8-sig").splitlines(), 1):
        fields = line.split("\t")
        if len(fields) <= col and line.strip():  # blank lines are skipped
            raise ValueError(
                f"{path}:{number} has {len(fields)} columns, --src-col is {col}: choose 0..{len(fields) - 1}"
            )
        if line.strip() and fields[col].strip():
            seen.setdefault(fields[col].strip(), None)
    texts = list(seen)
    if len(texts) < n:
        raise ValueError(
            f"{path} has {len(texts)} distinct texts in column {col}, {n} asked: lower --sentences"
        )
    random.Random(seed).shuffle(texts)
    return texts[:n]


def free_port() -> int:
    """A port free on 127.0.0.1 now (the server binds it a moment later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server process on 127.0.0.1: started, awaited until it translates, always stopped (context manager).

    Args:
        argv: the command without --port.
        log_path: where its stdout and stderr go.
        probe: a text to translate (greedy) to tell that it is ready; None: ready once its log says it listens
            (a server that wants an API key).
        start_timeout: seconds it may take to answer the probe.
    """

    def __init__(self, argv: list[str], log_path: Path, probe: str, start_timeout: float = 180.0):
        self.argv, self.log_path, self.probe, self.start_timeout = argv, log_path, probe, start_timeout
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def __enter__(self) -> "Server":
        import httpx

        self.port = port = free_port()
        self.url = f"http://127.0.0.1:{port}{PATH}"
        self._log = open(self.log_path, "wb")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            self.argv + ["--port", str(port)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )
        try:
            deadline = time.monotonic() + self.start_timeout
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"server exited with code {self.proc.returncode} before answering: "
                        f"{' '.join(self.argv)}\n{self.log_tail()}"
                    )
                if self._ready(httpx):
                    return self
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"server did not answer within {self.start_timeout:.0f} s (--start-timeout): "
                        f"{' '.join(self.argv)}\n{self.log_tail()}"
                    )
                time.sleep(0.25)
        except BaseException:
            self.stop()
            raise

    def _ready(self, httpx) -> bool:
        # every process listens (serve --processes prints the line once all of them do), and it translates
        if "listening on" not in self.log_path.read_text(errors="replace"):
            return False
        try:
            body = {"texts": [self.probe], "beam_size": 1}
            return self.probe is None or httpx.post(self.url, json=body, timeout=30).status_code == 200
        except httpx.HTTPError:
            return False

    def log_tail(self, lines: int = 15) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM to its process group, SIGKILL after `grace` seconds (idempotent)."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
            except ProcessLookupError:
                pass
        if not self._log.closed:
            self._log.close()

    def __exit__(self, *exc) -> None:
        self.stop()


def prepare_out(out: Path, force: bool) -> None:
    """Creates --out (and out/logs); refuses a non-empty one without force.

    Raises:
        ValueError: out exists, is not empty and force is False.
    """
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
        raise ValueError(
            f"{out} exists and is not empty: choose another --out or pass --force to write over it"
        )
    (out / "logs").mkdir(parents=True, exist_ok=True)


def terminate(signum, frame):
    raise SystemExit(128 + signum)  # unwinds through every `finally`: the servers are stopped


def rss_mb(pid: int | str = "self") -> float:
    """A process's resident set (VmRSS in /proc), MB; 0.0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(x.split()[1]) / 1024 for x in f if x.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return 0.0


# -- options every script spells the same way --------------------------------------------------------


def parser(doc: str) -> argparse.ArgumentParser:
    """The script's parser: its docstring's first paragraph as the description, the rest as the epilog."""
    head, _, rest = doc.partition("\n\n")
    return argparse.ArgumentParser(
        description=head, epilog=rest, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def add_out(p, what: str = "output directory") -> None:
    """--out DIR (required; refused when not empty, see prepare_out) and --force."""
    p.add_argument("--out", type=Path, required=True, help=f"{what} (refused when not empty, unless --force)")
    p.add_argument("--force", action="store_true", help="write into a non-empty --out")


def add_sentences(p, n: int, col: int = 1) -> None:
    """--data TSV, --src-col, --sentences N and --seed: the real sentences read_sentences draws."""
    p.add_argument(
        "--data", type=Path, default=DEFAULT_DATA, help="TSV of sentences (default: Tatoeba cmn.txt)"
    )
    p.add_argument("--src-col", type=int, default=col, help=f"its column of source texts (default {col})")
    p.add_argument("--sentences", type=int, default=n, help=f"distinct sentences used (default {n})")
    p.add_argument("--seed", type=int, default=0, help="seed of the sentences' choice (default 0)")


def add_timeouts(p, request: float) -> None:
    """--start-timeout (a server's first answer) and --request-timeout (the client's, per request)."""
    p.add_argument(
        "--start-timeout", type=float, default=180.0, help="seconds a server may take to start (180)"
    )
    p.add_argument(
        "--request-timeout", type=float, default=request, help=f"seconds per request (default {request:g})"
    )


def serve_argv(bundle: Path, *options) -> list[str]:
    """`seq2onnx serve BUNDLE --device cpu OPTIONS` as this interpreter runs it (Server adds --port)."""
    return [
        sys.executable,
        "-m",
        "seq2onnx.commands",
        "serve",
        str(bundle),
        "--device",
        "cpu",
        *map(str, options),
    ]


def checked(prog: str, check) -> int | None:
    """Runs check(); a ValueError (a bad argument) is printed as `prog: message` and gives exit code 2."""
    try:
        check()
    except ValueError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    return None


# -- tables -------------------------------------------------------------------------------------------


def fmt(x, spec: str = ",.0f") -> str:
    """x formatted, or an em dash for None (a figure not measured)."""
    return "—" if x is None else format(x, spec) if isinstance(x, (int, float)) else str(x)


def md_table(head: list[str], rows: list[list]) -> list[str]:
    """The lines of a Markdown table."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def write_report(out: Path, stem: str, report: dict, text: str, suffix: str = ".md") -> None:
    """OUT/STEM.json (the report) and OUT/STEM.SUFFIX (its text), each written atomically."""
    import json

    from seq2onnx.atomic import write_file

    write_file(out / f"{stem}.json", json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    write_file(out / f"{stem}{suffix}", text)
