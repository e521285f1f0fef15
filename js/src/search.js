// Greedy and beam search over an async step function: the JavaScript twin of runtime/search.py and
// runtime/beam.py.
//
// The convention is docs/decoding.md's and docs/bundle-format.md's, mirrored line for line
// from runtime/search.py and runtime/beam.py so that both hosts give the same token ids: scores are
// sums of log-probabilities (float64), end token included; the n-best is ranked by score / len^alpha; 2K
// candidates per sentence; an end token finishes only within the top K; at a sentence's last
// allowed step every top-K candidate finishes; ties go to the lower flat index (beam x V + token);
// a candidate whose score is -inf never finishes. forcePrefix wraps a step to force target prefixes.
//
//   step(tokens: number[], cacheIndices: number[], t: number, keep: number[] | null)
//     -> Promise<StepOutput>
//
// A StepOutput is either every row's full log-probabilities ({logProbs, vocab}: logProbs is a
// flat [rows x vocab] array) or only each row's k best ({values, ids, k, vocab}: flat [rows x k],
// best first, ties lower id first, as the decoder graph's TopK outputs give them). Rows are grouped
// by sentence, beams contiguous; row r continues row cacheIndices[r] of the previous step. `keep`
// is null, or the indices (into the previous step's sentences) of the sentences still decoding.

/**
 * @typedef {{logProbs: ArrayLike<number>, vocab: number}} FullLogProbs
 * @typedef {{values: ArrayLike<number>, ids: ArrayLike<number>, k: number, vocab: number}} TopK
 * @typedef {FullLogProbs | TopK} StepOutput
 * @typedef {(tokens: number[], cacheIndices: number[], t: number, keep: number[] | null) => Promise<StepOutput> | StepOutput} Step
 * @typedef {{hypotheses: number[][], scores: number[]}} SearchResult
 */

/**
 * A step that forces each sentence's target prefix (docs/bundle-format.md, "A forced target
 * prefix"; transformers' forced_bos_token_id): at step t < len(prefix) of a row's sentence, the
 * row's log-probabilities become 0 for prefix[t] and -inf for every other token, before the search
 * sees them, so the forced tokens add 0 to the score and count in the length. Works on both step
 * outputs: a top-k row becomes prefix[t] at 0, then the row's other ids at -inf (which ids those
 * are changes no result: a -inf candidate never finishes and never wins over a finite one). It
 * follows the sentences through `keep` as they finish (rows grouped by sentence, beams contiguous),
 * as the decoder graph does. With `end` it forces the end token at each sentence's last allowed step
 * (t = maxLengths[s] - 1) the same way: a bundle's decoding.forced_eos, transformers'
 * forced_eos_token_id. The twin of runtime/prefix.py's force_prefix.
 * @param {Step} step
 * @param {(ArrayLike<number> | null | undefined)[]} prefixes  one per sentence of the batch ([] or null: none)
 * @param {{endId: number, maxLengths: number[]} | null} [end]  the forced end token and each sentence's max length
 * @returns {Step}  `step` itself when nothing is forced
 */
export function forcePrefix(step, prefixes, end = null) {
  if (end && end.maxLengths.length !== prefixes.length) {
    throw new RangeError(
      `${end.maxLengths.length} max lengths for ${prefixes.length} sentences; give one per sentence`,
    );
  }
  // each sentence's forced tokens by step: its prefix, then (with end) the end token at its last step
  const table = prefixes.map((p, s) => {
    const row = Array.from(p ?? [], Number);
    if (end) row[Math.max(end.maxLengths[s], 1) - 1] = end.endId; // holes: nothing forced there
    return row;
  });
  const longest = Math.max(0, ...table.map((row) => row.length));
  if (!longest) return step;
  let alive = null; // the sentences of the last call's rows, in row order
  return async (tokens, cacheIndices, t, keep) => {
    if (t === 0) {
      if (tokens.length !== prefixes.length) {
        throw new RangeError(
          `${prefixes.length} target prefixes for a batch of ${tokens.length} sentences; give one per sentence`,
        );
      }
      alive = range(prefixes.length);
    } else if (keep !== null) {
      alive = keep.map((i) => alive[i]);
    }
    const out = await step(tokens, cacheIndices, t, keep);
    if (t >= longest) return out;
    const beams = tokens.length / alive.length;
    const forced = []; // [row, token]
    for (let r = 0; r < tokens.length; r++) {
      const token = table[alive[Math.floor(r / beams)]][t];
      if (token !== undefined) forced.push([r, token]);
    }
    if (!forced.length) return out;
    const vocab = out.vocab;
    for (const [, token] of forced) {
      if (!(Number.isInteger(token) && token >= 0 && token < vocab)) {
        throw new RangeError(`target prefix token ${token} is outside the target vocabulary [0, ${vocab})`);
      }
    }
    if ("ids" in out) {
      const { k } = out;
      const values = out.values.slice();
      const ids = out.ids.slice();
      for (const [r, token] of forced) {
        values.fill(-Infinity, r * k, (r + 1) * k);
        values[r * k] = 0;
        // the forced token first, then the row's other ids (distinct) in their order, as runtime/prefix.py
        const rest = Array.from(out.ids.slice(r * k, (r + 1) * k), Number).filter((id) => id !== token);
        ids[r * k] = token;
        for (let j = 1; j < k; j++) ids[r * k + j] = rest[j - 1];
      }
      return { ...out, values, ids };
    }
    const logProbs = out.logProbs.slice();
    for (const [r, token] of forced) {
      logProbs.fill(-Infinity, r * vocab, (r + 1) * vocab);
      logProbs[r * vocab + token] = 0;
    }
    return { ...out, logProbs };
  };
}

/** transformers' early_stopping values, beamSearch's earlyStopping. */
const EARLY_STOPPING = [true, false, "never"];

/**
 * How many candidates per row a search's step must return for it to be exact: 2K for a beam search (K = 1
 * included), 1 for greedy search (it reads its best alone), +1 under a minimum length (the best may be the
 * forbidden end token). The Python host's runtime/search.py candidates_needed is the same rule.
 */
export function candidatesNeeded(beamSize, minLength, greedy = false) {
  return (greedy ? 1 : 2 * beamSize) + (minLength > 0 ? 1 : 0);
}

const range = (n) => Array.from({ length: n }, (_, i) => i);

function check(beamSize, maxLengths, minLength) {
  if (!(Number.isInteger(beamSize) && beamSize >= 1)) {
    throw new RangeError(`beamSize=${beamSize}; it must be an integer of at least 1 (1 is greedy search)`);
  }
  const shortest = maxLengths.length ? Math.min(...maxLengths) : null;
  if (shortest !== null && shortest < 1) {
    throw new RangeError(`maxDecodingLength=${shortest}; it must be at least 1`);
  }
  if (minLength < 0 || (shortest !== null && minLength >= shortest)) {
    throw new RangeError(
      `minDecodingLength=${minLength} must lie in [0, maxDecodingLength=${shortest ?? "?"})`,
    );
  }
}

/** Row r's best token (first index on ties) and its log-probability; the end token may be forbidden. */
function argmaxRow(out, r, eosId, forbidEos) {
  let best = -1;
  let bestValue = -Infinity;
  if ("ids" in out) {
    // Sorted best first: the first entry that is not a forbidden end token, unless all are -inf.
    for (let j = 0; j < out.k; j++) {
      const id = Number(out.ids[r * out.k + j]);
      const v = forbidEos && id === eosId ? -Infinity : out.values[r * out.k + j];
      if (best < 0 || v > bestValue) [best, bestValue] = [id, v];
    }
  } else {
    for (let v = 0; v < out.vocab; v++) {
      const x = forbidEos && v === eosId ? -Infinity : out.logProbs[r * out.vocab + v];
      if (best < 0 || x > bestValue) [best, bestValue] = [v, x];
    }
  }
  return [best, bestValue];
}

/**
 * Argmax at each step (first index on ties); a sentence stops at its end token or its max length.
 * @param {Step} step
 * @param {number} batch
 * @param {{startId: number, eosId: number, maxLengths: number[], minLength?: number}} options
 * @returns {Promise<SearchResult[]>}
 */
export async function greedySearch(step, batch, { startId, eosId, maxLengths, minLength = 0 }) {
  check(1, maxLengths, minLength);
  const out = Array.from({ length: batch }, () => []);
  const scores = new Float64Array(batch);
  let alive = range(batch); // sentences still decoding, in row order
  let tokens = new Array(batch).fill(startId);
  let cacheIndices = range(batch);
  let keep = null;
  let t = 0;
  while (alive.length) {
    const res = await step(tokens, cacheIndices, t, keep);
    const best = new Array(alive.length);
    for (let r = 0; r < alive.length; r++) {
      const [token, lp] = argmaxRow(res, r, eosId, t < minLength);
      best[r] = token;
      out[alive[r]].push(token);
      scores[alive[r]] += lp;
    }
    t += 1;
    const still = range(alive.length).filter((r) => best[r] !== eosId && maxLengths[alive[r]] > t);
    if (still.length === alive.length) {
      keep = null;
      cacheIndices = range(alive.length);
      tokens = best;
    } else {
      keep = still;
      cacheIndices = still;
      alive = still.map((r) => alive[r]);
      tokens = still.map((r) => best[r]);
    }
  }
  return out.map((h, b) => ({ hypotheses: [h], scores: [scores[b]] }));
}

/** Orders (total desc, flat asc): the lower flat index wins a tie; -inf sorts last. */
const byTotalThenFlat = (a, b) => (a.total > b.total ? -1 : a.total < b.total ? 1 : a.flat - b.flat);

/** One sentence's 2K best candidates {flat, total} from its `beams` rows starting at `row0`. */
function sentenceCandidates(out, row0, beams, beamScores, n, eosId, forbidEos) {
  const vocab = out.vocab;
  if ("ids" in out) {
    const kk = out.k;
    const all = [];
    for (let j = 0; j < beams; j++) {
      for (let c = 0; c < kk; c++) {
        const i = (row0 + j) * kk + c;
        const id = Number(out.ids[i]);
        const value = forbidEos && id === eosId ? -Infinity : out.values[i];
        all.push({ flat: j * vocab + id, total: beamScores[j] + value });
      }
    }
    return all.sort(byTotalThenFlat).slice(0, n);
  }
  // Full log-probabilities: keep the n best while scanning in flat order, so that an equal value
  // met later (a higher flat index) never displaces an earlier one.
  const top = [];
  for (let j = 0; j < beams; j++) {
    for (let v = 0; v < vocab; v++) {
      const lp = forbidEos && v === eosId ? -Infinity : out.logProbs[(row0 + j) * vocab + v];
      const total = beamScores[j] + lp;
      if (top.length === n && !(total > top[n - 1].total)) continue;
      let at = top.length;
      while (at > 0 && !(top[at - 1].total >= total)) at--;
      top.splice(at, 0, { flat: j * vocab + v, total });
      if (top.length > n) top.pop();
    }
  }
  return top;
}

/**
 * Beam search over `batch` sentences at once; each sentence finishes on its own.
 * @param {Step} step
 * @param {number} batch
 * `bestFinished`: false, a finishing candidate takes a free place among the K (our convention,
 * docs/decoding.md); true, transformers' (generate()'s): the K best by normalised score of those
 * finished so far and this step's, which may displace one finished earlier. `earlyStopping`, with
 * bestFinished, is generate()'s: true, a sentence is done once K have finished; false or "never", a
 * full sentence goes on while its best live beam's score / len^alpha beats the worst finished one's,
 * len being the tokens generated so far, or for "never" with alpha > 0 the sentence's max length
 * (its _check_early_stop_heuristic). bundle.json's decoding.beam_convention names both (translator.js).
 * @param {{beamSize: number, startId: number, eosId: number, maxLengths: number[], minLength?: number,
 *          lengthPenalty?: number, numHypotheses?: number, bestFinished?: boolean,
 *          earlyStopping?: boolean | "never"}} options
 * @returns {Promise<SearchResult[]>}
 */
export async function beamSearch(
  step,
  batch,
  {
    beamSize,
    startId,
    eosId,
    maxLengths,
    minLength = 0,
    lengthPenalty = 1.0,
    numHypotheses = 1,
    bestFinished = false,
    earlyStopping = true,
  },
) {
  check(beamSize, maxLengths, minLength);
  if (!EARLY_STOPPING.includes(earlyStopping) || (earlyStopping !== true && !bestFinished)) {
    throw new RangeError(
      `earlyStopping=${JSON.stringify(earlyStopping)}: true, false or "never", and ` +
        'false or "never" only with bestFinished (transformers\' rule)',
    );
  }
  const k = beamSize;
  const norm = (score, length) => score / length ** lengthPenalty;
  if (!(Number.isInteger(numHypotheses) && numHypotheses >= 1 && numHypotheses <= k)) {
    throw new RangeError(`numHypotheses=${numHypotheses} must lie in [1, beamSize=${k}]`);
  }
  /** @type {{tokens: number[], score: number}[][]} finished hypotheses per sentence, in finishing order */
  const fin = Array.from({ length: batch }, () => []);
  let alive = range(batch); // sentence ids still decoding
  let beams = 1; // live beams per sentence: one on the first step
  let scores = alive.map(() => [0]); // [b][beams] cumulative log-probabilities
  let history = alive.map(() => [[]]); // [b][beams] tokens so far
  let tokens = new Array(batch).fill(startId);
  let cacheIndices = range(batch);
  let keep = null;
  let t = 0;
  while (alive.length) {
    const b = alive.length;
    const out = await step(tokens, cacheIndices, t, keep);
    const vocab = out.vocab;
    if (vocab < 2 * k) {
      throw new RangeError(
        `beamSize=${k} needs a vocabulary of at least ${2 * k} tokens, this one has ${vocab}`,
      );
    }
    if ("ids" in out && out.k < 2 * k) {
      throw new RangeError(`the step returned ${out.k} candidates per row; beamSize=${k} needs ${2 * k}`);
    }
    const nextHistory = [];
    const nextScores = [];
    const nextTokens = [];
    const origins = [];
    const still = [];
    for (let i = 0; i < b; i++) {
      const sent = alive[i];
      const cand = sentenceCandidates(out, i * beams, beams, scores[i], 2 * k, eosId, t < minLength);
      const last = maxLengths[sent] === t + 1;
      // 1. finish: top-K candidates that end (all top-K at the last step), while room remains; a
      // candidate whose score is -inf (a forbidden or forced-out token) never finishes
      // bestFinished: a sentence filled at this step, or full and still live, may swap (below)
      for (let rank = 0; rank < k && (fin[sent].length < k || bestFinished); rank++) {
        const token = cand[rank].flat % vocab;
        if ((token === eosId || last) && cand[rank].total !== -Infinity) {
          const beam = Math.floor(cand[rank].flat / vocab);
          const done = { tokens: [...history[i][beam], token], score: cand[rank].total };
          if (fin[sent].length < k) {
            fin[sent].push(done);
            continue;
          }
          // this step's candidates come best first: each may displace the worst finished (the first of equal ones)
          const norms = fin[sent].map((h) => norm(h.score, h.tokens.length));
          const worst = norms.indexOf(Math.min(...norms));
          if (norm(done.score, t + 1) > norms[worst]) fin[sent][worst] = done;
        }
      }
      // 2. continue: the first K candidates that do not end (each beam offers at most one end
      // token, so there are at least K among the 2K)
      const cont = cand.filter((c) => c.flat % vocab !== eosId).slice(0, k);
      if (cont.length < k)
        throw new Error(`internal: ${cont.length} continuing candidates for beamSize=${k}`);
      nextHistory.push(cont.map((c) => [...history[i][Math.floor(c.flat / vocab)], c.flat % vocab]));
      nextScores.push(cont.map((c) => c.total));
      nextTokens.push(cont.map((c) => c.flat % vocab));
      origins.push(cont.map((c) => i * beams + Math.floor(c.flat / vocab)));
      // 3. the sentence stays if it has steps left and room for more finished hypotheses, or (early
      // stopping false or "never") while its best live beam could still beat the worst finished one
      let stays = !last;
      if (stays && fin[sent].length === k) {
        if (earlyStopping === true) stays = false;
        else {
          const worst = Math.min(...fin[sent].map((h) => norm(h.score, h.tokens.length)));
          const reach = earlyStopping === "never" && lengthPenalty > 0 ? maxLengths[sent] : t + 1;
          stays = cont[0].total / reach ** lengthPenalty > worst;
        }
      }
      if (stays) still.push(i);
    }
    t += 1;
    keep = still.length === b ? null : still;
    const kept = keep ?? range(b);
    alive = kept.map((i) => alive[i]);
    history = kept.map((i) => nextHistory[i]);
    scores = kept.map((i) => nextScores[i]);
    tokens = kept.flatMap((i) => nextTokens[i]);
    cacheIndices = kept.flatMap((i) => origins[i]);
    beams = k;
  }
  return fin.map((done) => {
    const ranked = done.map((h) => ({ ...h, norm: norm(h.score, h.tokens.length) }));
    // stable: equal normalised scores keep their finishing order, as numpy's stable argsort does
    ranked.sort((x, y) => (x.norm > y.norm ? -1 : x.norm < y.norm ? 1 : 0));
    const best = ranked.slice(0, numHypotheses);
    return { hypotheses: best.map((h) => h.tokens), scores: best.map((h) => h.score) };
  });
}
