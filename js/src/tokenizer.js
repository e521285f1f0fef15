// SentencePiece through @sctg/sentencepiece-js: the C++ library itself compiled to WebAssembly,
// so that the pieces are the Python runtime's (sentencepiece's Python package wraps the same
// C++ code) rather than those of a re-implementation. It runs in Node and in the browser.
import { SentencePieceProcessor } from "@sctg/sentencepiece-js";

// Python's str.isspace() set: a text made only of these is "empty" for the Python runtime
// (str.strip()), which differs from String.prototype.trim() on \x1c-\x1f, \x85 and \ufeff.
const PY_SPACE_ONLY = /^[\t\n\v\f\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]*$/;
// A lone UTF-16 surrogate: Python replaces it by "?" before encoding (text.encode("utf-8", "replace")).
const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g;

/** Whether the Python runtime treats this text as empty (nothing to translate). */
export function isBlank(text) {
  return PY_SPACE_ONLY.test(text);
}

/** One SentencePiece model. */
export class SentencePiece {
  /** @param {SentencePieceProcessor} processor */
  constructor(processor) {
    this.processor = processor;
  }

  /**
   * Loads a model from the bytes of a `.model` file.
   * @param {Uint8Array} bytes
   * @param {string} [name] for error messages
   * @throws {Error} when the bytes are not a SentencePiece model
   */
  static async fromBytes(bytes, name = "SentencePiece model") {
    const spp = new SentencePieceProcessor();
    // load() takes a file path (Node only); _loadModel takes the bytes, which any platform has.
    await spp._loadModel(bytes);
    const status = spp.processor.status();
    const message = status.ToString();
    status.delete();
    if (message !== "OK") throw new Error(`${name}: not a SentencePiece model (${message})`);
    return new SentencePiece(spp);
  }

  /** Piece ids of a text: plain encoding, no begin/end tokens; lone surrogates become "?". */
  encode(text) {
    return this.processor.encodeIds(text.replace(LONE_SURROGATE, "?"));
  }

  /** The pieces of a text, as encode's ids ("▁" marks a word's start). */
  pieces(text) {
    return this.processor.encodePieces(text.replace(LONE_SURROGATE, "?"));
  }

  /** The text of piece ids. */
  decode(ids) {
    return ids.length ? this.processor.decodeIds(ids) : "";
  }
}
