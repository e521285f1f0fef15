// src/search.js alone: hand-made fake steps with known answers (the cases of
// tests/test_runtime_search.py), and agreement with a plain one-sentence reference search on
// random log-prob tables, through both step outputs (full log-probs and top-k candidates).
import assert from "node:assert/strict";
import { test } from "node:test";
import { beamSearch, candidatesNeeded, greedySearch } from "../src/search.js";

const START = 2;
const EOS = 3;
const NEG = -50.0; // "never" without -inf

/**
 * A decoder whose log-probs are a function of (sentence, generated prefix). It follows rows
 * through cacheIndices and sentences through `keep`, checks that both agree (rows grouped by
 * sentence, beams contiguous), and records [t, rows, keep] of every call. With `topK` it answers
 * with the k best of each row (best first, ties lower id first) as the decoder graph does.
 */
class Fake {
  constructor(fn, batch, topK = null) {
    Object.assign(this, { fn, batch, topK, calls: [] });
  }

  step = (tokens, cacheIndices, t, keep) => {
    assert.equal(tokens.length, cacheIndices.length);
    this.calls.push([t, tokens.length, keep === null ? null : [...keep]]);
    let rows;
    if (t === 0) {
      assert.equal(keep, null);
      assert.ok(tokens.every((x) => x === START));
      assert.deepEqual([...cacheIndices], [...Array(this.batch).keys()]);
      this.alive = [...Array(this.batch).keys()];
      rows = this.alive.map((s) => [s, []]);
    } else {
      assert.equal(this.calls.length, t + 1, "steps must come in order t = 0, 1, ...");
      if (keep !== null) {
        assert.ok(keep.length < this.alive.length);
        assert.deepEqual(keep, [...new Set(keep)].sort((a, b) => a - b));
        this.alive = keep.map((k) => this.alive[k]);
      }
      rows = [...cacheIndices].map((c, r) => [this.rows[c][0], [...this.rows[c][1], tokens[r]]]);
      const beams = rows.length / this.alive.length;
      assert.ok(Number.isInteger(beams));
      assert.deepEqual(rows.map(([s]) => s), this.alive.flatMap((s) => Array(beams).fill(s)));
    }
    this.rows = rows;
    const tables = rows.map(([s, p]) => this.fn(s, p));
    const vocab = tables[0].length;
    if (this.topK === null) return { logProbs: Float64Array.from(tables.flat()), vocab };
    const k = this.topK;
    const values = [];
    const ids = [];
    for (const row of tables) {
      const order = [...row.keys()].sort((a, b) => (row[a] > row[b] ? -1 : row[a] < row[b] ? 1 : a - b)).slice(0, k);
      values.push(...order.map((i) => Math.fround(row[i])));
      ids.push(...order);
    }
    return { values: Float32Array.from(values), ids: Int32Array.from(ids), k, vocab };
  };
}

/** Hand-made log-probs by prefix; unlisted prefixes strongly prefer `defaultBest`. */
function tableFn(tables, vocab, defaultBest = EOS) {
  return (s, prefix) => {
    const table = tables.get(`${s}:${prefix.join(",")}`) ?? tables.get(prefix.join(","));
    const row = Array(vocab).fill(NEG);
    if (!table) {
      row[defaultBest] = -0.01;
      return row;
    }
    for (const [token, value] of Object.entries(table)) row[Number(token)] = value;
    return row;
  };
}

/** Normalised log-probs from a seeded generator per (sentence, prefix); ties: logits from {0, 1, 2}. */
function randomFn(seed, vocab, { ties = false, eosDrift = 0.7 } = {}) {
  const cache = new Map();
  return (s, prefix) => {
    const key = `${s}:${prefix.join(",")}`;
    if (!cache.has(key)) {
      let h = 2166136261 ^ seed;
      for (const c of `${seed}|${key}`) h = Math.imul(h ^ c.charCodeAt(0), 16777619);
      const rand = () => { // mulberry32
        h = (h + 0x6d2b79f5) | 0;
        let x = Math.imul(h ^ (h >>> 15), 1 | h);
        x = (x + Math.imul(x ^ (x >>> 7), 61 | x)) ^ x;
        return ((x ^ (x >>> 14)) >>> 0) / 4294967296;
      };
      const logits = Array.from({ length: vocab }, () => (ties ? Math.floor(rand() * 3) : (rand() + rand() + rand() - 1.5) * 2));
      logits[EOS] += eosDrift * (prefix.length - 2);
      const max = Math.max(...logits);
      const lse = max + Math.log(logits.reduce((a, x) => a + Math.exp(x - max), 0));
      // float32 values, as the decoder graph gives them: both step outputs then carry the same numbers
      cache.set(key, logits.map((x) => Math.fround(x - lse)));
    }
    return cache.get(key);
  };
}

const close = (a, b, tol = 1e-9) => assert.ok(Math.abs(a - b) <= tol, `${a} vs ${b}`);

// -- greedy ------------------------------------------------------------------------------------

test("greedy: argmax takes the first index on ties; the score sums the log-probs", async () => {
  const fn = tableFn(new Map([["", { 4: -0.5, 5: -0.5, [EOS]: -0.9 }], ["4", { 6: -0.25, [EOS]: -1.0 }], ["4,6", { [EOS]: -0.125 }]]), 8);
  const fake = new Fake(fn, 1);
  const [r] = await greedySearch(fake.step, 1, { startId: START, eosId: EOS, maxLengths: [10] });
  assert.deepEqual(r.hypotheses, [[4, 6, EOS]]);
  assert.deepEqual(r.scores, [-0.875]);
  assert.deepEqual(fake.calls.map((c) => c[0]), [0, 1, 2]);
});

test("greedy: the minimum length forbids the end token", async () => {
  const fn = tableFn(new Map([["", { [EOS]: -0.1, 5: -2.0, 6: -3.0 }], ["5", { [EOS]: -0.1, 6: -1.0 }], ["5,6", { [EOS]: -0.2 }]]), 8);
  const [free] = await greedySearch(new Fake(fn, 1).step, 1, { startId: START, eosId: EOS, maxLengths: [10] });
  assert.deepEqual(free.hypotheses, [[EOS]]);
  for (const topK of [null, candidatesNeeded(1, 2)]) {
    const [r] = await greedySearch(new Fake(fn, 1, topK).step, 1, { startId: START, eosId: EOS, maxLengths: [10], minLength: 2 });
    assert.deepEqual(r.hypotheses, [[5, 6, EOS]]);
    close(r.scores[0], -3.2, 1e-6);
  }
});

test("greedy: per-sentence max lengths, and finished rows leave through keep", async () => {
  const fn = (s) => [NEG, NEG, NEG, -9.0, -0.1 - s, -0.2, -5.0, -6.0]; // never ends
  const fake = new Fake(fn, 3);
  const res = await greedySearch(fake.step, 3, { startId: START, eosId: EOS, maxLengths: [2, 4, 3] });
  assert.deepEqual(res.map((r) => r.hypotheses), [[[4, 4]], [[5, 5, 5, 5]], [[5, 5, 5]]]);
  close(res[1].scores[0], -0.8);
  assert.deepEqual(fake.calls, [[0, 3, null], [1, 3, null], [2, 2, [1, 2]], [3, 1, [0]]]);
});

test("greedy: the end token finishes each sentence on its own", async () => {
  const fn = (s, p) => Array.from({ length: 8 }, (_, v) => (v === (p.length >= s + 1 ? EOS : 4) ? -0.1 : -3.0));
  const fake = new Fake(fn, 3);
  const res = await greedySearch(fake.step, 3, { startId: START, eosId: EOS, maxLengths: [20, 20, 20] });
  assert.deepEqual(res.map((r) => r.hypotheses[0]), [[4, EOS], [4, 4, EOS], [4, 4, 4, EOS]]);
  assert.deepEqual(fake.calls.map((c) => c[1]), [3, 3, 2, 1]);
});

// -- beam search: hand-made cases --------------------------------------------------------------

const beam = (fake, batch, options) => beamSearch(fake.step, batch, { startId: START, eosId: EOS, ...options });

test("beam: an end token outside the top K does not finish", async () => {
  const fn = tableFn(new Map([["", { 4: -0.1, 5: -0.2, [EOS]: -0.25, 6: -4.0 }], ["4", { [EOS]: -0.1, 6: -3.0 }],
    ["5", { [EOS]: -0.1, 6: -3.0 }]]), 8);
  const [r] = await beam(new Fake(fn, 1), 1, { beamSize: 2, maxLengths: [10], lengthPenalty: 0, numHypotheses: 2 });
  assert.deepEqual(r.hypotheses, [[4, EOS], [5, EOS]]);
  close(r.scores[0], -0.2);
  close(r.scores[1], -0.3);
});

test("beam: the length penalty reorders the n-best; scores are raw and include the end token", async () => {
  const fn = tableFn(new Map([["", { [EOS]: -1.0, 5: -1.1, 6: -3.0, 7: -9.0 }], ["5", { [EOS]: -0.05, 7: -6.0 }],
    ["6", { [EOS]: -0.05, 7: -6.0 }]]), 8);
  const run = async (alpha, n = 2) => (await beam(new Fake(fn, 1), 1, { beamSize: 2, maxLengths: [10], lengthPenalty: alpha, numHypotheses: n }))[0];
  const a0 = await run(0.0);
  assert.deepEqual(a0.hypotheses, [[EOS], [5, EOS]]);
  close(a0.scores[0], -1.0);
  close(a0.scores[1], -1.15);
  assert.deepEqual((await run(0.6)).hypotheses, [[5, EOS], [EOS]]); // -1.15 / 2^0.6 = -0.759 > -1.0
  const a1 = await run(1.0);
  assert.deepEqual(a1.hypotheses, [[5, EOS], [EOS]]);
  close(a1.scores[0], -1.15);
  assert.deepEqual((await run(1.0, 1)).hypotheses, [[5, EOS]]);
});

test("beam: at the max length the top K finish, the lower flat index first on ties", async () => {
  const fn = () => [NEG, NEG, NEG, -20.0, -0.25, -0.5, -8.0, -9.0]; // exact binary fractions: exact ties
  const fake = new Fake(fn, 1);
  const [r] = await beam(fake, 1, { beamSize: 2, maxLengths: [3], lengthPenalty: 1, numHypotheses: 2 });
  assert.deepEqual(r.hypotheses, [[4, 4, 4], [4, 4, 5]]);
  assert.deepEqual(r.scores, [-0.75, -1.0]);
  assert.equal(fake.calls.length, 3);
});

test("beam: the n-best of K = 4 in order", async () => {
  const ends = { 4: -0.5, 5: -0.1, 6: -1.5, 7: -0.05 };
  const tables = new Map([["", { [EOS]: -0.5, 4: -0.6, 5: -0.7, 6: -0.8, 7: -0.9 }]]);
  for (const [tok, cost] of Object.entries(ends)) tables.set(tok, { [EOS]: cost, 8: -7.0 });
  const [r] = await beam(new Fake(tableFn(tables, 10), 1), 1, { beamSize: 4, maxLengths: [10], lengthPenalty: 0, numHypotheses: 4 });
  assert.deepEqual(r.hypotheses, [[EOS], [5, EOS], [7, EOS], [4, EOS]]);
  [-0.5, -0.8, -0.95, -1.1].forEach((s, i) => close(r.scores[i], s));
});

test("beam: sentences finish on their own and leave the batch", async () => {
  const fn = (s, p) => {
    const row = Array(8).fill(-6.0);
    if (s === 0) {
      row[EOS] = p.length ? -0.1 : -6.5;
      [row[4], row[5]] = p.length ? [-3.0, -3.5] : [-0.2, -0.3];
    } else {
      row[EOS] = NEG;
      row[4 + (p.length % 3)] = -0.1;
    }
    return row;
  };
  const fake = new Fake(fn, 2);
  const options = { beamSize: 2, maxLengths: [4, 4], lengthPenalty: 1, numHypotheses: 2 };
  const res = await beam(fake, 2, options);
  assert.deepEqual(fake.calls.map((c) => c[1]), [2, 4, 2, 2]);
  assert.deepEqual(fake.calls.map((c) => c[2]), [null, null, [1], null]);
  for (const s of [0, 1]) {
    const [alone] = await beam(new Fake((_, p) => fn(s, p), 1), 1, { ...options, maxLengths: [4] });
    assert.deepEqual(res[s], alone);
  }
  assert.ok(res[0].hypotheses.every((h) => h.at(-1) === EOS) && res[1].hypotheses.every((h) => h.length === 4));
});

test("search: argument errors name the value", async () => {
  const fn = randomFn(0, 6);
  const kw = { startId: START, eosId: EOS };
  await assert.rejects(beamSearch(new Fake(fn, 1).step, 1, { ...kw, beamSize: 0, maxLengths: [5] }), /beamSize=0/);
  await assert.rejects(beamSearch(new Fake(fn, 1).step, 1, { ...kw, beamSize: 2, numHypotheses: 3, maxLengths: [5] }), /numHypotheses=3/);
  await assert.rejects(beamSearch(new Fake(fn, 1).step, 1, { ...kw, beamSize: 2, minLength: 5, maxLengths: [5] }), /minDecodingLength=5/);
  await assert.rejects(greedySearch(new Fake(fn, 1).step, 1, { ...kw, minLength: -1, maxLengths: [5] }), /minDecodingLength/);
  await assert.rejects(greedySearch(new Fake(fn, 1).step, 1, { ...kw, maxLengths: [0] }), /maxDecodingLength=0/);
  await assert.rejects(beamSearch(new Fake(fn, 1).step, 1, { ...kw, beamSize: 4, maxLengths: [5] }), /vocabulary of at least 8/);
  await assert.rejects(beamSearch(new Fake(randomFn(0, 12), 1, 3).step, 1, { ...kw, beamSize: 2, maxLengths: [5] }), /returned 3 candidates/);
});

// -- against a plain reference -----------------------------------------------------------------

/** One sentence's beam search written straight from docs/bundle-format.md, no batching, no cache. */
function reference(fn, s, { k, alpha, minLength, maxLength }) {
  let live = [{ tokens: [], score: 0 }];
  const fin = [];
  for (let t = 0; t < maxLength && fin.length < k; t++) {
    const cand = [];
    live.forEach((b, j) => fn(s, b.tokens).forEach((lp, v) => {
      const value = t < minLength && v === EOS ? -Infinity : lp;
      cand.push({ beam: j, token: v, total: b.score + value, flat: j * 1e6 + v });
    }));
    cand.sort((a, b) => (a.total > b.total ? -1 : a.total < b.total ? 1 : a.flat - b.flat));
    const top = cand.slice(0, 2 * k);
    const last = t + 1 === maxLength;
    for (const c of top.slice(0, k)) {
      if ((c.token === EOS || last) && fin.length < k) fin.push({ tokens: [...live[c.beam].tokens, c.token], score: c.total });
    }
    live = top.filter((c) => c.token !== EOS).slice(0, k).map((c) => ({ tokens: [...live[c.beam].tokens, c.token], score: c.total }));
  }
  const ranked = fin.map((h) => ({ ...h, norm: h.score / h.tokens.length ** alpha }));
  ranked.sort((x, y) => (x.norm > y.norm ? -1 : x.norm < y.norm ? 1 : 0));
  return { hypotheses: ranked.map((h) => h.tokens), scores: ranked.map((h) => h.score) };
}

test("beam equals the plain reference, through full log-probs and through top-k candidates", async () => {
  const vocab = 9;
  let checked = 0;
  let shrank = 0;
  for (const k of [1, 2, 4]) {
    for (const ties of [false, true]) {
      for (let seed = 0; seed < 4; seed++) {
        const fn = randomFn(seed * 10 + k, vocab, { ties });
        const batch = 3;
        const maxLengths = seed % 2 ? [7, 4, 9] : [6, 6, 6];
        for (const alpha of [0.0, 0.6, 1.0, 2.0]) {
          for (const minLength of [0, 2]) {
            const options = { beamSize: k, maxLengths, minLength, lengthPenalty: alpha, numHypotheses: k };
            const full = new Fake(fn, batch);
            const got = await beam(full, batch, options);
            const viaTopK = await beam(new Fake(fn, batch, candidatesNeeded(k, minLength)), batch, options);
            assert.deepEqual(viaTopK, got);
            for (let s = 0; s < batch; s++) {
              const want = reference(fn, s, { k, alpha, minLength, maxLength: maxLengths[s] });
              assert.deepEqual(got[s].hypotheses, want.hypotheses, JSON.stringify({ k, ties, seed, alpha, minLength, s }));
              got[s].scores.forEach((x, i) => close(x, want.scores[i]));
              got[s].hypotheses.forEach((h, i) => {
                close(h.reduce((a, tok, j) => a + fn(s, h.slice(0, j))[tok], 0), got[s].scores[i]);
                assert.ok(h.length <= maxLengths[s] && !h.slice(0, minLength).includes(EOS));
              });
              checked++;
            }
            shrank += full.calls.some((c) => c[2] !== null) ? 1 : 0;
          }
        }
      }
    }
  }
  assert.equal(checked, 3 * 2 * 4 * 4 * 2 * 3);
  assert.ok(shrank > 0, "the batch never shrank: keep was not exercised");
});

test("beam with K = 1 equals greedy, through both step outputs", async () => {
  for (let seed = 0; seed < 6; seed++) {
    const fn = randomFn(100 + seed, 7, { ties: seed % 2 === 1 });
    const maxLengths = [8, 3, 6, 10];
    for (const minLength of [0, 2]) {
      const common = { startId: START, eosId: EOS, maxLengths, minLength };
      const greedy = await greedySearch(new Fake(fn, 4).step, 4, common);
      const greedyTopK = await greedySearch(new Fake(fn, 4, candidatesNeeded(1, minLength)).step, 4, common);
      const one = await beamSearch(new Fake(fn, 4).step, 4, { ...common, beamSize: 1, lengthPenalty: 1 });
      assert.deepEqual(greedyTopK, greedy);
      assert.deepEqual(one.map((r) => r.hypotheses), greedy.map((r) => r.hypotheses));
      one.forEach((r, s) => close(r.scores[0], greedy[s].scores[0]));
      greedy.forEach((r, s) => assert.deepEqual(r.hypotheses[0], reference(fn, s, { k: 1, alpha: 1, minLength, maxLength: maxLengths[s] }).hypotheses[0]));
    }
  }
});
