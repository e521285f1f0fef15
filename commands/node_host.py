"""The Node host (js/, `node js/bin/seq2onnx-js.mjs`) as `seq2onnx verify-host` runs it: finding it
(node, its version, the JS host's dependencies), and running one of its commands on lines of input.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

from seq2onnx import errors
from seq2onnx.commands.host_report import compare_tokens

NODE_MIN = (18, 17)  # js/package.json "engines"
MAX_BATCH = 32  # both hosts' default max_batch_size


def js_dir_default() -> Path:
    from seq2onnx.commands.web import default_js_dir

    return default_js_dir()


def find_node_host(node: str | None = None, js_dir: str | Path | None = None) -> dict:
    """Returns the Node host to run: {"node": executable, "cli": seq2onnx-js.mjs, "js_dir",
    "node_version", "onnxruntime_node"}.

    Args:
        node: the node executable; None: the one on PATH.
        js_dir: the checkout's js/ folder; None: default_js_dir().

    Raises:
        CommandError: naming what to install or pass when node, the JS host or its node_modules is
            missing (or not Node.js).
    """
    js = Path(js_dir) if js_dir is not None else js_dir_default()
    script = js / "bin" / "seq2onnx-js.mjs"
    if not script.is_file():
        raise errors.CommandError(
            f"{js}: no JS host there (bin/seq2onnx-js.mjs); verify-host needs the js/ "
            "folder of a seq2onnx checkout: pass --js-dir DIR"
        )
    node = _node_executable(node, js)
    for package in ("onnxruntime-node", "@sctg/sentencepiece-js"):
        if not (js / "node_modules" / package / "package.json").is_file():
            raise errors.CommandError(
                f"{js / 'node_modules' / package}: missing; install the JS host's "
                f"dependencies: npm ci --prefix {js}"
            )
    version = _node_version(node)
    ort_package = js / "node_modules" / "onnxruntime-node" / "package.json"
    ort_node = json.loads(ort_package.read_text(encoding="utf-8"))
    return {
        "node": node,
        "cli": script,
        "js_dir": js,
        "node_version": version,
        "onnxruntime_node": ort_node.get("version"),
    }


def _node_executable(node: str | None, js: Path) -> str:
    """The node to run: `node` if it is an executable file, else the one on PATH."""
    if node is None:
        found = shutil.which("node")
        if found is None:
            raise errors.CommandError(
                "node is not installed (not on PATH): install Node.js >= 18.17 "
                "(Debian: apt-get install nodejs npm), then the JS host's "
                f"dependencies: npm ci --prefix {js}; or pass --node PATH"
            )
        return found
    if not (os.path.isfile(node) and os.access(node, os.X_OK)):
        raise errors.CommandError(f"--node {node}: not an executable file; give the path of the node binary")
    return node


def _node_version(node: str) -> str:
    """`node --version`, refused unless it is Node.js >= NODE_MIN."""
    try:
        version = subprocess.run(
            [node, "--version"], capture_output=True, text=True, timeout=60
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        raise errors.CommandError(
            f"{node} --version failed ({e}); give a working node with --node PATH"
        ) from e
    match = re.fullmatch(r"v(\d+)\.(\d+)\.\d+\S*", version)
    if not match:
        said = version.splitlines()[0][:60] if version else "nothing"
        raise errors.CommandError(
            f"--node {node}: not Node.js (`{node} --version` printed {said!r}, not a "
            "version like v20.11.1); give the path of the node binary with --node PATH"
        )
    if tuple(map(int, match.groups())) < NODE_MIN:
        raise errors.CommandError(
            f"{node} is Node.js {version}; the JS host needs Node.js >= "
            f"{NODE_MIN[0]}.{NODE_MIN[1]}: install a newer one or pass --node PATH"
        )
    return version


def run_node(host: dict, args: list[str], lines: list[str]) -> tuple[list[dict], dict | None]:
    """Runs `seq2onnx-js ARGS` on `lines`; returns one parsed JSON object per line and the timing
    line's object (translate --timing) or None."""
    stdin = "".join(line + "\n" for line in lines)
    # The host runs in its own folder: paths given relative to ours are made absolute first.
    args = [str(Path(a).resolve()) if i == 1 else a for i, a in enumerate(args)]
    proc = subprocess.run(
        [host["node"], str(host["cli"]), *args],
        input=stdin,
        capture_output=True,
        text=True,
        encoding="utf-8",
        cwd=host["js_dir"],
    )
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-3:]
        command = " ".join(args[:2])
        raise errors.CommandError(
            f"the Node host failed (exit {proc.returncode}) on `{command} ...`: "
            + (" | ".join(tail) or "no message")
        )
    out = proc.stdout.splitlines()
    if len(out) != len(lines):
        raise errors.CommandError(
            f"the Node host wrote {len(out)} lines for {len(lines)} inputs (`{' '.join(args[:2])}`)"
        )
    timing = None
    for line in proc.stderr.splitlines():
        if line.startswith("seq2onnx-js: timing "):
            timing = json.loads(line.split(" ", 2)[2])
    try:
        return [json.loads(line) for line in out], timing
    except ValueError as e:
        raise errors.CommandError(f"the Node host wrote a line that is not JSON ({e})") from e


def _node_searches(
    host: dict,
    bundle_dir: str | Path,
    source_ids: list[list[int]],
    searches: dict[str, tuple[int, int]],
    threads: int,
    flags: list[str],
    log,
) -> tuple[dict[str, list[dict]], dict[str, dict | None]]:
    """Each search's results from the Node host (given the same source ids), and its timing."""
    node, node_timing = {}, {}
    id_lines = [json.dumps(ids) for ids in source_ids]
    for label, (size, n_best) in searches.items():
        log(f"the Node host: {label} on {len(source_ids)} sentences")
        args = [
            "translate",
            str(bundle_dir),
            "--ids",
            "--json",
            "--timing",
            "--beam",
            str(size),
            "--n-best",
            str(n_best),
            "--threads",
            str(threads),
            "--batch-size",
            str(MAX_BATCH),
            *flags,
        ]
        node[label], node_timing[label] = run_node(host, args, id_lines)
    return node, node_timing


def node_side(runner, bundle_dir, sentences, source_ids, searches, python, tokenizers, options, log):
    """verify-host's Node side: the Node host's searches (fed the Python tokenizer's ids) and its
    tokenizer rows."""
    langs, max_length, threads = options["langs"], options["max_length"], options["threads"]
    flags = [x for name, v in langs.items() if v for x in (f"--{name.replace('_', '-')}", v)]
    if max_length is not None:
        flags += ["--max-length", str(max_length)]
    results, timing = _node_searches(runner, bundle_dir, source_ids, searches, threads, flags, log)
    # target texts: every hypothesis the Python runtime wrote, once each, in order
    targets = list(
        dict.fromkeys(h for label in searches for r in python[label] for h in r.hypotheses if h.strip())
    )
    log("the Node host: tokenizers")
    source_tokens, _ = run_node(runner, ["tokenize", str(bundle_dir), "--side", "source"], sentences)
    target_tokens, _ = run_node(runner, ["tokenize", str(bundle_dir), "--side", "target"], targets)
    differences: list[dict] = []
    checks = [
        compare_tokens("source tokenizer", sentences, tokenizers[0], source_tokens, differences),
        compare_tokens("target tokenizer", targets, tokenizers[1], target_tokens, differences),
    ]
    return results, timing, checks, differences
