"""Helpers the test files share: the `seq2onnx` command in a child process or in this one, and a free local
port.

Plain functions, not fixtures, so that module-level code and helper functions can call them too.
Nothing here imports torch: the runtime-only run (.ci/run) imports this module as well.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# One environment for every child: one OpenMP thread (the models are tiny, and CTranslate2's default
# 4 spinning threads made a child 70x slower on a loaded 2-core machine), and an ordinary UTF-8
# locale (C.UTF-8: en_US.UTF-8 is not installed everywhere) with no override of Python's encodings.
ENV = {
    **{k: v for k, v in os.environ.items() if not k.startswith(("LC_", "PYTHONIOENCODING"))},
    "LC_ALL": "C.UTF-8",
    "OMP_NUM_THREADS": "1",
}

# Long enough for an export with parity checks on a loaded 2-core machine; a hung child still ends.
TIMEOUT = 600


def cli(
    *args,
    input: str | bytes | None = None,
    cwd: Path | str = REPO,
    env: dict | None = None,
    timeout: float = TIMEOUT,
    python: str = sys.executable,
) -> subprocess.CompletedProcess:
    """Runs `python -m seq2onnx.commands ARGS` and returns it finished, output captured.

    Args:
        *args: the command line after `seq2onnx` (converted with str, so paths may be passed).
        input: stdin; bytes run the child in binary mode (stdout and stderr are bytes then),
            text runs it in UTF-8 text mode.
        cwd: the child's working directory (the repository root unless told).
        env: the child's environment (ENV unless told).
        timeout: seconds before subprocess.TimeoutExpired.
        python: the interpreter (another venv's, for the installed-wheel test).
    """
    text = not isinstance(input, bytes)
    return subprocess.run(
        [python, "-m", "seq2onnx.commands", *map(str, args)],
        input=input,
        capture_output=True,
        text=text,
        encoding="utf-8" if text else None,
        cwd=cwd,
        env=ENV if env is None else env,
        timeout=timeout,
    )


def cli_here(*args) -> subprocess.CompletedProcess:
    """Runs `seq2onnx ARGS` in this process (commands.main.main), output captured as cli() captures it.

    For the commands that need torch (export, verify): a child pays about 2.4 s of CPU to import it, which
    a test worker has already paid. What these tests check (exit status, files, the one-line error) is
    main()'s; cli() stays for what only a process shows (signals, locale, the console entry, concurrency),
    and tests/test_cli_errors.py runs each command's errors in a real child.

    Args:
        *args: the command line after `seq2onnx` (converted with str).
    """
    import contextlib
    import io

    from seq2onnx.commands.main import main

    argv, out, err = [str(a) for a in args], io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:  # argparse's usage errors exit 2, as in a child
            code = e.code if isinstance(e.code, int) else 1
    return subprocess.CompletedProcess(["seq2onnx", *argv], code, out.getvalue(), err.getvalue())


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def until(test, timeout_s: float, what: str):
    """Polls test() every 0.1 s and returns its first true value; a bounded wait.

    Raises:
        TimeoutError: nothing true within timeout_s seconds (the message names `what`).
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = test()
        if value:
            return value
        time.sleep(0.1)
    raise TimeoutError(f"{what}: not within {timeout_s} s")


def prebuild_bundles(out: Path | str) -> list[Path]:
    """Builds the tiny bundles that the runtime-only run reads (conftest.RUNTIME_FILES), into `out`.

    Needs torch (they are trained and exported); the runtime-only run then points
    SEQ2ONNX_TEST_BUNDLES at `out` (tests/tiny.py).

    Args:
        out: a directory, created if missing; bundles already in it are replaced.
    """
    import shutil

    import tiny

    made = []
    for quantize in (None, "int8"):
        built = tiny.tiny_bundle(quantize=quantize)
        dest = Path(out) / built.name
        shutil.rmtree(dest, ignore_errors=True)
        made.append(Path(shutil.copytree(built, dest)))
    return made


if __name__ == "__main__":  # PYTHONPATH=tests python -m helpers DIR (as .ci/run does)
    if len(sys.argv) != 2:
        sys.exit(
            "usage: PYTHONPATH=tests python -m helpers DIR: "
            "builds the runtime-only run's tiny bundles into DIR"
        )
    print(*prebuild_bundles(sys.argv[1]), sep="\n")
