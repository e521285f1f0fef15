"""Nothing lost: an output never overlaps an input, `--force` replaces only what seq2onnx wrote, and an
output that cannot be written is named (not its temporary file). Real commands, real files."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from seq2onnx import atomic
from seq2onnx.export.ctranslate2.convert import ct2_available
from helpers import cli, cli_here
from tiny import scratch, tiny_run

CHECKPOINT_FILES = {"config.json", "model.safetensors", "source.spm.model", "target.spm.model"}


@pytest.fixture(scope="module")
def checkpoint() -> Path:
    """A copy of a trained checkpoint (step directory), alone in its own folder."""
    dest = scratch("ckpt") / "c"
    shutil.copytree((tiny_run() / "last").resolve(), dest)
    return dest


FORMATS = ["onnx"] + (["ctranslate2"] if ct2_available()[0] else [])


@pytest.mark.slow
@pytest.mark.parametrize("format_", FORMATS)
def test_export_into_its_own_checkpoint_is_refused_and_the_checkpoint_kept(checkpoint, format_):
    before = {p.name: p.read_bytes() for p in checkpoint.iterdir()}
    for out in (checkpoint, checkpoint / "bundle", checkpoint.parent):
        r = cli_here("export", checkpoint, out, "--force", "--format", format_)
        assert r.returncode == 1, r.stderr
        assert "overlaps the checkpoint" in r.stderr and "choose an output outside it" in r.stderr, r.stderr
    assert {p.name: p.read_bytes() for p in checkpoint.iterdir()} == before
    assert CHECKPOINT_FILES <= set(before)


@pytest.mark.slow
def test_export_into_a_run_through_its_last_link_is_refused(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(tiny_run(), run, symlinks=True)
    r = cli_here("export", run / "last", run, "--force")
    assert r.returncode == 1 and "overlaps the checkpoint" in r.stderr, r.stderr
    assert (run / "last" / "model.safetensors").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("format_", FORMATS)
def test_force_never_empties_a_folder_seq2onnx_did_not_write(checkpoint, tmp_path, format_):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "important.txt").write_text("keep me\n")
    r = cli_here("export", checkpoint, mine, "--force", "--format", format_)
    assert r.returncode == 1 and "non-empty directory that seq2onnx did not write" in r.stderr, r.stderr
    assert [p.name for p in mine.iterdir()] == ["important.txt"]
    # an export's own output is replaced with --force; and it is marked as ours
    out = tmp_path / "out"
    assert cli_here("export", checkpoint, out, "--format", format_).returncode == 0
    assert (out / atomic.MARKER).is_file()
    r = cli_here("export", checkpoint, out, "--force", "--format", format_)
    assert r.returncode == 0, r.stderr


def test_translate_refuses_to_write_over_its_input(tmp_path):
    from tiny import tiny_bundle

    source = tmp_path / "in.txt"
    source.write_text("the cat\n")
    r = cli("translate", tiny_bundle(), "-i", source, "-o", source, "--force")
    assert r.returncode == 1 and "overlaps --input" in r.stderr, r.stderr
    assert source.read_text() == "the cat\n"


def test_an_unwritable_output_names_the_output_not_a_temporary_file(tmp_path):
    target = Path("/proc/seq2onnx-test-output.txt")  # no file can be created there, even by root
    with pytest.raises(atomic.OutputError) as e:
        atomic.write_file(target, "x")
    assert (
        str(target) in str(e.value)
        and ".partial" not in str(e.value)
        and "choose a writable directory" in str(e.value)
    )


def test_refuse_overlap_sees_links_both_ways(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    link = tmp_path / "link"
    link.symlink_to(data)
    for out in (data, data / "x", tmp_path, link / "y"):
        with pytest.raises(atomic.OutputError, match="overlaps the input"):
            atomic.refuse_overlap(out, {"the input": link})
    atomic.refuse_overlap(tmp_path / "elsewhere", {"the input": link})  # beside it is fine
