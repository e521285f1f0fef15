// The bundle contract of docs/bundle-format.md, checked as runtime/bundle.py's read_bundle does
// (checks 1-4 of "Checks a host must do": bundle.json, its fields' types and ranges, the files'
// paths and hashes), through a platform adapter (files, paths, hashing) so that the same checks
// serve Node and the browser. The checks that need the tokenizers and sessions are src/checks.js.
// The format's names and limits, and the per-field checks of bundle.json, are spec/bundle.json's
// (src/spec.js), the file runtime/bundle.py reads too: this module spells none of them, and the
// other modules take them from here.
import { numberLiterals, SPEC, SPEC_URL } from "./spec.js";

export { numberLiterals };

export const FORMAT = SPEC.format;
export const FORMAT_VERSION = SPEC.format_version;
export const BUNDLE_JSON = SPEC.bundle_json;
/** The files every bundle has, by their key in bundle.json's `files`. */
export const FILE_KEYS = Object.keys(SPEC.files.required);
// Files a bundle may have. This host never loads the fused decoder (onnxruntime's contrib kernels,
// CONTRIB_DOMAIN, which onnxruntime-web lacks), but checks it as the Python runtime does: a damaged
// bundle is refused whichever host reads it.
export const OPTIONAL_FILE_KEYS = Object.keys(SPEC.files.optional);
/** Key -> the file name `seq2onnx export` writes, for every file a bundle may have. */
export const FILE_NAMES = Object.freeze({ ...SPEC.files.required, ...SPEC.files.optional });
// The optional vocabulary maps of bundles imported from Hugging Face, and the texts of the pieces a
// SentencePiece model lacks: their keys in files, and the spec's vocab_maps (the maps' element type,
// byte order, and the skip and text values; src/checks.js reads them).
export const SOURCE_VOCAB = "source_vocab";
export const TARGET_VOCAB = "target_vocab";
export const VOCAB_TEXTS = "vocab_texts";
export const VOCAB_MAP = SPEC.vocab_maps;
/** The optional files that are graphs (described in graphs.<key> too): the decoder labels among them. */
export const OPTIONAL_GRAPH_KEYS = OPTIONAL_FILE_KEYS.filter((k) => Object.values(SPEC.decoders).includes(k));
// The one file of every graph's large initializers (ONNX external data, each tensor once) and the rules
// of its references (alignment, element sizes): src/checks.js checks them, the platform hands the file
// to onnxruntime (a folder in Node, the bytes in the browser).
export const WEIGHTS = "weights";
export const WEIGHTS_SPEC = SPEC.weights;
// the weights file's CRC-32 field (checked for its form only: every load checks the sha256)
const CHECKSUM = WEIGHTS_SPEC.checksum;
// each files.<key>: its path's length at most, its sha256's width, its size's field (spec's file_entry)
const ENTRY = SPEC.file_entry;
/** The files whose bytes a Bundle keeps: the required ones, the vocabulary maps and texts. */
export const KEPT_FILE_KEYS = [...FILE_KEYS, SOURCE_VOCAB, TARGET_VOCAB, VOCAB_TEXTS];
// Where tokens.target_lang_in may put target_lang's token: the names of the two tokens fields it may
// replace, the first the default (docs/bundle-format.md, "The tokens section").
export const TARGET_LANG_IN = SPEC.target_lang_in;
export const [TARGET_PREFIX, SOURCE_PREFIX] = TARGET_LANG_IN;
export const MAX_JSON_BYTES = SPEC.max_json_bytes; // a real bundle.json is ~10 kB: anything near this is not one
export const DTYPES = SPEC.dtypes; // the key/value element types a host can feed
export const QUANTIZATIONS = SPEC.quantizations;
export const BEAM_CONVENTIONS = SPEC.beam_conventions; // decoding.beam_convention: [ours (default), transformers']
// The decoder graphs by variant (bundle.json's graphs.<label>.variant): the standard one, which
// this host drives, and the fused one, built from onnxruntime's contrib kernels (CONTRIB_DOMAIN).
export const STANDARD = "standard";
export const FUSED = "fused";
export const DECODER_LABELS = Object.freeze({
  [STANDARD]: SPEC.decoders[STANDARD],
  [FUSED]: SPEC.decoders[FUSED],
});
export const ENCODER_LABEL = "encoder"; // graphs.encoder and files.encoder (a key of the spec's files.required)
export const CONTRIB_DOMAIN = SPEC.contrib_domain;

// Graph input and output names (bundle.json lists them per graph).
const NAMES = SPEC.names;
export const SRC_IDS = NAMES.src_ids;
export const SRC_LENGTHS = NAMES.src_lengths;
export const SRC_MASK = NAMES.src_mask;
export const TOKENS = NAMES.tokens;
export const STEP = NAMES.step;
export const CACHE_INDICES = NAMES.cache_indices;
export const TOP_K = NAMES.top_k;
export const LOG_PROBS = NAMES.log_probs;
export const TOPK_LOG_PROBS = NAMES.topk_log_probs;
export const TOPK_IDS = NAMES.topk_ids;
// the standard decoder's last-layer cross-attention averaged over heads [rows, src_len] (0.3 and later)
export const CROSS_ATTENTION = NAMES.cross_attention;
// the fused decoder's (never driven here)
export const BEAM_WIDTH = NAMES.beam_width;
export const CACHE_INDIRECTION = NAMES.cache_indirection;
export const ROW_START = NAMES.row_start;

/**
 * A per-layer name: the spec's layer_names[kind] with "{i}" replaced by the layer index.
 * @param {"key_cross" | "value_cross" | "past_key" | "past_value" | "present_key" | "present_value"} kind
 * @param {number | string} i  a layer index, or e.g. "*" for a pattern in a message
 */
export function layerName(kind, i) {
  const template = SPEC.layer_names[kind];
  if (typeof template !== "string") throw new Error(`${SPEC_URL}: no layer_names.${kind}`);
  return template.replaceAll("{i}", String(i));
}

/** Whether `name` is layer_names[kind] for some layer index (a template with one "{i}"). */
export function isLayerName(kind, name) {
  const [head, tail = ""] = layerName(kind, "{i}").split("{i}");
  return (
    name.length > head.length + tail.length &&
    name.startsWith(head) &&
    name.endsWith(tail) &&
    /^\d+$/.test(name.slice(head.length, name.length - tail.length))
  );
}

const perLayer = (kinds) => (n) =>
  Array.from({ length: n }, (_, i) => kinds.map((k) => layerName(k, i))).flat();
/** @type {(n: number) => string[]} the encoder's outputs (and the decoder's inputs) of n layers */
export const crossNames = perLayer(["key_cross", "value_cross"]);
/** @type {(n: number) => string[]} the decoder's self-attention cache inputs of n layers */
export const pastNames = perLayer(["past_key", "past_value"]);
/** @type {(n: number) => string[]} the decoder's self-attention cache outputs of n layers */
export const presentNames = perLayer(["present_key", "present_value"]);

/** A bundle that is missing, damaged or of another format: the message names the file. */
export class BundleError extends Error {
  constructor(message) {
    super(message);
    this.name = "BundleError";
  }
}

/**
 * @typedef {object} Platform  What a host needs from its surroundings: Node or a browser.
 * @property {any} ort  the onnxruntime module (onnxruntime-node or onnxruntime-web: the same API)
 * @property {(dir: string, rel: string) => string} join  a path or URL inside the bundle
 * @property {(path: string, options?: {maxBytes?: number}) => Promise<Uint8Array>} readFile  rejects with
 *   code "ENOENT" when missing; where the platform can tell before reading: with code "ENOTREG" (and
 *   `kind`, in words) for anything but a regular file (a FIFO, a device, a socket, a directory), and
 *   with code "EFBIG" (and `size`) for a file larger than maxBytes
 * @property {number} [cores]  this machine's cores: Translator.load refuses more threads (Node)
 * @property {string} [coresSource]  how `cores` was found, for messages
 * @property {(dir: string, rel: string) => Promise<{inside: boolean, exists: boolean, path: string}>} resolveInside
 *   where `rel` leads from `dir` (symbolic links followed) and whether that lies inside `dir`
 * @property {(bytes: Uint8Array) => Promise<string>} sha256  lowercase hex digest
 * @property {(path: string, options?: {crc32?: boolean}) => Promise<{sha256?: string, crc32?: string, size: number}>} [hashFile]
 *   a file's digest (its sha256, or with `crc32` its CRC-32) and size read as a stream, no copy kept (Node):
 *   the weights file is checked so when the platform does not keep it, whatever its size
 * @property {boolean} [crc32]  hashFile gives a CRC-32 natively: the weights file is checked by
 *   files.weights.crc32 where the bundle has one (spec's weights.checksum), else by its sha256
 * @property {boolean} [keepsWeights]  onnxruntime takes the weights file as bytes (the browser)
 * @property {(path: string, name: string, options?: {size?: number}) => Promise<{sha256: string, size: number, folder: string}>} [privateCopy]
 *   copies the weights file into a private folder as `name`, hashing it on the way (Node): onnxruntime
 *   reads that copy (bundle.paths.weightsFolder), which no other process rewrites under it
 * @property {(bundle: object) => void} [releaseCopy]  removes that folder once the sessions are made
 */

/**
 * @typedef {object} Bundle
 * @property {string} path
 * @property {string} metaPath  bundle.json's path or URL
 * @property {any} meta  bundle.json as read
 * @property {Record<string, string>} paths  where each file listed in bundle.json was found
 * @property {Record<string, Uint8Array>} files  the bytes of encoder, decoder, source_tokenizer,
 *   target_tokenizer: exactly the bytes that were hashed, so what is loaded is what was checked
 */

const FIX_FIELD = "re-export the bundle with `seq2onnx export` (or correct the field)";

/** A value for a message: JSON, cut to 60 characters. */
export function short(value) {
  let text;
  try {
    text = value === undefined ? "missing" : JSON.stringify(value);
  } catch {
    text = String(value);
  }
  text ??= String(value);
  return text.length <= 60 ? text : `${text.slice(0, 57)}...`;
}

const isObject = (v) => v !== null && typeof v === "object" && !Array.isArray(v);

/** Type and range checks of bundle.json's fields; each failure names the field, its value and the fix. */
class Schema {
  /**
   * @param {string} where
   * @param {Map<string, string>} [fractions]  field -> number literal, for the numbers bundle.json's
   *   text writes with a fraction or an exponent (numberLiterals): JSON.parse reads 2.0 as 2
   */
  constructor(where, fractions = new Map()) {
    this.where = where;
    this.fractions = fractions;
  }

  fail(field, value, want) {
    throw new BundleError(`${this.where}: ${field} is ${short(value)}, ${want}; ${FIX_FIELD}`);
  }

  obj(parent, key, field) {
    if (!(key in parent))
      throw new BundleError(
        `${this.where}: missing the field '${field}'; re-export the bundle with \`seq2onnx export\``,
      );
    if (!isObject(parent[key])) this.fail(field, parent[key], "expected an object");
    return parent[key];
  }

  integer(parent, key, field, { low = 0, required = true } = {}) {
    if (!(key in parent) && !required) return null;
    const value = parent[key];
    if (!Number.isInteger(value) || value < low) this.fail(field, value, `expected an integer >= ${low}`);
    if (this.fractions.has(field)) {
      // written 2.0 or 2e0: a float to Python, refused there too
      throw new BundleError(
        `${this.where}: ${field} is ${this.fractions.get(field)}, expected an integer >= ${low}; ${FIX_FIELD}`,
      );
    }
    return value;
  }

  real(parent, key, field, low = null) {
    const value = parent[key];
    if (typeof value !== "number" || !Number.isFinite(value) || (low !== null && value < low)) {
      this.fail(field, value, `expected a finite number${low !== null ? ` >= ${low}` : ""}`);
    }
    return value;
  }

  text(parent, key, field, choices = null) {
    const value = parent[key];
    if (typeof value !== "string" || (choices && !choices.includes(value))) {
      this.fail(field, value, choices ? `expected one of ${choices.join(", ")}` : "expected a string");
    }
    return value;
  }

  /** A list of token ids: integers >= 0 (an empty list too). */
  ids(parent, key, field) {
    const value = parent[key];
    if (!Array.isArray(value) || !value.every((x) => Number.isInteger(x) && x >= 0)) {
      this.fail(field, value, "expected a list of token ids (integers >= 0)");
    }
    return value;
  }

  /** An object of language codes to token ids (integers >= 0), none written with a fraction (1.0). */
  idMap(parent, key, field) {
    const value = parent[key];
    const want = "expected an object of language codes to token ids (integers >= 0)";
    if (!isObject(value) || !Object.values(value).every((x) => Number.isInteger(x) && x >= 0))
      this.fail(field, value, want);
    const literal = (code) => this.fractions.get(`${field}.${code}`);
    if (Object.keys(value).some(literal)) {
      // as Python reads it: a float, shown as written
      const shown = `{${Object.entries(value)
        .map(([c, x]) => `${JSON.stringify(c)}:${literal(c) ?? x}`)
        .join(",")}}`;
      throw new BundleError(
        `${this.where}: ${field} is ${shown.length <= 60 ? shown : `${shown.slice(0, 57)}...`}, ${want}; ${FIX_FIELD}`,
      );
    }
    return value;
  }

  /**
   * One row of the spec's `fields` table: {field: "a.b.c", type: "integer" | "number" | "string" |
   * "ids" | "id_map" | "boolean", min?, choices? (a list, or the name of one of the spec's lists),
   * nullable?, required? (default true)}. A row that is not required is skipped when its field or
   * an object on the way to it is absent (the whole optional tokens section, say); an object on the
   * way that is there must be an object.
   */
  field(meta, row) {
    const path = row.field.split(".");
    const key = path.pop();
    let parent = meta;
    for (const [i, name] of path.entries()) {
      if (!(name in parent) && row.required === false) return;
      parent = this.obj(parent, name, path.slice(0, i + 1).join("."));
    }
    if (!(key in parent) && row.required === false) return;
    if (row.nullable && key in parent && parent[key] === null) return;
    switch (row.type) {
      case "integer":
        this.integer(parent, key, row.field, { low: row.min ?? 0 });
        break;
      case "number":
        this.real(parent, key, row.field, row.min ?? null);
        break;
      case "string":
        this.text(
          parent,
          key,
          row.field,
          typeof row.choices === "string" ? SPEC[row.choices] : (row.choices ?? null),
        );
        break;
      case "ids":
        this.ids(parent, key, row.field);
        break;
      case "id_map":
        this.idMap(parent, key, row.field);
        break;
      case "boolean":
        if (typeof parent[key] !== "boolean") this.fail(row.field, parent[key], "expected true or false");
        break;
      default: // a spec this host does not understand: refuse loudly rather than skip a check
        throw new Error(
          `${SPEC_URL}: fields[${row.field}] has type ${JSON.stringify(row.type)}; ` +
            "this host knows integer, number, string, ids, id_map, boolean",
        );
    }
  }
}

/**
 * Every field a host reads has its type and range, and the fields stated twice agree: check 3 of
 * docs/bundle-format.md, as runtime/bundle.py's validate_meta. The per-field checks are the
 * spec's `fields` table (spec/bundle.json), in its order; the checks that relate fields to each
 * other, and those of files, graphs and tokenizers, follow it.
 * @param {any} meta  bundle.json as parsed
 * @param {string} where  bundle.json's path or URL, for messages
 * @param {Map<string, string>} [fractions]  numberLiterals(text) of bundle.json's text: an integer field
 *   written with a fraction or an exponent (2.0, 2e0) is refused, as the Python runtime refuses it
 * @throws {BundleError} naming the field, its value and what was expected
 */
export function validateMeta(meta, where, fractions = new Map()) {
  const v = new Schema(where, fractions);
  for (const row of SPEC.fields) v.field(meta, row);
  const { model, special_ids: special } = meta;
  if (model.d_model % model.n_heads && !model.d_kv)
    v.fail("model.d_model", model.d_model, `expected a multiple of model.n_heads=${model.n_heads}`);
  if (meta.max_positions !== model.max_positions) {
    v.fail(
      "max_positions",
      meta.max_positions,
      `expected model.max_positions=${model.max_positions} (the same value twice)`,
    );
  }
  // The tokens section's ids (its types were checked by the table): inside the vocabularies they go to.
  const tokens = meta.tokens ?? {};
  const src = model.src_vocab_size;
  const both = Math.min(src, model.tgt_vocab_size);
  const inside = [
    [SOURCE_PREFIX, src, "the source vocabulary"],
    ["source_suffix", src, "the source vocabulary"],
    [TARGET_PREFIX, model.tgt_vocab_size, "the target vocabulary"],
  ];
  for (const [key, size, what] of inside) {
    if (key in tokens && tokens[key].some((id) => id >= size))
      v.fail(`tokens.${key}`, tokens[key], `expected ids inside ${what} [0, ${size})`);
  }
  if (tokens.languages && Object.values(tokens.languages).some((id) => id >= both)) {
    v.fail("tokens.languages", tokens.languages, `expected ids inside both vocabularies [0, ${both})`);
  }
  for (const key of ["pad", "unk", "bos", "eos", "decoder_start"]) {
    const value = special[key];
    const vocab =
      key === "decoder_start" ? model.tgt_vocab_size : Math.min(model.src_vocab_size, model.tgt_vocab_size);
    if (value >= vocab)
      v.fail(`special_ids.${key}`, value, `expected an id inside the vocabulary [0, ${vocab})`);
    const modelKey = key === "decoder_start" ? "decoder_start_id" : `${key}_id`;
    if (modelKey in model && model[modelKey] !== value) {
      v.fail(
        `special_ids.${key}`,
        value,
        `expected model.${modelKey}=${short(model[modelKey])} (the same id twice)`,
      );
    }
  }
  const files = v.obj(meta, "files", "files");
  for (const key of [...FILE_KEYS, ...OPTIONAL_FILE_KEYS.filter((k) => k in files)]) {
    const entry = v.obj(files, key, `files.${key}`);
    // the path's length before any path operation on it (runtime/meta.py's _check_entry)
    const where = v.text(entry, "path", `files.${key}.path`);
    if (where.includes("\0")) v.fail(`files.${key}.path`, where, "expected a path without a NUL character");
    if (where.length > ENTRY.max_path_chars) {
      v.fail(`files.${key}.path`, where, `expected a path of at most ${ENTRY.max_path_chars} characters`);
    }
    const digest = v.text(entry, "sha256", `files.${key}.sha256`);
    if (!new RegExp(`^[0-9a-f]{${ENTRY.sha256_hex_digits}}$`).test(digest)) {
      v.fail(`files.${key}.sha256`, digest, `expected ${ENTRY.sha256_hex_digits} lowercase hex digits`);
    }
    v.integer(entry, ENTRY.size_field, `files.${key}.${ENTRY.size_field}`, { required: false });
  }
  const weights = files[WEIGHTS];
  if (weights && typeof weights === "object" && CHECKSUM.field in weights) {
    // bundles before it have none
    const value = weights[CHECKSUM.field];
    if (typeof value !== "string" || !new RegExp(`^[0-9a-f]{${CHECKSUM.hex_digits}}$`).test(value)) {
      v.fail(
        `files.${WEIGHTS}.${CHECKSUM.field}`,
        value,
        `expected ${CHECKSUM.hex_digits} lowercase hex digits (the file's CRC-32)`,
      );
    }
  }
  const graphs = v.obj(meta, "graphs", "graphs");
  const labels = [ENCODER_LABEL, DECODER_LABELS[STANDARD]];
  for (const key of OPTIONAL_GRAPH_KEYS) {
    // an optional graph is described exactly when its file is listed
    if (key in files !== key in graphs) {
      const [has, lacks] = key in files ? ["files", "graphs"] : ["graphs", "files"];
      v.fail(`${lacks}.${key}`, undefined, `expected because ${has}.${key} is present`);
    }
    if (key in files) labels.push(key);
  }
  for (const label of labels) {
    const graph = v.obj(graphs, label, `graphs.${label}`);
    if ("variant" in graph)
      v.text(graph, "variant", `graphs.${label}.variant`, [
        label === DECODER_LABELS[FUSED] ? FUSED : STANDARD,
      ]);
    if (
      "domains" in graph &&
      !(Array.isArray(graph.domains) && graph.domains.every((d) => typeof d === "string"))
    ) {
      v.fail(`graphs.${label}.domains`, graph.domains, "expected a list of operator domains (strings)");
    }
    for (const side of ["inputs", "outputs"]) {
      const items = graph[side];
      if (!Array.isArray(items) || !items.length)
        v.fail(`graphs.${label}.${side}`, items, "expected a non-empty list");
      items.forEach((item, i) => {
        const field = `graphs.${label}.${side}[${i}]`;
        if (!isObject(item)) v.fail(field, item, "expected an object");
        v.text(item, "name", `${field}.name`);
        v.text(item, "dtype", `${field}.dtype`);
        const shape = item.shape;
        if (
          !Array.isArray(shape) ||
          !shape.every((d) => typeof d === "string" || (Number.isInteger(d) && d >= 0))
        ) {
          v.fail(`${field}.shape`, shape, "expected a list of sizes (integers) and axis names (strings)");
        }
      });
    }
  }
  if (meta.tokenizers !== undefined && meta.tokenizers !== null) {
    // optional: vocabulary fingerprints (src/checks.js)
    const tokenizers = v.obj(meta, "tokenizers", "tokenizers");
    for (const side of ["source", "target"]) {
      const entry = v.obj(tokenizers, side, `tokenizers.${side}`);
      v.integer(entry, "pieces", `tokenizers.${side}.pieces`, { low: 1 });
      v.text(entry, "pieces_sha256", `tokenizers.${side}.pieces_sha256`);
    }
  }
}

/**
 * Reads and validates a bundle directory before anything is loaded from it: checks 1-4 of
 * docs/bundle-format.md, as runtime/bundle.py's read_bundle. The tokenizers' and graphs' own
 * statements are checked once they are loaded (src/checks.js).
 * @param {string} dir
 * @param {Platform} platform
 * @param {{checkHashes?: boolean}} [options]  checkHashes: false skips only the hash comparison
 * @returns {Promise<Bundle>}
 * @throws {BundleError} naming the file, the field and the problem: missing files, invalid or
 *   over-large JSON, another format or version, a field of the wrong type or range, file names
 *   that leave the bundle, hashes that do not match
 */
export async function readBundle(dir, platform, { checkHashes = true } = {}) {
  const metaPath = platform.join(dir, BUNDLE_JSON);
  let raw;
  try {
    raw = await platform.readFile(metaPath, { maxBytes: MAX_JSON_BYTES });
  } catch (e) {
    if (e && (e.code === "ENOENT" || e.code === "ENOTDIR")) {
      throw new BundleError(
        `${metaPath}: missing; ${dir} is not a seq2onnx bundle (make one with \`seq2onnx export CHECKPOINT ${dir}\`)`,
      );
    }
    if (e?.code === "EFBIG") throw tooLarge(metaPath, e.size);
    throw unreadable(metaPath, e);
  }
  if (raw.length > MAX_JSON_BYTES) throw tooLarge(metaPath, raw.length); // a platform that cannot tell before reading
  let meta;
  let text;
  try {
    text = new TextDecoder("utf-8", { fatal: true }).decode(raw);
    meta = JSON.parse(text);
  } catch (e) {
    throw new BundleError(`${metaPath}: invalid JSON (${e.message}); re-export the bundle`);
  }
  if (!isObject(meta) || meta.format !== FORMAT) {
    throw new BundleError(
      `${metaPath}: not a ${FORMAT} description (format=${short(isObject(meta) ? (meta.format ?? null) : null)})`,
    );
  }
  // JSON.parse reads 1.0 as 1: the text tells whether the version is an integer, as Python's json does.
  const fractions = numberLiterals(text);
  if (meta.format_version !== FORMAT_VERSION || fractions.has("format_version")) {
    const version = fractions.get("format_version") ?? short(meta.format_version ?? null);
    throw new BundleError(
      `${metaPath}: format_version ${version}, this host reads version ${FORMAT_VERSION} (an integer); ` +
        "re-export the bundle with a matching seq2onnx or install the matching host",
    );
  }
  validateMeta(meta, metaPath, fractions);
  const files = {};
  const paths = {};
  let weightsSize = 0;
  for (const key of [...FILE_KEYS, ...OPTIONAL_FILE_KEYS.filter((k) => k in meta.files)]) {
    const entry = meta.files[key];
    const where = await platform.resolveInside(dir, entry.path);
    if (!where.inside) {
      throw new BundleError(
        `${metaPath}: files.${key}.path ${JSON.stringify(entry.path)} points outside the bundle; refusing it`,
      );
    }
    if (!where.exists)
      throw new BundleError(`${where.path}: missing from the bundle (files.${key} in ${BUNDLE_JSON})`);
    paths[key] = where.path;
    // the fused decoder is read only to be hashed (this host never loads it); the maps are kept; the
    // weights file is read for its hash and size, and kept where the platform hands onnxruntime bytes
    if (!checkHashes && !KEPT_FILE_KEYS.includes(key) && key !== WEIGHTS) continue;
    // a weights file the platform does not keep is copied where only this process runs it (a private
    // folder: platform.privateCopy) and hashed on the way, as a stream: it may be past 2 GiB
    const streamed = key === WEIGHTS && !platform.keepsWeights && platform.privateCopy;
    const size = entry[ENTRY.size_field]; // checked before a byte is read, where the bundle records it
    let bytes;
    let digest;
    try {
      if (streamed) digest = await platform.privateCopy(where.path, entry.path, { size });
      else bytes = await platform.readFile(where.path, { size });
    } catch (e) {
      if (e && (e.code === "ENOENT" || e.code === "ENOTDIR")) {
        throw new BundleError(`${where.path}: missing from the bundle (files.${key} in ${BUNDLE_JSON})`);
      }
      if (e?.code === "ESIZE") throw wrongSize(where.path, e.size, size, key);
      throw unreadable(where.path, e, `files.${key} in ${BUNDLE_JSON}`);
    }
    if (bytes && size !== undefined && bytes.length !== size)
      throw wrongSize(where.path, bytes.length, size, key);
    if (streamed) paths.weightsFolder = digest.folder;
    if (checkHashes && (streamed ? digest.sha256 : await platform.sha256(bytes)) !== entry.sha256) {
      throw new BundleError(
        `${where.path}: sha256 differs from ${BUNDLE_JSON} (files.${key}); the file is damaged or was replaced: re-export the bundle`,
      );
    }
    if (KEPT_FILE_KEYS.includes(key) || (key === WEIGHTS && platform.keepsWeights)) files[key] = bytes;
    if (key === WEIGHTS) weightsSize = streamed ? digest.size : bytes.length;
  }
  return { path: dir, metaPath, meta, files, paths, weightsSize };
}

/** A file whose size is not bundle.json's files.<key>.size (the words of runtime/bundle.py). */
function wrongSize(file, size, recorded, key) {
  return new BundleError(
    `${file}: ${size} bytes, ${BUNDLE_JSON} records ${recorded} (${ENTRY.size_field}); the file is ` +
      `damaged or was replaced: re-export the bundle (files.${key} in ${BUNDLE_JSON})`,
  );
}

function tooLarge(metaPath, size) {
  return new BundleError(
    `${metaPath}: ${size} bytes, more than the ${MAX_JSON_BYTES} a bundle description can be; ` +
      `this is not a ${BUNDLE_JSON} made by \`seq2onnx export\` (re-export the bundle)`,
  );
}

/** A bundle file that cannot be read: not a regular file (refused before reading), or an I/O error. */
function unreadable(file, e, what = null) {
  if (e?.code === "ENOTREG") {
    // the words of runtime/bundle.py, with what the file is
    const kind = e.kind ?? "a device, pipe or socket";
    return new BundleError(
      `${file}: not a regular file (${what ? `${kind}; ${what}` : kind}); a bundle holds ` +
        "files: re-export it with `seq2onnx export` (a link to a device or a named pipe is never one)",
    );
  }
  return new BundleError(`${file}: cannot be read (${e?.message ?? e})`);
}
