"""`seq2onnx translate BUNDLE` (python -m seq2onnx.commands translate) against Translator.translate_batch."""

from __future__ import annotations

import functools
import os
import queue
import shlex
import signal
import stat
import subprocess
import sys
import threading
import time

import pytest

from helpers import ENV, cli
from helpers import REPO as ROOT
from tiny import scratch

try:  # the tiny model is built with torch: one thread is much faster on a small shared machine
    import torch

    torch.set_num_threads(1)
except ImportError:  # pragma: no cover
    pass

LINES = [
    "the cat dances in the box",
    "",
    "eleven young cows eat the brave book",
    "a small bird sleeps",
    "   ",
    "three old kings carry the red boxes",
    "the farmer liked 12 green cows",
    "漢字 ☃ 🙂",
]


COMMAND = [sys.executable, "-m", "seq2onnx.commands", "translate"]
# `seq2onnx translate ...` in a child (tests/helpers.py: a UTF-8 locale; bytes as input give bytes back).
translate = functools.partial(cli, "translate")


def _ok(proc: subprocess.CompletedProcess) -> list[str]:
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.endswith("\n")
    return proc.stdout.split("\n")[:-1]


@pytest.mark.slow
def test_translate_stdin_one_line_per_input_line(bundle, translator):
    out = _ok(translate(str(bundle), "--device", "cpu", input="\n".join(LINES) + "\n"))
    assert len(out) == len(LINES)
    assert out == [r.hypotheses[0] for r in translator.translate_batch(LINES)]  # bundle defaults: beam 4
    assert out[1] == "" and out[4] == "" and out[0] and out[2]
    # no trailing newline on the last line: still read; order kept across --batch-size batches
    small = _ok(translate(str(bundle), "--batch-size", "2", input="\n".join(LINES)))
    assert small == out


@pytest.mark.slow
def test_translate_beam_one(bundle, translator):
    out = _ok(translate(str(bundle), "--beam", "1", input="\n".join(LINES) + "\n"))
    assert out == [r.hypotheses[0] for r in translator.translate_batch(LINES, beam_size=1)]


@pytest.mark.slow
def test_translate_scores(bundle, translator):
    out = _ok(
        translate(
            str(bundle), "--scores", "--beam", "2", "--length-penalty", "0.6", input="\n".join(LINES) + "\n"
        )
    )
    want = translator.translate_batch(LINES, beam_size=2, length_penalty=0.6, return_scores=True)
    assert len(out) == len(LINES)
    for line, r in zip(out, want):
        score, text = line.split("\t")
        assert text == r.hypotheses[0]
        assert score == f"{r.scores[0]:.4f}"
        assert float(score) <= 0
    assert any(float(line.split("\t")[0]) < 0 for line in out)


@pytest.mark.slow
def test_translate_n_best(bundle, translator):
    out = _ok(translate(str(bundle), "--n-best", "2", input="\n".join(LINES) + "\n"))
    want = translator.translate_batch(LINES, num_hypotheses=2, return_scores=True)
    assert len(out) == 2 * len(LINES)
    expected = [
        f"{i} ||| {text} ||| {score:.4f}"
        for i, r in enumerate(want)
        for text, score in zip(r.hypotheses, r.scores)
    ]
    assert out == expected
    parts = out[0].split(" ||| ")
    assert len(parts) == 3 and parts[0] == "0" and float(parts[2]) < 0


def test_translate_files(bundle, translator):
    d = scratch("cli-files")
    (d / "in.txt").write_text("\n".join(LINES) + "\n", encoding="utf-8")
    proc = translate(str(bundle), "-i", str(d / "in.txt"), "-o", str(d / "out.txt"), "--beam", "2")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    out = (d / "out.txt").read_text(encoding="utf-8").split("\n")
    assert out[-1] == "" and out[:-1] == [
        r.hypotheses[0] for r in translator.translate_batch(LINES, beam_size=2)
    ]


def _one_error_line(proc: subprocess.CompletedProcess, *words: str) -> str:
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("seq2onnx translate: error:")
    for w in words:
        assert w in lines[0]
    assert proc.stdout == ""
    return lines[0]


def test_missing_input_file(bundle):
    missing = scratch("cli-missing") / "nope.txt"
    _one_error_line(translate(str(bundle), "-i", str(missing)), "nope.txt")


@pytest.mark.slow
def test_bad_bundle_path():
    bad = scratch("cli-bad") / "no-bundle"
    _one_error_line(translate(str(bad), input="the cat\n"), "no-bundle")
    empty = scratch("cli-empty")  # a directory without bundle.json
    _one_error_line(translate(str(empty), input="the cat\n"), "bundle.json")


def test_help():
    proc = translate("--help")
    assert proc.returncode == 0
    assert "--beam" in proc.stdout and "--n-best" in proc.stdout and "--scores" in proc.stdout


@pytest.mark.slow
def test_unicode_line_separators_do_not_split_lines(bundle):
    lines = ["the cat\x0cdances in the box", "a small\u2028bird sleeps", "the farmer liked 12 green cows"]
    out = _ok(translate(str(bundle), "--beam", "1", input="\n".join(lines) + "\n"))
    assert len(out) == len(lines)


def test_help_explains_the_filter_options():
    text = translate("--help").stdout
    for option in (
        "--strict",
        "--truncate",
        "--progress",
        "--no-progress",
        "--force",
        "--threads",
        "Unix filter",
        "U+FFFD",
    ):
        assert option in text, option


# -- a Unix filter ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_streaming_answers_each_line_before_stdin_closes(bundle, translator):
    """A co-process: each line's translation comes back while stdin is still open."""
    proc = subprocess.Popen(
        COMMAND + [str(bundle), "--beam", "1"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env=ENV,
    )
    answers: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [answers.put(line) for line in proc.stdout], daemon=True).start()
    try:
        for line, timeout in ((LINES[0], 120), (LINES[3], 30), (LINES[2], 30)):
            proc.stdin.write(line.encode() + b"\n")
            proc.stdin.flush()
            got = answers.get(timeout=timeout).decode("utf-8")  # queue.Empty here: it waited for EOF
            assert got == translator.translate(line, beam_size=1) + "\n"
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0
        assert proc.stderr.read() == b""
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_reader_leaving_early_ends_quietly_with_status_0(bundle, translator):
    """`... | seq2onnx translate B | head -1`: no 'Broken pipe', status 0 (PIPESTATUS of translate)."""
    command = " ".join(map(shlex.quote, [*COMMAND, str(bundle), "--beam", "1", "--batch-size", "8"]))
    script = (
        f"yes 'a small bird sleeps' | head -3000 | {command} | head -1; echo \"status=${{PIPESTATUS[2]}}\""
    )
    proc = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=300
    )
    assert proc.stdout == translator.translate("a small bird sleeps", beam_size=1) + "\nstatus=0\n", (
        proc.stderr
    )
    assert "Broken pipe" not in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stderr == ""


@pytest.mark.slow
def test_invalid_utf8_is_replaced_with_one_warning_stdin_and_file_alike(bundle, translator):
    data = b"a small bird sleeps\nthe cat \xff\xfe dances in the box\r\nthree old kings carry the red boxes\n"
    expected_lines = [
        "a small bird sleeps",
        "the cat \ufffd\ufffd dances in the box",
        "three old kings carry the red boxes",
    ]
    want = "".join(r.hypotheses[0] + "\n" for r in translator.translate_batch(expected_lines)).encode("utf-8")
    path = scratch("cli-utf8") / "in.txt"
    path.write_bytes(data)
    for proc in (translate(str(bundle), input=data), translate(str(bundle), "-i", str(path), input=b"")):
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == want
        warnings = proc.stderr.decode().splitlines()
        assert len(warnings) == 1 and "line 2" in warnings[0] and "invalid UTF-8" in warnings[0], warnings


@pytest.mark.slow
def test_over_long_line_is_truncated_with_a_warning_and_the_others_translated(bundle, translator):
    long = "the cat dances " * 200  # 3,000 characters, far more tokens than the tiny model's positions
    assert len(translator.source_tokenizer.encode(long)) > translator.max_positions
    lines = [LINES[0], LINES[2], LINES[3], long, LINES[5], LINES[6]]
    want = [r.hypotheses[0] for r in translator.translate_batch(lines, truncate=True)]
    for extra in ([], ["--truncate"]):  # the old flag is accepted and is the default
        out = translate(str(bundle), "--batch-size", "2", *extra, input="\n".join(lines) + "\n")
        assert _ok(out) == want
        warnings = out.stderr.splitlines()
        assert len(warnings) == 1 and "line 4:" in warnings[0] and "--strict" in warnings[0], warnings
        assert str(translator.max_positions) in warnings[0]


@pytest.mark.slow
def test_strict_error_names_the_input_line(bundle, translator):
    short = [LINES[i % 3 * 2] for i in range(300)]  # lines 0, 2, 4 of LINES: two texts and an empty line
    lines = short[:280] + ["the cat dances " * 200] + short[280:]
    proc = translate(str(bundle), "--strict", "--beam", "1", input="\n".join(lines) + "\n")
    assert proc.returncode == 1
    errors = proc.stderr.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("seq2onnx translate: error: input line 281 has "), (
        proc.stderr
    )
    assert f"at most {translator.max_positions} positions" in errors[0] and "--strict" in errors[0]
    # the lines before it were translated and written
    assert proc.stdout.split("\n")[:-1] == [
        r.hypotheses[0] for r in translator.translate_batch(short[:280], beam_size=1)
    ]


# -- -o FILE ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_output_file_needs_force_to_replace_and_gets_the_usual_mode(bundle, translator):
    d = scratch("cli-force")
    out = d / "out.txt"
    out.write_text("old\n")
    proc = translate(str(bundle), "-o", str(out), input="a small bird sleeps\n")
    assert proc.returncode == 1 and "--force" in proc.stderr and str(out) in proc.stderr
    assert out.read_text() == "old\n"
    proc = translate(str(bundle), "-o", str(out), "--force", input="a small bird sleeps\n")
    assert proc.returncode == 0, proc.stderr
    assert out.read_text(encoding="utf-8") == translator.translate("a small bird sleeps") + "\n"
    new = d / "new.txt"
    assert translate(str(bundle), "-o", str(new), input="a small bird sleeps\n").returncode == 0
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(new.stat().st_mode) == 0o666 & ~umask  # not the temporary file's 0600
    assert sorted(p.name for p in d.iterdir()) == ["new.txt", "out.txt"]  # no temporary file left


@pytest.mark.slow
def test_output_file_is_not_left_partial_on_failure(bundle):
    d = scratch("cli-partial")
    lines = "\n".join([LINES[0], LINES[2], "the cat dances " * 200]) + "\n"
    proc = translate(str(bundle), "-o", str(d / "out.txt"), "--strict", input=lines)
    assert proc.returncode == 1 and "input line 3" in proc.stderr
    assert list(d.iterdir()) == []
    (d / "out.txt").write_text("old\n")
    proc = translate(str(bundle), "-o", str(d / "out.txt"), "--strict", "--force", input=lines)
    assert proc.returncode == 1
    assert [p.name for p in d.iterdir()] == ["out.txt"] and (d / "out.txt").read_text() == "old\n"


@pytest.mark.skipif(os.name == "nt", reason="SIGINT to a child is POSIX")
@pytest.mark.slow
def test_output_file_is_not_left_partial_on_ctrl_c(bundle):
    d = scratch("cli-ctrl-c")
    # PYTHONFAULTHANDLER: should it ever hang, SIGABRT below makes it print every thread's stack
    proc = subprocess.Popen(
        COMMAND + [str(bundle), "-o", str(d / "out.txt")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env={**ENV, "PYTHONFAULTHANDLER": "1"},
        # Ctrl-C as at a terminal: a shell's background job inherits SIGINT ignored,
        # and Python then installs no KeyboardInterrupt handler at all
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        proc.stdin.write(b"a small bird sleeps\n")
        proc.stdin.flush()
        deadline = time.monotonic() + 120
        while not list(d.iterdir()) and time.monotonic() < deadline:  # the temporary file: it is writing
            time.sleep(0.05)
        assert list(d.iterdir()), "no temporary output file appeared"
        time.sleep(0.5)  # the first line translated and written to the temporary file
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=120)  # generous: a loaded 2-core CI machine once needed more than 30 s
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            _, err = proc.communicate(timeout=60)
            raise AssertionError(
                f"no exit 120 s after Ctrl-C; its threads:\n{err.decode(errors='replace')[-6000:]}"
            )
        assert code == 130
        assert list(d.iterdir()) == []
    finally:
        proc.kill()
        proc.wait()


# -- progress --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_progress_only_when_asked_or_on_a_terminal(bundle):
    path = scratch("cli-progress") / "in.txt"
    path.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    plain = translate(str(bundle), "-i", str(path))
    assert plain.returncode == 0 and plain.stderr == ""  # stderr is a pipe here: no bar by default
    shown = translate(str(bundle), "-i", str(path), "--progress")
    assert shown.returncode == 0 and shown.stdout == plain.stdout
    assert f"{len(LINES)}/{len(LINES)} lines" in shown.stderr
    from_stdin = translate(str(bundle), "--progress", input="\n".join(LINES) + "\n")
    assert f"{len(LINES)} lines, " in from_stdin.stderr and from_stdin.stdout == plain.stdout
    assert translate(str(bundle), "-i", str(path), "--no-progress").stderr == ""
    env = {**ENV, "SEQ2ONNX_PROGRESS": "1"}  # the old undocumented switch is gone
    old = subprocess.run(
        [*COMMAND, str(bundle), "-i", str(path)], capture_output=True, text=True, env=env, timeout=120
    )
    assert old.returncode == 0 and old.stderr == ""


@pytest.mark.slow
def test_option_errors_name_the_value_and_the_fix(bundle):
    cores = os.cpu_count()
    for value in ("100000", "-1"):
        line = _one_error_line(translate(str(bundle), "--threads", value, input="a\n"), f"--threads {value}")
        assert f"{cores} cores" in line and "0 to use them all" in line
    _one_error_line(
        translate(str(bundle), "--n-best", "3", "--beam", "2", input="a\n"), "--n-best 3", "--beam 3"
    )
    _one_error_line(translate(str(bundle), "--batch-size", "0", input="a\n"), "--batch-size 0")
    _one_error_line(
        translate(str(bundle), "--max-length", "100000", input="a\n"), "--max-length 100000", "max_positions"
    )
