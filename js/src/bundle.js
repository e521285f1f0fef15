// The bundle contract of docs/bundle-format.md, checked as runtime/bundle.py's read_bundle does,
// through a platform adapter (files, paths, hashing) so that the same checks serve Node and the
// browser.

export const FORMAT = "seq2onnx-bundle";
export const FORMAT_VERSION = 1;
export const BUNDLE_JSON = "bundle.json";
export const FILE_KEYS = ["encoder", "decoder", "source_tokenizer", "target_tokenizer"];

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
 * @property {any} meta  bundle.json as read
 * @property {Record<string, Uint8Array>} files  the bytes of encoder, decoder, source_tokenizer,
 *   target_tokenizer: exactly the bytes that were hashed, so what is loaded is what was checked
 */

/**
 * Reads and validates a bundle directory before anything is loaded from it.
 * @param {string} dir
 * @param {Platform} platform
 * @param {{checkHashes?: boolean}} [options]
 * @returns {Promise<Bundle>}
 * @throws {BundleError} naming the file and the problem: missing files, invalid JSON, another
 *   format or version, file names that leave the bundle, hashes that do not match
 */
export async function readBundle(dir, platform, { checkHashes = true } = {}) {
  const metaPath = platform.join(dir, BUNDLE_JSON);
  let raw;
  try {
    raw = await platform.readFile(metaPath);
  } catch (e) {
    if (e && e.code === "ENOENT") {
      throw new BundleError(`${metaPath}: missing; ${dir} is not a seq2onnx bundle (make one with \`seq2onnx export CHECKPOINT ${dir}\`)`);
    }
    throw new BundleError(`${metaPath}: cannot be read (${e?.message ?? e})`);
  }
  let meta;
  try {
    meta = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(raw));
  } catch (e) {
    throw new BundleError(`${metaPath}: invalid JSON (${e.message}); re-export the bundle`);
  }
  const isObject = meta !== null && typeof meta === "object" && !Array.isArray(meta);
  if (!isObject || meta.format !== FORMAT) {
    throw new BundleError(`${metaPath}: not a ${FORMAT} description (format=${JSON.stringify(isObject ? meta.format ?? null : null)})`);
  }
  if (meta.format_version !== FORMAT_VERSION) {
    throw new BundleError(
      `${metaPath}: format_version ${JSON.stringify(meta.format_version ?? null)}, this host reads version ${FORMAT_VERSION}; ` +
        "re-export the bundle with a matching seq2onnx or install the matching host",
    );
  }
  for (const key of ["model", "special_ids", "decoding", "files", "graphs", "dtype"]) {
    if (!(key in meta)) throw new BundleError(`${metaPath}: missing the field '${key}'; re-export the bundle`);
  }
  const files = {};
  for (const key of FILE_KEYS) {
    const entry = meta.files?.[key];
    if (!entry || typeof entry !== "object" || typeof entry.path !== "string") {
      throw new BundleError(`${metaPath}: files.${key} is missing or has no path`);
    }
    const where = await platform.resolveInside(dir, entry.path);
    if (!where.inside) {
      throw new BundleError(`${metaPath}: files.${key}.path ${JSON.stringify(entry.path)} points outside the bundle; refusing it`);
    }
    if (!where.exists) throw new BundleError(`${where.path}: missing from the bundle (files.${key} in ${BUNDLE_JSON})`);
    const bytes = await platform.readFile(where.path);
    if (checkHashes && (await platform.sha256(bytes)) !== entry.sha256) {
      throw new BundleError(
        `${where.path}: sha256 differs from bundle.json (files.${key}); the file is damaged or was replaced: re-export the bundle`,
      );
    }
    files[key] = bytes;
  }
  return { path: dir, meta, files };
}
