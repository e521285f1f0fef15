"""`seq2onnx translate`'s terminal and files: stdin as bytes, the output written atomically, the progress bar
and the warnings on stderr, an input line's bytes as text."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from seq2onnx import atomic
from seq2onnx.errors import CommandError

READ_CHUNK = 1 << 16
WARNINGS_SHOWN = 10  # per kind; the rest are counted in one closing line


def stdin_read():
    """A read() -> bytes over stdin's file descriptor (stdin is read as bytes whatever the locale)."""
    if sys.stdin is None:
        raise CommandError("stdin is closed: give the input with -i FILE")
    try:
        fd = sys.stdin.fileno()
    except (OSError, ValueError, AttributeError):  # stdin replaced by an in-memory stream (embedding, tests)
        buffer = getattr(sys.stdin, "buffer", None)
        if buffer is not None:
            return lambda: buffer.read(READ_CHUNK)
        return lambda: sys.stdin.read(READ_CHUNK).encode("utf-8", "surrogateescape")
    return lambda: os.read(fd, READ_CHUNK)


def count_lines(path: Path) -> int:
    """Lines in a file as LineReader splits them (for the progress bar's total)."""
    count, last = 0, b"\n"
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (last != b"\n")


class AtomicOutput(atomic.AtomicFile):
    """-o FILE: written beside FILE and renamed over it only when complete (seq2onnx.atomic), so FILE is never
    a partial translation, even after an error or Ctrl-C. Refuses an existing FILE unless force (check)."""

    def __init__(self, path: Path, force: bool, option: str = "--output"):
        self.check(path, force, option)
        super().__init__(path)

    @staticmethod
    def check(path: Path, force: bool, option: str = "--output") -> None:
        """Raises CommandError when path cannot or may not be written (the message names `option`)."""
        if path.is_dir():
            raise CommandError(f"{option} {path} is a directory; give a file path")
        if path.exists() and not force:
            raise CommandError(f"{option} {path}: {path.name} exists; pass --force to overwrite it")
        if not path.parent.is_dir():
            raise CommandError(
                f"{option} {path}: the directory {path.parent} does not exist; create it first"
            )


class Progress:
    """A one-line progress bar on stderr (tqdm is not a runtime dependency); total None: a line count."""

    def __init__(self, total: int | None, enabled: bool):
        self.total, self.done, self.t0, self.enabled = total, 0, time.time(), enabled
        self.drawn, self.last_draw, self.shown = 0, 0.0, -1

    def update(self, n: int) -> None:
        """Counts n more lines done; when enabled, redraws the bar (at most every 0.2 s)."""
        self.done += n
        if self.enabled and time.time() - self.last_draw >= 0.2:  # throttled: a log gets no flood of redraws
            self._draw()

    def _draw(self) -> None:
        elapsed = time.time() - self.t0
        rate = self.done / elapsed if elapsed > 0 else 0.0
        if self.total:
            width = 30
            filled = int(width * min(self.done / self.total, 1.0))
            left = (self.total - self.done) / rate if rate else 0.0
            text = (
                f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} lines "
                f"{rate:.1f}/s, {left:.0f} s left "
            )
        else:
            text = f"{self.done} lines, {rate:.1f}/s "
        sys.stderr.write("\r" + text.ljust(self.drawn))
        sys.stderr.flush()
        self.drawn, self.last_draw, self.shown = len(text), time.time(), self.done

    def clear(self) -> None:
        """Blanks the bar's line (before another message on stderr); the next update redraws it."""
        if self.drawn:
            sys.stderr.write("\r" + " " * self.drawn + "\r")
            self.drawn = 0

    def close(self) -> None:
        """When enabled, draws the final count and ends the bar's line."""
        if self.enabled:
            if self.shown != self.done or not self.drawn:
                self._draw()
            sys.stderr.write("\n")
            sys.stderr.flush()


class Warnings:
    """Warnings on stderr, one line each, naming the input line; after WARNINGS_SHOWN of one kind the
    rest are only counted, so a binary file does not bury the terminal."""

    def __init__(self, progress: Progress):
        self.progress, self.counts = progress, {}

    def warn(self, kind: str, message: str) -> None:
        """Prints `message` (the first WARNINGS_SHOWN of its `kind`, the bar cleared first); counts it either
        way."""
        n = self.counts[kind] = self.counts.get(kind, 0) + 1
        if n <= WARNINGS_SHOWN:
            self.progress.clear()
            more = f" (further lines with {kind} are counted, not shown)" if n == WARNINGS_SHOWN else ""
            print(f"seq2onnx translate: warning: {message}{more}", file=sys.stderr, flush=True)

    def close(self) -> None:
        """Prints, for each kind with more than WARNINGS_SHOWN warnings, how many lines in all had it."""
        for kind, n in self.counts.items():
            if n > WARNINGS_SHOWN:
                print(f"seq2onnx translate: warning: {n} lines in all had {kind}", file=sys.stderr)


def decode_line(raw: bytes, line: int, warnings: Warnings) -> str:
    """One input line as text: a trailing "\\r" dropped, invalid UTF-8 replaced by U+FFFD with a warning."""
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        bad = raw[e.start : e.end].hex(" ")
        warnings.warn(
            "invalid UTF-8",
            f"line {line}: invalid UTF-8 (byte {bad} at byte {e.start + 1} of the "
            "line, perhaps more after it) replaced by U+FFFD",
        )
        return raw.decode("utf-8", errors="replace")
