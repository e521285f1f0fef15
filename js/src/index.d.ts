// Types of the Node entry point (src/index.js). The sources carry the same as JSDoc.

export interface TranslationResult {
  /** Detokenised texts, best first. */
  hypotheses: string[];
  /** Target ids, end token excluded. */
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
  loadTokenizer?(bytes: Uint8Array, name: string): Promise<{ encode(text: string): number[]; decode(ids: number[]): string }>;
}

export declare class PortableTranslator {
  static load(bundleDir: string, options: LoadOptions & { platform: Platform }): Promise<PortableTranslator>;
  readonly maxPositions: number;
  translate(text: string, options?: TranslateOptions): Promise<string>;
  translateBatch(source: (string | ArrayLike<number>)[], options?: TranslateOptions): Promise<TranslationResult[]>;
  prepareSource(text: string, options?: { truncate?: boolean }): { ids: number[]; truncated: boolean };
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
export type Step = (tokens: number[], cacheIndices: number[], t: number, keep: number[] | null) => Promise<StepOutput> | StepOutput;
export interface SearchResult { hypotheses: number[][]; scores: number[] }

export declare function candidatesNeeded(beamSize: number, minLength: number): number;
export declare function greedySearch(step: Step, batch: number,
  options: { startId: number; eosId: number; maxLengths: number[]; minLength?: number }): Promise<SearchResult[]>;
export declare function beamSearch(step: Step, batch: number,
  options: { beamSize: number; startId: number; eosId: number; maxLengths: number[]; minLength?: number;
    lengthPenalty?: number; numHypotheses?: number }): Promise<SearchResult[]>;
export declare function readBundle(dir: string, platform: Platform, options?: { checkHashes?: boolean }):
  Promise<{ path: string; meta: any; files: Record<string, Uint8Array> }>;
export declare class SentencePiece {
  static fromBytes(bytes: Uint8Array, name?: string): Promise<SentencePiece>;
  encode(text: string): number[];
  pieces(text: string): string[];
  decode(ids: number[]): string;
}
