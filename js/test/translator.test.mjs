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
import { beamSearch, forcePrefix, greedySearch } from "../src/search.js";
import { Translator } from "../src/translator.js";
import { EOS, fakeBundle, fakePlatform, START, table, VOCAB } from "./fake-host.mjs";
import { vocabBytes } from "./fixtures.mjs";

const root = mkdtempSync(path.join(tmpdir(), "seq2onnx-js-translator-"));
after(() => rmSync(root, { recursive: true, force: true }));

async function load(log, edit, options = {}, extra = {}) {
  return Translator.load(fakeBundle(root, edit, extra), { platform: fakePlatform(log), ...options });
}

/** The same search run directly on the table, sentence tags = first source ids, prefixes forced. */
async function direct(
  sources,
  { beamSize, minLength = 0, maxLength, lengthPenalty = 1, numHypotheses = 1, prefixes = [] },
) {
  const table0 = (tokens, cacheIndices, t) => {
    if (t === 0) direct.rows = sources.map((s) => [s[0], []]);
    else direct.rows = cacheIndices.map((c, r) => [direct.rows[c][0], [...direct.rows[c][1], tokens[r]]]);
    return { logProbs: direct.rows.flatMap(([tag, p]) => table(tag, p)), vocab: VOCAB };
  };
  const step = forcePrefix(table0, prefixes);
  const maxLengths = sources.map((s) => maxLength ?? Math.min(Math.trunc(1.5 * s.length) + 2, 12));
  const common = { startId: START, eosId: EOS, maxLengths, minLength };
  return beamSize === 1
    ? greedySearch(step, sources.length, common)
    : beamSearch(step, sources.length, { ...common, beamSize, lengthPenalty, numHypotheses });
}

const strip = (h) => (h.at(-1) === EOS ? h.slice(0, -1) : h);

test("the translator drives the graphs by the contract and equals the search on the same table", async () => {
  const log = [];
  const t = await load(log);
  const sources = [[5, 9, 4], [7], [11, 4, 6, 8, 5, 9], [6, 6], [4, 13, 9], [15, 5, 5, 5]];
  for (const [beamSize, minLength, numHypotheses] of [
    [1, 0, 1],
    [4, 0, 4],
    [2, 3, 2],
    [3, 0, 1],
  ]) {
    log.length = 0;
    const got = await t.translateBatch(sources, {
      beamSize,
      minDecodingLength: minLength,
      numHypotheses,
      returnScores: true,
    });
    // translateBatch sorts by length (stable) and appends the end token; the direct search does not sort
    const withEos = sources.map((s) => [...s, EOS]);
    const want = await direct(withEos, { beamSize, minLength, numHypotheses });
    got.forEach((r, i) => {
      assert.deepEqual(r.tokenIds, want[i].hypotheses.map(strip), `beam ${beamSize} source ${i}`);
      assert.deepEqual(r.scores, want[i].scores);
      assert.deepEqual(
        r.hypotheses,
        r.tokenIds.map((ids) => ids.join("-")),
      );
    });
    const k = (beamSize === 1 ? 1 : 2 * beamSize) + (minLength > 0 ? 1 : 0);
    assert.ok(
      log.every((c) => c.k === k),
      "top_k = 2K, 1 for greedy (+1 under a minimum length)",
    );
    assert.ok(
      log.every((c) => c.fetches.includes("topk_ids") && !c.fetches.includes("log_probs")),
      "only the top-k comes down",
    );
    assert.ok(
      log.some((c, j) => j > 0 && c.batch < log[j - 1].batch),
      "finished sentences left the batch",
    );
  }
  await t.release();
});

test("topKFromGraph: false downloads log_probs and gives the same results", async () => {
  const log = [];
  const sources = [
    [5, 9, 4],
    [7, 8],
    [11, 4, 6],
  ];
  const viaTopK = await (await load([])).translateBatch(sources, {
    beamSize: 2,
    numHypotheses: 2,
    returnScores: true,
  });
  const viaFull = await (await load(log, () => {}, { topKFromGraph: false })).translateBatch(sources, {
    beamSize: 2,
    numHypotheses: 2,
    returnScores: true,
  });
  assert.deepEqual(viaFull, viaTopK);
  assert.ok(log.every((c) => c.fetches.includes("log_probs") && !c.fetches.includes("topk_ids")));
});

test("texts, empty texts, batches of one, lengths and errors", async () => {
  const t = await load([]);
  const [a, empty, blank, b] = await t.translateBatch(["one two three", "", " \t\u3000", "four"], {
    beamSize: 2,
    returnScores: true,
  });
  const nothing = { hypotheses: [""], tokenIds: [[]], scores: [0], attention: null };
  assert.deepEqual([empty, blank], [nothing, nothing]);
  const byIds = await t.translateBatch([[7, 7, 9], [8]], {
    beamSize: 2,
    returnScores: true,
    maxBatchSize: 1,
  });
  assert.deepEqual([a, b], byIds);
  assert.deepEqual(t.prepareSource("one two three"), { ids: [7, 7, 9, EOS], truncated: false });
  assert.deepEqual(t.maxLengths([[1, 2, EOS], Array(11).fill(4)], undefined), [6, 12]); // min(trunc(1.5 n) + 2, 12)
  const long = "w ".repeat(20);
  await assert.rejects(
    t.translateBatch(["ok", long]),
    /source 1 has 21 tokens; this model was exported for at most 12 positions/,
  );
  assert.deepEqual(t.prepareSource(long, { truncate: true }).ids, [...Array(11).fill(5), EOS]);
  await assert.rejects(
    t.translateBatch([[4, VOCAB]]),
    /token ids \[16\] are outside the source vocabulary \[0, 16\)/,
  );
  await assert.rejects(t.translateBatch("a text"), TypeError);
  await assert.rejects(t.translateBatch([{}]), /source 0 is object/);
  await assert.rejects(
    t.translateBatch(["a"], { beamSize: 2, numHypotheses: 3 }),
    /numHypotheses=3 must lie in \[1, beamSize=2\]/,
  );
  await assert.rejects(
    t.translateBatch(["a"], { maxDecodingLength: 13 }),
    /maxDecodingLength=13; this model has 12 positions/,
  );
  const [short] = await t.translateBatch(["one two three four"], {
    beamSize: 3,
    numHypotheses: 3,
    maxDecodingLength: 2,
  });
  assert.ok(short.tokenIds.every((h) => h.length <= 2));
});

test("graphs whose inputs differ from bundle.json are refused", async () => {
  await assert.rejects(
    load([], (meta) => {
      meta.graphs.decoder.inputs.push({ name: "extra", dtype: "int64", shape: [1] });
    }),
    (e) =>
      e instanceof BundleError &&
      /decoder: its inputs\/outputs .* differ from bundle\.json's/.test(e.message),
  );
});

// -- bundles imported from Hugging Face: vocabulary maps and the tokens section ---------------------

// The fake tokenizer's piece ids (4 + a word's length) become model ids through the source map
// (p -> 19 - p for the words' pieces); model ids 13-15 are language tokens that the target map skips.
const SOURCE_MAP = Array.from({ length: VOCAB }, (_, p) => (p < 4 ? p : 19 - p));
const TARGET_MAP = Array.from({ length: VOCAB }, (_, i) => (i >= 13 ? -1 : i));
const MAPS = { source_vocab: vocabBytes(SOURCE_MAP), target_vocab: vocabBytes(TARGET_MAP) };
const M2M = {
  source_prefix: [13],
  source_suffix: [EOS],
  target_prefix: [14],
  languages: { de: 13, en: 14, fr: 15 },
};
const imported = (tokens) => (meta) => {
  meta.tokens = tokens;
};

test("a mapped bundle: prefix, mapped text ids and suffix go in; the forced target prefix comes out, left out of the text", async () => {
  const log = [];
  const t = await load(log, imported(M2M), {}, MAPS);
  const mapped = (text) => text.split(" ").map((w) => SOURCE_MAP[4 + w.length]);
  assert.deepEqual(t.prepareSource("one three"), {
    ids: [13, ...mapped("one three"), EOS],
    truncated: false,
  });
  assert.deepEqual(t.prepareSource("one three", { sourceLang: "fr" }).ids, [15, ...mapped("one three"), EOS]);
  const texts = ["one two three", "four", "a bb ccc dddd"];
  for (const [beamSize, options, prefixes] of [
    [1, {}, [[14], [14], [14]]],
    [3, { targetLang: "fr" }, [[15], [15], [15]]],
    [2, { targetPrefix: [[5, 6], [13], []], targetLang: "fr" }, [[5, 6], [13], []]], // the caller's replace target_lang's
  ]) {
    const got = await t.translateBatch(texts, {
      beamSize,
      numHypotheses: beamSize,
      returnScores: true,
      ...options,
    });
    const sources = texts.map((text) => [13, ...mapped(text), EOS]);
    const want = await direct(sources, { beamSize, numHypotheses: beamSize, prefixes });
    got.forEach((r, i) => {
      assert.deepEqual(r.tokenIds, want[i].hypotheses.map(strip), `beam ${beamSize} source ${i}`);
      assert.deepEqual(r.scores, want[i].scores);
      for (const ids of r.tokenIds)
        assert.deepEqual(ids.slice(0, prefixes[i].length), prefixes[i].slice(0, ids.length));
      assert.deepEqual(
        r.hypotheses,
        r.tokenIds.map((ids) => ids.filter((id) => id < 13).join("-")),
        "skipped ids leave the text",
      );
    });
  }
  // ids are the whole row: the suffix appended unless there, no prefix
  assert.deepEqual(
    (
      await t.translateBatch(
        [
          [7, 8],
          [9, EOS],
        ],
        { beamSize: 1, returnScores: true },
      )
    ).map((r) => r.scores.length),
    [1, 1],
  );
  assert.deepEqual(t._sourceIds(0, [7, 8], false).ids, [7, 8, EOS]);
  assert.deepEqual(t._sourceIds(0, [9, EOS], false).ids, [9, EOS]);
  await t.release();
});

test("a mapped bundle: truncation keeps max_positions - len(prefix) - len(suffix) text ids; option errors", async () => {
  const t = await load([], imported({ ...M2M, source_suffix: [EOS, 12] }), {}, MAPS);
  const long = "w ".repeat(20);
  assert.deepEqual(t.prepareSource(long, { truncate: true }), {
    ids: [13, ...Array(9).fill(SOURCE_MAP[5]), EOS, 12],
    truncated: true,
  });
  await assert.rejects(
    t.translateBatch(["ok", long]),
    /^RangeError: source 1 has 23 tokens; this model was exported for at most 12 positions/,
  );
  assert.deepEqual(t._sourceIds(0, Array(20).fill(7), true).ids, [...Array(10).fill(7), EOS, 12]);
  assert.deepEqual(t._sourceIds(0, [7, EOS, 12], false).ids, [7, EOS, 12]);
  await assert.rejects(
    t.translateBatch(["one"], { targetLang: "xx" }),
    (e) =>
      e instanceof RangeError &&
      e.message === 'targetLang="xx" is not a language of this model; choose one of de, en, fr',
  );
  await assert.rejects(
    t.translateBatch(["one"], { sourceLang: "it" }),
    /^RangeError: sourceLang="it" is not a language of this model/,
  );
  await assert.rejects(
    t.translateBatch(["one", "two"], { targetPrefix: [[5]] }),
    /^RangeError: targetPrefix has 1 entries for 2 sources; give one array of target ids per source$/,
  );
  await assert.rejects(
    t.translateBatch(["one"], { targetPrefix: [[5, 16, -1, EOS]] }),
    (e) =>
      e instanceof RangeError &&
      e.message ===
        "targetPrefix[0] has ids [16,-1,3] outside [0, 16) or the end token 3; give target ids of the text before the translation",
  );
  for (const bad of [5, null, [1.5], ["7"]]) {
    await assert.rejects(
      t.translateBatch(["one"], { targetPrefix: [bad] }),
      /^TypeError: targetPrefix\[0\] is .*; give an array of target token ids$/,
    );
  }
  // an empty text stays empty, whatever prefix the others get
  const [empty] = await t.translateBatch([" "], { beamSize: 1 });
  assert.deepEqual(empty.tokenIds, [[]]);
});

test("multilingual Marian: the target language, or the text's >>code<< in its place, leads the source; unk for a code not there", async () => {
  const marian = {
    languages: { de: 13, fr: 15 },
    target_lang_in: "source_prefix",
    text_language_codes: true,
  };
  const t = await load([], imported(marian), {}, MAPS);
  const two = [SOURCE_MAP[7], SOURCE_MAP[7]];
  assert.deepEqual(t.prepareSource(">>fr<< one two").ids, [15, ...two, EOS]);
  assert.deepEqual(t.prepareSource(">>xx<< one two").ids, [1, ...two, EOS]);
  assert.deepEqual(t.prepareSource("one two", { targetLang: "de" }).ids, [13, ...two, EOS]);
  assert.deepEqual(
    t.prepareSource(">>fr<< one two", { targetLang: "de" }).ids,
    [15, ...two, EOS],
    "the text's code replaces the prefix",
  );
  assert.deepEqual(t.prepareSource(">>fr<<", {}).ids, [15, EOS]);
  assert.deepEqual(t.prepareSource(`>>fr<< ${"w ".repeat(20)}`, { truncate: true }).ids.slice(0, 2), [
    15,
    SOURCE_MAP[5],
  ]);
  assert.equal(t.prepareSource(`>>fr<< ${"w ".repeat(20)}`, { truncate: true }).ids.length, 12);
  const [r] = await t.translateBatch([">>fr<< one two"], { beamSize: 2, targetLang: "de" });
  assert.ok(r.tokenIds[0].length > 0); // no target prefix: target_lang went to the source
});

test("vocab_texts are read with the maps at load and given to the tokens (a -2 entry needs its text)", async () => {
  const texts = new TextEncoder().encode(JSON.stringify({ source: { x: 5 }, target: { 12: "\u2581qq" } }));
  const target = vocabBytes(TARGET_MAP.map((x, i) => (i === 12 ? -2 : x)));
  const t = await load([], imported(M2M), {}, { ...MAPS, target_vocab: target, vocab_texts: texts });
  assert.deepEqual(
    [t.tokens.unknownPieces, t.tokens.targetTexts],
    [new Map([["x", 5]]), new Map([[12, "\u2581qq"]])],
  );
  await assert.rejects(
    load(
      [],
      imported(M2M),
      {},
      { ...MAPS, target_vocab: target, vocab_texts: new TextEncoder().encode("{}") },
    ),
    (e) =>
      e instanceof BundleError &&
      /vocab_texts\.bin: no text for target id 12, which target_vocab marks -2; re-export/.test(e.message),
  );
});

test("a vocabulary map that does not fit the model is refused at load", async () => {
  await assert.rejects(
    load(
      [],
      imported(M2M),
      {},
      { ...MAPS, target_vocab: vocabBytes(TARGET_MAP.map((x) => (x === 12 ? 16 : x))) },
    ),
    (e) =>
      e instanceof BundleError &&
      /target_vocab\.bin: entry 12 is 16, expected an id in \[-2, 16\); re-export/.test(e.message),
  );
  await assert.rejects(
    load([], imported({ ...M2M, target_prefix: [16] }), {}, MAPS),
    (e) =>
      e instanceof BundleError &&
      /tokens\.target_prefix is \[16\], expected ids inside the target vocabulary \[0, 16\)/.test(e.message),
  );
});

test("int8 bundles: every session asks for exact int8 products, and optimisations below extended are refused", async () => {
  const int8 = (meta) => {
    meta.quantization = "int8";
    meta.variant = "int8";
  };
  const platform = fakePlatform([]);
  const t = await Translator.load(fakeBundle(root, int8), { platform });
  assert.ok(platform.ort.created.length >= 2);
  for (const options of platform.ort.created) assert.equal(options.extra.session.x64quantprecision, "1");
  await t.release();
  for (const optimization of ["basic", "none"]) {
    await assert.rejects(
      Translator.load(fakeBundle(root, int8), { platform: fakePlatform([]), optimization }),
      (e) =>
        e instanceof RangeError &&
        e.message.includes(`optimization="${optimization}" with an int8 bundle`) &&
        e.message.includes('"extended" or "all"'),
    );
    await Translator.load(fakeBundle(root), { platform: fakePlatform([]), optimization }); // float32: any level
  }
});
