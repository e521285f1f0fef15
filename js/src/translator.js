// Translator: drives a bundle's encoder and decoder-step graphs with onnxruntime, as
// runtime/translator.py does, on any platform adapter (platform-node.js, platform-web.js).
import {
  BEAM_CONVENTIONS,
  BUNDLE_JSON,
  BundleError,
  CACHE_INDICES,
  CROSS_ATTENTION,
  crossNames,
  DECODER_LABELS,
  DTYPES,
  ENCODER_LABEL,
  FILE_NAMES,
  LOG_PROBS,
  pastNames,
  presentNames,
  readBundle,
  SRC_IDS,
  SRC_LENGTHS,
  SRC_MASK,
  STANDARD,
  STEP,
  short,
  TOKENS,
  TOP_K,
  TOPK_IDS,
  TOPK_LOG_PROBS,
  WEIGHTS,
} from "./bundle.js";
import { checkGraphs, checkReferences, checkScheme, checkTokenizers } from "./checks.js";
import { readOptions } from "./options.js";
import { sampleSearch } from "./sampling.js";
import { beamSearch, candidatesNeeded, forcePrefix, greedySearch } from "./search.js";
import { SPEC_URL } from "./spec.js";
import { isBlank, SentencePiece, Tokens } from "./tokenizer.js";

// The typed array that carries each cache element type (float16 travels as raw bits); the element
// types themselves are the spec's dtypes, in its order.
const ARRAYS = { float32: Float32Array, float16: Uint16Array };
const CACHE_ARRAY = Object.fromEntries(DTYPES.filter((d) => d in ARRAYS).map((d) => [d, ARRAYS[d]]));
const DECODER = DECODER_LABELS[STANDARD]; // the decoder this host drives (files.<it>, graphs.<it>)
const LEVELS = { all: "all", extended: "extended", basic: "basic", none: "disabled" };
// decoding.beam_convention, by its place in spec/bundle.json's beam_conventions: ours (fairseq, the default),
// then transformers' rule with generate()'s early_stopping true, false, "never" (docs/decoding.md; the Python
// runtime's search.EARLY_STOPPING)
const EARLY_STOPPING = [true, true, false, "never"];
if (EARLY_STOPPING.length !== BEAM_CONVENTIONS.length)
  throw new Error(`${SPEC_URL}: beam_conventions changed`);
/** beamSearch's {bestFinished, earlyStopping} for a bundle's decoding.beam_convention (validated at load). */
const beamRule = (convention = BEAM_CONVENTIONS[0]) => {
  const at = BEAM_CONVENTIONS.indexOf(convention);
  return { bestFinished: at > 0, earlyStopping: EARLY_STOPPING[at] };
};

/**
 * @typedef {object} TranslationResult  One source's n-best, best first.
 * @property {string[]} hypotheses  detokenised texts
 * @property {number[][]} tokenIds  target ids, end token excluded, a forced target prefix included
 * @property {number[] | null} scores  sums of log-probabilities, end token included (returnScores)
 * @property {number[][][] | null} attention  per hypothesis [target pieces][source pieces + end token]:
 *   the last decoder layer's cross-attention averaged over heads (returnAttention)
 */

/**
 * @typedef {object} TranslateOptions
 * @property {number} [beamSize]  1 is greedy search (default: bundle.json's decoding.beam_size)
 * @property {number} [numHypotheses]  hypotheses per source, 1..beamSize (default 1)
 * @property {number} [lengthPenalty]  alpha of score / len^alpha (default: bundle.json's)
 * @property {number} [maxDecodingLength]  1..max_positions (default: a x source length + b, capped)
 * @property {number} [minDecodingLength]  the end token is forbidden before this step (default: bundle.json's)
 * @property {boolean} [returnScores]
 * @property {boolean} [returnAttention]  each hypothesis's cross-attention, computed after the search by a
 *   forced pass of the decoder over the hypotheses (runtime/attention.py's convention): results are unchanged
 * @property {boolean} [truncate]  cut sources longer than the model's positions instead of refusing them
 * @property {number} [maxBatchSize]  sources per batch (default 32)
 * @property {string} [sourceLang]  a language code of tokens.languages: its token replaces tokens.source_prefix
 * @property {string} [targetLang]  a language code: its token replaces tokens.target_prefix (or the source
 *   prefix, where tokens.target_lang_in says so)
 * @property {ArrayLike<number>[]} [targetPrefix]  per source, target ids forced at the start of its translation
 *   (docs/bundle-format.md, "A forced target prefix"), replacing the bundle's and targetLang's
 * @property {number} [samplingTemperature]  switches to random sampling (> 0): numHypotheses independent
 *   samples per source, each depending only on the seed and its source, drawn as the Python runtime draws
 *   them (src/sampling.js)
 * @property {number} [samplingTopk]  sample among the k likeliest tokens (0: all, the default)
 * @property {number} [samplingTopp]  ... and among the smallest set whose probability reaches p (1: all)
 * @property {number | bigint} [seed]  the sampling seed, an integer >= 0 (default: a fresh one each call)
 */

/** Rows `rows` of a tensor along its first axis, in that order. */
function takeRows(ort, tensor, rows) {
  const [n, ...rest] = tensor.dims;
  const size = rest.reduce((a, b) => a * b, 1);
  const data = new tensor.data.constructor(rows.length * size);
  rows.forEach((r, i) => {
    if (r < 0 || r >= n) throw new RangeError(`row ${r} of a tensor with ${n} rows`);
    data.set(tensor.data.subarray(r * size, (r + 1) * size), i * size);
  });
  return new ort.Tensor(tensor.type, data, [rows.length, ...rest]);
}

const int64 = (ort, values, dims) =>
  new ort.Tensor(
    "int64",
    BigInt64Array.from(values, (v) => BigInt(v)),
    dims,
  );

/**
 * onnxruntime's intra-op threads: 0 (its default, one per core) to the platform's core count (where it
 * knows it; Node does). More only adds threads that wait for a core, each with its stack: 99999 of them
 * hang the process while its memory grows. As the Python runtime's check_intra_threads.
 * @throws {RangeError} naming the value, the limit and the fix
 */
export function checkThreads(threads, platform = {}) {
  const cores = platform.cores;
  if (Number.isInteger(threads) && threads >= 0 && (cores === undefined || threads <= cores)) return threads;
  const limit = cores === undefined ? "or more" : `to ${cores}`;
  const machine =
    cores === undefined
      ? ""
      : `: this machine has ${cores} cores (${platform.coresSource ?? "its core count"})`;
  throw new RangeError(
    `threads=${short(threads)}${machine}; give an integer from 0 (onnxruntime's default: one per core) ${limit}`,
  );
}

export class Translator {
  /**
   * Loads and checks a bundle made by `seq2onnx export`. Use Translator.load, not the constructor.
   * @param {import("./bundle.js").Bundle} bundle
   * @param {any} encoder
   * @param {any} decoder
   * @param {{source: SentencePiece, target: SentencePiece}} tokenizers
   * @param {import("./bundle.js").Platform} platform
   * @param {boolean} topKFromGraph
   * @param {object} [maps]  the vocabulary maps and texts (checkTokenizers)
   */
  constructor(bundle, encoder, decoder, tokenizers, platform, topKFromGraph, maps = {}) {
    const cfg = bundle.meta.model;
    const ids = bundle.meta.special_ids;
    Object.assign(this, {
      bundle,
      encoder,
      decoder,
      platform,
      topKFromGraph,
      ort: platform.ort,
      sourceTokenizer: tokenizers.source,
      targetTokenizer: tokenizers.target,
      nLayers: cfg.n_decoder_layers,
      nHeads: cfg.n_heads,
      headDim: cfg.d_kv || cfg.d_model / cfg.n_heads,
      maxPositions: cfg.max_positions,
      srcVocab: cfg.src_vocab_size,
      tgtVocab: cfg.tgt_vocab_size,
      padId: ids.pad,
      eosId: ids.eos,
      startId: ids.decoder_start,
      cacheType: bundle.meta.dtype,
      tokens: new Tokens(bundle.meta, maps), // prefixes, suffix, languages, vocabulary maps and texts
    });
    if (!(this.cacheType in CACHE_ARRAY)) {
      throw new BundleError(
        `${bundle.path}: dtype ${JSON.stringify(this.cacheType)}; ` +
          `this host drives ${Object.keys(CACHE_ARRAY).join(" and ")} bundles`,
      );
    }
  }

  /**
   * Reads, checks and loads a bundle directory.
   * @param {string} bundleDir
   * @param {{platform: import("./bundle.js").Platform, threads?: number, checkHashes?: boolean,
   *          optimization?: "all" | "extended" | "basic" | "none", topKFromGraph?: boolean,
   *          threadSpinning?: boolean}} options
   *   threads: onnxruntime intra-op threads (0: its default, the core count). threadSpinning: off by
   *   default, as in the Python runtime: between two steps the search runs here and a spinning
   *   thread would take a core from it.
   * @returns {Promise<Translator>}
   * @throws {BundleError} the bundle is missing, damaged, of another version, or its graphs differ
   */
  static async load(
    bundleDir,
    {
      platform,
      threads = 0,
      checkHashes = true,
      optimization = "all",
      topKFromGraph = true,
      threadSpinning = false,
    } = {},
  ) {
    if (!platform)
      throw new TypeError("Translator.load needs a platform (import from the package's entry point)");
    if (!(optimization in LEVELS)) {
      throw new RangeError(
        `optimization=${JSON.stringify(optimization)}; choose one of ${Object.keys(LEVELS).join(", ")}`,
      );
    }
    checkThreads(threads, platform);
    const bundle = await readBundle(bundleDir, platform, { checkHashes });
    if (bundle.meta.quantization && (optimization === "basic" || optimization === "none")) {
      // onnxruntime's exact rewrite of int8 weights (x64quantprecision, below) is an extended-level optimisation
      throw new RangeError(
        `optimization=${JSON.stringify(optimization)} with an int8 bundle: its int8 products are exact ` +
          `on every CPU only with "extended" or "all"; use one of those, or a float32 bundle`,
      );
    }
    checkScheme(bundle, platform.ort.env?.versions?.common); // a scheme it cannot run, by name, before any session
    const maps = await checkTokenizers(bundle, platform); // sizes, special ids, vocabularies and maps: before the graphs load
    const options = {
      executionProviders: ["cpu"],
      graphOptimizationLevel: LEVELS[optimization],
      intraOpNumThreads: threads,
      logSeverityLevel: 3,
      // x64quantprecision: int8 bundles multiply uint8 by int8, which onnxruntime's x86 kernels without VNNI
      // saturate; "1" makes them exact (u8 x u8) there, and costs speed on VNNI CPUs (docs/bundle-format.md).
      extra: {
        session: { intra_op: { allow_spinning: threadSpinning ? "1" : "0" }, x64quantprecision: "1" },
      },
    };
    // Each graph's failure names its file (the path found for files.<key>), what failed and the fix.
    const session = async (key) => {
      checkReferences(bundle, key); // its external data points into the weights file, as the spec says
      // a bundle's weights file, as this platform hands it to onnxruntime (a folder in Node, bytes in a browser)
      const withWeights =
        bundle.meta.files.weights && platform.weightsOptions
          ? platform.weightsOptions(options, bundle)
          : options;
      try {
        return await platform.ort.InferenceSession.create(bundle.files[key], withWeights);
      } catch (e) {
        throw new BundleError(
          `${bundle.paths[key] ?? FILE_NAMES[key]}: onnxruntime cannot load this graph ` +
            `(${String(e?.message ?? e).trim()}); re-export the bundle with \`seq2onnx export\``,
        );
      }
    };
    let encoder;
    let decoder;
    try {
      encoder = await session(ENCODER_LABEL);
      decoder = await session(DECODER);
    } catch (e) {
      await encoder?.release?.();
      throw e;
    } finally {
      platform.releaseCopy?.(bundle); // the private copy of the weights: onnxruntime holds what it read
      // and the weights' bytes where the platform read them (a browser): onnxruntime-web copied what each
      // session reads into its own memory, so kept here they would be a second copy for the page's life
      delete bundle.files[WEIGHTS];
    }
    try {
      checkGraphs(bundle, encoder, decoder); // names, element types, sizes and tables against bundle.json
    } catch (e) {
      await encoder.release?.();
      await decoder.release?.();
      throw e;
    }
    const loadTokenizer = platform.loadTokenizer ?? SentencePiece.fromBytes;
    const tokenizers = {};
    for (const [side, key] of [
      ["source", "source_tokenizer"],
      ["target", "target_tokenizer"],
    ]) {
      try {
        tokenizers[side] = await loadTokenizer(bundle.files[key], key);
      } catch (e) {
        await encoder.release?.();
        await decoder.release?.();
        throw new BundleError(
          `${bundle.paths[key] ?? FILE_NAMES[key]}: the SentencePiece model cannot be read (${e.message}); ` +
            "re-export the bundle with `seq2onnx export`",
        );
      }
    }
    return new Translator(bundle, encoder, decoder, tokenizers, platform, topKFromGraph, maps);
  }

  /** Frees the onnxruntime sessions. */
  async release() {
    await this.encoder.release?.();
    await this.decoder.release?.();
  }

  /** Translates one string; options as for translateBatch. */
  async translate(text, options = {}) {
    return (await this.translateBatch([text], options))[0].hypotheses[0];
  }

  /**
   * Translates texts (or source token id arrays) and returns one result per source, in order.
   * An empty or whitespace-only text gives an empty translation.
   * @param {(string | ArrayLike<number>)[]} source
   * @param {TranslateOptions} [options]
   * @returns {Promise<TranslationResult[]>}
   * @throws {TypeError} for items that are neither strings nor ids
   * @throws {RangeError} for a source longer than the model's positions (unless truncate), an unknown
   *   language code, target prefix ids outside the vocabulary and impossible settings
   */
  async translateBatch(source, options = {}) {
    if (typeof source === "string" || !Array.isArray(source)) {
      throw new TypeError("translateBatch takes an array of sources; for one string use translate(text)");
    }
    // every option checked as the Python runtime checks it (src/options.js: spec/capabilities.json's limits)
    const {
      beamSize,
      numHypotheses,
      lengthPenalty,
      maxDecodingLength,
      minDecodingLength,
      returnScores,
      returnAttention,
      truncate,
      maxBatchSize,
      sourceLang,
      targetLang,
      targetPrefix,
      samplingTemperature,
      samplingTopk,
      samplingTopp,
      seed,
    } = readOptions(options, this.bundle.meta.decoding);
    const sampling =
      samplingTemperature == null
        ? null
        : { temperature: samplingTemperature, topK: samplingTopk, topP: samplingTopp, seed };
    if (maxDecodingLength != null && maxDecodingLength > this.maxPositions) {
      throw new RangeError(
        `maxDecodingLength=${maxDecodingLength}; this model has ${this.maxPositions} positions ` +
          `(max_positions in ${BUNDLE_JSON}): choose 1..that`,
      );
    }
    if (returnAttention && !this.decoder.outputNames.includes(CROSS_ATTENTION)) {
      throw new BundleError(
        `${this.bundle.path}: its ${FILE_NAMES[DECODER]} has no "${CROSS_ATTENTION}" output (exported by ` +
          "seq2onnx before 0.3), so attention cannot be returned: export the checkpoint again with `seq2onnx export`",
      );
    }
    const layout = this.tokens.layout({ sourceLang, targetLang });
    const prefixes = this._targetPrefixes(source.length, targetPrefix, layout.targetPrefix);
    const ids = source.map((item, i) => this._sourceIds(i, item, truncate, layout)?.ids ?? null);
    const results = new Array(ids.length);
    const n = numHypotheses;
    ids.forEach((s, i) => {
      if (s === null) {
        results[i] = {
          hypotheses: new Array(n).fill(""),
          tokenIds: Array.from({ length: n }, () => []),
          scores: returnScores ? new Array(n).fill(0) : null,
          attention: returnAttention ? Array.from({ length: n }, () => []) : null,
        };
      }
    });
    // similar lengths share a batch (less padding): the same stable order and chunks as Python,
    // so that each sentence is decoded in the same company on both hosts
    const todo = ids
      .map((_s, i) => i)
      .filter((i) => ids[i] !== null)
      .sort((a, b) => ids[a].length - ids[b].length);
    for (let start = 0; start < todo.length; start += maxBatchSize) {
      const chunk = todo.slice(start, start + maxBatchSize);
      const found = await this._search(
        chunk.map((i) => ids[i]),
        {
          beamSize,
          numHypotheses,
          lengthPenalty,
          maxDecodingLength,
          minDecodingLength,
          prefixes: chunk.map((i) => prefixes[i]),
          sampling,
        },
      );
      const tokens = found.map((f) =>
        f.hypotheses.map((h) => (h.length && h[h.length - 1] === this.eosId ? h.slice(0, -1) : h)),
      );
      const attention = returnAttention
        ? await this._attention(
            chunk.map((i) => ids[i]),
            tokens,
          )
        : null;
      chunk.forEach((i, j) => {
        results[i] = {
          hypotheses: tokens[j].map((t) => this.tokens.decode(t, this.targetTokenizer)),
          tokenIds: tokens[j],
          scores: returnScores ? found[j].scores : null,
          attention: attention ? attention[j] : null,
        };
      });
    }
    return results;
  }

  /**
   * Source token ids of one text as translateBatch feeds them to the encoder (docs/bundle-format.md,
   * "Tokenization": the source prefix, its text's ids, the suffix: the end token by default), and
   * whether they were cut to the model's positions. An empty or whitespace-only text gives [].
   * @param {string} text
   * @param {{truncate?: boolean, sourceLang?: string, targetLang?: string}} [options]  as translateBatch's
   * @returns {{ids: number[], truncated: boolean}}
   * @throws {RangeError} when the text has more tokens than the model's positions and truncate is false,
   *   or for an unknown language code
   */
  prepareSource(text, { truncate = false, sourceLang = null, targetLang = null } = {}) {
    return this._prepareText(text, truncate, this.tokens.layout({ sourceLang, targetLang }));
  }

  _prepareText(text, truncate, { prefix, suffix }) {
    if (typeof text !== "string") throw new TypeError(`text is ${typeof text}; give a string`);
    if (isBlank(text)) return { ids: [], truncated: false };
    const [code, rest] = this.tokens.splitCode(text); // a leading >>code<< (Marian) replaces the prefix
    return this._fit(
      code === null ? prefix : [code],
      this.tokens.encodeSource(this.sourceTokenizer, rest),
      suffix,
      truncate,
    );
  }

  /** prefix + body + suffix, or with truncate the first max_positions - len(prefix) - len(suffix) of body. */
  _fit(prefix, body, suffix, truncate) {
    const length = prefix.length + body.length + suffix.length;
    if (length <= this.maxPositions) return { ids: [...prefix, ...body, ...suffix], truncated: false };
    const room = this.maxPositions - prefix.length - suffix.length;
    if (!truncate || room < 0) {
      const fix =
        room < 0
          ? `its ${prefix.length + suffix.length} prefix and suffix ids alone do not fit`
          : "shorten it or pass truncate: true";
      throw new RangeError(
        `${length} tokens; this model was exported for at most ${this.maxPositions} positions ` +
          `(max_positions in ${BUNDLE_JSON}): ${fix}`,
      );
    }
    return { ids: [...prefix, ...body.slice(0, room), ...suffix], truncated: true };
  }

  /**
   * One source of translateBatch (a text, or ids: the whole row, the suffix appended unless they end
   * with it, no prefix) as the encoder's ids and whether they were cut; null for an empty source.
   */
  _sourceIds(index, item, truncate, layout = this.tokens.layout()) {
    if (typeof item === "string") {
      let found;
      try {
        found = this._prepareText(item, truncate, layout);
      } catch (e) {
        if (e instanceof RangeError) throw new RangeError(`source ${index} has ${e.message}`);
        throw e;
      }
      return found.ids.length ? found : null;
    }
    if (!(Array.isArray(item) || ArrayBuffer.isView(item))) {
      throw new TypeError(
        `source ${index} is ${item === null ? "null" : typeof item}; give a string or an array of token ids`,
      );
    }
    const ids = Array.from(item, (x) => (typeof x === "bigint" ? Number(x) : x));
    if (!ids.every(Number.isInteger)) throw new TypeError(`source ${index}: token ids must be integers`);
    if (!ids.length) return null;
    const bad = ids.filter((x) => x < 0 || x >= this.srcVocab);
    if (bad.length) {
      throw new RangeError(
        `source ${index}: token ids ${JSON.stringify(bad.slice(0, 5))} are outside the source vocabulary [0, ${this.srcVocab})`,
      );
    }
    const { suffix } = layout;
    const ends =
      suffix.length <= ids.length && suffix.every((x, j) => ids[ids.length - suffix.length + j] === x);
    try {
      return this._fit([], ends ? ids.slice(0, ids.length - suffix.length) : ids, suffix, truncate);
    } catch (e) {
      throw new RangeError(`source ${index} has ${e.message}`);
    }
  }

  /**
   * Each source's forced target prefix: the caller's (targetPrefix, one array per source, replacing
   * the bundle's and targetLang's) or `fallback`. As runtime/vocab.py's prefixes: the ids lie in the
   * target vocabulary and are not the end token (a prefix is text before the translation).
   */
  _targetPrefixes(n, targetPrefix, fallback) {
    if (targetPrefix == null) return new Array(n).fill(fallback);
    if (!Array.isArray(targetPrefix) || targetPrefix.length !== n) {
      throw new RangeError(
        `targetPrefix has ${Array.isArray(targetPrefix) ? targetPrefix.length : short(targetPrefix)} ` +
          `entries for ${n} sources; give one array of target ids per source`,
      );
    }
    return targetPrefix.map((p, i) => {
      const ids =
        Array.isArray(p) || ArrayBuffer.isView(p)
          ? Array.from(p, (x) => (typeof x === "bigint" ? Number(x) : x))
          : null;
      if (!ids?.every(Number.isInteger))
        throw new TypeError(`targetPrefix[${i}] is ${short(p)}; give an array of target token ids`);
      const bad = ids.filter((x) => x < 0 || x >= this.tgtVocab || x === this.eosId);
      if (bad.length) {
        throw new RangeError(
          `targetPrefix[${i}] has ids ${JSON.stringify(bad.slice(0, 5))} outside [0, ${this.tgtVocab}) or the end ` +
            `token ${this.eosId}; give target ids of the text before the translation`,
        );
      }
      if (ids.length > this.maxPositions - 2) {
        // as runtime/options.py's check_prefix_options: never cut silently
        throw new RangeError(
          `targetPrefix[${i}] has ${ids.length} ids; give at most ${this.maxPositions - 2} (the model has ` +
            `${this.maxPositions} positions, one for the start token and one for a token after the prefix)`,
        );
      }
      return ids;
    });
  }

  /** Maximum target lengths: the caller's, or min(floor(a x source length) + b, max_positions). */
  maxLengths(sources, maxDecodingLength) {
    if (maxDecodingLength != null) return sources.map(() => maxDecodingLength);
    const { max_length_a: a, max_length_b: b } = this.bundle.meta.decoding;
    return sources.map((s) => Math.min(Math.trunc(a * s.length) + b, this.maxPositions));
  }

  async _search(sources, options) {
    if (options.sampling) return this._sample(sources, options);
    const { beamSize, numHypotheses, lengthPenalty, maxDecodingLength, minDecodingLength, prefixes } =
      options;
    const { src, width } = this._pad(sources);
    // Searches need only their candidates: download [rows, 2K or 1 for greedy (+1)] instead of [rows, vocab].
    const needed = candidatesNeeded(beamSize, minDecodingLength, beamSize === 1);
    const topK = this.topKFromGraph ? Math.min(needed, this.tgtVocab) : null;
    const maxLengths = this.maxLengths(sources, maxDecodingLength);
    // forced target prefixes, and forced_eos' end token at the last step: the step's log-probs replaced before
    // the search sees them
    const end = this.bundle.meta.decoding.forced_eos ? { endId: this.eosId, maxLengths } : null;
    const step = forcePrefix(
      await this._stepFn(
        src,
        sources.map((s) => s.length),
        width,
        topK,
      ),
      prefixes,
      end,
    );
    const common = { startId: this.startId, eosId: this.eosId, maxLengths, minLength: minDecodingLength };
    if (beamSize === 1) return greedySearch(step, sources.length, common);
    // imported bundles: transformers' rule for the finished hypotheses (its n-best) and its early_stopping, docs/decoding.md
    const rule = beamRule(this.bundle.meta.decoding.beam_convention);
    return beamSearch(step, sources.length, { ...common, beamSize, lengthPenalty, numHypotheses, ...rule });
  }

  /**
   * numHypotheses samples per source, as runtime/translator.py: each source's rows repeated n times, row h of
   * source s keyed by [h, len(s), ...s], so that its sample depends only on the seed and that key.
   */
  async _sample(sources, { numHypotheses: n, maxDecodingLength, minDecodingLength, prefixes, sampling }) {
    const rows = sources.flatMap((s) => new Array(n).fill(s));
    const keys = sources.flatMap((s) => Array.from({ length: n }, (_, h) => [h, s.length, ...s]));
    const maxLengths = this.maxLengths(rows, maxDecodingLength);
    const end = this.bundle.meta.decoding.forced_eos ? { endId: this.eosId, maxLengths } : null;
    const { src, width } = this._pad(rows);
    const rowPrefixes = prefixes.flatMap((p) => new Array(n).fill(p));
    const inner = await this._stepFn(
      src,
      rows.map((s) => s.length),
      width,
      null,
    ); // every log-prob: no top-k
    const step = forcePrefix(inner, rowPrefixes, end);
    const flat = await sampleSearch(step, rows.length, {
      startId: this.startId,
      eosId: this.eosId,
      maxLengths,
      minLength: minDecodingLength,
      ...sampling,
      rowKeys: keys,
    });
    return sources.map((_, i) => {
      const mine = flat.slice(i * n, (i + 1) * n);
      return { hypotheses: mine.flatMap((r) => r.hypotheses), scores: mine.flatMap((r) => r.scores) };
    });
  }

  _pad(sources) {
    const width = Math.max(...sources.map((s) => s.length));
    const src = new Array(sources.length * width).fill(this.padId);
    sources.forEach((s, row) => {
      s.forEach((id, j) => {
        src[row * width + j] = id;
      });
    });
    return { src, width };
  }

  /**
   * Each source's hypotheses' cross-attention ([target pieces][source pieces]), by one forced pass of
   * the decoder over all of them (rows grouped by source, n per source), as runtime/attention.py.
   */
  async _attention(sources, hypotheses) {
    const ort = this.ort;
    const n = Math.max(...hypotheses.map((h) => h.length));
    const rows = sources.flatMap((_s, i) => Array.from({ length: n }, (_, j) => hypotheses[i][j] ?? []));
    const steps = Math.max(0, ...rows.map((h) => h.length));
    const lengths = sources.map((s) => s.length);
    const weights = [];
    if (steps > 0) {
      const { src, width } = this._pad(sources);
      const enc = await this.encoder.run({
        [SRC_IDS]: int64(ort, src, [sources.length, width]),
        [SRC_LENGTHS]: int64(ort, lengths, [sources.length]),
      });
      const Cache = CACHE_ARRAY[this.cacheType];
      let past = pastNames(this.nLayers).map(
        () => new ort.Tensor(this.cacheType, new Cache(0), [rows.length, this.nHeads, 0, this.headDim]),
      );
      const present = presentNames(this.nLayers);
      const keep = int64(
        ort,
        rows.map((_, r) => r),
        [rows.length],
      );
      for (let t = 0; t < steps; t++) {
        // the start token, then each row's own pieces; ended rows feed the end token (dropped below)
        const tokens = rows.map((h) => (t === 0 ? this.startId : (h[t - 1] ?? this.eosId)));
        const feeds = {
          [TOKENS]: int64(ort, tokens, [rows.length, 1]),
          [STEP]: int64(ort, [t], [1]),
          [CACHE_INDICES]: keep,
          [TOP_K]: int64(ort, [1], [1]),
          [SRC_MASK]: enc[SRC_MASK],
        };
        pastNames(this.nLayers).forEach((name, i) => {
          feeds[name] = past[i];
        });
        crossNames(this.nLayers).forEach((name) => {
          feeds[name] = enc[name];
        });
        const out = await this.decoder.run(feeds, [...present, CROSS_ATTENTION]);
        past = present.map((name) => out[name]);
        weights.push(out[CROSS_ATTENTION]);
      }
    }
    return sources.map((_s, i) =>
      hypotheses[i].map((h, j) => {
        const r = i * n + j;
        return h.map((_, t) => {
          const w = weights[t];
          const row = w.dims[1];
          return Array.from(w.data.subarray(r * row, r * row + lengths[i]));
        });
      }),
    );
  }

  /** Encodes the sources once and returns the search's step over the decoder graph. */
  async _stepFn(src, lengths, width, topK) {
    const ort = this.ort;
    const batch = lengths.length;
    const enc = await this.encoder.run({
      [SRC_IDS]: int64(ort, src, [batch, width]),
      [SRC_LENGTHS]: int64(ort, lengths, [batch]),
    });
    let mask = enc[SRC_MASK];
    let cross = crossNames(this.nLayers).map((name) => enc[name]);
    const Cache = CACHE_ARRAY[this.cacheType];
    let past = pastNames(this.nLayers).map(
      () => new ort.Tensor(this.cacheType, new Cache(0), [batch, this.nHeads, 0, this.headDim]),
    );
    const kInput = int64(ort, [topK ?? 1], [1]);
    const present = presentNames(this.nLayers);
    const fetches = [...present, ...(topK ? [TOPK_LOG_PROBS, TOPK_IDS] : [LOG_PROBS])];
    const crossNamesList = crossNames(this.nLayers);
    const pastNamesList = pastNames(this.nLayers);
    return async (tokens, cacheIndices, t, keep) => {
      if (keep !== null) {
        // Finished sentences leave: their cross keys/values and mask rows go too.
        cross = cross.map((x) => takeRows(ort, x, keep));
        mask = takeRows(ort, mask, keep);
      }
      const feeds = {
        [TOKENS]: int64(ort, tokens, [tokens.length, 1]),
        [STEP]: int64(ort, [t], [1]),
        [CACHE_INDICES]: int64(ort, cacheIndices, [cacheIndices.length]),
        [TOP_K]: kInput,
        [SRC_MASK]: mask,
      };
      pastNamesList.forEach((name, i) => {
        feeds[name] = past[i];
      });
      crossNamesList.forEach((name, i) => {
        feeds[name] = cross[i];
      });
      const out = await this.decoder.run(feeds, fetches);
      past = present.map((name) => out[name]);
      if (!topK) return { logProbs: out[LOG_PROBS].data, vocab: this.tgtVocab };
      const ids = out[TOPK_IDS];
      return {
        values: out[TOPK_LOG_PROBS].data,
        ids: Int32Array.from(ids.data, Number),
        k: ids.dims[1],
        vocab: this.tgtVocab,
      };
    };
  }
}
