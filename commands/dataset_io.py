"""The files of `seq2onnx translate-dataset`: INPUT's format (from its suffix or --input-format), its texts
read as one pyarrow string array, and OUTPUT written block by block in input order (text or Parquet)."""

from __future__ import annotations

from pathlib import Path

from seq2onnx import errors

INPUT_FORMATS = ("text", "parquet", "jsonl")
OUTPUT_FORMATS = ("text", "parquet")


def guess_format(path: Path, given: str | None, choices: tuple[str, ...]) -> str:
    """Picks a file's format: the one given, else the one named by the suffix (.parquet,
    .jsonl/.ndjson/.json), else text.

    Args:
        path: the file.
        given: the format the user gave, or None.
        choices: the formats allowed here (a suffix outside them means text).

    Returns:
        The format.
    """
    if given:
        return given
    suffix = path.suffix.lower()
    if suffix == ".parquet" and "parquet" in choices:
        return "parquet"
    if suffix in (".jsonl", ".ndjson", ".json") and "jsonl" in choices:
        return "jsonl"
    return "text"


def read_source(path: Path, fmt: str, column: str | None):
    """Reads the source texts as one pyarrow string array (nulls kept), in input order.

    Text lines end at "\\n" only, with a trailing "\\r" dropped, as in `seq2onnx translate`
    (str.splitlines would also split at form feeds and U+2028 and shift every later line).

    Args:
        path: the input file.
        fmt: "text", "parquet" or "jsonl".
        column: the column to translate (Parquet, JSONL); None: the only one.

    Returns:
        pyarrow.StringArray: the texts.

    Raises:
        CommandError: a missing file, a missing or non-text column, or --column on text.
    """
    import pyarrow as pa

    if not path.is_file():
        raise errors.CommandError(f"INPUT {path}: no such file")
    if fmt == "text":
        if column is not None:
            raise errors.CommandError(
                f"--column {column!r} applies to Parquet or JSONL input; {path} is read as text lines"
            )
        with open(path, encoding="utf-8", errors="replace", newline="") as f:
            lines = f.read().split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        return pa.array([line[:-1] if line.endswith("\r") else line for line in lines], pa.string())
    if fmt == "parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(path)
    else:
        import pyarrow.json as pj

        table = pj.read_json(path)
    names = table.column_names
    if column is None:
        if len(names) != 1:
            raise errors.CommandError(
                f"{path} has the columns {names}; choose the one to translate with --column"
            )
        column = names[0]
    if column not in names:
        raise errors.CommandError(f"--column {column!r} is not in {path}; its columns are {names}")
    values = table.column(column)
    if not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)):
        raise errors.CommandError(
            f"--column {column!r} of {path} holds {values.type}, not text; choose a string column"
        )
    return values.combine_chunks().cast(pa.string())


class Writer:
    """Writes translated blocks to text or Parquet, checking that indices run 0, 1, 2, ..."""

    def __init__(self, path: Path, fmt: str):
        self.path, self.fmt, self.rows = path, fmt, 0

    def __enter__(self):
        if self.fmt == "parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            self.schema = pa.schema([("translation", pa.string())])
            self.file = pq.ParquetWriter(self.path, self.schema)
        else:
            self.file = open(self.path, "w", encoding="utf-8", newline="\n")
        return self

    def write(self, batch) -> None:
        index = batch.column("index").to_pylist()
        if index != list(range(self.rows, self.rows + len(index))):
            raise RuntimeError(
                f"rows came back out of order: expected index {self.rows}, got "
                f"{index[:1]}...; the output was not written"
            )
        if self.fmt == "parquet":
            self.file.write_table(batch.select(["translation"]).cast(self.schema))
        else:
            self.file.write("".join(f"{t or ''}\n" for t in batch.column("translation").to_pylist()))
        self.rows += len(index)

    def __exit__(self, *exc) -> None:
        self.file.close()
