"""The bundle spec (spec/bundle.json) is the one source of the format's names and limits, and the
shared cases (spec/cases/bundle-json.json) are refused by this host exactly as by the JS host,
whose node:test suite reads the same file."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from seq2onnx.runtime import bundle as fmt
from seq2onnx.runtime.bundle import BundleError, validate_meta

ROOT = Path(__file__).resolve().parents[1]
CASES = json.loads((ROOT / "spec" / "cases" / "bundle-json.json").read_text(encoding="utf-8"))
SPEC = json.loads((ROOT / "spec" / "bundle.json").read_text(encoding="utf-8"))


def _apply(meta: dict, edits: list[dict]) -> dict:
    meta = copy.deepcopy(meta)

    def walk(path):
        parent = meta
        for key in path[:-1]:
            parent = parent[key]
        return parent, path[-1]

    for edit in edits:
        parent, key = walk(edit["path"])
        if edit["op"] == "set":
            parent[key] = edit["value"]
        elif edit["op"] == "delete":
            del parent[key]
        elif edit["op"] == "copy":
            source, source_key = walk(edit["from"])
            parent[key] = copy.deepcopy(source[source_key])
        else:
            raise AssertionError(f"unknown edit {edit['op']!r} in the cases file")
    return meta


def test_the_base_bundle_json_passes():
    validate_meta(copy.deepcopy(CASES["base"]), Path("B/bundle.json"))


@pytest.mark.parametrize("case", CASES["cases"], ids=[c["what"] for c in CASES["cases"]])
def test_each_shared_case_is_refused_with_its_message(case):
    meta = _apply(CASES["base"], case["edits"])
    with pytest.raises(BundleError) as e:
        validate_meta(meta, Path("B/bundle.json"))
    message = str(e.value)
    assert message.startswith("B/bundle.json: "), message
    assert re.search(case["message"], message), (case["message"], message)
    assert CASES["fix"] in message, message


def test_the_runtime_takes_its_names_and_limits_from_the_spec():
    assert (fmt.FORMAT, fmt.FORMAT_VERSION, fmt.BUNDLE_JSON, fmt.MAX_JSON_BYTES) == (
        SPEC["format"],
        SPEC["format_version"],
        SPEC["bundle_json"],
        SPEC["max_json_bytes"],
    )
    assert fmt.FILE_KEYS == SPEC["files"]["required"] and fmt.OPTIONAL_FILE_KEYS == SPEC["files"]["optional"]
    assert list(fmt.DTYPES) == SPEC["dtypes"] and fmt.MS_DOMAIN == SPEC["contrib_domain"]
    assert [fmt.TOKENS, fmt.TOPK_IDS, fmt.CACHE_INDIRECTION] == [
        SPEC["names"][k] for k in ("tokens", "topk_ids", "cache_indirection")
    ]
    assert fmt.past_key(3) == SPEC["layer_names"]["past_key"].replace("{i}", "3")
    assert fmt.cross_names(1) == [
        SPEC["layer_names"]["key_cross"].replace("{i}", "0"),
        SPEC["layer_names"]["value_cross"].replace("{i}", "0"),
    ]


def test_a_name_changed_in_the_spec_changes_the_runtime(tmp_path):
    """A fresh interpreter whose spec says another name for `tokens` uses it (one-line edit, no code)."""
    import shutil
    import subprocess
    import sys

    package = tmp_path / "seq2onnx"
    shutil.copytree(ROOT / "runtime", package / "runtime")
    (package / "spec").mkdir()
    (package / "__init__.py").write_text("")
    spec = dict(SPEC, names={**SPEC["names"], "tokens": "target_ids"}, max_json_bytes=4096)
    (package / "spec" / "bundle.json").write_text(json.dumps(spec))
    code = (
        "from seq2onnx.runtime import bundle, signature; "
        "print(bundle.TOKENS, bundle.MAX_JSON_BYTES, signature.graph_signature(1, 2, 4, 'float32', 8)"
        "['decoder']['inputs'][0]['name'])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["target_ids", "4096", "target_ids"]


def test_no_source_file_repeats_a_graph_or_file_name_of_the_spec():
    """The names live in spec/bundle.json; code refers to them through runtime/bundle.py."""
    literals = {
        *SPEC["names"].values(),
        *SPEC["files"]["required"].values(),
        *SPEC["files"]["optional"].values(),
        *(v.replace("{i}", "") for v in SPEC["layer_names"].values()),
        SPEC["format"],
    }
    literals -= {"step", "tokens"}  # common words: also used as ordinary names in the code
    found = []
    for folder in ("runtime",):
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            for literal in literals:
                if re.search(r"(?<!\[)[\"']" + re.escape(literal) + r"[\"'{]", text):
                    found.append(f"{path.relative_to(ROOT)}: {literal!r}")
    assert not found, found
