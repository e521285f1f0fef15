// The bundle contract of docs/bundle-format.md, checked as runtime/bundle.py's read_bundle does
// (checks 1-4 of "Checks a host must do": bundle.json, its fields' types and ranges, the files'
// paths and hashes), through a platform adapter (files, paths, hashing) so that the same checks
// serve Node and the browser. The checks that need the tokenizers and sessions are src/checks.js.

export const FORMAT = "seq2onnx-bundle";
export const FORMAT_VERSION = 1;
export const BUNDLE_JSON = "bundle.json";
export const FILE_KEYS = ["encoder", "decoder", "source_tokenizer", "target_tokenizer"];
// Files a bundle may have. This host never loads decoder_fused (onnxruntime's com.microsoft
// kernels, which onnxruntime-web lacks), but checks it as the Python runtime does: a damaged
// bundle is refused whichever host reads it.
export const OPTIONAL_FILE_KEYS = ["decoder_fused"];
export const MAX_JSON_BYTES = 1 << 20; // a real bundle.json is ~10 kB: anything near this is not one
export const DTYPES = ["float32", "float16"]; // the key/value element types a host can feed

// Graph input and output names (runtime/bundle.py defines them; bundle.json lists them).
export const SRC_IDS = "src_ids";
export const SRC_LENGTHS = "src_lengths";
export const SRC_MASK = "src_mask";
export const TOKENS = "tokens";
export const STEP = "step";
export const CACHE_INDICES = "cache_indices";
export const TOP_K = "top_k";
export const LOG_PROBS = "log_probs";
export const TOPK_LOG_PROBS = "topk_log_probs";
export const TOPK_IDS = "topk_ids";
// the standard decoder's last-layer cross-attention averaged over heads [rows, src_len] (0.3 and later)
export const CROSS_ATTENTION = "cross_attention";

/** @param {number} n */
export const crossNames = (n) => Array.from({ length: n }, (_, i) => [`key_cross_${i}`, `value_cross_${i}`]).flat();
/** @param {number} n */
export const pastNames = (n) => Array.from({ length: n }, (_, i) => [`past_key_self_${i}`, `past_value_self_${i}`]).flat();
/** @param {number} n */
export const presentNames = (n) =>
  Array.from({ length: n }, (_, i) => [`present_key_self_${i}`, `present_value_self_${i}`]).flat();

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
 * @property {(path: string) => Promise<Uint8Array>} readFile  rejects with code "ENOENT" when missing
 * @property {(dir: string, rel: string) => Promise<{inside: boolean, exists: boolean, path: string}>} resolveInside
 *   where `rel` leads from `dir` (symbolic links followed) and whether that lies inside `dir`
 * @property {(bytes: Uint8Array) => Promise<string>} sha256  lowercase hex digest
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
  constructor(where) {
    this.where = where;
  }

  fail(field, value, want) {
    throw new BundleError(`${this.where}: ${field} is ${short(value)}, ${want}; ${FIX_FIELD}`);
  }

  obj(parent, key, field) {
    if (!(key in parent)) throw new BundleError(`${this.where}: missing the field '${field}'; re-export the bundle with \`seq2onnx export\``);
    if (!isObject(parent[key])) this.fail(field, parent[key], "expected an object");
    return parent[key];
  }

  integer(parent, key, field, { low = 0, required = true } = {}) {
    if (!(key in parent) && !required) return null;
    const value = parent[key];
    if (!Number.isInteger(value) || value < low) this.fail(field, value, `expected an integer >= ${low}`);
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
}

/**
 * Every field a host reads has its type and range, and the fields stated twice agree: check 3 of
 * docs/bundle-format.md, as runtime/bundle.py's validate_meta.
 * @param {any} meta  bundle.json as parsed
 * @param {string} where  bundle.json's path or URL, for messages
 * @throws {BundleError} naming the field, its value and what was expected
 */
export function validateMeta(meta, where) {
  const v = new Schema(where);
  const model = v.obj(meta, "model", "model");
  const sizes = {};
  for (const k of ["src_vocab_size", "tgt_vocab_size", "d_model", "n_heads", "n_decoder_layers", "max_positions"]) {
    sizes[k] = v.integer(model, k, `model.${k}`, { low: 1 });
  }
  v.integer(model, "n_encoder_layers", "model.n_encoder_layers", { low: 1, required: false });
  if (sizes.d_model % sizes.n_heads) v.fail("model.d_model", sizes.d_model, `expected a multiple of model.n_heads=${sizes.n_heads}`);
  const top = v.integer(meta, "max_positions", "max_positions", { low: 1 });
  if (top !== sizes.max_positions) {
    v.fail("max_positions", top, `expected model.max_positions=${sizes.max_positions} (the same value twice)`);
  }
  const special = v.obj(meta, "special_ids", "special_ids");
  for (const key of ["pad", "unk", "bos", "eos", "decoder_start"]) {
    const value = v.integer(special, key, `special_ids.${key}`);
    const vocab = key === "decoder_start" ? sizes.tgt_vocab_size : Math.min(sizes.src_vocab_size, sizes.tgt_vocab_size);
    if (value >= vocab) v.fail(`special_ids.${key}`, value, `expected an id inside the vocabulary [0, ${vocab})`);
    const modelKey = key === "decoder_start" ? "decoder_start_id" : `${key}_id`;
    if (modelKey in model && model[modelKey] !== value) {
      v.fail(`special_ids.${key}`, value, `expected model.${modelKey}=${short(model[modelKey])} (the same id twice)`);
    }
  }
  v.text(meta, "dtype", "dtype", DTYPES);
  if (meta.quantization !== undefined && meta.quantization !== null) v.text(meta, "quantization", "quantization", ["int8"]);
  const decoding = v.obj(meta, "decoding", "decoding");
  v.integer(decoding, "beam_size", "decoding.beam_size", { low: 1 });
  v.real(decoding, "length_penalty", "decoding.length_penalty");
  v.real(decoding, "max_length_a", "decoding.max_length_a", 0);
  v.integer(decoding, "max_length_b", "decoding.max_length_b");
  v.integer(decoding, "min_length", "decoding.min_length", { required: false });
  const files = v.obj(meta, "files", "files");
  for (const key of [...FILE_KEYS, ...OPTIONAL_FILE_KEYS.filter((k) => k in files)]) {
    const entry = v.obj(files, key, `files.${key}`);
    v.text(entry, "path", `files.${key}.path`);
    v.text(entry, "sha256", `files.${key}.sha256`);
  }
  const graphs = v.obj(meta, "graphs", "graphs");
  const labels = ["encoder", "decoder"];
  for (const key of OPTIONAL_FILE_KEYS) { // an optional graph is described exactly when its file is listed
    if ((key in files) !== (key in graphs)) {
      const [has, lacks] = key in files ? ["files", "graphs"] : ["graphs", "files"];
      v.fail(`${lacks}.${key}`, undefined, `expected because ${has}.${key} is present`);
    }
    if (key in files) labels.push(key);
  }
  for (const label of labels) {
    const graph = v.obj(graphs, label, `graphs.${label}`);
    if ("variant" in graph) v.text(graph, "variant", `graphs.${label}.variant`, [label === "decoder_fused" ? "fused" : "standard"]);
    if ("domains" in graph && !(Array.isArray(graph.domains) && graph.domains.every((d) => typeof d === "string"))) {
      v.fail(`graphs.${label}.domains`, graph.domains, "expected a list of operator domains (strings)");
    }
    for (const side of ["inputs", "outputs"]) {
      const items = graph[side];
      if (!Array.isArray(items) || !items.length) v.fail(`graphs.${label}.${side}`, items, "expected a non-empty list");
      items.forEach((item, i) => {
        const field = `graphs.${label}.${side}[${i}]`;
        if (!isObject(item)) v.fail(field, item, "expected an object");
        v.text(item, "name", `${field}.name`);
        v.text(item, "dtype", `${field}.dtype`);
        const shape = item.shape;
        if (!Array.isArray(shape) || !shape.every((d) => typeof d === "string" || (Number.isInteger(d) && d >= 0))) {
          v.fail(`${field}.shape`, shape, "expected a list of sizes (integers) and axis names (strings)");
        }
      });
    }
  }
  if (meta.tokenizers !== undefined && meta.tokenizers !== null) { // optional: vocabulary fingerprints (src/checks.js)
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
    raw = await platform.readFile(metaPath);
  } catch (e) {
    if (e && (e.code === "ENOENT" || e.code === "ENOTDIR")) {
      throw new BundleError(`${metaPath}: missing; ${dir} is not a seq2onnx bundle (make one with \`seq2onnx export CHECKPOINT ${dir}\`)`);
    }
    throw new BundleError(`${metaPath}: cannot be read (${e?.message ?? e})`);
  }
  if (raw.length > MAX_JSON_BYTES) {
    throw new BundleError(`${metaPath}: ${raw.length} bytes, more than the ${MAX_JSON_BYTES} a bundle description can be; ` +
      "this is not a bundle.json made by `seq2onnx export`");
  }
  let meta;
  try {
    meta = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(raw));
  } catch (e) {
    throw new BundleError(`${metaPath}: invalid JSON (${e.message}); re-export the bundle`);
  }
  if (!isObject(meta) || meta.format !== FORMAT) {
    throw new BundleError(`${metaPath}: not a ${FORMAT} description (format=${short(isObject(meta) ? meta.format ?? null : null)})`);
  }
  // JSON.parse reads 1.0 as 1: this host cannot tell them apart (the Python runtime refuses 1.0).
  if (meta.format_version !== FORMAT_VERSION) {
    throw new BundleError(
      `${metaPath}: format_version ${short(meta.format_version ?? null)}, this host reads version ${FORMAT_VERSION} (an integer); ` +
        "re-export the bundle with a matching seq2onnx or install the matching host",
    );
  }
  validateMeta(meta, metaPath);
  const files = {};
  const paths = {};
  for (const key of [...FILE_KEYS, ...OPTIONAL_FILE_KEYS.filter((k) => k in meta.files)]) {
    const entry = meta.files[key];
    const where = await platform.resolveInside(dir, entry.path);
    if (!where.inside) {
      throw new BundleError(`${metaPath}: files.${key}.path ${JSON.stringify(entry.path)} points outside the bundle; refusing it`);
    }
    if (!where.exists) throw new BundleError(`${where.path}: missing from the bundle (files.${key} in ${BUNDLE_JSON})`);
    paths[key] = where.path;
    if (!checkHashes && !FILE_KEYS.includes(key)) continue; // an optional file is read only to be hashed
    const bytes = await platform.readFile(where.path);
    if (checkHashes && (await platform.sha256(bytes)) !== entry.sha256) {
      throw new BundleError(
        `${where.path}: sha256 differs from bundle.json (files.${key}); the file is damaged or was replaced: re-export the bundle`,
      );
    }
    if (FILE_KEYS.includes(key)) files[key] = bytes;
  }
  return { path: dir, metaPath, meta, files, paths };
}
