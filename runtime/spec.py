"""The bundle format's names and limits, as spec/bundle.json states them for every host.

spec/bundle.json ships inside the package; this module reads it once. Every graph input and output
name, file key and limit of the Python side comes from here (through runtime/bundle.py, which
re-exports them), so that a change in the spec changes the Python and JavaScript hosts alike.
"""

from __future__ import annotations

import json
from pathlib import Path

# The spec every host reads (spec/bundle.json, shipped inside the package): names and limits come
# from it and from nowhere else, so that a change there changes the Python and JavaScript hosts alike.
SPEC_PATH = Path(__file__).resolve().parents[1] / "spec" / "bundle.json"
SPEC = json.loads(SPEC_PATH.read_text(encoding="utf-8"))

FORMAT = SPEC["format"]
FORMAT_VERSION = SPEC["format_version"]
BUNDLE_JSON = SPEC["bundle_json"]
MAX_JSON_BYTES = SPEC["max_json_bytes"]  # a real bundle.json is ~10 kB: anything near this is not one
DTYPES = tuple(SPEC["dtypes"])  # the key/value element types a host can feed
FILE_KEYS = dict(SPEC["files"]["required"])
# Files a bundle may have: an fp32 export writes the fused decoder unless told `--decoder standard`.
OPTIONAL_FILE_KEYS = dict(SPEC["files"]["optional"])
ENCODER_FILE, DECODER_FILE = FILE_KEYS["encoder"], FILE_KEYS["decoder"]
SOURCE_SPM, TARGET_SPM = FILE_KEYS["source_tokenizer"], FILE_KEYS["target_tokenizer"]
FUSED_DECODER_FILE = OPTIONAL_FILE_KEYS["decoder_fused"]
# Of those, the optional graphs (described in graphs.<key> too) and the vocabulary maps of
# imported models (spec's vocab_maps: little-endian int32 arrays).
OPTIONAL_GRAPH_KEYS = {k: v for k, v in OPTIONAL_FILE_KEYS.items() if v.endswith(".onnx")}
SOURCE_VOCAB, TARGET_VOCAB = OPTIONAL_FILE_KEYS["source_vocab"], OPTIONAL_FILE_KEYS["target_vocab"]
VOCAB_TEXTS = OPTIONAL_FILE_KEYS["vocab_texts"]
# One file of every graph's large initializers (ONNX external data), each distinct tensor once:
# its byte alignment and the element size of each ONNX data type a reference may name.
WEIGHTS_FILE = OPTIONAL_FILE_KEYS["weights"]
WEIGHTS_ALIGNMENT = SPEC["weights"]["alignment"]
ELEMENT_BYTES = {int(k): v for k, v in SPEC["weights"]["element_bytes"].items()}
# The weights file's load-time checksum (a CRC-32, where a host computes one natively; else its sha256):
# its field in files.weights and its width in hex digits.
WEIGHTS_CHECKSUM = SPEC["weights"]["checksum"]["field"]
WEIGHTS_CHECKSUM_DIGITS = SPEC["weights"]["checksum"]["hex_digits"]
# Each files.<key> entry: its path's length at most, its sha256's width, and the field of its size in bytes
# (bundles exported before it have none): the size is compared with the file's before a byte is read.
MAX_PATH_CHARS = SPEC["file_entry"]["max_path_chars"]
SHA256_DIGITS = SPEC["file_entry"]["sha256_hex_digits"]
SIZE_FIELD = SPEC["file_entry"]["size_field"]
VOCAB_MAPS = SPEC["vocab_maps"]
TARGET_LANG_IN = tuple(SPEC["target_lang_in"])
# The decoder graphs by variant (bundle.json's graphs.<label>.variant), and the operator domain
# of onnxruntime's contrib kernels that only the fused one uses.
STANDARD, FUSED = "standard", "fused"
DECODER_LABELS = {variant: SPEC["decoders"][variant] for variant in (STANDARD, FUSED)}
MS_DOMAIN = SPEC["contrib_domain"]

_NAMES = SPEC["names"]
# Encoder graph: source ids and lengths -> the source mask and every layer's cross keys/values.
SRC_IDS, SRC_LENGTHS, SRC_MASK = _NAMES["src_ids"], _NAMES["src_lengths"], _NAMES["src_mask"]
# Decoder step graph.
TOKENS, STEP, CACHE_INDICES, LOG_PROBS = (
    _NAMES["tokens"],
    _NAMES["step"],
    _NAMES["cache_indices"],
    _NAMES["log_probs"],
)
# The k best log-probabilities of each row, best first (ties: lower token id first), so that a
# search can download [rows, k] instead of [rows, vocab]. `top_k` is an input: 1 <= k <= vocab.
TOP_K, TOPK_LOG_PROBS, TOPK_IDS = _NAMES["top_k"], _NAMES["topk_log_probs"], _NAMES["topk_ids"]
# Standard decoder only: the last layer's cross-attention weights averaged over heads [rows,
# src_len] (CTranslate2's return_attention convention), for showing what each target piece
# attended to. Bundles exported before 0.3 lack it; the search never binds it.
CROSS_ATTENTION = _NAMES["cross_attention"]
# Fused decoder only: the beams per sentence W and, replacing cache_indices, the table
# [batch, W, max_length] naming for each beam and position the beam whose cache row holds it.
BEAM_WIDTH, CACHE_INDIRECTION = _NAMES["beam_width"], _NAMES["cache_indirection"]
# Fused decoder only: [rows] int32, the cache position at which each row's sentence began. Row r
# attends to positions row_start[r]..step and its position in the sentence is step - row_start[r],
# so rows that joined a serving round later share one cache buffer (zeros: every row from 0).
# Fused graphs exported before it lack it (their rows all begin at 0).
ROW_START = _NAMES["row_start"]
# The fused graph's value step - row_start (each row's position), which indexes its positional table
# (runtime/checks.py finds the table by it); a graph value, not an input: Python-only.
ROW_POSITION = "row_position"


def _layer_name(kind: str, i: int) -> str:
    return SPEC["layer_names"][kind].replace("{i}", str(i))


def key_cross(i: int) -> str:
    """Layer i's cross-attention keys (an encoder output, a decoder input)."""
    return _layer_name("key_cross", i)


def value_cross(i: int) -> str:
    """Layer i's cross-attention values (an encoder output, a decoder input)."""
    return _layer_name("value_cross", i)


def past_key(i: int) -> str:
    """Layer i's cached self-attention keys, fed to the decoder."""
    return _layer_name("past_key", i)


def past_value(i: int) -> str:
    """Layer i's cached self-attention values, fed to the decoder."""
    return _layer_name("past_value", i)


def present_key(i: int) -> str:
    """Layer i's updated self-attention keys, output by the decoder."""
    return _layer_name("present_key", i)


def present_value(i: int) -> str:
    """Layer i's updated self-attention values, output by the decoder."""
    return _layer_name("present_value", i)


def cross_names(n_layers: int) -> list[str]:
    """Returns key_cross(i), value_cross(i) for every layer, in layer order: the graphs' order.

    Args:
        n_layers: decoder layers.
    """
    return [n for i in range(n_layers) for n in (key_cross(i), value_cross(i))]


def past_names(n_layers: int) -> list[str]:
    """Returns past_key(i), past_value(i) for every layer, in layer order: the graphs' order.

    Args:
        n_layers: decoder layers.
    """
    return [n for i in range(n_layers) for n in (past_key(i), past_value(i))]


def present_names(n_layers: int) -> list[str]:
    """Returns present_key(i), present_value(i) for every layer, in layer order: the graphs' order.

    Args:
        n_layers: decoder layers.
    """
    return [n for i in range(n_layers) for n in (present_key(i), present_value(i))]


class BundleError(ValueError):
    """A bundle that is missing, damaged or of another format: the message names the file."""
