// SentencePiece through @sctg/sentencepiece-js: the C++ library itself compiled to WebAssembly,
// so that normalisation, BPE and decoding are the Python runtime's (sentencepiece's Python
// package wraps the same C++ code) rather than those of a re-implementation. It runs in Node and
// in the browser.
//
// One step is redone here: the unigram segmentation. @sctg/sentencepiece-js 1.3.3 compiles
// sentencepiece at commit d8f7418 (August 2024, after 0.2.0), whose optimised Viterbi
// (unigram_model.cc, Model::EncodeOptimized) adds a piece's score to the best path in double
// precision (the user-defined-symbol branch of its `?:` is a double, so the whole expression is)
// and compares that with a best score stored as float. sentencepiece 0.2.1 and later (what
// `pip install sentencepiece` gives) add in float: paths whose scores round to the same float tie,
// and the earlier start wins. On runs of one letter ("iiiiiiiiiiiiii" -> ▁ iiiiii iiiiiiii in
// Python, ▁ iiiiiiii iiiiii in the WASM), where several segmentations use the same pieces in
// another order, the two differ; both decode to the same text. So for unigram models the WASM
// gives the normalised text (its pieces, concatenated) and UnigramEncoder below segments it as
// sentencepiece 0.2.3's Model::EncodeOptimized and SentencePieceProcessor::EncodeOptimized do:
// float32 sums, ties to the earlier start, user-defined pieces scored 0.1 x (bytes - 1), unknown
// characters scored min_score - 10, runs of unknowns merged into one id, or split into <0xXX>
// byte pieces when the model has byte_fallback.
//
// Also here: Tokens, the tokens section of bundle.json and the vocabulary maps of models imported
// from Hugging Face (docs/bundle-format.md, "Tokenization"): the ids around a source's text ids,
// language codes, and the target ids -> text.
import { SentencePieceProcessor } from "@sctg/sentencepiece-js";
import { SOURCE_PREFIX, short, TARGET_LANG_IN, VOCAB_MAP } from "./bundle.js";
import { MODEL_TYPES, PIECE_TYPES, readVocabulary } from "./checks.js";

// Python's str.isspace() set: a text made only of these is "empty" for the Python runtime
// (str.strip()), which differs from String.prototype.trim() on \x1c-\x1f, \x85 and \ufeff.
const PY_SPACE =
  "\\t\\n\\v\\f\\r\\x1c-\\x1f \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000";
const PY_SPACE_ONLY = new RegExp(`^[${PY_SPACE}]*$`);
const PY_STRIP = new RegExp(`^[${PY_SPACE}]+|[${PY_SPACE}]+$`, "g"); // str.strip()
// Marian's leading target-language code, e.g. >>fra<< (runtime/vocab.py's _CODE; Python's \s is str.isspace())
const LANGUAGE_CODE = new RegExp(`^>>([^<>${PY_SPACE}]+)<<`);
const TRAILING_SPACE = /[ \t\n\r\f]$/; // runtime/vocab.py's SPACES: a text that ends so gets tokens.trailing_space
// A lone UTF-16 surrogate: Python replaces it by "?" before encoding (text.encode("utf-8", "replace")).
const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g;

/** Whether the Python runtime treats this text as empty (nothing to translate). */
export function isBlank(text) {
  return PY_SPACE_ONLY.test(text);
}

const UNK_PENALTY = 10; // unigram_model.cc kUnkPenalty
const SCORE_RESET = 100000; // unigram_model.cc kScoreResetThreshold (0.2.3): rebases long paths' scores
const f32 = Math.fround; // float32 + float32 computed in double and rounded once is the float32 sum
const utf8Encoder = new TextEncoder();
/** util.h OneCharLen: the length of a UTF-8 sequence from its first byte. */
const oneCharLen = (byte) => [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4][byte >> 4];

/**
 * sentencepiece 0.2.3's unigram segmentation (Model::EncodeOptimized, then the id list of
 * SentencePieceProcessor::EncodeOptimized) over an already normalised text.
 */
export class UnigramEncoder {
  /** @param {ReturnType<typeof readVocabulary>} model */
  constructor({ pieces, types, scores, byteFallback }) {
    const { NORMAL, UNKNOWN, USER_DEFINED, UNUSED, BYTE } = PIECE_TYPES;
    this.scores = scores;
    this.types = types;
    this.byteFallback = byteFallback;
    this.unkId = types.indexOf(UNKNOWN);
    let min = 3.4028234663852886e38; // FLT_MAX: min_score_ over the normal pieces
    types.forEach((t, i) => {
      if (t === NORMAL && scores[i] < min) min = scores[i];
    });
    this.unkScore = f32(min - UNK_PENALTY);
    // The trie of the pieces that segmentation may use (NORMAL, USER_DEFINED, UNUSED: InitializePieces
    // with the reserved id map), over their UTF-8 bytes: node -> Map(byte -> node), and each node's id.
    this.next = [new Map()];
    this.ids = [-1];
    types.forEach((t, id) => {
      if (t !== NORMAL && t !== USER_DEFINED && t !== UNUSED) return;
      let node = 0;
      for (const byte of utf8Encoder.encode(pieces[id])) {
        let child = this.next[node].get(byte);
        if (child === undefined) {
          child = this.next.length;
          this.next.push(new Map());
          this.ids.push(-1);
          this.next[node].set(byte, child);
        }
        node = child;
      }
      this.ids[node] = id;
    });
    // PieceToId("<0xXX>") for byte fallback (the unknown id where a byte piece is missing)
    const byId = new Map(pieces.map((p, i) => [p, i]));
    this.byteIds = Array.from({ length: 256 }, (_, b) => {
      const id = byId.get(`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`);
      return id !== undefined && types[id] === BYTE ? id : this.unkId;
    });
  }

  /**
   * Piece ids of a normalised text.
   * @param {Uint8Array} text  UTF-8
   * @returns {number[]}
   */
  encode(text) {
    return this.segment(text).map((p) => p.id);
  }

  /**
   * The pieces of a normalised text: [from, end) byte spans with their ids, as
   * SentencePieceProcessor::EncodeOptimized emits them (a run of unknowns one piece, an unknown of
   * a byte-fallback model one piece per byte).
   * @param {Uint8Array} text  UTF-8
   * @returns {{id: number, from: number, end: number}[]}
   */
  segment(text) {
    const size = text.length;
    if (!size) return [];
    const { USER_DEFINED, UNUSED, UNKNOWN } = PIECE_TYPES;
    const score = new Float64Array(size + 1); // float32 values: best path score ending at each byte
    const start = new Int32Array(size + 1).fill(-1);
    const id = new Int32Array(size + 1).fill(-1);
    const offer = (end, from, candidate, piece) => {
      if (start[end] === -1 || candidate > score[end]) {
        // ties: the earlier start, offered first, stays
        score[end] = candidate;
        start[end] = from;
        id[end] = piece;
      }
    };
    let frontier = 0;
    for (let from = 0; from < size; ) {
      let here = score[from];
      if (here < -SCORE_RESET || here > SCORE_RESET) {
        // 0.2.3: subtract the offset from the open ends
        for (let i = from; i <= frontier; i++) {
          if (i === from || start[i] !== -1) score[i] = f32(score[i] - here);
        }
        here = 0;
      }
      const charLen = Math.min(oneCharLen(text[from]), size - from);
      let single = false;
      for (let node = 0, end = from; end < size; ) {
        node = this.next[node].get(text[end++]);
        if (node === undefined) break;
        const piece = this.ids[node];
        if (piece < 0 || this.types[piece] === UNUSED) continue;
        frontier = Math.max(frontier, end);
        const length = end - from;
        const own = this.types[piece] === USER_DEFINED ? f32(0.1 * (length - 1)) : this.scores[piece];
        offer(end, from, f32(own + here), piece);
        if (length === charLen) single = true;
      }
      if (!single) {
        frontier = Math.max(frontier, from + charLen);
        offer(from + charLen, from, f32(this.unkScore + here), this.unkId);
      }
      from += charLen;
    }
    const path = [];
    for (let end = size; end > 0; end = start[end]) path.push([start[end], end, id[end]]);
    path.reverse();
    const out = [];
    let previousUnknown = false;
    for (const [from, end, piece] of path) {
      const unknown = piece === this.unkId || this.types[piece] === UNKNOWN;
      if (unknown && this.byteFallback) {
        for (let i = from; i < end; i++) out.push({ id: this.byteIds[text[i]], from: i, end: i + 1 });
      } else if (unknown && previousUnknown) {
        // a run of unknowns is one piece
        out[out.length - 1].end = end;
      } else {
        out.push({ id: piece, from, end });
      }
      previousUnknown = unknown;
    }
    return out;
  }
}

/** One SentencePiece model. */
export class SentencePiece {
  /**
   * @param {SentencePieceProcessor} processor
   * @param {ReturnType<typeof readVocabulary> | null} [model]  the model's pieces: a unigram model is
   *   segmented by UnigramEncoder (see the top of this file); null: the WASM's ids as they are
   */
  constructor(processor, model = null) {
    this.processor = processor;
    this.model = model;
    this.unigram = model && model.modelType === MODEL_TYPES.UNIGRAM ? new UnigramEncoder(model) : null;
    this.pieceBytes = model ? model.pieces.map((p) => utf8Encoder.encode(p)) : null;
    this.byteValue = model
      ? new Map(
          model.pieces.flatMap((p, i) =>
            model.types[i] === PIECE_TYPES.BYTE && /^<0x[0-9A-F]{2}>$/.test(p)
              ? [[p, parseInt(p.slice(3, 5), 16)]]
              : [],
          ),
        )
      : null;
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
    let model;
    try {
      model = readVocabulary(bytes);
    } catch (e) {
      throw new Error(`${name}: not a SentencePiece model (${e.message})`);
    }
    return new SentencePiece(spp, model);
  }

  /**
   * The normalised text, UTF-8, as sentencepiece's normaliser gives it (spaces as "▁", the dummy
   * prefix added, NFKC where the model says so): the WASM's segmentation concatenated, each known
   * piece as the model's bytes for it, each byte piece (<0xXX>, byte-fallback models) as its byte,
   * each run of unknown characters as the text the WASM gives for it.
   * @param {string} text  without lone surrogates
   * @returns {Uint8Array}
   */
  normalized(text) {
    const ids = this.processor.encodeIds(text);
    const pieces = this.processor.encodePieces(text); // the same segmentation, as strings
    if (pieces.length !== ids.length)
      throw new Error(`SentencePiece: ${ids.length} ids but ${pieces.length} pieces for one text`);
    const { UNKNOWN, BYTE } = PIECE_TYPES;
    const parts = ids.map((id, i) => {
      const type = this.model.types[id];
      if (type === BYTE) return Uint8Array.of(this.byteValue.get(this.model.pieces[id]));
      return type === UNKNOWN ? utf8Encoder.encode(pieces[i]) : this.pieceBytes[id];
    });
    const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
    let at = 0;
    for (const p of parts) {
      out.set(p, at);
      at += p.length;
    }
    return out;
  }

  /** Piece ids of a text, as Python's SentencePieceProcessor.encode(text): plain encoding, no begin/end tokens; lone surrogates become "?". */
  encode(text) {
    const clean = text.replace(LONE_SURROGATE, "?");
    if (!this.unigram) return this.processor.encodeIds(clean);
    return this.unigram.encode(this.normalized(clean));
  }

  /**
   * The pieces of a text, as encode's ids ("▁" marks a word's start), as Python's
   * encode(text, out_type=str): an unknown piece is its text, a byte piece its name (<0xXX>).
   */
  pieces(text) {
    const clean = text.replace(LONE_SURROGATE, "?");
    if (!this.unigram) return this.processor.encodePieces(clean);
    const normalized = this.normalized(clean);
    const decoder = new TextDecoder("utf-8", { ignoreBOM: true }); // keeps a leading U+FEFF, as Python
    return this.unigram
      .segment(normalized)
      .map(({ id, from, end }) =>
        this.model.types[id] === PIECE_TYPES.BYTE
          ? this.model.pieces[id]
          : decoder.decode(normalized.subarray(from, end)),
      );
  }

  /** The text of piece ids. */
  decode(ids) {
    return ids.length ? this.processor.decodeIds(ids) : "";
  }

  /** The unknown piece's id (Python's unk_id()), -1 where the model has none. */
  get unkId() {
    return this.model?.special.unk ?? -1;
  }

  /** Piece id -> piece (Python's id_to_piece). */
  idToPiece(id) {
    return this.model.pieces[id];
  }

  /**
   * The text of pieces given as strings, as Python's decode_pieces (SentencePiece's DecodePieces): a
   * piece the model lacks is kept as it is, "▁" included. The WASM decodes only ids, so each run of
   * known pieces is decoded by it; a run after text already written is decoded behind a sentinel
   * piece (one without "▁", whose surface is itself) and the sentinel cut off, so that it keeps the
   * leading space that DecodePieces strips only at the start of the text.
   * @param {string[]} pieces
   */
  decodePieces(pieces) {
    this.pieceIds ??= new Map(this.model.pieces.map((p, i) => [p, i]));
    this.sentinel ??= this.model.pieces.findIndex(
      (p, i) => this.model.types[i] === PIECE_TYPES.NORMAL && p && !p.includes("\u2581"),
    );
    let out = "";
    let run = [];
    const flush = () => {
      if (!run.length) return;
      if (out && this.sentinel >= 0)
        out += this.decode([this.sentinel, ...run]).slice(this.model.pieces[this.sentinel].length);
      else out += this.decode(run);
      run = [];
    };
    for (const piece of pieces) {
      const id = this.pieceIds.get(piece);
      if (id !== undefined) {
        run.push(id);
      } else {
        flush();
        out += piece;
      }
    }
    flush();
    return out;
  }
}

/**
 * bundle.json's tokens section with its defaults, and the vocabulary maps: how a source becomes
 * the encoder's ids and the search's ids become text (docs/bundle-format.md, "Tokenization").
 * Without a tokens section and maps, exactly the convention of our own exports: [text ids, eos],
 * no target prefix, SentencePiece's ids decoded as they are.
 */

/**
 * The tokenizers library's Metaspace decoding of piece texts (tokens.metaspace), as runtime/vocab.py's
 * metaspace_text: joined, each "▁" a space, one leading space dropped, nothing stripped.
 * @param {string[]} pieces
 */
export function metaspaceText(pieces) {
  const text = pieces.join("").replaceAll("\u2581", " ");
  return text.startsWith(" ") ? text.slice(1) : text;
}

export class Tokens {
  /**
   * @param {any} meta  bundle.json (validated)
   * @param {{source?: Int32Array | null, target?: Int32Array | null,
   *   texts?: {source: Map<string, number>, target: Map<number, string>}}} [maps]  from checkTokenizers
   */
  constructor(meta, { source = null, target = null, texts = { source: new Map(), target: new Map() } } = {}) {
    const t = meta.tokens ?? {};
    this.sourcePrefix = t.source_prefix ?? [];
    this.sourceSuffix = t.source_suffix ?? [meta.special_ids.eos];
    this.targetPrefix = t.target_prefix ?? [];
    this.languages = t.languages ?? {};
    this.targetLangIn = t.target_lang_in ?? TARGET_LANG_IN[0];
    this.textLanguageCodes = t.text_language_codes ?? false;
    this.stripText = t.strip_text ?? false;
    this.restoreSpaces = t.restore_spaces ?? false;
    this.metaspace = t.metaspace ?? false;
    this.unkId = meta.special_ids.unk;
    this.sourceMap = source;
    this.targetMap = target;
    this.unknownPieces = texts.source; // vocab_texts: the text of a piece SentencePiece marks unknown -> model id
    this.targetTexts = texts.target; // vocab_texts: model id -> the text of a piece the target model lacks
    this.trailingSpace = t.trailing_space ?? []; // ids after a text ending in white space (runtime/vocab.py SPACES)
  }

  /**
   * A language code's token id.
   * @throws {TypeError} for a code that is not a string
   * @throws {RangeError} for a code the bundle does not have, naming it and the known ones (runtime/vocab.py's words)
   */
  language(code, option) {
    if (typeof code !== "string")
      throw new TypeError(`${option}=${short(code)}; give a language code (a string)`);
    if (Object.hasOwn(this.languages, code)) return this.languages[code];
    const known = Object.keys(this.languages).sort();
    const listed =
      known.slice(0, 10).join(", ") + (known.length > 10 ? ` and ${known.length - 10} more` : "");
    const fix = known.length ? `choose one of ${listed}` : "this model has no language tokens: leave it out";
    throw new RangeError(`${option}=${JSON.stringify(code)} is not a language of this model; ${fix}`);
  }

  /**
   * The ids put around every source text's ids, and the target prefix, for a caller's languages:
   * sourceLang replaces the source prefix; targetLang replaces the target prefix, or the source
   * prefix where tokens.target_lang_in says so (then it wins over sourceLang).
   * @param {{sourceLang?: string | null, targetLang?: string | null}} [languages]
   * @param {{sourceLang?: string, targetLang?: string}} [names]  the options' names for messages
   * @returns {{prefix: number[], suffix: number[], targetPrefix: number[]}}
   */
  layout({ sourceLang = null, targetLang = null } = {}, names = {}) {
    let prefix = this.sourcePrefix;
    let targetPrefix = this.targetPrefix;
    if (sourceLang != null) prefix = [this.language(sourceLang, names.sourceLang ?? "sourceLang")];
    if (targetLang != null) {
      const id = [this.language(targetLang, names.targetLang ?? "targetLang")];
      if (this.targetLangIn === SOURCE_PREFIX) prefix = id;
      else targetPrefix = id;
    }
    return { prefix, suffix: this.sourceSuffix, targetPrefix };
  }

  /**
   * With tokens.text_language_codes (Marian), a text that starts with ">>code<<" (a code of no
   * "<", ">" or white space, as runtime/vocab.py's) loses that token before SentencePiece, and its
   * id replaces the source prefix: [id or null, the rest of the text]. A code the bundle does not
   * have is the unknown id.
   */
  splitCode(text) {
    const found = this.textLanguageCodes ? LANGUAGE_CODE.exec(text) : null;
    if (!found) return [null, text];
    return [
      Object.hasOwn(this.languages, found[1]) ? this.languages[found[1]] : this.unkId,
      text.slice(found[0].length),
    ];
  }

  /**
   * A text's model source ids: SentencePiece's, through the source map where there is one; a piece
   * SentencePiece marks unknown whose text vocab_texts lists gets that id (as transformers looks
   * pieces up by text). As runtime/vocab.py's _Encoder.
   * @param {{encode: (text: string) => number[], pieces?: (text: string) => string[], unkId?: number}} tokenizer
   */
  encodeSource(tokenizer, text) {
    const ids = this._mapped(tokenizer, text);
    // tokens.trailing_space: SentencePiece drops a text's final white space, NLLB's tokenizer keeps a lone ▁
    if (this.trailingSpace.length && ids.length && TRAILING_SPACE.test(text))
      return [...ids, ...this.trailingSpace];
    return ids;
  }

  _mapped(tokenizer, text) {
    const ids = tokenizer.encode(text);
    const map = this.sourceMap;
    if (!map) return ids;
    const out = Array.from(ids, (p) => map[p]);
    const unk = tokenizer.unkId ?? -1;
    if (this.unknownPieces.size && unk >= 0 && ids.includes(unk)) {
      const pieces = tokenizer.pieces(text);
      ids.forEach((p, i) => {
        if (p === unk && this.unknownPieces.has(pieces[i])) out[i] = this.unknownPieces.get(pieces[i]);
      });
    }
    return out;
  }

  /**
   * A hypothesis's ids as piece texts, as runtime/vocab.py's to_texts: each id's piece, ids mapped to the skip
   * value left out, the vocab_texts text of pieces the target model lacks.
   * @param {number[]} ids
   * @param {{idToPiece: (id: number) => string}} tokenizer
   */
  pieceTexts(ids, tokenizer) {
    const map = this.targetMap;
    if (!map) return ids.map((id) => tokenizer.idToPiece(id));
    return ids.flatMap((id) =>
      map[id] >= 0
        ? [tokenizer.idToPiece(map[id])]
        : map[id] === VOCAB_MAP.text
          ? [this.targetTexts.get(id) ?? ""]
          : [],
    );
  }

  /**
   * The text of a hypothesis's ids (its end token already removed), as runtime/vocab.py's decoder:
   * with a target map, each id's piece, the ids mapped to the skip value (special and language
   * tokens) left out; where vocab_texts gives the text of pieces the target model lacks (the map's
   * text value), the pieces as strings through decodePieces, which keeps such a text as it is. Then
   * "▁" made a space where tokens.restore_spaces says so, and the text stripped as Python's
   * str.strip() where tokens.strip_text says so.
   * @param {number[]} ids
   * @param {{decode: (ids: number[]) => string, decodePieces?: (pieces: string[]) => string,
   *   idToPiece?: (id: number) => string}} tokenizer  the target SentencePiece model
   */
  decode(ids, tokenizer) {
    const map = this.targetMap;
    if (this.metaspace) return metaspaceText(this.pieceTexts(ids, tokenizer));
    let text;
    if (map && this.targetTexts.size) {
      text = tokenizer.decodePieces(this.pieceTexts(ids, tokenizer));
    } else {
      text = tokenizer.decode(map ? ids.map((id) => map[id]).filter((p) => p >= 0) : ids);
    }
    if (this.restoreSpaces) text = text.replaceAll("\u2581", " ");
    return this.stripText ? text.replace(PY_STRIP, "") : text;
  }
}
