"""Hugging Face weights read without torch: each safetensors file's header (shapes and dtypes, nothing else of
the file), and config.json held to those shapes before transformers would fill a mismatch at random or drop
it."""

from __future__ import annotations

import json
import math
import re
import struct
from pathlib import Path

from .checks import HFImportError, _is_int, _show, read_json_object

# safetensors refuses headers over 100 MB itself; a real one of a few thousand tensors is under 1 MB.
MAX_HEADER = 100_000_000
DTYPE_BYTES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}
_COPY_FIX = "copy the weights again (save_pretrained writes the whole file; a download may stop short)"


def safetensors_header(path: Path) -> dict[str, tuple[str, list[int]]]:
    """Reads a safetensors file's header by hand: an 8-byte little-endian length, then that much JSON.

    Nothing else of the file is read, so a damaged file is refused before safetensors or torch maps it.

    Returns:
        Tensor name -> (dtype, shape).

    Raises:
        HFImportError: an empty or truncated file, a length or offsets beyond the file, an invalid header.
    """
    size = path.stat().st_size
    if size < 8:
        raise HFImportError(
            f"{path}: is {size} bytes, too short for a safetensors file (an 8-byte header "
            f"length, the header, the data); {_COPY_FIX}"
        )
    length, header = _read_header(path, size)
    data_bytes = size - 8 - length
    return {
        name: _checked_entry(path, name, entry, data_bytes)
        for name, entry in header.items()
        if name != "__metadata__"
    }


def _read_header(path: Path, size: int) -> tuple[int, dict]:
    """The header's length and its JSON object, read from a file of `size` bytes (at least 8).

    Raises:
        HFImportError: a length beyond the file or safetensors' limit, a header that is no JSON object.
    """
    with path.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        if length > min(size - 8, MAX_HEADER):
            raise HFImportError(
                f"{path}: its header claims {length:,} bytes but the file holds {size - 8:,} "
                f"after the length (safetensors allows {MAX_HEADER:,}): truncated or not "
                f"safetensors; {_COPY_FIX}"
            )
        raw = f.read(length)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise HFImportError(
            f"{path}: its {length:,}-byte header is not valid JSON ({e}); {_COPY_FIX}"
        ) from None
    if not isinstance(header, dict):
        raise HFImportError(
            f"{path}: its header is a JSON {type(header).__name__}, not an object; {_COPY_FIX}"
        )
    return length, header


def _checked_entry(path: Path, name: str, entry, data_bytes: int) -> tuple[str, list[int]]:
    """One tensor's (dtype, shape) from its header entry, checked against its offsets and the data.

    Raises:
        HFImportError: an entry that is no safetensors entry, offsets that disagree with the shape, or
            data beyond the file.
    """
    try:
        dtype, shape, (begin, end) = entry["dtype"], list(entry["shape"]), entry["data_offsets"]
        good = all(_is_int(x) and x >= 0 for x in [*shape, begin, end]) and begin <= end
        nbytes = DTYPE_BYTES[dtype] * math.prod(shape) if good else 0
    except (TypeError, KeyError, ValueError):
        good = False
    if not good:
        raise HFImportError(
            f"{path}: tensor {name}'s header entry {_show(entry)} is not a safetensors "
            f"entry (dtype, shape, data_offsets); {_COPY_FIX}"
        )
    if nbytes != end - begin:
        raise HFImportError(
            f"{path}: tensor {name} of shape {shape} ({dtype}) needs {nbytes:,} bytes "
            f"but its data_offsets hold {end - begin:,}: the header is damaged; "
            f"{_COPY_FIX}"
        )
    if end > data_bytes:
        raise HFImportError(
            f"{path}: tensor {name} ends at byte {end:,} of the data but the file holds "
            f"{data_bytes:,}: the file is truncated; {_COPY_FIX}"
        )
    return dtype, shape


def weight_headers(model_dir: Path) -> dict[str, tuple[str, list[int]]] | None:
    """The tensors of model.safetensors (or of the shards its index lists); None for pickled weights.

    Raises:
        HFImportError: as safetensors_header, or an index naming a missing shard.
    """
    single, index = model_dir / "model.safetensors", model_dir / "model.safetensors.index.json"
    if single.is_file():
        return safetensors_header(single)
    if not index.is_file():
        return None
    weight_map = read_json_object(index, "the index that save_pretrained wrote").get("weight_map")
    if not isinstance(weight_map, dict):
        raise HFImportError(f"{index}: has no weight_map object; restore the index save_pretrained wrote")
    tensors: dict = {}
    for shard in sorted(set(map(str, weight_map.values()))):
        if not (model_dir / shard).is_file():
            raise HFImportError(
                f"{index}: lists the shard {shard}, which is missing; copy every shard into {model_dir}"
            )
        tensors.update(safetensors_header(model_dir / shard))
    return tensors


def _layers(tensors: dict, stack: str) -> int:
    pattern = re.compile(rf"(?:^|\.){stack}\.layers\.(\d+)\.")
    return len({m.group(1) for name in tensors if (m := pattern.search(name))})


def check_weights(model_dir: Path, config: dict, tensors: dict) -> None:
    """config.json against the tensors' shapes: what transformers would otherwise fill at random or drop.

    Raises:
        HFImportError: naming config.json's field, its value, what the weights hold, and the fix.
    """
    path = model_dir / "config.json"
    weights = "model.safetensors" if (model_dir / "model.safetensors").is_file() else "the safetensors shards"
    match = "or restore the matching weights"
    embeds = [n for n in tensors if n.endswith(("shared.weight", "encoder.embed_tokens.weight"))]
    if embeds:
        rows, width = (tensors[embeds[0]][1] + [0, 0])[:2]
        found = ("vocab_size", rows, f"has {rows} rows"), ("d_model", width, f"is {width} wide")
        for field, value, what in found:
            if value != config[field]:
                raise HFImportError(
                    f"{path}: {field} is {config[field]} but {weights}'s {embeds[0]} {what}; "
                    f"the config does not belong to these weights (set {field} to {value} "
                    f"{match})"
                )
    for stack in ("encoder", "decoder"):
        found, declared = _layers(tensors, stack), config.get(f"{stack}_layers")  # T5's: block.N
        if found and found != declared:
            raise HFImportError(
                f"{path}: {stack}_layers is {declared} but {weights} hold {found} {stack} "
                f"layers; transformers would {'invent' if declared > found else 'drop'} the "
                f"difference (set {stack}_layers to {found} {match})"
            )
        fc1 = [
            shape
            for name, (_, shape) in tensors.items()
            if re.search(rf"{stack}\.layers\.0\.fc1\.weight$", name)
        ]
        field = f"{stack}_ffn_dim"
        if fc1 and fc1[0][0] != config[field]:
            raise HFImportError(
                f"{path}: {field} is {config[field]} but {weights}' feed-forward is "
                f"{fc1[0][0]} wide (set {field} to {fc1[0][0]} {match})"
            )
