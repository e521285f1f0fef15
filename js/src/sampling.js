// Random sampling over an async step function: the JavaScript twin of runtime/sampling.py, with the
// same random stream, so that both hosts draw the same tokens for the same seed.
//
// Each sentence's draws come from a counter-based generator keyed by (seed, the sentence's key) and
// the step, so that a sentence's sample does not depend on the other sentences of its batch:
//   stream = numpy's SeedSequence([seed, ...key]).generate_state(1, uint64)[0]  (ported below, exactly)
//   u(t)   = SplitMix64(stream + (t + 1) x 0x9E3779B97F4A7C15) >> 11, times 2^-53, in [0, 1)
// The token is the first whose cumulative probability exceeds u(t), over softmax(logProbs /
// temperature) restricted to the topK likeliest (ties to the lower id) and to the smallest set whose
// probability reaches topP; sums are numpy's pairwise sums, so that the probabilities match too.

import { checkOption } from "./options.js";
import { greedySearch } from "./search.js";

const MASK64 = (1n << 64n) - 1n;
const GOLDEN = 0x9e3779b97f4a7c15n;
// numpy/random/bit_generator.pyx: SeedSequence's hash constants (pool of 4 uint32 words)
const INIT_A = 0x43b0d7e5;
const MULT_A = 0x931e8875;
const INIT_B = 0x8b51f9dd;
const MULT_B = 0x58f38ded;
const MIX_MULT_L = 0xca01f9dd;
const MIX_MULT_R = 0x4973f715;
const POOL_SIZE = 4;

/** A non-negative integer (Number or BigInt) as numpy's little-endian uint32 words (0 is [0]). */
function uint32Words(n) {
  let v = BigInt(n);
  if (v === 0n) return [0];
  const words = [];
  for (; v > 0n; v >>= 32n) words.push(Number(v & 0xffffffffn));
  return words;
}

/**
 * numpy's SeedSequence(entropy).generate_state(1, np.uint64)[0] for a list of non-negative integers.
 * @param {(number | bigint)[]} entropy
 * @returns {bigint}
 */
export function seedSequenceState(entropy) {
  const words = entropy.flatMap(uint32Words);
  let hashConst = INIT_A;
  const hashmix = (value) => {
    value = (value ^ hashConst) >>> 0;
    hashConst = Math.imul(hashConst, MULT_A) >>> 0;
    value = Math.imul(value, hashConst) >>> 0;
    return (value ^ (value >>> 16)) >>> 0;
  };
  const mix = (x, y) => {
    const r = (Math.imul(MIX_MULT_L, x) - Math.imul(MIX_MULT_R, y)) >>> 0;
    return (r ^ (r >>> 16)) >>> 0;
  };
  const pool = Array.from({ length: POOL_SIZE }, (_, i) => hashmix(i < words.length ? words[i] : 0));
  for (let src = 0; src < POOL_SIZE; src++) {
    for (let dst = 0; dst < POOL_SIZE; dst++) {
      if (src !== dst) pool[dst] = mix(pool[dst], hashmix(pool[src]));
    }
  }
  for (let src = POOL_SIZE; src < words.length; src++) {
    for (let dst = 0; dst < POOL_SIZE; dst++) pool[dst] = mix(pool[dst], hashmix(words[src]));
  }
  let h = INIT_B;
  const out = [0, 1].map((i) => {
    let v = (pool[i] ^ h) >>> 0;
    h = Math.imul(h, MULT_B) >>> 0;
    v = Math.imul(v, h) >>> 0;
    return (v ^ (v >>> 16)) >>> 0;
  });
  return BigInt(out[0]) | (BigInt(out[1]) << 32n); // the two words viewed as one little-endian uint64
}

/**
 * One draw in [0, 1) for a stream key at step t: runtime/sampling.py's _uniform, bit for bit.
 * @param {bigint} key
 * @param {number} t
 * @returns {number}
 */
export function uniform(key, t) {
  let z = (key + BigInt(t + 1) * GOLDEN) & MASK64;
  z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & MASK64;
  z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & MASK64;
  z ^= z >> 31n;
  return Number(z >> 11n) * 2 ** -53;
}

/** numpy's pairwise sum of a float64 array (its add.reduce): 8 partial sums per block of 128. */
export function pairwiseSum(a, start = 0, n = a.length) {
  if (n < 8) {
    let s = 0;
    for (let i = start; i < start + n; i++) s += a[i];
    return s;
  }
  if (n <= 128) {
    const r = Array.from({ length: 8 }, (_, j) => a[start + j]);
    let i = 8;
    for (; i < n - (n % 8); i += 8) for (let j = 0; j < 8; j++) r[j] += a[start + i + j];
    let s = r[0] + r[1] + (r[2] + r[3]) + (r[4] + r[5] + (r[6] + r[7]));
    for (; i < n; i++) s += a[start + i];
    return s;
  }
  let half = Math.floor(n / 2);
  half -= half % 8;
  return pairwiseSum(a, start, half) + pairwiseSum(a, start + half, n - half);
}

/** Indices of `values` by value descending, ties to the lower index (numpy's stable argsort of -values). */
const descending = (values) => Array.from(values.keys()).sort((i, j) => values[j] - values[i] || i - j);

/** One row's sampling distribution: softmax(logProbs / temperature) within topK and topP. */
export function rowProbabilities(logProbs, { temperature = 1, topK = 0, topP = 1 } = {}) {
  const logits = Float64Array.from(logProbs, (x) => x / temperature);
  if (topK > 0 && topK < logits.length) {
    const outside = descending(logits).slice(topK);
    for (const i of outside) logits[i] = -Infinity;
  }
  const top = logits.reduce((a, b) => (b > a ? b : a), -Infinity);
  let probs = logits.map((x) => Math.exp(x - top));
  const total = pairwiseSum(probs);
  probs = probs.map((p) => p / total);
  if (topP < 1) {
    let before = 0; // numpy's cumsum - p: the mass of the likelier tokens
    for (const i of descending(probs)) {
      const p = probs[i];
      if (before + p - p >= topP) probs[i] = 0;
      before += p;
    }
    const kept = pairwiseSum(probs);
    probs = probs.map((p) => p / kept);
  }
  return probs;
}

/** The first index whose cumulative probability exceeds u (0 where none does, as numpy's argmax). */
function pick(probs, u) {
  let cum = 0;
  for (let i = 0; i < probs.length; i++) {
    cum += probs[i];
    if (cum > u) return i;
  }
  return 0;
}

/**
 * Refuses sampling settings out of range, naming the value and the fix (the Python runtime's limits).
 * @throws {RangeError}
 */
export function checkSampling({ temperature, topK, topP, seed, minLength = 0 }) {
  // as translateBatch's samplingTemperature, samplingTopk, samplingTopp, seed (spec/capabilities.json's limits)
  checkOption("sampling_temperature", temperature ?? NaN);
  checkOption("sampling_topk", topK);
  checkOption("sampling_topp", topP);
  checkOption("seed", seed);
  checkOption("min_decoding_length", minLength);
}

/** A fresh 128-bit seed, as numpy's SeedSequence() draws one when none is given. */
function freshSeed() {
  const words = new Uint32Array(4);
  if (globalThis.crypto?.getRandomValues) globalThis.crypto.getRandomValues(words);
  else
    words.forEach((_, i) => {
      words[i] = Math.floor(Math.random() * 2 ** 32);
    });
  return words.reduce((acc, w, i) => acc | (BigInt(w) << BigInt(32 * i)), 0n);
}

/**
 * Random sampling over `batch` sentences: runtime/sampling.py's sample, with the same stream. The
 * step must return full log-probabilities ({logProbs, vocab}), not top-k candidates.
 * @param {import("./search.js").Step} step
 * @param {number} batch
 * @param {{startId: number, eosId: number, maxLengths: number[], minLength?: number, temperature?: number,
 *          topK?: number, topP?: number, seed?: number | bigint | null,
 *          rowKeys?: (number | bigint)[][] | null}} options
 *   rowKeys: one key per sentence (default: its index); a sentence's draws depend only on (seed, key).
 * @returns {Promise<import("./search.js").SearchResult[]>}  scores: the model's log-probs of the samples
 * @throws {RangeError} a setting out of range, or not one row key per sentence
 */
export async function sampleSearch(
  step,
  batch,
  {
    startId,
    eosId,
    maxLengths,
    minLength = 0,
    temperature = 1,
    topK = 0,
    topP = 1,
    seed = null,
    rowKeys = null,
  },
) {
  checkSampling({ temperature, topK, topP, seed, minLength });
  const keys = rowKeys ?? Array.from({ length: batch }, (_, r) => [r]);
  if (keys.length !== batch) {
    throw new RangeError(`rowKeys has ${keys.length} keys for ${batch} sentences; give one per sentence`);
  }
  const shortest = maxLengths.length ? Math.min(...maxLengths) : null;
  if (shortest !== null && minLength >= shortest) {
    throw new RangeError(`minDecodingLength=${minLength} must lie in [0, maxDecodingLength=${shortest})`);
  }
  const root = seed ?? freshSeed();
  const streams = keys.map((key) => seedSequenceState([root, ...key]));
  let alive = null; // the sentence of each row, followed through `keep` as greedy search drops them
  const sampled = async (tokens, cacheIndices, t, keep) => {
    alive = t === 0 ? streams.map((_, r) => r) : keep === null ? alive : keep.map((i) => alive[i]);
    const out = await step(tokens, cacheIndices, t, keep);
    if (!("logProbs" in out)) {
      throw new TypeError("sampling needs every log-probability: the step returned top-k candidates");
    }
    const { vocab } = out;
    const oneHot = new Float64Array(alive.length * vocab).fill(-Infinity);
    alive.forEach((sentence, r) => {
      // slice: the step may hand a typed array or a plain one
      const row = Float64Array.from(out.logProbs.slice(r * vocab, (r + 1) * vocab));
      if (t < minLength) row[eosId] = -Infinity;
      const choice = pick(rowProbabilities(row, { temperature, topK, topP }), uniform(streams[sentence], t));
      oneHot[r * vocab + choice] = row[choice]; // greedy search's argmax: the choice, the model's score
    });
    return { logProbs: oneHot, vocab };
  };
  return greedySearch(sampled, batch, { startId, eosId, maxLengths, minLength: 0 });
}
