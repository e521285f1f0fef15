"""`pytest --cpu-report`: where the suite's CPU goes, every process below the run sampled from /proc and summed
by kind.

On 2 cores the suite is CPU-bound (the machine's CPU is about twice the wall time), so it gets faster only by
spending less CPU, and `--durations` (wall time per test, the other workers' load included) does not say where
that CPU is. With --cpu-report the process that runs the session (xdist's controller, or the one process with
-n0) reads /proc/PID/stat of every process below it every 0.3 s, and the summary lists the CPU of each kind: the
pytest workers, the `seq2onnx COMMAND` children, `python -m MODULE`, node, Chromium, Ray's workers by the title
Ray gives them. A process that lives less than 0.3 s is missed, and one that left the tree (daemonized) counts
what it had used when last seen: the summary gives the CPU of the run and every process it reaped beside the
sum sampled. It then lists the test files that cost most: each worker writes the file it is running to
CURRENT_DIR/PID, and each CPU delta sampled goes to the file its worker was on (its children's included).
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import tempfile
import sys
import threading
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
CURRENT_DIR = "SEQ2ONNX_CPU_REPORT_DIR"  # environment: where each worker names the test file it is running


def note_file(nodeid: str) -> None:
    """In a worker (or a -n0 run), names the test file it now runs, for the controller's attribution."""
    with open(os.path.join(os.environ[CURRENT_DIR], str(os.getpid())), "w") as f:
        f.write(nodeid.split("::")[0])


def kind(comm: str, argv: list[str]) -> str:
    """A process's kind, from its command name and arguments (Ray's workers from the title Ray sets)."""
    line = " ".join(argv)
    if line.startswith("ray::"):
        return "ray " + line[5:].split("(")[0].split()[0]
    if "exec(eval(sys.stdin" in line:
        return "pytest worker (xdist)"
    if "python" not in (Path(argv[0]).name if argv else comm):
        return comm if comm not in ("node", "nodejs") or len(argv) < 2 else f"node {Path(argv[1]).name}"
    rest = argv[1:]
    while rest and rest[0].startswith("-") and rest[0] not in ("-m", "-c"):  # -u, -B, -W ARG, -X ARG
        rest = rest[2:] if rest[0] in ("-W", "-X") else rest[1:]
    if rest[:2] == ["-m", "seq2onnx.commands"] or rest[:2] == ["-m", "seq2onnx"]:
        return "seq2onnx " + (rest[2] if len(rest) > 2 else "")
    if rest[:1] == ["-m"] and len(rest) > 1:
        return f"python -m {rest[1]}"
    if rest[:1] == ["-c"]:  # named by the first module outside the standard library that its code imports
        modules = re.findall(r"(?:from|import)\s+([\w.]+)", rest[1] if len(rest) > 1 else "")
        named = [m for m in modules if m.split(".")[0] not in sys.stdlib_module_names] or modules
        return f"python -c ({named[0]})" if named else "python -c"
    return f"python {Path(rest[0]).name}" if rest else "python"


class FileCpu(collections.Counter):
    """CPU seconds by test file; the folder where the workers name their files (CURRENT_DIR); the sampling
    process's own CPU when last sampled (a -n0 run's tests run in it, so its growth is theirs)."""

    def __init__(self, folder: str):
        super().__init__()
        self.folder, self.root_cpu = folder, None


def sample(root: int, seen: dict, files: FileCpu | None = None) -> None:
    """Adds or updates every process below `root` in `seen`: (pid, start) -> [kind, cpu seconds].

    With `files`, each process's CPU since the last sample is added to the test file that the nearest of
    it and its ancestors names in CURRENT_DIR ("(no file)" before a worker's first test).
    """
    table = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().decode("utf-8", "replace").rstrip("\0").split("\0")
        except OSError:  # it ended between listdir and open
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        cpu = (int(fields[11]) + int(fields[12])) / TICK
        table[int(pid)] = (int(fields[1]), fields[19], comm, argv, cpu)
    below, grew = {root}, True
    while grew:
        new = {pid for pid, row in table.items() if row[0] in below and pid not in below}
        below |= new
        grew = bool(new)
    current = _current_files(files.folder) if files is not None else {}
    for pid in below - {root}:
        ppid, start, comm, argv, cpu = table[pid]
        known = seen.get((pid, start))
        # a process that has ended (a zombie) has no arguments left: it keeps the kind it was seen as
        seen[(pid, start)] = [known[0] if known and argv == [""] else kind(comm, argv), cpu]
        if files is not None:
            owner = pid
            while owner not in current and owner in table and owner != root:
                owner = table[owner][0]
            files[current.get(owner, "(no file)")] += cpu - (known[1] if known else 0)
    if files is not None and root in table:  # in a -n0 run the tests run in the root itself
        if root in current:
            files[current[root]] += table[root][4] - (files.root_cpu or table[root][4])
        files.root_cpu = table[root][4]


def _current_files(folder: str) -> dict[int, str]:
    current = {}
    for name in os.listdir(folder) if os.path.isdir(folder) else ():
        with contextlib.suppress(OSError):
            text = Path(folder, name).read_text()
            if text:  # empty while note_file rewrites it: the ancestors', or "(no file)", for this sample
                current[int(name)] = text
    return current


class CpuReport:
    """Samples the processes below this one in a thread until stop(); lines() is the summary."""

    INTERVAL_S = 0.3

    def __init__(self):
        self.seen: dict = {}
        self._folder = tempfile.TemporaryDirectory(prefix="cpu-report-")
        self.files = FileCpu(self._folder.name)
        os.environ[CURRENT_DIR] = self._folder.name  # before xdist starts the workers, which inherit it
        self._stop = threading.Event()
        self._wall = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="cpu-report", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.INTERVAL_S):
            sample(os.getpid(), self.seen, self.files)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._wall = time.perf_counter() - self._wall
        self._folder.cleanup()

    def lines(self, top: int = 30) -> list[str]:
        """The summary: wall, this process's CPU and its reaped children's, then the kinds, costliest first."""
        totals, counts = collections.Counter(), collections.Counter()
        for name, cpu in self.seen.values():
            totals[name] += cpu
            counts[name] += 1
        t = os.times()
        lines = [
            f"{self._wall:.0f} s wall; CPU of this process {t.user + t.system:.0f} s, of the processes it reaped "
            f"{t.children_user + t.children_system:.0f} s; sampled below it every {self.INTERVAL_S} s: "
            f"{sum(totals.values()):.0f} s in {len(self.seen)} processes",
            f"{'CPU s':>8}  {'processes':>9}  kind",
        ]
        lines += [f"{cpu:8.1f}  {counts[name]:9d}  {name}" for name, cpu in totals.most_common(top)]
        lines += ["", f"{'CPU s':>8}  test file (its worker's CPU and its children's)"]
        return lines + [f"{cpu:8.1f}  {name}" for name, cpu in self.files.most_common(top)]
