// Types of the Node entry point (src/index.js). The sources carry the same as JSDoc.

export interface TranslationResult {
  /** Detokenised texts, best first. */
  hypotheses: string[];
  /** Target ids, end token excluded, a forced target prefix included. */
  tokenIds: number[][];
  /** Sums of log-probabilities, end token included (only with returnScores). */
  scores: number[] | null;
  /** Per hypothesis [target pieces][source pieces + end token]: the last decoder layer's cross-attention
   *  averaged over heads (only with returnAttention). */
  attention: number[][][] | null;
}

export interface TranslateOptions {
  /** 1 is greedy search (default: bundle.json's decoding.beam_size). */
  beamSize?: number;
  /** Hypotheses per source, 1..beamSize (default 1). */
  numHypotheses?: number;
  /** alpha of score / len^alpha (default: bundle.json's). */
  lengthPenalty?: number;
  /** 1..max_positions (default: min(floor(a x source length) + b, max_positions)). */
  maxDecodingLength?: number;
  /** The end token is forbidden before this step (default: bundle.json's decoding.min_length). */
  minDecodingLength?: number;
  returnScores?: boolean;
  /** Also each hypothesis's cross-attention, by a forced pass after the search (results unchanged). */
  returnAttention?: boolean;
  /** Cut sources longer than the model's positions instead of refusing them. */
  truncate?: boolean;
  /** Sources per batch (default 32). */
  maxBatchSize?: number;
  /** A language code of bundle.json's tokens.languages: its token replaces the source prefix (M2M100, NLLB). */
  sourceLang?: string;
  /** A language code: its token is forced first in each translation, or replaces the source prefix where
   *  tokens.target_lang_in says so (multilingual Marian). An unknown code is a RangeError listing the known ones. */
  targetLang?: string;
  /** Per source, target ids forced at the start of its translation (docs/bundle-format.md, "A forced target
   *  prefix"), replacing the bundle's and targetLang's: one array per source, no end token. */
  targetPrefix?: ArrayLike<number>[];
  /** Random sampling instead of beam search (> 0): numHypotheses samples per source, each depending only on
   *  the seed and its source, the Python runtime's stream (src/sampling.js). */
  samplingTemperature?: number;
  /** Sample among the k likeliest tokens (0: all). */
  samplingTopk?: number;
  /** ... and among the smallest set whose probability reaches p (1: all). */
  samplingTopp?: number;
  /** The sampling seed, an integer >= 0 (a bigint above 2^53); default: a fresh one per call. */
  seed?: number | bigint;
}

export interface LoadOptions {
  /** onnxruntime intra-op threads: 0 (its default, the core count) to the platform's cores (RangeError beyond). */
  threads?: number;
  /** Verify every file's sha256 against bundle.json (default true). */
  checkHashes?: boolean;
  optimization?: "all" | "extended" | "basic" | "none";
  /** Download each step's 2K candidates from the decoder's TopK outputs (default true). */
  topKFromGraph?: boolean;
  /** Let idle onnxruntime threads spin between operators (default false). */
  threadSpinning?: boolean;
  platform?: Platform;
}

export interface Platform {
  ort: unknown;
  join(dir: string, rel: string): string;
  /** Rejects with code "ENOENT" when missing; "ENOTREG" (and `kind`) for what is not a regular file and
   *  "EFBIG" (and `size`) above maxBytes, where the platform can tell before reading. */
  readFile(path: string, options?: { maxBytes?: number }): Promise<Uint8Array>;
  /** This machine's cores: Translator.load refuses more threads. */
  cores?: number;
  coresSource?: string;
  resolveInside(dir: string, rel: string): Promise<{ inside: boolean; exists: boolean; path: string }>;
  sha256(bytes: Uint8Array): Promise<string>;
  loadTokenizer?(
    bytes: Uint8Array,
    name: string,
  ): Promise<{ encode(text: string): number[]; decode(ids: number[]): string }>;
}

export declare class PortableTranslator {
  static load(bundleDir: string, options: LoadOptions & { platform: Platform }): Promise<PortableTranslator>;
  readonly maxPositions: number;
  translate(text: string, options?: TranslateOptions): Promise<string>;
  translateBatch(
    source: (string | ArrayLike<number>)[],
    options?: TranslateOptions,
  ): Promise<TranslationResult[]>;
  /** The encoder's ids of a text: the source prefix, its (mapped) SentencePiece ids, the suffix. */
  prepareSource(
    text: string,
    options?: { truncate?: boolean; sourceLang?: string; targetLang?: string },
  ): { ids: number[]; truncated: boolean };
  /** bundle.json's tokens section and the vocabulary maps. */
  readonly tokens: Tokens;
  maxLengths(sources: number[][], maxDecodingLength?: number): number[];
  release(): Promise<void>;
}

export declare class Translator extends PortableTranslator {
  static load(bundleDir: string, options?: LoadOptions): Promise<PortableTranslator>;
}

export declare class BundleError extends Error {}
export declare const FORMAT: "seq2onnx-bundle";
export declare const FORMAT_VERSION: 1;
export declare const nodePlatform: Platform;

export type StepOutput =
  | { logProbs: ArrayLike<number>; vocab: number }
  | { values: ArrayLike<number>; ids: ArrayLike<number>; k: number; vocab: number };
export type Step = (
  tokens: number[],
  cacheIndices: number[],
  t: number,
  keep: number[] | null,
) => Promise<StepOutput> | StepOutput;
export interface SearchResult {
  hypotheses: number[][];
  scores: number[];
}

/** Candidates per row a step must return: 2K for a beam search, 1 for greedy (`greedy`), +1 under a minimum length. */
export declare function candidatesNeeded(beamSize: number, minLength: number, greedy?: boolean): number;
/** A step whose rows of sentence s are forced to prefixes[s][t] (0, every other token -inf) at t < its length. */
export declare function forcePrefix(step: Step, prefixes: (ArrayLike<number> | null | undefined)[]): Step;
export declare function greedySearch(
  step: Step,
  batch: number,
  options: { startId: number; eosId: number; maxLengths: number[]; minLength?: number },
): Promise<SearchResult[]>;
export declare function beamSearch(
  step: Step,
  batch: number,
  options: {
    beamSize: number;
    startId: number;
    eosId: number;
    maxLengths: number[];
    minLength?: number;
    lengthPenalty?: number;
    numHypotheses?: number;
  },
): Promise<SearchResult[]>;
export declare function readBundle(
  dir: string,
  platform: Platform,
  options?: { checkHashes?: boolean },
): Promise<{ path: string; meta: any; files: Record<string, Uint8Array> }>;
/** bundle.json's tokens section with its defaults, and the vocabulary maps (docs/bundle-format.md, "Tokenization"). */
export declare class Tokens {
  constructor(
    meta: any,
    maps?: {
      source?: Int32Array | null;
      target?: Int32Array | null;
      texts?: { source: Map<string, number>; target: Map<number, string> };
    },
  );
  readonly sourcePrefix: number[];
  readonly sourceSuffix: number[];
  readonly targetPrefix: number[];
  readonly languages: Record<string, number>;
  language(code: string, option: string): number;
  layout(
    languages?: { sourceLang?: string | null; targetLang?: string | null },
    names?: { sourceLang?: string; targetLang?: string },
  ): { prefix: number[]; suffix: number[]; targetPrefix: number[] };
  splitCode(text: string): [number | null, string];
  /** A text's model source ids: SentencePiece's through the source map; unknown pieces by their text (vocab_texts). */
  encodeSource(tokenizer: SentencePiece | { encode(text: string): number[] }, text: string): number[];
  /** A hypothesis's text: mapped, skipped ids left out, vocab_texts kept as they are, restore_spaces, strip_text. */
  decode(ids: number[], tokenizer: SentencePiece | { decode(ids: number[]): string }): string;
}
export declare class SentencePiece {
  static fromBytes(bytes: Uint8Array, name?: string): Promise<SentencePiece>;
  encode(text: string): number[];
  pieces(text: string): string[];
  decode(ids: number[]): string;
  /** Python's decode_pieces: a piece the model lacks is kept as it is. */
  decodePieces(pieces: string[]): string;
  idToPiece(id: number): string;
  readonly unkId: number;
}
