"""Reading tab-separated corpora, leak-free splits, length filter and token batches."""

from __future__ import annotations

from pathlib import Path

import pytest

from seq2onnx.model.data import DataError, Split, filter_by_length, read_pairs, split_pairs, token_batches

TATOEBA = Path(__file__).resolve().parents[2] / "shared/data/tatoeba-cmn-eng/cmn.txt"


def _write(tmp_path: Path, data: bytes, name: str = "corpus.tsv") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_bom_removed_and_fields_stripped(tmp_path):
    path = _write(tmp_path, "\ufeffHi.\t嗨。\n  Run! \t 跑。 \n".encode("utf-8"))
    assert read_pairs(path) == ([("Hi.", "嗨。"), ("Run!", "跑。")], 0)


def test_blank_lines_ignored_not_counted(tmp_path):
    path = _write(tmp_path, b"\na\tb\n   \n\t \nc\td\n\n")
    assert read_pairs(path) == ([("a", "b"), ("c", "d")], 0)


def test_crlf_line_endings(tmp_path):
    path = _write(tmp_path, b"a\tb\r\nc\td\r\n\r\n")
    assert read_pairs(path) == ([("a", "b"), ("c", "d")], 0)


def test_extra_columns_ignored_and_columns_chosen(tmp_path):
    path = _write(tmp_path, "Hi.\t嗨。\tCC-BY 2.0 (France) #538123\n".encode("utf-8"))
    assert read_pairs(path)[0] == [("Hi.", "嗨。")]
    assert read_pairs(path, src_col=1, tgt_col=0)[0] == [("嗨。", "Hi.")]
    assert read_pairs(path, src_col=2, tgt_col=0)[0] == [("CC-BY 2.0 (France) #538123", "Hi.")]


def test_malformed_line_names_file_line_and_fix(tmp_path):
    path = _write(tmp_path, b"a\tb\n\nno tab here\nc\td\n")
    with pytest.raises(DataError) as err:
        read_pairs(path)
    msg = str(err.value)
    assert f"{path}:3:" in msg
    assert "found 1" in msg and "skip_bad=True" in msg


def test_column_out_of_range_is_per_line_error(tmp_path):
    path = _write(tmp_path, b"a\tb\nc\td\n")
    with pytest.raises(DataError, match=r":1: expected at least 4 .*found 2"):
        read_pairs(path, src_col=0, tgt_col=3)


def test_empty_field_is_error(tmp_path):
    path = _write(tmp_path, b"a\tb\nc\t  \n")
    with pytest.raises(DataError, match=r"corpus\.tsv:2: empty target field"):
        read_pairs(path)


def test_invalid_utf8_names_its_line(tmp_path):
    path = _write(tmp_path, b"a\tb\nc\td\ne\t\xff\xfe\n")
    with pytest.raises(DataError, match=r"corpus\.tsv:3: invalid UTF-8"):
        read_pairs(path)


def test_skip_bad_counts_skipped_lines(tmp_path):
    path = _write(tmp_path, b"a\tb\nbroken\n \tx\nc\t\xff\ne\tf\n\n")
    assert read_pairs(path, skip_bad=True) == ([("a", "b"), ("e", "f")], 3)


def test_empty_file_and_all_bad_raise(tmp_path):
    with pytest.raises(DataError, match="no sentence pairs"):
        read_pairs(_write(tmp_path, b"\xef\xbb\xbf\n  \n"))
    with pytest.raises(DataError, match="2 malformed lines skipped"):
        read_pairs(_write(tmp_path, b"x\ny\n", "bad.tsv"), skip_bad=True)


def test_bad_arguments_and_missing_file(tmp_path):
    with pytest.raises(DataError, match="src_col=1, tgt_col=1"):
        read_pairs(_write(tmp_path, b"a\tb\n"), src_col=1, tgt_col=1)
    with pytest.raises(DataError, match="no such file"):
        read_pairs(tmp_path / "missing.tsv")


def test_tatoeba_cmn_eng():
    if not TATOEBA.exists():
        pytest.skip(f"{TATOEBA} is absent (shared Tatoeba data not downloaded)")
    pairs, skipped = read_pairs(TATOEBA, src_col=1, tgt_col=0)
    assert (len(pairs), skipped) == (29155, 0)
    assert pairs[0] == ("嗨。", "Hi.")


def _pairs_with_repeats(n_sources: int = 60) -> list[tuple[str, str]]:
    # Every third source has three translations, like Tatoeba's popular sentences.
    return [(f"s{i}", f"t{i}.{k}") for i in range(n_sources) for k in range(3 if i % 3 == 0 else 1)]


def test_split_groups_repeated_sources():
    pairs = _pairs_with_repeats()
    split = split_pairs(pairs, valid_size=10, test_size=10, seed=1)
    sources = [{s for s, _ in part} for part in (split.train, split.valid, split.test)]
    assert not (sources[0] & sources[1]) and not (sources[0] & sources[2]) and not (sources[1] & sources[2])
    assert sorted(split.train + split.valid + split.test) == sorted(pairs)
    # A group is never cut, so overshoot is below the largest group (3).
    assert 10 <= len(split.valid) < 13 and 10 <= len(split.test) < 13


def test_split_deterministic_and_seed_dependent():
    pairs = [(f"s{i}", f"t{i}") for i in range(100)]
    a = split_pairs(pairs, valid_size=5, test_size=7, seed=3)
    assert a == split_pairs(pairs, valid_size=5, test_size=7, seed=3)
    assert a != split_pairs(pairs, valid_size=5, test_size=7, seed=4)
    assert isinstance(a, Split)
    assert (len(a.train), len(a.valid), len(a.test)) == (88, 5, 7)


def test_split_too_small_raises():
    pairs = [("a", "1"), ("a", "2"), ("b", "3"), ("c", "4")]  # 3 distinct sources
    with pytest.raises(DataError, match=r"3 distinct source.*need 4"):
        split_pairs(pairs, valid_size=2, test_size=1)
    assert len(split_pairs(pairs, valid_size=1, test_size=1).train) >= 1


def test_filter_by_length():
    examples = [([1, 2], [3]), ([], [1]), ([1] * 5, [1] * 4), ([1] * 4, [1] * 6), ([1], [1] * 4)]
    assert filter_by_length(examples, max_len=4) == ([0, 4], 3)
    assert filter_by_length(examples, max_len=6, min_len=2) == ([2, 3], 3)
    with pytest.raises(ValueError, match="max_len=0"):
        filter_by_length(examples, max_len=0)


def _lengths(n: int = 200) -> list[tuple[int, int]]:
    # A fixed, irregular spread of lengths without randomness in the test itself.
    return [((i * 37) % 23 + 1, (i * 11) % 29 + 1) for i in range(n)]


def test_token_batches_budget_and_every_index_once():
    lengths = _lengths()
    batches = token_batches(lengths, max_tokens=64, shuffle=False)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        width = max(max(lengths[i]) for i in b)
        assert len(b) * width <= 64
    # Sorted by length: the first batch holds the shortest sources.
    assert min(lengths[i][0] for i in batches[-1]) >= max(lengths[i][0] for i in batches[0])


def test_token_batches_fill_greedily():
    # Ten examples of width 4 and a budget of 16: exactly four per batch, then two.
    assert [len(b) for b in token_batches([(4, 4)] * 10, max_tokens=16, shuffle=False)] == [4, 4, 2]


def test_token_batches_shuffle_is_deterministic_and_keeps_content():
    lengths = _lengths()
    plain = token_batches(lengths, max_tokens=64, shuffle=False)
    shuffled = token_batches(lengths, max_tokens=64, shuffle=True, seed=7)
    assert shuffled == token_batches(lengths, max_tokens=64, shuffle=True, seed=7)
    assert shuffled != plain and shuffled != token_batches(lengths, max_tokens=64, shuffle=True, seed=8)
    assert sorted(map(tuple, shuffled)) == sorted(map(tuple, plain))


def test_token_batches_long_example_alone_never_dropped():
    lengths = [(3, 3), (100, 2), (3, 4), (2, 3)]
    batches = token_batches(lengths, max_tokens=20, shuffle=False)
    assert [1] in batches
    assert sorted(i for b in batches for i in b) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="max_tokens=0"):
        token_batches(lengths, max_tokens=0, shuffle=False)
