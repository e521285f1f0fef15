// src/sampling.js: the shared cases of spec/cases/sampling.json (drawn by runtime/sampling.py, so
// passing them proves the same tokens as the Python host), the stream itself, the sampler's own
// properties (the seed reproduces, top-k and top-p restrict the support, batch invariance), and
// sampling through translateBatch and the command line on the fake host.
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { after, test } from "node:test";
import { main } from "../src/cli.js";
import { Translator } from "../src/index.js";
import { pairwiseSum, rowProbabilities, sampleSearch, seedSequenceState, uniform } from "../src/sampling.js";
import { EOS, fakeBundle, fakePlatform, VOCAB } from "./fake-host.mjs";

const SPEC = JSON.parse(readFileSync(new URL("../../spec/cases/sampling.json", import.meta.url), "utf8"));
const TABLE = JSON.parse(readFileSync(new URL("../../spec/capabilities.json", import.meta.url), "utf8"));
const root = mkdtempSync(path.join(tmpdir(), "seq2onnx-sampling-"));
after(() => rmSync(root, { recursive: true, force: true }));

/** The fake decoder of sampling.json: row (s, p) is base[(s + len(p) + sum(p)) % len(base)]; follows keep. */
function fake(sentences) {
  let rows = [];
  let alive = [];
  return (tokens, cacheIndices, t, keep) => {
    if (t === 0) {
      alive = [...sentences];
      rows = alive.map((s) => [s, []]);
    } else {
      if (keep !== null) alive = keep.map((i) => alive[i]);
      rows = cacheIndices.map((c, r) => [rows[c][0], [...rows[c][1], tokens[r]]]);
    }
    const base = SPEC.base;
    const at = (s, p) => (s + p.length + p.reduce((a, x) => a + x, 0)) % base.length;
    const logProbs = Float64Array.from(rows.flatMap(([s, p]) => base[at(s, p)]));
    return { logProbs, vocab: SPEC.vocab };
  };
}

const optionsOf = (c) => ({
  startId: SPEC.start_id,
  eosId: SPEC.end_id,
  maxLengths: c.max_lengths,
  minLength: c.min_length ?? 0,
  temperature: c.temperature,
  topK: c.top_k ?? 0,
  topP: c.top_p ?? 1,
  seed: BigInt(c.seed),
  rowKeys: c.row_keys ?? null,
});

/** The options a case exercises, by spec/capabilities.json's FILE:FIELD entries. */
const exercised = (c) =>
  Object.entries(TABLE.options)
    .filter(([, o]) => o.cases.some((ref) => ref.startsWith("sampling.json:") && ref.split(":")[1] in c))
    .map(([name]) => name);

for (const c of SPEC.cases) {
  const lacking = exercised(c).filter((name) => TABLE.options[name].hosts.node !== true);
  const why = lacking.map((n) => `${n} (${TABLE.options[n].hosts.node})`).join(", ");
  const skip = lacking.length ? `node lacks ${why}` : false; // the table's gap, by name
  test(`sampling case ${c.name}: the Python host's tokens and scores`, { skip }, async () => {
    const batch = c.max_lengths.length;
    const found = await sampleSearch(fake(range(batch)), batch, optionsOf(c));
    assert.deepEqual(
      found.map((r) => r.hypotheses[0]),
      c.expect.map((e) => e.tokens),
    );
    assert.deepEqual(
      found.map((r) => r.scores[0]),
      c.expect.map((e) => e.score),
    );
    // batch invariance: each sentence alone, with its own key, draws the same tokens
    for (let s = 0; s < c.max_lengths.length; s++) {
      const alone = { ...optionsOf(c), maxLengths: [c.max_lengths[s]], rowKeys: [c.row_keys?.[s] ?? [s]] };
      const [one] = await sampleSearch(fake([s]), 1, alone);
      assert.deepEqual(one.hypotheses[0], c.expect[s].tokens, `sentence ${s} alone`);
    }
  });
}

test("the stream: numpy's SeedSequence state and the SplitMix64 draws, bit for bit", () => {
  for (const d of SPEC.draws) {
    const stream = seedSequenceState([BigInt(d.seed), ...d.key]);
    assert.equal(stream.toString(), d.stream);
    assert.equal(uniform(stream, d.t), d.u);
  }
  assert.notEqual(seedSequenceState([1, 0]), seedSequenceState([1, 1])); // the key matters
});

test("pairwiseSum is numpy's: a sum whose order shows in the last bits", () => {
  const a = Float64Array.from({ length: 300 }, (_, i) => (i % 7 === 0 ? 1e16 : 1) * (i % 2 ? 1 : -1) + i / 3);
  let naive = 0;
  for (const x of a) naive += x;
  // numpy.add.reduce over the rows of np.stack([a, a]) with numpy 2.x: -9999999999985048.0; a plain
  // left-to-right sum gives -9999999999985028.0
  assert.equal(pairwiseSum(a), -9999999999985048);
  assert.notEqual(naive, pairwiseSum(a));
});

test("the seed reproduces; another seed draws otherwise; no seed draws a fresh one", async () => {
  const c = { max_lengths: new Array(6).fill(8), temperature: 1.5, seed: 42 };
  const run = (seed) => sampleSearch(fake(range(6)), 6, { ...optionsOf(c), seed });
  const first = await run(42n);
  assert.deepEqual(await run(42n), first);
  assert.deepEqual(await run(42), first); // a Number seed is the same seed
  assert.notDeepEqual(await run(43n), first);
  const fresh = await Promise.all(range(4).map(() => run(null)));
  assert.ok(
    fresh.some((f) => JSON.stringify(f) !== JSON.stringify(fresh[0])),
    "no seed: samples vary",
  );
});

const range = (n) => Array.from({ length: n }, (_, i) => i);

test("top-k and top-p restrict the support to the likeliest tokens", async () => {
  const row = SPEC.base[0]; // likeliest first: 3 (-0.5), 7 (-0.75), 4 (-1.0), 5, 6, 2
  const byRank = [3, 7, 4, 5, 6, 2];
  const support = (probs) => range(probs.length).filter((i) => probs[i] > 0);
  assert.deepEqual(support(rowProbabilities(row, { topK: 2 })), [3, 7]);
  assert.deepEqual(support(rowProbabilities(row, { topK: 3 })), [3, 4, 7]);
  const p = rowProbabilities(row);
  const mass = (k) => byRank.slice(0, k).reduce((a, i) => a + p[i], 0);
  assert.deepEqual(support(rowProbabilities(row, { topP: mass(2) - 1e-9 })), [3, 7]);
  assert.deepEqual(support(rowProbabilities(row, { topP: mass(2) + 1e-9 })), [3, 4, 7]);
  const restricted = rowProbabilities(row, { topK: 3, topP: 0.999 });
  assert.ok(Math.abs(restricted.reduce((a, x) => a + x, 0) - 1) < 1e-12);
  // 200 sentences of top-k 2 draw only those two tokens at the first step, and both of them
  const first = optionsOf({ max_lengths: new Array(200).fill(1), temperature: 1, seed: 9 });
  const found = await sampleSearch(fake(range(200).map(() => 0)), 200, { ...first, topK: 2 });
  assert.deepEqual([...new Set(found.map((f) => f.hypotheses[0][0]))].sort(), [3, 7]);
});

test("sampling refuses settings out of range, naming the value and the fix", async () => {
  const base = optionsOf({ max_lengths: [4], temperature: 1, seed: 1 });
  const cases = [
    [{ temperature: 0 }, /samplingTemperature=0: give a number in \[0\.001, 1000\]/],
    [{ temperature: 5e-324 }, /samplingTemperature=5e-324: give a number in \[0\.001, 1000\]/],
    [{ topK: -1 }, /samplingTopk=-1: give an int >= 0 \(0 keeps every token\)/],
    [{ topP: 1.5 }, /samplingTopp=1.5: give a number in \(0, 1\]/],
    [{ seed: -3 }, /seed=-3: give an int >= 0/],
    [{ seed: 2 ** 60 }, /seed=.*a BigInt above 2\^53/],
    [{ rowKeys: [[0], [1]] }, /rowKeys has 2 keys for 1 sentences/],
    [{ minLength: 4 }, /minDecodingLength=4 must lie in \[0, maxDecodingLength=4\)/],
  ];
  for (const [bad, message] of cases) {
    await assert.rejects(sampleSearch(fake([0]), 1, { ...base, ...bad }), message);
  }
  const topK = async () => ({ values: [0], ids: [3], k: 1, vocab: SPEC.vocab });
  await assert.rejects(sampleSearch(topK, 1, base), /sampling needs every log-probability/);
});

test("translateBatch samples numHypotheses per source, batch-invariant, the seed reproducing", async () => {
  const t = await Translator.load(fakeBundle(root), { platform: fakePlatform([]) });
  const sources = [
    [5, 6, 7, EOS],
    [8, 9, EOS],
    [10, EOS],
  ];
  const options = {
    samplingTemperature: 1.3,
    samplingTopk: 6,
    seed: 2026n,
    numHypotheses: 5,
    beamSize: 1,
    returnScores: true,
  };
  const all = await t.translateBatch(sources, options);
  assert.deepEqual(
    all.map((r) => r.tokenIds.length),
    [5, 5, 5],
  ); // more samples than the beam: allowed
  assert.ok(new Set(all.flatMap((r) => r.tokenIds.map(String))).size > 3, "samples differ");
  for (const [i, s] of sources.entries()) {
    const [alone] = await t.translateBatch([s], { ...options, maxBatchSize: 1 });
    assert.deepEqual(alone.tokenIds, all[i].tokenIds, `source ${i} alone`);
  }
  assert.deepEqual(await t.translateBatch(sources, options), all);
  assert.ok(all.every((r) => r.tokenIds.every((h) => h.every((id) => id >= 0 && id < VOCAB && id !== EOS))));
  await assert.rejects(t.translateBatch(sources, { samplingTemperature: -1 }), /samplingTemperature=-1/);
  await t.release();
});

test("the command line samples with --sampling-temperature, and names its flags in errors", async () => {
  const bundle = fakeBundle(root);
  const run = async (...args) => {
    let out = "";
    let err = "";
    const io = {
      stdin: () => Buffer.from("[5, 6, 7]\n[8, 9]\n"),
      stdout: (x) => {
        out += x;
      },
      stderr: (x) => {
        err += x;
      },
      load: (dir, options) => Translator.load(dir, { ...options, platform: fakePlatform([]) }),
      cores: 2,
    };
    const rc = await main(["translate", bundle, "--ids", "--json", ...args], io);
    return { rc, out, err };
  };
  const flags = ["--sampling-temperature", "1.2", "--sampling-topk", "5", "--seed", "7", "--n-best", "3"];
  const sampled = await run(...flags);
  assert.equal(sampled.rc, 0, sampled.err);
  const lines = sampled.out
    .trim()
    .split("\n")
    .map((l) => JSON.parse(l));
  assert.deepEqual(
    lines.map((l) => l.token_ids.length),
    [3, 3],
  );
  assert.deepEqual((await run(...flags)).out, sampled.out);
  assert.notDeepEqual((await run(...flags.slice(0, -4), "--seed", "8", "--n-best", "3")).out, sampled.out);
  for (const [args, message] of [
    [["--seed", "3"], /--seed needs --sampling-temperature/],
    [
      ["--sampling-temperature", "1", "--sampling-topp", "1.5"],
      /--sampling-topp 1.5: give a number in \(0, 1\]/,
    ],
    [["--sampling-temperature", "x"], /--sampling-temperature x: give a number/],
    [["--sampling-temperature", "1", "--seed", "1.5"], /--seed 1.5: give an integer >= 0/],
  ]) {
    const r = await run(...args);
    assert.equal(r.rc, 2, r.err);
    assert.match(r.err, message);
  }
});
