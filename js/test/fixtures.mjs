// Test fixtures, no tests: a sound bundle.json, and the smallest real SentencePiece and ONNX
// protobufs that the load-time checks (src/checks.js) read: pieces with their types, and
// constant tables gathered by named indices. Written by hand with a protobuf writer of a few
// lines, so that the node tests need no Python, no exporter and no model files.

import { createHash } from "node:crypto";
import { mkdirSync, writeFileSync } from "node:fs";
import path from "node:path";

const hash = (bytes) => createHash("sha256").update(bytes).digest("hex");

function varint(n) {
  const out = [];
  while (n >= 0x80) {
    out.push((n % 0x80) | 0x80);
    n = Math.floor(n / 0x80);
  }
  out.push(n);
  return out;
}

/** One protobuf field: a number (varint), a string or bytes (length-delimited). */
function field(number, value) {
  if (typeof value === "number") return [...varint(number * 8), ...varint(value)];
  const bytes = typeof value === "string" ? [...new TextEncoder().encode(value)] : [...value];
  return [...varint(number * 8 + 2), ...varint(bytes.length), ...bytes];
}

const NORMAL = 1;
const UNKNOWN = 2;
const CONTROL = 3;

/**
 * A SentencePiece ModelProto of `size` pieces: <pad>, <unk>, <s>, </s> (ids 0-3, as seq2onnx's
 * tokenizers) then "▁p4", "▁p5", ... `edit(pieces)` may change [piece, type] pairs; `trainer` sets
 * trainer_spec fields (45 unk_piece ... 48 pad_piece).
 * @returns {Uint8Array}
 */
export function spmModel(size, { edit = (p) => p, trainer = {}, prefix = "p" } = {}) {
  let pieces = [
    ["<pad>", CONTROL],
    ["<unk>", UNKNOWN],
    ["<s>", CONTROL],
    ["</s>", CONTROL],
  ];
  for (let i = 4; i < size; i++) pieces.push([`\u2581${prefix}${i}`, NORMAL]);
  pieces = edit(pieces);
  // score (field 2) is a fixed32, as in real models: the reader must skip it
  const score = [2 * 8 + 5, 0, 0, 0x80, 0xbf];
  const bytes = pieces.flatMap(([piece, type]) =>
    field(1, [...field(1, piece), ...score, ...field(3, type)]),
  );
  const spec = Object.entries(trainer).flatMap(([n, v]) => field(Number(n), v));
  return new Uint8Array([...bytes, ...(spec.length ? field(2, spec) : [])]);
}

/** bundle.json's `tokenizers` entry of a model made by spmModel: the fingerprint of runtime/checks.py. */
export function fingerprint(size, options = {}) {
  const pieces = [["<pad>"], ["<unk>"], ["<s>"], ["</s>"]].map(([p]) => p);
  for (let i = 4; i < size; i++) pieces.push(`\u2581${options.prefix ?? "p"}${i}`);
  return { pieces: size, pieces_sha256: hash(new TextEncoder().encode(pieces.join("\n"))) };
}

/**
 * An ONNX ModelProto whose graph holds constant tables gathered by named indices, as the
 * exporter's embedding (Gather(table, src_ids)) and positional table (Gather(table, step)).
 * @param {{name: string, indices: string, dims: number[], via?: "Constant" | "Cast"}[]} tables
 * @returns {Uint8Array}
 */
export function onnxModel(tables) {
  const graph = [];
  for (const { name, indices, dims, via } of tables) {
    const tensor = [...dims.flatMap((d) => field(1, d)), ...field(8, name)];
    let table = name;
    if (via === "Constant") {
      // the table as a Constant node's value attribute
      graph.push(
        ...field(1, [
          ...field(2, name),
          ...field(4, "Constant"),
          ...field(5, [...field(1, "value"), ...field(5, tensor)]),
        ]),
      );
    } else {
      graph.push(...field(5, tensor));
    }
    if (via === "Cast") {
      // fp16 tables are cast to fp32 before the Gather
      table = `${name}_cast`;
      graph.push(...field(1, [...field(1, name), ...field(2, table), ...field(4, "Cast")]));
    }
    graph.push(
      ...field(1, [
        ...field(1, table),
        ...field(1, indices),
        ...field(2, `${name}_out`),
        ...field(4, "Gather"),
      ]),
    );
  }
  return new Uint8Array([...field(1, 8), ...field(7, graph)]);
}

/** The graph signature bundle.json records for a model of these sizes (runtime/bundle.py's graph_signature). */
export function graphSignature({ layers = 1, heads = 2, headDim = 4, vocab = 16, dtype = "float32" } = {}) {
  const kv = (name, rows, length) => ({ name, dtype, shape: [rows, heads, length, headDim] });
  const names = (a, b) => Array.from({ length: layers }, (_, i) => [`${a}_${i}`, `${b}_${i}`]).flat();
  return {
    encoder: {
      inputs: [
        { name: "src_ids", dtype: "int64", shape: ["batch", "src_len"] },
        { name: "src_lengths", dtype: "int64", shape: ["batch"] },
      ],
      outputs: [
        { name: "src_mask", dtype: "bool", shape: ["batch", "src_len"] },
        ...names("key_cross", "value_cross").map((n) => kv(n, "batch", "src_len")),
      ],
    },
    decoder: {
      inputs: [
        { name: "tokens", dtype: "int64", shape: ["rows", 1] },
        { name: "step", dtype: "int64", shape: [1] },
        { name: "cache_indices", dtype: "int64", shape: ["rows"] },
        ...names("past_key_self", "past_value_self").map((n) => kv(n, "prev_rows", "past")),
        ...names("key_cross", "value_cross").map((n) => kv(n, "batch", "src_len")),
        { name: "src_mask", dtype: "bool", shape: ["batch", "src_len"] },
        { name: "top_k", dtype: "int64", shape: [1] },
      ],
      outputs: [
        { name: "log_probs", dtype: "float32", shape: ["rows", vocab] },
        ...names("present_key_self", "present_value_self").map((n) => kv(n, "rows", "past_plus_1")),
        { name: "topk_log_probs", dtype: "float32", shape: ["rows", "k"] },
        { name: "topk_ids", dtype: "int64", shape: ["rows", "k"] },
      ],
    },
  };
}

/** A sound bundle.json for a model of these sizes, its `files` still empty. */
export function soundMeta({
  layers = 1,
  heads = 2,
  dModel = 8,
  vocab = 16,
  maxPositions = 12,
  dtype = "float32",
} = {}) {
  return {
    format: "seq2onnx-bundle",
    format_version: 1,
    dtype,
    quantization: null,
    max_positions: maxPositions,
    model: {
      src_vocab_size: vocab,
      tgt_vocab_size: vocab,
      d_model: dModel,
      n_heads: heads,
      n_encoder_layers: layers,
      n_decoder_layers: layers,
      max_positions: maxPositions,
      pad_id: 0,
      unk_id: 1,
      bos_id: 2,
      eos_id: 3,
      decoder_start_id: 2,
    },
    special_ids: { pad: 0, unk: 1, bos: 2, eos: 3, decoder_start: 2 },
    decoding: { beam_size: 4, length_penalty: 1.0, max_length_a: 1.5, max_length_b: 10, min_length: 0 },
    graphs: graphSignature({ layers, heads, headDim: dModel / heads, vocab, dtype }),
    tokenizers: { source: fingerprint(vocab), target: fingerprint(vocab, { prefix: "q" }) },
    files: {},
  };
}

/**
 * The files of a sound bundle for soundMeta's sizes: real protobufs, name -> bytes, and their
 * files.* entries (key -> {path, sha256}).
 */
export function soundFiles({ vocab = 16, dModel = 8, maxPositions = 12 } = {}) {
  const bytes = {
    "encoder.onnx": onnxModel([{ name: "encoder.embed.weight", indices: "src_ids", dims: [vocab, dModel] }]),
    "decoder.onnx": onnxModel([
      { name: "decoder.embed.weight", indices: "tokens", dims: [vocab, dModel] },
      { name: "decoder.positions", indices: "step", dims: [maxPositions, dModel] },
    ]),
    "source.spm.model": spmModel(vocab),
    "target.spm.model": spmModel(vocab, { prefix: "q" }),
  };
  const keys = {
    encoder: "encoder.onnx",
    decoder: "decoder.onnx",
    source_tokenizer: "source.spm.model",
    target_tokenizer: "target.spm.model",
  };
  const files = Object.fromEntries(
    Object.entries(keys).map(([key, name]) => [key, { path: name, sha256: hash(bytes[name]) }]),
  );
  return { bytes, files };
}

/** A vocabulary map file's bytes (spec/bundle.json's vocab_maps: little-endian int32 entries). */
export function vocabBytes(entries) {
  const bytes = new Uint8Array(4 * entries.length);
  const view = new DataView(bytes.buffer);
  entries.forEach((x, i) => {
    view.setInt32(4 * i, x, true);
  });
  return bytes;
}

/**
 * Writes a sound bundle directory (soundFiles' files) at `dir`, whose bundle.json is `edit(meta)`
 * serialised with `stringify` (a string that `edit` returns is written as is); returns `dir`.
 */
export function writeBundle(dir, edit = (meta) => meta, stringify = (meta) => JSON.stringify(meta)) {
  mkdirSync(dir);
  const { bytes, files } = soundFiles();
  for (const [name, data] of Object.entries(bytes)) writeFileSync(path.join(dir, name), data);
  const meta = { ...soundMeta(), files };
  const out = edit(meta) ?? meta;
  writeFileSync(path.join(dir, "bundle.json"), typeof out === "string" ? out : stringify(out));
  return dir;
}

export { hash };
