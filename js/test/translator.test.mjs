// src/translator.js over a fake onnxruntime: stand-in encoder and decoder sessions that keep the
// decoder-graph contract of docs/bundle-format.md (the cache holds each row's tokens, the cross
// tensors say which sentence a row belongs to) and check that the Translator feeds it right:
// cache rows follow cache_indices, finished sentences' cross rows and mask leave, top_k is 2K(+1),
// only the needed outputs are fetched. Its answers must equal the search run on the same table.
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { after, test } from "node:test";
import * as ort from "onnxruntime-node";
import { BundleError } from "../src/bundle.js";
import { nodePlatform } from "../src/platform-node.js";
import { beamSearch, greedySearch } from "../src/search.js";
import { Translator } from "../src/translator.js";
import { soundFiles } from "./fixtures.mjs";

const EOS = 3;
const START = 2;
const VOCAB = 16;

/** Log-probs of the next token after `prefix` in sentence `tag`: deterministic, float32. */
function table(tag, prefix) {
  let h = 2166136261 ^ tag;
  for (const x of prefix) h = Math.imul(h ^ (x + 7), 16777619);
  const logits = Array.from({ length: VOCAB }, (_, v) => ((Math.imul(h ^ v, 2654435761) >>> 0) % 1000) / 250);
  logits[EOS] += 0.9 * (prefix.length - 3);
  const max = Math.max(...logits);
  const lse = max + Math.log(logits.reduce((a, x) => a + Math.exp(x - max), 0));
  return logits.map((x) => Math.fround(x - lse));
}

/** Fake sessions: the encoder writes each sentence's tag (its first source id) into its cross rows. */
function fakeOrt(log) {
  const encoder = {
    inputNames: ["src_ids", "src_lengths"],
    outputNames: ["src_mask", "key_cross_0", "value_cross_0"],
    async run(feeds) {
      const [b, s] = feeds.src_ids.dims;
      const ids = Array.from(feeds.src_ids.data, Number);
      const lengths = Array.from(feeds.src_lengths.data, Number);
      const mask = new Uint8Array(b * s).map((_, i) => (i % s < lengths[Math.floor(i / s)] ? 1 : 0));
      const cross = new Float32Array(b * s).map((_, i) => ids[Math.floor(i / s) * s]);
      return { src_mask: new ort.Tensor("bool", mask, [b, s]), key_cross_0: new ort.Tensor("float32", cross, [b, 1, s, 1]),
        value_cross_0: new ort.Tensor("float32", cross.slice(), [b, 1, s, 1]) };
    },
  };
  const decoder = {
    inputNames: ["tokens", "step", "cache_indices", "past_key_self_0", "past_value_self_0", "key_cross_0", "value_cross_0",
      "src_mask", "top_k"],
    outputNames: ["log_probs", "present_key_self_0", "present_value_self_0", "topk_log_probs", "topk_ids"],
    async run(feeds, fetches) {
      const tokens = Array.from(feeds.tokens.data, Number);
      const indices = Array.from(feeds.cache_indices.data, Number);
      const t = Number(feeds.step.data[0]);
      const k = Number(feeds.top_k.data[0]);
      const past = feeds.past_key_self_0;
      const [prevRows, , p] = past.dims;
      const [batch, , srcLen] = feeds.key_cross_0.dims;
      const rows = tokens.length;
      assert.equal(p, t, "past length = step");
      assert.deepEqual(feeds.src_mask.dims, [batch, srcLen]);
      assert.ok(indices.every((c) => c >= 0 && c < prevRows));
      assert.equal(rows % batch, 0, "rows = batch x beams");
      log.push({ t, rows, batch, k, fetches: [...fetches] });
      const present = new Float32Array(rows * (p + 1));
      const values = [];
      const ids = [];
      const full = [];
      for (let r = 0; r < rows; r++) {
        const prefix = [...past.data.subarray(indices[r] * p, (indices[r] + 1) * p), tokens[r]];
        present.set(prefix, r * (p + 1));
        const tag = feeds.key_cross_0.data[Math.floor(r / (rows / batch)) * srcLen];
        const lp = table(tag, t === 0 ? [] : prefix.slice(1)); // prefix[0] is the start token
        full.push(...lp);
        const order = [...lp.keys()].sort((a, b) => lp[b] - lp[a] || a - b).slice(0, k);
        values.push(...order.map((i) => lp[i]));
        ids.push(...order);
      }
      const out = {
        present_key_self_0: new ort.Tensor("float32", present, [rows, 1, p + 1, 1]),
        present_value_self_0: new ort.Tensor("float32", present.slice(), [rows, 1, p + 1, 1]),
        log_probs: new ort.Tensor("float32", Float32Array.from(full), [rows, VOCAB]),
        topk_log_probs: new ort.Tensor("float32", Float32Array.from(values), [rows, k]),
        topk_ids: new ort.Tensor("int64", BigInt64Array.from(ids, BigInt), [rows, k]),
      };
      return Object.fromEntries(fetches.map((name) => [name, out[name]]));
    },
  };
  return {
    sessions: { encoder, decoder },
    Tensor: ort.Tensor,
    InferenceSession: { create: async (bytes) => (new TextDecoder().decode(bytes).includes("encoder") ? encoder : decoder) },
  };
}

// words -> ids: a word's id is 4 + its length (capped); ids -> text: the ids joined by "-"
const fakeTokenizer = async () => ({
  encode: (text) => text.split(/\s+/).filter(Boolean).map((w) => 4 + Math.min(w.length, VOCAB - 5)),
  decode: (ids) => ids.join("-"),
});

/** bundle.json's graphs for the fake sessions: names are what a host checks. */
function graphSignature() {
  const io = (names) => names.map((name) => ({ name, dtype: "float32", shape: [] }));
  const { encoder, decoder } = fakeOrt([]).sessions;
  return { encoder: { inputs: io(encoder.inputNames), outputs: io(encoder.outputNames) },
    decoder: { inputs: io(decoder.inputNames), outputs: io(decoder.outputNames) } };
}

const root = mkdtempSync(path.join(tmpdir(), "seq2onnx-js-translator-"));
after(() => rmSync(root, { recursive: true, force: true }));

function fakeBundle(edit = () => {}) {
  const dir = mkdtempSync(path.join(root, "b"));
  const meta = {
    format: "seq2onnx-bundle", format_version: 1, dtype: "float32", max_positions: 12,
    model: { n_decoder_layers: 1, n_heads: 1, d_model: 1, max_positions: 12, src_vocab_size: VOCAB, tgt_vocab_size: VOCAB },
    special_ids: { pad: 0, unk: 1, bos: START, eos: EOS, decoder_start: START },
    decoding: { beam_size: 4, length_penalty: 1.0, max_length_a: 1.5, max_length_b: 2, min_length: 0 },
    graphs: graphSignature(), files: {},
  };
  // real protobufs of these sizes (the load-time checks read them); the fake sessions ignore them
  const { bytes: real } = soundFiles({ vocab: VOCAB, dModel: 1, maxPositions: 12 });
  const names = { encoder: "encoder.onnx", decoder: "decoder.onnx", source_tokenizer: "source.spm.model", target_tokenizer: "target.spm.model" };
  for (const key of ["encoder", "decoder", "source_tokenizer", "target_tokenizer"]) {
    const bytes = real[names[key]];
    writeFileSync(path.join(dir, key), bytes);
    meta.files[key] = { path: key, sha256: createHash("sha256").update(bytes).digest("hex") };
  }
  edit(meta);
  mkdirSync(dir, { recursive: true });
  writeFileSync(path.join(dir, "bundle.json"), JSON.stringify(meta));
  return dir;
}

async function load(log, edit, options = {}) {
  const platform = { ...nodePlatform, ort: fakeOrt(log), loadTokenizer: fakeTokenizer };
  return Translator.load(fakeBundle(edit), { platform, ...options });
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
