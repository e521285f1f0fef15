"""Input lines read on a thread for `seq2onnx translate`, so that it can answer before more input comes."""

from __future__ import annotations

import queue
import threading
import time
from typing import Iterator

READ_WAIT_S = 0.05  # after a line arrives, how long to wait for more to share its batch
_SIGNAL_CHECK_S = 0.2  # how soon a translate waiting for input notices Ctrl-C
_EOF = object()


class LineReader:
    """Lines from a byte source, read on a thread, so that the translating thread can answer before more
    input comes.

    The translating thread takes the lines that have arrived so far and translates them (a filter, a
    co-process, `tail -f | seq2onnx translate`). The reading thread holds no lock of Python's buffered
    streams, so a thread still blocked on stdin cannot stall the interpreter's exit. Lines end at b"\\n"
    only; each is handed over as raw bytes, without its "\\n".

    Args:
        read (Callable[[], bytes]): os.read on a file descriptor for stdin and -i FILE alike, so both
            take the same path.
        max_queued: lines held at most (bounded: a fast producer cannot fill memory).
    """

    def __init__(self, read, max_queued: int = 4096):
        self._queue: queue.Queue = queue.Queue(max_queued)  # bounded: a fast producer cannot fill memory
        threading.Thread(
            target=self._run, args=(read,), daemon=True, name="seq2onnx-translate-reader"
        ).start()

    def _run(self, read) -> None:
        pending = bytearray()
        try:
            while chunk := read():
                start = 0
                # Lines end at "\n" only: str.splitlines would also split at form feeds, U+2028 and other
                # separators inside a line, and every later translation would land on the wrong line.
                while (end := chunk.find(b"\n", start)) >= 0:
                    pending += chunk[start:end]
                    self._queue.put(bytes(pending))
                    pending.clear()
                    start = end + 1
                pending += chunk[start:]
            if pending:  # a last line without "\n"
                self._queue.put(bytes(pending))
            self._queue.put(_EOF)
        except BaseException as e:  # handed to the reading thread, which raises it
            self._queue.put(e)

    def _get(self, timeout: float | None = None):
        # Without a timeout, wait in slices: Ctrl-C delivered to another thread (the reader, onnxruntime's
        # pools) leaves a blocked wait asleep; the end of a slice checks for it.
        while True:
            try:
                item = self._queue.get(timeout=_SIGNAL_CHECK_S if timeout is None else timeout)
                break
            except queue.Empty:
                if timeout is not None:
                    raise
        if isinstance(item, BaseException):
            raise item
        return item

    def batches(self, max_lines: int, wait: float = READ_WAIT_S) -> Iterator[list[bytes]]:
        """Batches of the lines available now: waits for one line, then takes what has arrived, or
        arrives within `wait` seconds, up to max_lines. Ends at the end of the input."""
        while True:
            item = self._get()
            if item is _EOF:
                return
            batch, deadline = [item], time.monotonic() + wait
            while len(batch) < max_lines:
                try:
                    item = self._get(timeout=max(deadline - time.monotonic(), 0.0))
                except queue.Empty:
                    break
                if item is _EOF:
                    yield batch
                    return
                batch.append(item)
            yield batch
