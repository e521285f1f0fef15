// Load-time checks: what bundle.json states must be what the tokenizers and graphs state (checks
// 5-8 of docs/bundle-format.md "Checks a host must do"), as runtime/checks.py does for the Python
// runtime. A bundle.json that disagrees with its own files translates garbage (a wrong end id),
// fluent garbage (source and target tokenizers exchanged) or fails at the first step with a raw
// onnxruntime error (a wrong head count); each check turns that into a BundleError at load that
// names the field, both values and the fix.
//
// The tokenizers' vocabularies and the graphs' constant tables are read from the bytes that
// readBundle hashed, by a small protobuf reader (sentencepiece-js exposes no piece list, and an
// onnxruntime session no initializer shapes); tensor data is skipped by its length, never copied.
// No Node API: the same checks run in the browser.
import {
  BUNDLE_JSON,
  BundleError,
  DECODER_LABELS,
  DTYPES,
  ENCODER_LABEL,
  isLayerName,
  LOG_PROBS,
  layerName,
  OPTIONAL_FILE_KEYS,
  pastNames,
  SOURCE_VOCAB,
  SRC_IDS,
  STANDARD,
  STEP,
  short,
  TARGET_VOCAB,
  TOP_K,
  VOCAB_MAP,
  VOCAB_TEXTS,
  WEIGHTS,
  WEIGHTS_SPEC,
} from "./bundle.js";
import { SPEC, SPEC_URL } from "./spec.js";

const DECODER = DECODER_LABELS[STANDARD]; // the decoder this host drives: graphs.<it> and files.<it>

const FIX = `re-export the bundle with \`seq2onnx export\` (its ${BUNDLE_JSON} does not describe these files)`;

function mismatch(bundle, field, stated, found, where) {
  const show = (x) => JSON.stringify(x);
  return new BundleError(
    `${bundle.metaPath}: ${field}=${show(stated)}, but ${where} has ${show(found)}; ` +
      `${FIX}, or set ${field} to ${show(found)} if only ${BUNDLE_JSON} is wrong`,
  );
}

// -- protobuf, only what is needed ---------------------------------------------------------------

class ProtoError extends Error {}

function varint(buf, pos) {
  let result = 0;
  let scale = 1;
  for (let i = 0; i < 10; i++) {
    if (pos >= buf.length) throw new ProtoError("the data ends inside a field");
    const b = buf[pos++];
    result += (b & 0x7f) * scale; // exact up to 2^53, far above any size read here
    if (b < 0x80) return [result, pos];
    scale *= 128;
  }
  throw new ProtoError("varint longer than 10 bytes");
}

/** [field number, wire type, value] of one message; value is a number (varint) or [start, end]. */
function* fields(buf, start, end) {
  let pos = start;
  while (pos < end) {
    let key;
    [key, pos] = varint(buf, pos);
    const number = Math.floor(key / 8);
    const wire = key % 8;
    if (wire === 0) {
      let value;
      [value, pos] = varint(buf, pos);
      yield [number, wire, value];
    } else if (wire === 2) {
      let n;
      [n, pos] = varint(buf, pos);
      if (pos + n > end) throw new ProtoError("a field runs past the end of its message");
      yield [number, wire, [pos, pos + n]];
      pos += n;
    } else if (wire === 1 || wire === 5) {
      // fixed64, fixed32: their bytes (a SentencePiece score is a fixed32 float)
      const n = wire === 1 ? 8 : 4;
      if (pos + n > end) throw new ProtoError("a field runs past the end of its message");
      yield [number, wire, [pos, pos + n]];
      pos += n;
    } else {
      throw new ProtoError(`unsupported protobuf wire type ${wire}`);
    }
  }
  if (pos > end) throw new ProtoError("the data ends inside a field");
}

const utf8 = new TextDecoder("utf-8", { ignoreBOM: true }); // a piece may start with U+FEFF: keep it, as Python does
const baseName = (path) => path.split(/[\\/]/).pop();
const text = (buf, [s, e]) => utf8.decode(buf.subarray(s, e));

// -- SentencePiece vocabulary ---------------------------------------------------------------------

// sentencepiece_model.proto: ModelProto.pieces = 1 (piece = 1, score = 2, type = 3), trainer_spec = 2
// (model_type = 3, byte_fallback = 35, unk_piece = 45, bos_piece = 46, eos_piece = 47, pad_piece = 48,
// with these defaults).
const NORMAL = 1;
const UNKNOWN = 2;
const CONTROL = 3;
const SPECIAL_PIECES = {
  45: ["unk", "<unk>"],
  46: ["bos", "<s>"],
  47: ["eos", "</s>"],
  48: ["pad", "<pad>"],
};
/** SentencePiece's piece types (ModelProto.SentencePiece.Type) and model types (TrainerSpec.ModelType). */
export const PIECE_TYPES = Object.freeze({ NORMAL, UNKNOWN, CONTROL, USER_DEFINED: 4, UNUSED: 5, BYTE: 6 });
export const MODEL_TYPES = Object.freeze({ UNIGRAM: 1, BPE: 2, WORD: 3, CHAR: 4 });

/**
 * The pieces of a SentencePiece `.model` file and its special ids, as the Python processor gives
 * them: unk_id() is the id of trainer_spec.unk_piece when that piece is of type UNKNOWN, bos/eos/
 * pad_id() the id of their piece when it is of type CONTROL, else -1 (sentencepiece_processor.cc);
 * and what src/tokenizer.js's unigram encoder needs: each piece's type and score (float32), the
 * model type (trainer_spec.model_type, UNIGRAM when absent) and trainer_spec.byte_fallback.
 * @param {Uint8Array} bytes
 * @returns {{pieces: string[], types: number[], scores: Float32Array, modelType: number, byteFallback: boolean,
 *   special: {pad: number, unk: number, bos: number, eos: number}}}
 * @throws {Error} when the bytes are not a SentencePiece model
 */
export function readVocabulary(bytes) {
  const pieces = [];
  const types = [];
  const scores = [];
  const names = Object.fromEntries(Object.values(SPECIAL_PIECES));
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  let modelType = MODEL_TYPES.UNIGRAM;
  let byteFallback = false;
  for (const [number, wire, value] of fields(bytes, 0, bytes.length)) {
    if (number === 1 && wire === 2) {
      let piece = "";
      let type = NORMAL;
      let score = 0;
      for (const [n, w, v] of fields(bytes, ...value)) {
        if (n === 1 && w === 2) piece = text(bytes, v);
        else if (n === 2 && w === 5) score = view.getFloat32(v[0], true);
        else if (n === 3 && w === 0) type = v;
      }
      pieces.push(piece);
      types.push(type);
      scores.push(score);
    } else if (number === 2 && wire === 2) {
      for (const [n, w, v] of fields(bytes, ...value)) {
        if (n in SPECIAL_PIECES && w === 2) names[SPECIAL_PIECES[n][0]] = text(bytes, v);
        else if (n === 3 && w === 0) modelType = v;
        else if (n === 35 && w === 0) byteFallback = v !== 0;
      }
    }
  }
  if (!pieces.length) throw new ProtoError("no pieces");
  const index = new Map(pieces.map((p, i) => [p, i]));
  const unkIndex = types.indexOf(UNKNOWN);
  const idOf = (name, type) => {
    const id = index.get(name) ?? unkIndex; // PieceToId: an unknown piece is the unknown id
    return id >= 0 && types[id] === type ? id : -1;
  };
  const special = {
    pad: idOf(names.pad, CONTROL),
    unk: idOf(names.unk, UNKNOWN),
    bos: idOf(names.bos, CONTROL),
    eos: idOf(names.eos, CONTROL),
  };
  return { pieces, types, scores: Float32Array.from(scores), modelType, byteFallback, special };
}

// -- vocabulary maps and texts ----------------------------------------------------------------------

// How an entry of a map is read: a DataView reader per element type and byte order this host knows.
// Refused at import if the spec names another layout, rather than reading a map wrongly.
const READERS = { int32: [4, (view, at, little) => view.getInt32(at, little)] };
const LITTLE = { little: true, big: false };
if (
  ![SOURCE_VOCAB, TARGET_VOCAB, VOCAB_TEXTS].every((k) => OPTIONAL_FILE_KEYS.includes(k)) ||
  !Object.hasOwn(READERS, VOCAB_MAP.dtype) ||
  !Object.hasOwn(LITTLE, VOCAB_MAP.byte_order)
) {
  throw new Error(`${SPEC_URL}: files.optional or vocab_maps names a vocabulary map this host cannot read`);
}
const [ENTRY_BYTES, readEntry] = READERS[VOCAB_MAP.dtype];
// runtime/vocab.py's words for a map or texts file that does not fit (no hint that bundle.json is
// right: these files are made by the exporter with the model, not written by hand)
const REEXPORT = "re-export the bundle with `seq2onnx export`";

/**
 * One vocabulary map, as runtime/vocab.py's read_map: `length` entries, each in [low, high). The
 * source map has one entry per source piece, each a model source id; the target map one per model
 * target id, each a target piece, or the skip value (never written) or the text value (a piece the
 * target SentencePiece model lacks, whose text is in vocab_texts). Null where the bundle has none.
 * @returns {Int32Array | null}
 * @throws {BundleError} naming the file, the value found, the limit and the fix
 */
function vocabMap(bundle, key, length, low, high) {
  const bytes = bundle.files[key];
  if (!bytes) return null;
  const where = bundle.paths[key];
  if (bytes.length % ENTRY_BYTES) {
    throw new BundleError(
      `${where}: ${bytes.length} bytes is not a whole number of ${VOCAB_MAP.dtype} entries; ${REEXPORT}`,
    );
  }
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const map = Int32Array.from({ length: bytes.length / ENTRY_BYTES }, (_, i) =>
    readEntry(view, i * ENTRY_BYTES, LITTLE[VOCAB_MAP.byte_order]),
  );
  if (map.length !== length)
    throw new BundleError(`${where}: ${map.length} entries, expected ${length}; ${REEXPORT}`);
  const bad = map.findIndex((x) => x < low || x >= high);
  if (bad >= 0)
    throw new BundleError(
      `${where}: entry ${bad} is ${map[bad]}, expected an id in [${low}, ${high}); ${REEXPORT}`,
    );
  return map;
}

/**
 * vocab_texts, as runtime/vocab.py's _read_texts: {source: piece text -> model source id (a piece
 * that SentencePiece marks unknown is looked up by its text), target: model target id -> its text
 * (for the ids the target map marks with the text value)}; empty maps where the bundle has none.
 * @returns {{source: Map<string, number>, target: Map<number, string>}}
 * @throws {BundleError} naming the file, what is wrong and the fix
 */
function vocabTexts(bundle, targetMap) {
  const texts = { source: new Map(), target: new Map() };
  const bytes = bundle.files[VOCAB_TEXTS];
  if (!bytes) return texts;
  const where = bundle.paths[VOCAB_TEXTS];
  try {
    const data = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(bytes));
    if (data === null || typeof data !== "object" || Array.isArray(data)) throw new Error("not an object");
    for (const [text, id] of Object.entries(data.source ?? {})) {
      if (!Number.isInteger(id))
        throw new Error(`source[${JSON.stringify(text)}] is ${short(id)}, not an id`);
      texts.source.set(text, id);
    }
    for (const [id, text] of Object.entries(data.target ?? {})) {
      if (!/^\d+$/.test(id) || typeof text !== "string")
        throw new Error(`target[${JSON.stringify(id)}] is not an id's text`);
      texts.target.set(Number(id), text);
    }
  } catch (e) {
    throw new BundleError(
      `${where}: not the vocabulary texts the spec describes (${e.message}); ${REEXPORT}`,
    );
  }
  const src = bundle.meta.model.src_vocab_size;
  if ([...texts.source.values()].some((id) => id < 0 || id >= src))
    throw new BundleError(`${where}: a source id outside [0, ${src}); ${REEXPORT}`);
  const missing = targetMap
    ? [...targetMap.keys()].filter((i) => targetMap[i] === VOCAB_MAP.text && !texts.target.has(i))
    : [];
  if (missing.length) {
    throw new BundleError(
      `${where}: no text for target id ${missing[0]}, which ${TARGET_VOCAB} marks ${VOCAB_MAP.text}; ${REEXPORT}`,
    );
  }
  return texts;
}

/**
 * Checks 5 and 6: each tokenizer's vocabulary size and special ids are bundle.json's, and its
 * pieces are the vocabulary recorded in `tokenizers` (when recorded): an exchanged pair is named
 * as such. As runtime/checks.py's check_tokenizers. A side with a vocabulary map (a model imported
 * from Hugging Face, whose ids are not SentencePiece's) has its map checked instead of the size
 * and the special ids: the SentencePiece model's ids are not the model's there.
 * @param {import("./bundle.js").Bundle} bundle  from readBundle (its files are the hashed bytes)
 * @param {{sha256: (bytes: Uint8Array) => Promise<string>}} platform
 * @returns {Promise<{source: Int32Array | null, target: Int32Array | null,
 *   texts: {source: Map<string, number>, target: Map<number, string>}}>} the vocabulary maps and texts
 * @throws {BundleError} naming the file, the field, both values and the fix
 */
export async function checkTokenizers(bundle, platform) {
  const { model, special_ids: ids, tokenizers: fingerprints } = bundle.meta;
  const sides = [
    ["source", "src_vocab_size", "source_tokenizer"],
    ["target", "tgt_vocab_size", "target_tokenizer"],
  ];
  const file = (key) => bundle.paths[key];
  const vocab = {};
  const have = {};
  for (const [side, , key] of sides) {
    try {
      vocab[side] = readVocabulary(bundle.files[key]);
    } catch (e) {
      throw new BundleError(`${file(key)}: not a SentencePiece model (${e.message}); ${FIX}`);
    }
    // the fingerprint of runtime/checks.py: sha256 of the pieces in id order joined by "\n"
    if (fingerprints)
      have[side] = await platform.sha256(new TextEncoder().encode(vocab[side].pieces.join("\n")));
  }
  // The maps and texts of an imported model first, as the Python runtime reads them (runtime/vocab.py)
  const maps = {
    source: vocabMap(bundle, SOURCE_VOCAB, vocab.source.pieces.length, 0, model.src_vocab_size),
    target: vocabMap(bundle, TARGET_VOCAB, model.tgt_vocab_size, VOCAB_MAP.text, vocab.target.pieces.length),
  };
  maps.texts = vocabTexts(bundle, maps.target);
  // As runtime/checks.py: a tokenizer that is the other side's is named as such; "exchanged" when
  // the other file is in turn this side's, else "the same vocabulary as" the other file.
  const wrongVocabulary = (side, key, { isOther = false, exchanged = false } = {}) => {
    const other = side === "source" ? "target" : "source";
    const what = exchanged
      ? `; it is the ${other} tokenizer: the two .model files are exchanged`
      : isOther
        ? `; it is the ${other} tokenizer (the same vocabulary as ${baseName(file(`${other}_tokenizer`))})`
        : "";
    return new BundleError(
      `${file(key)}: its vocabulary is not the ${side} vocabulary the model was exported with ` +
        `(tokenizers.${side}.pieces_sha256 in ${BUNDLE_JSON})${what}; ${FIX}`,
    );
  };
  // A tokenizer that is the other side's first: named as such rather than as a size or id mismatch.
  if (fingerprints) {
    for (const [side, , key] of sides) {
      const other = side === "source" ? "target" : "source";
      if (
        have[side] === fingerprints[other].pieces_sha256 &&
        have[side] !== fingerprints[side].pieces_sha256
      ) {
        throw wrongVocabulary(side, key, {
          isOther: true,
          exchanged: have[other] === fingerprints[side].pieces_sha256,
        });
      }
    }
  }
  for (const [side, sizeKey, key] of sides) {
    const { pieces, special } = vocab[side];
    if (!maps[side] && pieces.length !== model[sizeKey]) {
      throw mismatch(
        bundle,
        `model.${sizeKey}`,
        model[sizeKey],
        pieces.length,
        `${baseName(file(key))} (get_piece_size())`,
      );
    }
    for (const name of maps[side] ? [] : ["pad", "unk", "bos", "eos"]) {
      if (special[name] !== ids[name])
        throw mismatch(
          bundle,
          `special_ids.${name}`,
          ids[name],
          special[name],
          `${baseName(file(key))} (${name}_id())`,
        );
    }
    if (fingerprints && have[side] !== fingerprints[side].pieces_sha256) throw wrongVocabulary(side, key);
  }
  return maps;
}

// -- graphs ---------------------------------------------------------------------------------------

/** name -> {type, shape} of a session's inputs or outputs, or null where onnxruntime gives no metadata. */
function metadata(list) {
  if (!Array.isArray(list) || !list.length) return null;
  return new Map(
    list.filter((m) => m.isTensor !== false).map((m) => [m.name, { type: m.type, shape: [...m.shape] }]),
  );
}

/**
 * Checks 7 and 8: each session's inputs and outputs are bundle.json's (names, element types,
 * ranks, fixed sizes), and the model's sizes are the graphs': layers (the cache inputs), heads and
 * head size (their fixed dims), dtype, target vocabulary (log_probs), source vocabulary (the
 * encoder's embedding) and max_positions (the decoder's positional table). As runtime/checks.py's
 * check_graphs, for the standard decoder (graphs.decoder), the one this host drives. Element
 * types and dims need the sessions' inputMetadata/outputMetadata (onnxruntime >= 1.22); without
 * them only names, layers and tables are checked.
 * @param {import("./bundle.js").Bundle} bundle
 * @param {any} encoder  onnxruntime session of files.encoder
 * @param {any} decoder  onnxruntime session of files.decoder
 * @throws {BundleError} naming the file, the field, both values and the fix
 */
export function checkGraphs(bundle, encoder, decoder) {
  const { model, graphs, dtype } = bundle.meta;
  const sessions = [
    [ENCODER_LABEL, encoder],
    [DECODER, decoder],
  ];
  for (const [label, session] of sessions) {
    const spec = graphs[label];
    const file = bundle.paths[label];
    const have = [[...session.inputNames].sort(), [...session.outputNames].sort()];
    const want = [spec.inputs.map((i) => i.name).sort(), spec.outputs.map((o) => o.name).sort()];
    if (JSON.stringify(have) !== JSON.stringify(want)) {
      throw new BundleError(
        `${file}: its inputs/outputs ${JSON.stringify(have)} differ from ${BUNDLE_JSON}'s ` +
          `graphs.${label} ${JSON.stringify(want)}; ${FIX}`,
      );
    }
    for (const [kind, list] of [
      ["inputs", session.inputMetadata],
      ["outputs", session.outputMetadata],
    ]) {
      const found = metadata(list);
      if (!found) continue;
      for (const item of spec[kind]) {
        const arg = found.get(item.name);
        if (!arg) continue;
        if (arg.type !== item.dtype)
          throw mismatch(
            bundle,
            `graphs.${label}.${kind}[${item.name}].dtype`,
            item.dtype,
            arg.type,
            baseName(file),
          );
        const fixed = item.shape.map((d, i) => [i, d]).filter(([, d]) => Number.isInteger(d));
        if (arg.shape.length !== item.shape.length || fixed.some(([i, d]) => arg.shape[i] !== d)) {
          throw mismatch(
            bundle,
            `graphs.${label}.${kind}[${item.name}].shape`,
            item.shape,
            arg.shape,
            baseName(file),
          );
        }
      }
    }
  }
  const decFile = bundle.paths[DECODER];
  const decName = baseName(decFile);
  const layers = model.n_decoder_layers;
  const inputs = [...decoder.inputNames];
  const cacheInputs = inputs.filter((n) => isLayerName("past_key", n) || isLayerName("past_value", n)).length;
  if (cacheInputs !== 2 * layers || !pastNames(layers).every((n) => inputs.includes(n))) {
    throw mismatch(
      bundle,
      "model.n_decoder_layers",
      layers,
      Math.floor(cacheInputs / 2),
      `${decName} (its ${layerName("past_key", "*")}/${layerName("past_value", "*")} inputs, layers)`,
    );
  }
  if (!inputs.includes(TOP_K)) throw new BundleError(`${decFile}: no ${TOP_K} input; ${FIX}`);
  const decIn = metadata(decoder.inputMetadata);
  const decOut = metadata(decoder.outputMetadata);
  if (decIn) {
    const first = layerName("past_key", 0);
    const { shape: cache, type } = decIn.get(first);
    const where = `${decName} (input ${first} of shape ${JSON.stringify(cache)}`;
    const headDim = model.d_kv || model.d_model / model.n_heads; // d_kv: T5's head size of its own
    if (cache.length !== 4 || cache[1] !== model.n_heads) {
      throw mismatch(
        bundle,
        "model.n_heads",
        model.n_heads,
        cache.length === 4 ? cache[1] : cache,
        `${where})`,
      );
    }
    if (cache[3] !== headDim) {
      throw mismatch(
        bundle,
        "model.d_model",
        model.d_model,
        cache[3] * model.n_heads,
        `${where}: head size ${cache[3]} x ${model.n_heads} heads)`,
      );
    }
    if (!DTYPES.includes(type) || type !== dtype) throw mismatch(bundle, "dtype", dtype, type, `${where})`);
  }
  if (decOut) {
    const logProbs = decOut.get(LOG_PROBS).shape;
    if (logProbs[logProbs.length - 1] !== model.tgt_vocab_size) {
      throw mismatch(
        bundle,
        "model.tgt_vocab_size",
        model.tgt_vocab_size,
        logProbs[logProbs.length - 1],
        `${decName} (output ${LOG_PROBS} of shape ${JSON.stringify(logProbs)})`,
      );
    }
  }
  checkTables(bundle);
}

// -- constant tables of the graphs ------------------------------------------------------------------

// onnx.proto: ModelProto.graph = 7; GraphProto.node = 1, initializer = 5; NodeProto.input = 1,
// output = 2, op_type = 4, attribute = 5; AttributeProto.t = 5; TensorProto.dims = 1, name = 8.
function tensorInfo(buf, span) {
  let name = "";
  const dims = [];
  for (const [n, w, v] of fields(buf, ...span)) {
    if (n === 1 && w === 0) dims.push(v);
    else if (n === 1 && w === 2) {
      // packed
      for (let pos = v[0], d; pos < v[1]; ) {
        [d, pos] = varint(buf, pos);
        dims.push(d);
      }
    } else if (n === 8 && w === 2) name = text(buf, v);
  }
  return { name, dims };
}

/** [1, 32, 0] of "1.32.0" or "1.32.0-dev.2026": the leading numbers. */
function release(version) {
  const numbers = [];
  for (const part of String(version).split(/[+-]/)[0].split(".")) {
    if (!/^\d+$/.test(part)) break;
    numbers.push(Number(part));
  }
  return numbers;
}

function older(a, b) {
  for (let i = 0; i < Math.max(a.length, b.length); i++) {
    if ((a[i] ?? 0) !== (b[i] ?? 0)) return (a[i] ?? 0) < (b[i] ?? 0);
  }
  return false;
}

/**
 * Refuses, by name, a quantization scheme this host does not know or its onnxruntime cannot run
 * (the spec's quantization_schemes: operators and the oldest onnxruntime each was run with), before a
 * session is made. A bundle without quantization_scheme passes. As runtime/checks.py's check_scheme.
 * @param {{meta: object, metaPath: string}} bundle
 * @param {string} [ortVersion]  this host's onnxruntime ("1.30.0": ort.env.versions.common); undefined where
 *   the onnxruntime package does not say (then only the name is checked)
 * @throws {BundleError}
 */
export function checkScheme(bundle, ortVersion) {
  const scheme = bundle.meta.quantization_scheme;
  if (!scheme) return;
  const known = Object.fromEntries(
    Object.entries(SPEC.quantization_schemes).filter(([k]) => !k.startsWith("$")),
  );
  const name = typeof scheme === "object" ? scheme.name : scheme;
  if (!Object.hasOwn(known, name)) {
    throw new BundleError(
      `${bundle.metaPath}: quantization_scheme.name=${JSON.stringify(name)} is not a scheme this ` +
        `host runs (${Object.keys(known).join(", ")}); upgrade seq2onnx, or re-export the bundle with ` +
        "`seq2onnx export --quantize int8`",
    );
  }
  const need = known[name].onnxruntime;
  if (ortVersion !== undefined && older(release(ortVersion), release(need))) {
    const operators = known[name].operators.join(", ") || "its int8 operators";
    throw new BundleError(
      `${bundle.metaPath}: quantization scheme ${JSON.stringify(name)} (${operators}) needs ` +
        `onnxruntime >= ${need}, and this host has onnxruntime ${ortVersion}; upgrade onnxruntime, or re-export ` +
        "the bundle with `seq2onnx export --quantize int8`",
    );
  }
}

/**
 * (indices input, table shape) of every Gather of a constant table in an ONNX model's bytes,
 * following the table back through Cast, DequantizeLinear and Identity (runtime/onnx_info.py).
 * With packed (the lookup operator of a scheme whose tables' codes are packed, and their bits: bundle.json's
 * quantization_scheme.tables), that operator's lookups too, at the table's logical shape
 * [rows, codes' bytes x 8 / bits].
 * @param {Uint8Array} buf
 * @param {{op: string, bits: number}} [packed]
 * @returns {[string, number[]][]}
 */
export function gatherTables(buf, packed) {
  const graphs = [...fields(buf, 0, buf.length)].filter(([n, w]) => n === 7 && w === 2);
  if (graphs.length !== 1) throw new ProtoError(`${graphs.length} graphs in the model`);
  const shapes = new Map();
  const nodes = [];
  for (const [number, wire, value] of fields(buf, ...graphs[0][2])) {
    if (wire !== 2) continue;
    if (number === 5) {
      const { name, dims } = tensorInfo(buf, value);
      shapes.set(name, dims);
    } else if (number === 1) {
      const node = { op: "", inputs: [], outputs: [] };
      const values = [];
      for (const [n, w, v] of fields(buf, ...value)) {
        if (w !== 2) continue;
        if (n === 1) node.inputs.push(text(buf, v));
        else if (n === 2) node.outputs.push(text(buf, v));
        else if (n === 4) node.op = text(buf, v);
        else if (n === 5)
          values.push(...[...fields(buf, ...v)].filter(([an, aw]) => an === 5 && aw === 2).map((a) => a[2]));
      }
      if (node.op === "Constant" && values.length && node.outputs.length)
        shapes.set(node.outputs[0], tensorInfo(buf, values[0]).dims);
      nodes.push(node);
    }
  }
  const tableShape = (name, depth = 4) => {
    if (shapes.has(name)) return shapes.get(name);
    if (!depth) return null;
    const from = nodes.find(
      (n) =>
        n.outputs.includes(name) &&
        ["Cast", "DequantizeLinear", "Identity"].includes(n.op) &&
        n.inputs.length,
    );
    return from ? tableShape(from.inputs[0], depth - 1) : null;
  };
  const isPacked = (n) => packed && n.op === packed.op && n.inputs.length >= 3;
  return nodes
    .filter((n) => (n.op === "Gather" && n.inputs.length === 2) || isPacked(n))
    .map((n) => {
      const shape = tableShape(n.inputs[0]);
      if (!isPacked(n) || shape === null) return [n.inputs[1], shape];
      return [n.inputs[1], shape.length === 2 ? [shape[0], (shape[1] * 8) / packed.bits] : null];
    })
    .filter(([, shape]) => shape !== null);
}

/**
 * The initializers of an ONNX model's bytes whose data is external (TensorProto.data_location = 1, or
 * external_data entries): TensorProto.data_type = 2, external_data = 13 (key = 1, value = 2), data_location = 14.
 * @param {Uint8Array} buf
 * @returns {{name: string, dataType: number, dims: number[], entries: Record<string, string>}[]}
 */
export function externalTensors(buf) {
  const graphs = [...fields(buf, 0, buf.length)].filter(([n, w]) => n === 7 && w === 2);
  if (graphs.length !== 1) throw new ProtoError(`${graphs.length} graphs in the model`);
  const found = [];
  for (const [number, wire, value] of fields(buf, ...graphs[0][2])) {
    if (number !== 5 || wire !== 2) continue;
    const { name, dims } = tensorInfo(buf, value);
    let dataType = 0;
    let location = 0;
    const entries = {};
    for (const [n, w, v] of fields(buf, ...value)) {
      if (n === 2 && w === 0) dataType = v;
      else if (n === 14 && w === 0) location = v;
      else if (n === 13 && w === 2) {
        const pair = {};
        for (const [pn, pw, pv] of fields(buf, ...v)) if (pw === 2) pair[pn] = text(buf, pv);
        entries[pair[1] ?? ""] = pair[2] ?? "";
      }
    }
    if (location === 1 || Object.keys(entries).length) found.push({ name, dataType, dims, entries });
  }
  return found;
}

/**
 * Every external reference of a graph points into the bundle's weights file, as spec/bundle.json's
 * `weights` says: that file's name, whole numbers inside it, aligned, the tensor's length (runtime/weights.py).
 * @param {object} bundle  readBundle's result (weightsSize: the checked file's size)
 * @param {string} key  the graph's file key
 * @throws {BundleError} naming the initializer and the fix
 */
export function checkReferences(bundle, key) {
  const file = bundle.paths[key];
  let found;
  try {
    found = externalTensors(bundle.files[key]);
  } catch (e) {
    throw new BundleError(`${file}: not a readable ONNX graph (${e.message}); ${REEXPORT}`);
  }
  const weights = bundle.meta.files[WEIGHTS];
  for (const t of found) {
    const where = `${file}: initializer ${JSON.stringify(t.name)}`;
    if (!weights)
      throw new BundleError(
        `${where} is external data but ${BUNDLE_JSON} lists no files.weights; ${REEXPORT}`,
      );
    if (t.entries.location !== weights.path) {
      throw new BundleError(
        `${where} points at ${JSON.stringify(t.entries.location ?? null)}; a bundle's graphs may only ` +
          `point at its weights file ${JSON.stringify(weights.path)}; ${REEXPORT}`,
      );
    }
    const offset = Number(t.entries.offset ?? "0");
    const length = Number(t.entries.length);
    if (!/^\d+$/.test(t.entries.offset ?? "0") || !/^\d+$/.test(t.entries.length ?? "")) {
      throw new BundleError(`${where}: offset/length are not whole numbers; ${REEXPORT}`);
    }
    const width = WEIGHTS_SPEC.element_bytes[String(t.dataType)];
    const count = t.dims.reduce((a, b) => a * b, 1);
    if (width === undefined || length !== count * width) {
      throw new BundleError(
        `${where}: ${length} bytes for a tensor of shape ${JSON.stringify(t.dims)} and ONNX type ` +
          `${t.dataType}; ${REEXPORT}`,
      );
    }
    if (offset % WEIGHTS_SPEC.alignment || offset + length > bundle.weightsSize) {
      throw new BundleError(
        `${where}: bytes ${offset}..${offset + length} of ${weights.path} (${bundle.weightsSize} bytes, ` +
          `alignment ${WEIGHTS_SPEC.alignment}); the file is truncated or the graph damaged: ${REEXPORT}`,
      );
    }
  }
}

/**
 * {op, bits} of a scheme whose tables' codes are packed (export/quantize_nbits.py): the lookup bundle.json
 * names, where it is one of the spec's operators for that scheme; else undefined.
 */
function packedTables(scheme) {
  const tables = scheme?.tables;
  const known =
    scheme && Object.hasOwn(SPEC.quantization_schemes, scheme.name)
      ? SPEC.quantization_schemes[scheme.name]
      : null;
  if (!known?.operators?.includes(tables?.lookup) || !Number.isInteger(tables.bits) || tables.bits < 1)
    return undefined;
  return { op: tables.lookup, bits: tables.bits };
}

/** The source embedding's rows and the positional table's rows, read from the graph files. */
function checkTables(bundle) {
  const { model } = bundle.meta;
  const tables = [
    [ENCODER_LABEL, SRC_IDS, "src_vocab_size", "source embedding"],
    [DECODER, STEP, "max_positions", "positional table"],
  ];
  if (model.relative_buckets) tables.pop(); // T5 has no positional table (a relative bias instead)
  const packed = packedTables(bundle.meta.quantization_scheme);
  for (const [key, indices, field, what] of tables) {
    const file = bundle.paths[key];
    let found;
    try {
      found = gatherTables(bundle.files[key], packed)
        .filter(([idx]) => idx === indices)
        .map(([, shape]) => shape);
      // an int8 table is looked up twice, its codes and its row scales [rows, 1] (export/quantize.py)
      if (found.length > 1) found = found.filter((shape) => !(shape.length === 2 && shape[1] === 1));
    } catch (e) {
      throw new BundleError(`${file}: cannot be read for its tables (${e.message}); ${FIX}`);
    }
    if (found.length !== 1 || found[0].length !== 2)
      throw new BundleError(`${file}: no ${what} (a Gather of ${indices}) found; ${FIX}`);
    const [rows, width] = found[0];
    const where = `${baseName(file)} (${what} of shape [${rows}, ${width}])`;
    if (rows !== model[field]) throw mismatch(bundle, `model.${field}`, model[field], rows, where);
    if (width !== model.d_model) throw mismatch(bundle, "model.d_model", model.d_model, width, where);
  }
}
