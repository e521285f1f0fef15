// src/search.js alone: the hand-made fake steps with known answers of spec/cases/search.json
// (shared with tests/test_runtime_search.py), and agreement with a plain one-sentence reference
// search on random log-prob tables, through both step outputs (full log-probs and top-k candidates).
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import { beamSearch, candidatesNeeded, forcePrefix, greedySearch } from "../src/search.js";

const CASES = JSON.parse(readFileSync(new URL("../../spec/cases/search.json", import.meta.url), "utf8"));
// a case's convention (bundle.json's decoding.beam_convention) as beamSearch's options, as src/translator.js maps it
const RULES = {
  fairseq: { bestFinished: false, earlyStopping: true },
  transformers: { bestFinished: true, earlyStopping: true },
  transformers_heuristic: { bestFinished: true, earlyStopping: false },
  transformers_never: { bestFinished: true, earlyStopping: "never" },
};
const START = CASES.start_id;
const EOS = CASES.end_id;
const NEG = CASES.never; // "never" without -inf

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
        assert.deepEqual(
          keep,
          [...new Set(keep)].sort((a, b) => a - b),
        );
        this.alive = keep.map((k) => this.alive[k]);
      }
      rows = [...cacheIndices].map((c, r) => [this.rows[c][0], [...this.rows[c][1], tokens[r]]]);
      const beams = rows.length / this.alive.length;
      assert.ok(Number.isInteger(beams));
      assert.deepEqual(
        rows.map(([s]) => s),
        this.alive.flatMap((s) => Array(beams).fill(s)),
      );
    }
    this.rows = rows;
    const tables = rows.map(([s, p]) => this.fn(s, p));
    const vocab = tables[0].length;
    if (this.topK === null) return { logProbs: Float64Array.from(tables.flat()), vocab };
    const k = this.topK;
    const values = [];
    const ids = [];
    for (const row of tables) {
      const order = [...row.keys()]
        .sort((a, b) => (row[a] > row[b] ? -1 : row[a] < row[b] ? 1 : a - b))
        .slice(0, k);
      values.push(...order.map((i) => Math.fround(row[i])));
      ids.push(...order);
    }
    return { values: Float32Array.from(values), ids: Int32Array.from(ids), k, vocab };
  };
}

/**
 * The fake decoder of a spec/cases/search.json case: its log-prob row for (sentence, prefix),
 * looked up by the keys "S:P", "P", "S:*", "*" in turn; unlisted prefixes strongly prefer
 * `default_best` (the end token when absent). See the file's $comment.
 */
function caseFn(c) {
  const tables = c.log_probs;
  const value = (v) => (v === "never" ? NEG : v);
  return (s, prefix) => {
    const p = prefix.join(",");
    const key = [`${s}:${p}`, p, `${s}:*`, "*"].find((k) => Object.hasOwn(tables, k));
    if (key === undefined) {
      const row = Array(c.vocab).fill(NEG);
      row[c.default_best ?? EOS] = -0.01;
      return row;
    }
    const row = Array(c.vocab).fill(value(tables[key]["*"] ?? "never"));
    for (const [token, v] of Object.entries(tables[key])) if (token !== "*") row[Number(token)] = value(v);
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
      const rand = () => {
        // mulberry32
        h = (h + 0x6d2b79f5) | 0;
        let x = Math.imul(h ^ (h >>> 15), 1 | h);
        x = (x + Math.imul(x ^ (x >>> 7), 61 | x)) ^ x;
        return ((x ^ (x >>> 14)) >>> 0) / 4294967296;
      };
      const logits = Array.from({ length: vocab }, () =>
        ties ? Math.floor(rand() * 3) : (rand() + rand() + rand() - 1.5) * 2,
      );
      logits[EOS] += eosDrift * (prefix.length - 2);
      const max = Math.max(...logits);
      const lse = max + Math.log(logits.reduce((a, x) => a + Math.exp(x - max), 0));
      // float32 values, as the decoder graph gives them: both step outputs then carry the same numbers
      cache.set(
        key,
        logits.map((x) => Math.fround(x - lse)),
      );
    }
    return cache.get(key);
  };
}

const close = (a, b, tol = 1e-9) => assert.ok(Math.abs(a - b) <= tol, `${a} vs ${b}`);

const beam = (fake, batch, options) =>
  beamSearch(fake.step, batch, { startId: START, eosId: EOS, ...options });

// -- greedy and beam search: the shared hand-made cases (spec/cases/search.json) ---------------

/**
 * One case through greedySearch or beamSearch, the Fake answering with full log-probs or top-k,
 * through forcePrefix where the case has target prefixes (`prefixes`, one per sentence searched) or
 * forced_eos.
 */
async function runCase(c, fn, maxLengths, stepOutput, prefixes = c.target_prefixes) {
  const minLength = c.min_length ?? 0;
  const beamSize = c.search === "beam" ? c.beam_size : 1;
  const fake = new Fake(
    fn,
    maxLengths.length,
    stepOutput === "full" ? null : candidatesNeeded(beamSize, minLength, c.search !== "beam"),
  );
  const end = c.forced_eos ? { endId: EOS, maxLengths } : null; // forced_eos: the end token at the last step
  const forced = prefixes ?? (end ? maxLengths.map(() => []) : null);
  const step = forced ? forcePrefix(fake.step, forced, end) : fake.step;
  const common = { startId: START, eosId: EOS, maxLengths, minLength };
  if (c.search === "greedy") return [await greedySearch(step, maxLengths.length, common), fake];
  assert.equal(c.search, "beam");
  const options = {
    ...common,
    beamSize,
    numHypotheses: c.num_hypotheses,
    lengthPenalty: c.length_penalty,
    ...RULES[c.convention ?? "fairseq"],
  };
  return [await beamSearch(step, maxLengths.length, options), fake];
}

for (const c of CASES.cases) {
  for (const stepOutput of c.steps) {
    test(`${c.name} [${stepOutput}]`, async () => {
      assert.ok(["full", "top_k"].includes(stepOutput), stepOutput);
      if (c.target_prefixes)
        assert.equal(c.target_prefixes.length, c.max_lengths.length, "one prefix per sentence");
      const fn = caseFn(c);
      const [res, fake] = await runCase(c, fn, c.max_lengths, stepOutput);
      assert.equal(res.length, c.max_lengths.length);
      assert.equal(c.expect.length, c.max_lengths.length);
      c.expect.forEach((want, s) => {
        assert.deepEqual(res[s].hypotheses, want.hypotheses, `sentence ${s}`);
        assert.equal(res[s].scores.length, want.scores.length, `sentence ${s}`);
        want.scores.forEach((x, i) => {
          close(res[s].scores[i], x, c.score_tolerance);
        });
      });
      if (c.calls) assert.deepEqual(fake.calls, c.calls);
      if (c.max_lengths.length > 1) {
        // each sentence alone gives what it gets in the batch
        for (let s = 0; s < c.max_lengths.length; s++) {
          const [[alone]] = await runCase(
            c,
            (_, p) => fn(s, p),
            [c.max_lengths[s]],
            stepOutput,
            c.target_prefixes && [c.target_prefixes[s]],
          );
          assert.deepEqual(alone, res[s], `sentence ${s}`);
        }
      }
    });
  }
}

// -- argument errors ---------------------------------------------------------------------------

test("beam conventions: every one of the spec's, in its order (src/translator.js maps them by place), has cases", () => {
  const spec = JSON.parse(readFileSync(new URL("../../spec/bundle.json", import.meta.url), "utf8"));
  assert.deepEqual(spec.beam_conventions, Object.keys(RULES));
  const used = new Set(CASES.cases.filter((c) => c.search === "beam").map((c) => c.convention ?? "fairseq"));
  assert.deepEqual([...used].sort(), Object.keys(RULES).sort());
});

test("search: argument errors name the value", async () => {
  const fn = randomFn(0, 6);
  const kw = { startId: START, eosId: EOS };
  await assert.rejects(
    beamSearch(new Fake(fn, 1).step, 1, { ...kw, beamSize: 0, maxLengths: [5] }),
    /beamSize=0/,
  );
  await assert.rejects(
    beamSearch(new Fake(fn, 1).step, 1, { ...kw, beamSize: 2, numHypotheses: 3, maxLengths: [5] }),
    /numHypotheses=3/,
  );
  await assert.rejects(
    beamSearch(new Fake(fn, 1).step, 1, { ...kw, beamSize: 2, minLength: 5, maxLengths: [5] }),
    /minDecodingLength=5/,
  );
  await assert.rejects(
    beamSearch(new Fake(fn, 1).step, 1, {
      ...kw,
      beamSize: 2,
      maxLengths: [5],
      bestFinished: true,
      earlyStopping: "no",
    }),
    /earlyStopping="no"/,
  );
  await assert.rejects(
    beamSearch(new Fake(fn, 1).step, 1, { ...kw, beamSize: 2, maxLengths: [5], earlyStopping: false }),
    /only with bestFinished/,
  );
  await assert.rejects(
    greedySearch(new Fake(fn, 1).step, 1, { ...kw, minLength: -1, maxLengths: [5] }),
    /minDecodingLength/,
  );
  await assert.rejects(
    greedySearch(new Fake(fn, 1).step, 1, { ...kw, maxLengths: [0] }),
    /maxDecodingLength=0/,
  );
  await assert.rejects(
    beamSearch(new Fake(fn, 1).step, 1, { ...kw, beamSize: 4, maxLengths: [5] }),
    /vocabulary of at least 8/,
  );
  await assert.rejects(
    beamSearch(new Fake(randomFn(0, 12), 1, 3).step, 1, { ...kw, beamSize: 2, maxLengths: [5] }),
    /returned 3 candidates/,
  );
});

// -- against a plain reference -----------------------------------------------------------------

/**
 * One sentence's beam search written straight from docs/bundle-format.md, no batching, no cache; a
 * forced prefix replaces the log-probs at t < its length (0 for its token, -inf elsewhere).
 */
function reference(fn, s, { k, alpha, minLength, maxLength, prefix = [] }) {
  let live = [{ tokens: [], score: 0 }];
  const fin = [];
  for (let t = 0; t < maxLength && fin.length < k; t++) {
    const cand = [];
    live.forEach((b, j) => {
      fn(s, b.tokens).forEach((lp, v) => {
        const forced = t < prefix.length ? (v === prefix[t] ? 0 : -Infinity) : lp;
        const value = t < minLength && v === EOS ? -Infinity : forced;
        cand.push({ beam: j, token: v, total: b.score + value, flat: j * 1e6 + v });
      });
    });
    cand.sort((a, b) => (a.total > b.total ? -1 : a.total < b.total ? 1 : a.flat - b.flat));
    const top = cand.slice(0, 2 * k);
    const last = t + 1 === maxLength;
    for (const c of top.slice(0, k)) {
      // a candidate at -inf never finishes
      const finishes = (c.token === EOS || last) && c.total !== -Infinity;
      if (finishes && fin.length < k) fin.push({ tokens: [...live[c.beam].tokens, c.token], score: c.total });
    }
    live = top
      .filter((c) => c.token !== EOS)
      .slice(0, k)
      .map((c) => ({ tokens: [...live[c.beam].tokens, c.token], score: c.total }));
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
              assert.deepEqual(
                got[s].hypotheses,
                want.hypotheses,
                JSON.stringify({ k, ties, seed, alpha, minLength, s }),
              );
              got[s].scores.forEach((x, i) => {
                close(x, want.scores[i]);
              });
              got[s].hypotheses.forEach((h, i) => {
                close(
                  h.reduce((a, tok, j) => a + fn(s, h.slice(0, j))[tok], 0),
                  got[s].scores[i],
                );
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

test("greedy asks for its best candidate alone (+1 while the end token is forbidden), a beam search for 2K", () => {
  assert.deepEqual([candidatesNeeded(1, 0, true), candidatesNeeded(1, 3, true)], [1, 2]);
  assert.deepEqual([candidatesNeeded(1, 0), candidatesNeeded(4, 0), candidatesNeeded(4, 1)], [2, 8, 9]);
});

test("beam with K = 1 equals greedy, through both step outputs", async () => {
  for (let seed = 0; seed < 6; seed++) {
    const fn = randomFn(100 + seed, 7, { ties: seed % 2 === 1 });
    const maxLengths = [8, 3, 6, 10];
    for (const minLength of [0, 2]) {
      const common = { startId: START, eosId: EOS, maxLengths, minLength };
      const greedy = await greedySearch(new Fake(fn, 4).step, 4, common);
      const greedyTopK = await greedySearch(
        new Fake(fn, 4, candidatesNeeded(1, minLength, true)).step,
        4,
        common,
      );
      const one = await beamSearch(new Fake(fn, 4).step, 4, { ...common, beamSize: 1, lengthPenalty: 1 });
      assert.deepEqual(greedyTopK, greedy);
      assert.deepEqual(
        one.map((r) => r.hypotheses),
        greedy.map((r) => r.hypotheses),
      );
      one.forEach((r, s) => {
        close(r.scores[0], greedy[s].scores[0]);
      });
      greedy.forEach((r, s) => {
        assert.deepEqual(
          r.hypotheses[0],
          reference(fn, s, { k: 1, alpha: 1, minLength, maxLength: maxLengths[s] }).hypotheses[0],
        );
      });
    }
  }
});

test("forced prefixes: beam and greedy equal the plain reference, through both step outputs, sentences leaving", async () => {
  const vocab = 9;
  const pick = (seed, s) => [[], [5], [7, 4], [3], [6, 3, 8], [1, 1, 1, 1, 1]][(seed * 7 + s * 3) % 6];
  let checked = 0;
  for (const k of [1, 2, 4]) {
    for (let seed = 0; seed < 6; seed++) {
      const fn = randomFn(500 + seed * 10 + k, vocab, { ties: seed % 3 === 2 });
      const maxLengths = seed % 2 ? [7, 3, 9, 5] : [6, 6, 6, 6];
      const prefixes = maxLengths.map((_, s) => pick(seed, s));
      for (const [alpha, minLength] of [
        [1.0, 0],
        [0.0, 2],
        [0.6, 0],
      ]) {
        const options = { beamSize: k, maxLengths, minLength, lengthPenalty: alpha, numHypotheses: k };
        const full = await beam({ step: forcePrefix(new Fake(fn, 4).step, prefixes) }, 4, options);
        const topK = await beam(
          { step: forcePrefix(new Fake(fn, 4, candidatesNeeded(k, minLength)).step, prefixes) },
          4,
          options,
        );
        assert.deepEqual(topK, full);
        for (let s = 0; s < 4; s++) {
          const want = reference(fn, s, {
            k,
            alpha,
            minLength,
            maxLength: maxLengths[s],
            prefix: prefixes[s],
          });
          const where = JSON.stringify({ k, seed, alpha, minLength, s, prefix: prefixes[s] });
          assert.deepEqual(full[s].hypotheses, want.hypotheses, where);
          full[s].scores.forEach((x, i) => {
            close(x, want.scores[i]);
          });
          for (const h of full[s].hypotheses)
            assert.deepEqual(h.slice(0, prefixes[s].length), prefixes[s].slice(0, h.length), where);
          checked++;
        }
        if (k === 1) {
          const common = { startId: START, eosId: EOS, maxLengths, minLength };
          const greedy = await greedySearch(forcePrefix(new Fake(fn, 4).step, prefixes), 4, common);
          const greedyTopK = await greedySearch(
            forcePrefix(new Fake(fn, 4, candidatesNeeded(1, minLength, true)).step, prefixes),
            4,
            common,
          );
          // An end token forced where the minimum length forbids it leaves no finite candidate: the
          // argmax of a row of -inf is then the step output's first entry, unspecified. Elsewhere
          // greedy is beam K = 1, through both step outputs.
          greedy.forEach((r, s) => {
            if (prefixes[s].slice(0, minLength).includes(EOS)) return;
            assert.deepEqual(greedyTopK[s], r, `greedy ${s}`);
            assert.deepEqual(r.hypotheses, full[s].hypotheses, `greedy ${s}`);
          });
        }
      }
    }
  }
  assert.equal(checked, 3 * 6 * 3 * 4);
});

test("forcePrefix: the step itself without prefixes; one prefix per sentence; ids inside the vocabulary", async () => {
  const fake = new Fake(randomFn(1, 6), 2);
  assert.equal(forcePrefix(fake.step, [[], null]), fake.step);
  const kw = { startId: START, eosId: EOS, maxLengths: [4, 4] };
  await assert.rejects(
    greedySearch(forcePrefix(new Fake(randomFn(1, 6), 2).step, [[4]]), 2, kw),
    /1 target prefixes for a batch of 2 sentences/,
  );
  await assert.rejects(
    greedySearch(forcePrefix(new Fake(randomFn(1, 6), 2).step, [[4], [6]]), 2, kw),
    /target prefix token 6 is outside the target vocabulary \[0, 6\)/,
  );
  // the rows forced, the step's own arrays untouched
  const out = {
    values: Float32Array.of(-0.5, -1, -2, -0.1, -0.2, -0.3),
    ids: Int32Array.of(4, 0, 1, 2, 5, 3),
    k: 3,
    vocab: 6,
  };
  const forced = await forcePrefix(() => out, [[0], [5]])([START, START], [0, 1], 0, null);
  assert.deepEqual([...forced.ids], [0, 4, 1, 5, 2, 3]); // the forced id, then the row's others in order
  assert.deepEqual([...forced.values], [0, -Infinity, -Infinity, 0, -Infinity, -Infinity]);
  assert.deepEqual([...out.ids], [4, 0, 1, 2, 5, 3]);
});
