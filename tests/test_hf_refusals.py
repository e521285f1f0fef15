"""Damaged Hugging Face directories are refused by name, before anything is written (issue 37, items 9-11).

Each case breaks one file of a tiny untrained Marian or M2M100 directory (tests/hf_fixtures.py) and
expects one line naming the file, the field or tensor, the value and the fix; no bundle and no
temporary directory is left, and the model directory is unchanged. A few run the `seq2onnx` command
as typed; the rest call export_hf_bundle, which the command runs.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
from pathlib import Path

import pytest

from extras import require

require("transformers", "hf")

import hf_fixtures as F  # noqa: E402
from helpers import cli_here  # noqa: E402
from seq2onnx.export.hf.bundle import export_hf_bundle  # noqa: E402
from seq2onnx.export.hf.checks import (  # noqa: E402
    MIN_POSITIONS,
    check_memory,
    parameter_estimate,
)
from seq2onnx.export.hf.weights_check import safetensors_header  # noqa: E402
from seq2onnx.export.hf.read import HFImportError, is_hf_dir, read_config  # noqa: E402


def _json(name, edit):
    def apply(d: Path):
        path = d / name
        data = json.loads(path.read_text(encoding="utf-8"))
        edit(data)
        path.write_text(json.dumps(data, indent=2), encoding="utf-8")

    return apply


def _set(name, **fields):
    return _json(name, lambda data: data.update(fields))


def _replaced(name, make):
    def apply(d: Path):
        (d / name).unlink()
        make(d / name)

    return apply


def _text(name, text):
    return lambda d: (d / name).write_text(text, encoding="utf-8")


def _weights(edit):
    def apply(d: Path):
        path = d / "model.safetensors"
        path.write_bytes(edit(path.read_bytes()))

    return apply


def _length(data: bytes) -> int:
    return struct.unpack("<Q", data[:8])[0]


def _tensor(name, **fields):
    def change(data: bytes) -> bytes:
        n = _length(data)
        header = json.loads(data[8 : 8 + n])
        header[name].update(fields)
        text = json.dumps(header).encode()
        return struct.pack("<Q", len(text)) + text + data[8 + n :]

    return _weights(change)


def _duplicate_id(vocab: dict) -> None:
    pieces = [t for t in vocab if not t.startswith("<")]
    vocab[pieces[1]] = vocab[pieces[0]]


def _beams_in_config(d: Path) -> None:
    _json("generation_config.json", lambda g: g.pop("num_beams"))(d)
    _set("config.json", num_beams=0)(d)


def _pickled_huge(d: Path) -> None:
    """d_model 10^9 beside weights whose header cannot be read first: the memory estimate must refuse it."""
    (d / "model.safetensors").unlink()
    (d / "pytorch_model.bin").write_bytes(b"")
    _set("config.json", d_model=10**9)(d)


GEN, CFG, VOCAB, WEIGHTS = "generation_config.json", "config.json", "vocab.json", "model.safetensors"
EMBED = "model.shared.weight"
# name -> (model, damage, words of the one line: the file, the field and value, the fix)
CASES = {
    # item 9: the values the bundle takes from generation_config.json (or config.json)
    "gen_max_length_-1": ("marian", _set(GEN, max_length=-1), [GEN, "max_length is -1", ">= 2", "set it to"]),
    "gen_max_length_1": ("marian", _set(GEN, max_length=1), [GEN, "max_length is 1", ">= 2"]),
    "gen_num_beams_0": (
        "marian",
        _set(GEN, num_beams=0),
        [GEN, "num_beams is 0", "from 1 to", "set it to 1"],
    ),
    "gen_num_beams_str": ("marian", _set(GEN, num_beams="4"), [GEN, "num_beams is '4'", "an integer"]),
    "gen_length_penalty_nan": (
        "marian",
        _set(GEN, length_penalty=float("nan")),
        [GEN, "length_penalty is nan", "finite", "1.0"],
    ),
    "gen_min_over_max": ("marian", _set(GEN, min_length=100), [GEN, "min_length 100 is above max_length 64"]),
    "gen_min_length_-1": ("marian", _set(GEN, min_length=-1), [GEN, "min_length is -1", ">= 0"]),
    "gen_start_oov": (
        "marian",
        _set(GEN, decoder_start_token_id=100000),
        [GEN, "decoder_start_token_id is 100000", "0 to 102"],
    ),
    "gen_bad_words_oov": (
        "marian",
        _set(GEN, bad_words_ids=[[100000]]),
        [GEN, "bad_words_ids is [[100000]]"],
    ),
    "gen_suppress_oov": ("marian", _set(GEN, suppress_tokens=[-5]), [GEN, "suppress_tokens is [-5]"]),
    "gen_forced_bos_oov": (
        "m2m100",
        _set(GEN, forced_bos_token_id=100000),
        [GEN, "forced_bos_token_id is 100000", "0 to 268"],
    ),
    "gen_invalid_json": ("marian", _text(GEN, '{"max_length": 64,'), [GEN, "not valid JSON", "restore"]),
    "gen_list": ("marian", _text(GEN, "[64]"), [GEN, "JSON list, not an object"]),
    # issue 60, item 9: a generation_config.json that is no file is refused by name, not ignored
    "gen_directory": (
        "marian",
        _replaced(GEN, lambda p: p.mkdir()),
        [GEN, "not a regular file (a directory)"],
    ),
    "gen_dev_zero": (
        "marian",
        _replaced(GEN, lambda p: p.symlink_to("/dev/zero")),
        [GEN, "not a regular file (a device, pipe or socket)"],
    ),
    "gen_num_beams_1e9": (
        "marian",
        _set(GEN, num_beams=10**9),
        [GEN, "num_beams is 1000000000", "an integer from 1 to 103", "set it to 1"],
    ),
    "gen_early_stopping_list": (
        "marian",
        _set(GEN, early_stopping=[True]),
        [GEN, "early_stopping is [True]", 'true, false or "never"'],
    ),
    "cfg_num_beams_0": ("marian", _beams_in_config, [CFG, "num_beams is 0", "from 1 to"]),
    # items 9 and 11: config.json
    "cfg_list": ("marian", _text(CFG, "[]"), [CFG, "JSON list, not an object", "save_pretrained"]),
    "cfg_invalid_json": ("marian", _text(CFG, '{"model_type": "marian",'), [CFG, "not valid JSON"]),
    "cfg_no_model_type": (
        "marian",
        _json(CFG, lambda c: c.pop("model_type")),
        [CFG, "has no model_type", "marian"],
    ),
    "cfg_encoder_layers_-1": ("marian", _set(CFG, encoder_layers=-1), [CFG, "encoder_layers is -1", ">= 1"]),
    "cfg_decoder_layers_3": (
        "marian",
        _set(CFG, decoder_layers=3),
        [CFG, "decoder_layers is 3", "hold 2 decoder layers", "decoder_layers to 2"],
    ),
    "cfg_max_positions_1": (
        "marian",
        _set(CFG, max_position_embeddings=1),
        [CFG, "max_position_embeddings is 1", ">= 5"],
    ),
    "cfg_max_positions_1_m2m": (
        "m2m100",
        _set(CFG, max_position_embeddings=1),
        [CFG, "max_position_embeddings is 1", ">= 5"],
    ),
    "cfg_d_model_1e9": (
        "marian",
        _set(CFG, d_model=10**9),
        [CFG, "d_model is 1000000000", "32 wide", "set d_model to 32"],
    ),
    "cfg_d_model_1e9_pickled": (
        "marian",
        _pickled_huge,
        [CFG, "d_model 1000000000", "GiB", "more than this machine"],
    ),
    "cfg_d_model_str": ("marian", _set(CFG, d_model="32"), [CFG, "d_model is '32'", "an integer"]),
    "cfg_heads_differ": (
        "marian",
        _set(CFG, decoder_attention_heads=2),
        [CFG, "encoder_attention_heads is 4 but decoder_attention_heads is 2"],
    ),
    "cfg_heads_5": (
        "marian",
        _set(CFG, encoder_attention_heads=5, decoder_attention_heads=5),
        [CFG, "d_model 32 is not a multiple of encoder_attention_heads 5"],
    ),
    "cfg_ffn_-64": ("marian", _set(CFG, encoder_ffn_dim=-64), [CFG, "encoder_ffn_dim is -64"]),
    "cfg_activation_tanh": (
        "marian",
        _set(CFG, activation_function="tanh"),
        [CFG, "activation_function is 'tanh'", "relu"],
    ),
    "cfg_pad_oov": ("marian", _set(CFG, pad_token_id=100000), [CFG, "pad_token_id is 100000", "0 to 102"]),
    "cfg_eos_-1": ("m2m100", _set(CFG, eos_token_id=-1), [CFG, "eos_token_id is -1"]),
    "cfg_no_d_model": ("m2m100", _json(CFG, lambda c: c.pop("d_model")), [CFG, "has no d_model"]),
    # item 10: vocab.json
    "vocab_duplicate_id": ("marian", _json(VOCAB, _duplicate_id), [VOCAB, "both have id 2", "restore"]),
    "vocab_no_pad": (
        "marian",
        _json(VOCAB, lambda v: v.pop("<pad>")),
        [VOCAB, "no pad token '<pad>'", "102"],
    ),
    "vocab_no_pad_m2m": ("m2m100", _json(VOCAB, lambda v: v.pop("<pad>")), [VOCAB, "no pad token '<pad>'"]),
    "vocab_pad_moved": (
        "m2m100",
        _json(VOCAB, lambda v: v.update({"<pad>": 200})),
        [VOCAB, "'<pad>' has id 200", "pad_token_id is 1"],
    ),
    "vocab_id_oov": ("marian", _json(VOCAB, lambda v: v.update({"<unk>": 5000})), [VOCAB, "id 5000", "103"]),
    # item 11: model.safetensors, read by hand before safetensors or torch maps it
    "st_empty": ("marian", _weights(lambda b: b""), [WEIGHTS, "is 0 bytes", "copy the weights again"]),
    "st_truncated": ("marian", _weights(lambda b: b[: len(b) // 2]), [WEIGHTS, "truncated"]),
    "st_header_2p60": (
        "marian",
        _weights(lambda b: struct.pack("<Q", 2**60) + b[8:]),
        [WEIGHTS, "header claims 1,152,921,504,606,846,976 bytes"],
    ),
    "st_header_garbage": (
        "marian",
        _weights(lambda b: b[:8] + b"{" * _length(b) + b[8 + _length(b) :]),
        [WEIGHTS, "header is not valid JSON"],
    ),
    "st_huge_tensor": (
        "marian",
        _tensor(EMBED, shape=[10**9, 10**9]),
        [WEIGHTS, EMBED, "[1000000000, 1000000000]", "header is damaged"],
    ),
    "st_offsets_2p60": (
        "marian",
        _tensor(EMBED, data_offsets=[0, 2**60]),
        [WEIGHTS, EMBED, "header is damaged"],
    ),
}
# Run as typed (`seq2onnx export DIR OUT`, in this process): one of each file; the rest call the function the command calls.
TYPED = (
    "gen_max_length_-1",
    "gen_num_beams_0",
    "cfg_list",
    "cfg_d_model_1e9",
    "vocab_duplicate_id",
    "st_header_2p60",
)


def _digest(d: Path) -> dict[str, str]:
    # a directory or a link to a device (the damage of some cases) is named by what it is, not read
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        if p.is_file() and not p.is_symlink()
        else f"{'link to ' + str(p.readlink()) if p.is_symlink() else 'directory'}"
        for p in sorted(d.iterdir())
    }


def _broken(tmp_path: Path, name: str) -> Path:
    model, damage, _ = CASES[name]
    broken = tmp_path / "model"
    shutil.copytree(F.random_model(model), broken)
    damage(broken)
    return broken


def _nothing_written(tmp_path: Path) -> None:
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no bundle, no .bundle.tmp-*


@pytest.mark.parametrize("name", [n for n in CASES if n not in TYPED])
def test_refused_by_name(tmp_path, name):
    broken = _broken(tmp_path, name)
    before = _digest(broken)
    with pytest.raises(HFImportError) as refused:
        export_hf_bundle(broken, tmp_path / "bundle", decoder="standard")
    line = str(refused.value)
    assert "\n" not in line and line.startswith(str(broken)), line
    for word in CASES[name][2]:
        assert word in line, line
    _nothing_written(tmp_path)
    assert _digest(broken) == before


@pytest.mark.slow
@pytest.mark.parametrize("name", TYPED)
def test_refused_as_typed(tmp_path, name):
    broken = _broken(tmp_path, name)
    before = _digest(broken)
    run = cli_here(
        "export", broken, tmp_path / "bundle"
    )  # the command's main(); test_cli_errors runs a child
    assert run.returncode == 1, run.stderr
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"seq2onnx export: error: {broken}"), run.stderr
    for word in CASES[name][2]:
        assert word in lines[0], lines[0]
    assert "unexpected" not in lines[0] and ".bundle.tmp" not in lines[0]
    _nothing_written(tmp_path)
    assert _digest(broken) == before


@pytest.mark.parametrize(
    "model, options", [("marian", {}), ("marian", {"shared_vocab": False}), ("m2m100", {})]
)
def test_undamaged_directories_pass_every_check(model, options):
    """The checks refuse what is broken, not the models the importer exists for."""
    directory = F.random_model(model, **options)
    assert read_config(directory)["model_type"] == {"marian": "marian", "m2m100": "m2m_100"}[model]


@pytest.mark.slow
def test_shortest_position_table_exports(tmp_path):
    """MIN_POSITIONS is the exporter's true limit: a table that long exports, one shorter is refused."""
    model = tmp_path / "model"
    shutil.copytree(F.random_model("marian"), model)
    _set(CFG, max_position_embeddings=MIN_POSITIONS - 1)(model)
    with pytest.raises(HFImportError, match=f"max_position_embeddings is {MIN_POSITIONS - 1}, expected"):
        export_hf_bundle(model, tmp_path / "refused")
    _set(CFG, max_position_embeddings=MIN_POSITIONS)(model)
    bundle = export_hf_bundle(model, tmp_path / "bundle", decoder="standard")
    assert json.loads((bundle / "bundle.json").read_text())["model"]["max_positions"] == MIN_POSITIONS


def test_header_reader_agrees_with_safetensors():
    from safetensors import safe_open

    path = F.random_model("m2m100") / "model.safetensors"
    ours = safetensors_header(path)
    with safe_open(str(path), framework="pt") as f:
        theirs = {name: list(f.get_slice(name).get_shape()) for name in f.keys()}
    assert {name: shape for name, (_, shape) in ours.items()} == theirs and len(theirs) > 20


@pytest.mark.slow
@pytest.mark.parametrize("model", ["marian", "m2m100"])
def test_memory_estimate_against_the_limit(model):
    from transformers import AutoModelForSeq2SeqLM

    directory = F.random_model(model)
    config = json.loads((directory / "config.json").read_text())
    hf = AutoModelForSeq2SeqLM.from_pretrained(str(directory))
    tensors = {id(t): t.numel() for t in [*hf.parameters(), *hf.buffers()] if t.is_floating_point()}
    assert abs(parameter_estimate(config) / sum(tensors.values()) - 1) < 0.05  # what transformers allocates
    need = int(1.5 * 4 * parameter_estimate(config))  # one float32 copy, and half again beside it
    check_memory(directory, config, limit=need)
    with pytest.raises(HFImportError, match=r"config\.json: d_model 32, 2\+2 layers .* more than this"):
        check_memory(directory, config, limit=need - 1)


def test_damaged_config_is_routed_by_its_neighbours(tmp_path):
    """A damaged config.json beside save_pretrained's files is a Hugging Face directory (its error names
    config.json); beside our checkpoint's tokenizer models it stays ours."""
    hf = _broken(tmp_path, "cfg_list")
    assert is_hf_dir(hf)
    ours = tmp_path / "ours"
    ours.mkdir()
    (ours / "config.json").write_text("[]")
    for name in ("model.safetensors", "source.spm.model", "target.spm.model"):
        (ours / name).write_bytes(b"")
    assert not is_hf_dir(ours)
    (ours / "source.spm.model").unlink()
    (ours / "target.spm.model").unlink()
    (ours / "vocab.json").write_text("{}")
    assert is_hf_dir(ours)
