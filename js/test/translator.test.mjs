// src/translator.js over a fake onnxruntime: stand-in encoder and decoder sessions that keep the
// decoder-graph contract of docs/bundle-format.md (the cache holds each row's tokens, the cross
// tensors say which sentence a row belongs to) and check that the Translator feeds it right:
// cache rows follow cache_indices, finished sentences' cross rows and mask leave, top_k is 2K(+1),
// only the needed outputs are fetched. Its answers must equal the search run on the same table.
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { after, test } from "node:test";
import { BundleError } from "../src/bundle.js";
import { beamSearch, greedySearch } from "../src/search.js";
import { Translator } from "../src/translator.js";
import { EOS, START, VOCAB, fakeBundle, fakePlatform, table } from "./fake-host.mjs";

const root = mkdtempSync(path.join(tmpdir(), "seq2onnx-js-translator-"));
after(() => rmSync(root, { recursive: true, force: true }));

async function load(log, edit, options = {}) {
  return Translator.load(fakeBundle(root, edit), { platform: fakePlatform(log), ...options });
}

/** The same search run directly on the table, sentence tags = first source ids. */
async function direct(sources, { beamSize, minLength = 0, maxLength, lengthPenalty = 1, numHypotheses = 1 }) {
  const step = (tokens, cacheIndices, t, keep) => {
    if (t === 0) direct.rows = sources.map((s) => [s[0], []]);
    else direct.rows = cacheIndices.map((c, r) => [direct.rows[c][0], [...direct.rows[c][1], tokens[r]]]);
    return { logProbs: direct.rows.flatMap(([tag, p]) => table(tag, p)), vocab: VOCAB };
  };
  const maxLengths = sources.map((s) => maxLength ?? Math.min(Math.trunc(1.5 * s.length) + 2, 12));
  const common = { startId: START, eosId: EOS, maxLengths, minLength };
  return beamSize === 1 ? greedySearch(step, sources.length, common)
    : beamSearch(step, sources.length, { ...common, beamSize, lengthPenalty, numHypotheses });
}

const strip = (h) => (h.at(-1) === EOS ? h.slice(0, -1) : h);

test("the translator drives the graphs by the contract and equals the search on the same table", async () => {
  const log = [];
  const t = await load(log);
  const sources = [[5, 9, 4], [7], [11, 4, 6, 8, 5, 9], [6, 6], [4, 13, 9], [15, 5, 5, 5]];
  for (const [beamSize, minLength, numHypotheses] of [[1, 0, 1], [4, 0, 4], [2, 3, 2], [3, 0, 1]]) {
    log.length = 0;
    const got = await t.translateBatch(sources, { beamSize, minDecodingLength: minLength, numHypotheses, returnScores: true });
    // translateBatch sorts by length (stable) and appends the end token; the direct search does not sort
    const withEos = sources.map((s) => [...s, EOS]);
    const want = await direct(withEos, { beamSize, minLength, numHypotheses });
    got.forEach((r, i) => {
      assert.deepEqual(r.tokenIds, want[i].hypotheses.map(strip), `beam ${beamSize} source ${i}`);
      assert.deepEqual(r.scores, want[i].scores);
      assert.deepEqual(r.hypotheses, r.tokenIds.map((ids) => ids.join("-")));
    });
    assert.ok(log.every((c) => c.k === 2 * beamSize + (minLength > 0 ? 1 : 0)), "top_k = 2K (+1 under a minimum length)");
    assert.ok(log.every((c) => c.fetches.includes("topk_ids") && !c.fetches.includes("log_probs")), "only the top-k comes down");
    assert.ok(log.some((c, j) => j > 0 && c.batch < log[j - 1].batch), "finished sentences left the batch");
  }
  await t.release();
});

test("topKFromGraph: false downloads log_probs and gives the same results", async () => {
  const log = [];
  const sources = [[5, 9, 4], [7, 8], [11, 4, 6]];
  const viaTopK = await (await load([])).translateBatch(sources, { beamSize: 2, numHypotheses: 2, returnScores: true });
  const viaFull = await (await load(log, () => {}, { topKFromGraph: false })).translateBatch(sources,
    { beamSize: 2, numHypotheses: 2, returnScores: true });
  assert.deepEqual(viaFull, viaTopK);
  assert.ok(log.every((c) => c.fetches.includes("log_probs") && !c.fetches.includes("topk_ids")));
});

test("texts, empty texts, batches of one, lengths and errors", async () => {
  const t = await load([]);
  const [a, empty, blank, b] = await t.translateBatch(["one two three", "", " \t\u3000", "four"], { beamSize: 2, returnScores: true });
  const nothing = { hypotheses: [""], tokenIds: [[]], scores: [0], attention: null };
  assert.deepEqual([empty, blank], [nothing, nothing]);
  const byIds = await t.translateBatch([[7, 7, 9], [8]], { beamSize: 2, returnScores: true, maxBatchSize: 1 });
  assert.deepEqual([a, b], byIds);
  assert.deepEqual(t.prepareSource("one two three"), { ids: [7, 7, 9, EOS], truncated: false });
  assert.deepEqual(t.maxLengths([[1, 2, EOS], Array(11).fill(4)], undefined), [6, 12]); // min(trunc(1.5 n) + 2, 12)
  const long = "w ".repeat(20);
  await assert.rejects(t.translateBatch(["ok", long]), /source 1 has 21 tokens; this model was exported for at most 12 positions/);
  assert.deepEqual(t.prepareSource(long, { truncate: true }).ids, [...Array(11).fill(5), EOS]);
  await assert.rejects(t.translateBatch([[4, VOCAB]]), /token ids \[16\] are outside the source vocabulary \[0, 16\)/);
  await assert.rejects(t.translateBatch("a text"), TypeError);
  await assert.rejects(t.translateBatch([{}]), /source 0 is object/);
  await assert.rejects(t.translateBatch(["a"], { beamSize: 2, numHypotheses: 3 }), /numHypotheses=3 must lie in \[1, beamSize=2\]/);
  await assert.rejects(t.translateBatch(["a"], { maxDecodingLength: 13 }), /maxDecodingLength=13; this model has 12 positions/);
  const [short] = await t.translateBatch(["one two three four"], { beamSize: 3, numHypotheses: 3, maxDecodingLength: 2 });
  assert.ok(short.tokenIds.every((h) => h.length <= 2));
});

test("graphs whose inputs differ from bundle.json are refused", async () => {
  await assert.rejects(load([], (meta) => { meta.graphs.decoder.inputs.push({ name: "extra", dtype: "int64", shape: [1] }); }),
    (e) => e instanceof BundleError && /decoder: its inputs\/outputs .* differ from bundle\.json's/.test(e.message));
});
