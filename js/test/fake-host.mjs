// A stand-in for onnxruntime and a bundle that describes it, for the tests of src/translator.js
// and src/cli.js: fake encoder and decoder sessions that keep the decoder-graph contract of
// docs/bundle-format.md (the cache holds each row's tokens, the cross tensors say which sentence a
// row belongs to), a tokenizer of words (a word's id is 4 + its length), and a bundle folder whose
// bundle.json describes them (its files are real small protobufs: the load-time checks read them).
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { mkdirSync, mkdtempSync, writeFileSync } from "node:fs";
import path from "node:path";
import * as ort from "onnxruntime-node";
import { nodePlatform } from "../src/platform-node.js";
import { soundFiles } from "./fixtures.mjs";

export const EOS = 3;
export const START = 2;
export const VOCAB = 16;

/** Log-probs of the next token after `prefix` in sentence `tag`: deterministic, float32. */
export function table(tag, prefix) {
  let h = 2166136261 ^ tag;
  for (const x of prefix) h = Math.imul(h ^ (x + 7), 16777619);
  const logits = Array.from({ length: VOCAB }, (_, v) => ((Math.imul(h ^ v, 2654435761) >>> 0) % 1000) / 250);
  logits[EOS] += 0.9 * (prefix.length - 3);
  const max = Math.max(...logits);
  const lse = max + Math.log(logits.reduce((a, x) => a + Math.exp(x - max), 0));
  return logits.map((x) => Math.fround(x - lse));
}

/** Fake sessions: the encoder writes each sentence's tag (its first source id) into its cross rows. */
export function fakeOrt(log) {
  const encoder = {
    inputNames: ["src_ids", "src_lengths"],
    outputNames: ["src_mask", "key_cross_0", "value_cross_0"],
    async run(feeds) {
      const [b, s] = feeds.src_ids.dims;
      const ids = Array.from(feeds.src_ids.data, Number);
      const lengths = Array.from(feeds.src_lengths.data, Number);
      const mask = new Uint8Array(b * s).map((_, i) => (i % s < lengths[Math.floor(i / s)] ? 1 : 0));
      const cross = new Float32Array(b * s).map((_, i) => ids[Math.floor(i / s) * s]);
      return {
        src_mask: new ort.Tensor("bool", mask, [b, s]),
        key_cross_0: new ort.Tensor("float32", cross, [b, 1, s, 1]),
        value_cross_0: new ort.Tensor("float32", cross.slice(), [b, 1, s, 1]),
      };
    },
  };
  const decoder = {
    inputNames: [
      "tokens",
      "step",
      "cache_indices",
      "past_key_self_0",
      "past_value_self_0",
      "key_cross_0",
      "value_cross_0",
      "src_mask",
      "top_k",
    ],
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
  const created = []; // the options of each session made, in order
  return {
    sessions: { encoder, decoder },
    created,
    Tensor: ort.Tensor,
    InferenceSession: {
      create: async (bytes, options) => {
        created.push(options);
        return new TextDecoder().decode(bytes).includes("encoder") ? encoder : decoder;
      },
    },
  };
}

// words -> ids: a word's id is 4 + its length (capped); ids -> text: the ids joined by "-"
export const fakeTokenizer = async () => ({
  encode: (text) =>
    text
      .split(/\s+/)
      .filter(Boolean)
      .map((w) => 4 + Math.min(w.length, VOCAB - 5)),
  decode: (ids) => ids.join("-"),
});

/** bundle.json's graphs for the fake sessions: names are what a host checks. */
export function graphSignature() {
  const io = (names) => names.map((name) => ({ name, dtype: "float32", shape: [] }));
  const { encoder, decoder } = fakeOrt([]).sessions;
  return {
    encoder: { inputs: io(encoder.inputNames), outputs: io(encoder.outputNames) },
    decoder: { inputs: io(decoder.inputNames), outputs: io(decoder.outputNames) },
  };
}

/**
 * A bundle folder under `root` whose bundle.json describes the fake sessions; `edit(meta)` before it is written.
 * @param {string} root
 * @param {(meta: any) => void} [edit]
 * @param {Record<string, Uint8Array>} [extra]  more files by their key in `files` (the vocabulary maps), listed and hashed
 */
export function fakeBundle(root, edit = () => {}, extra = {}) {
  const dir = mkdtempSync(path.join(root, "b"));
  const meta = {
    format: "seq2onnx-bundle",
    format_version: 1,
    dtype: "float32",
    max_positions: 12,
    model: {
      n_decoder_layers: 1,
      n_heads: 1,
      d_model: 1,
      max_positions: 12,
      src_vocab_size: VOCAB,
      tgt_vocab_size: VOCAB,
    },
    special_ids: { pad: 0, unk: 1, bos: START, eos: EOS, decoder_start: START },
    decoding: { beam_size: 4, length_penalty: 1.0, max_length_a: 1.5, max_length_b: 2, min_length: 0 },
    graphs: graphSignature(),
    files: {},
  };
  // real protobufs of these sizes (the load-time checks read them); the fake sessions ignore them
  const { bytes: real } = soundFiles({ vocab: VOCAB, dModel: 1, maxPositions: 12 });
  const names = {
    encoder: "encoder.onnx",
    decoder: "decoder.onnx",
    source_tokenizer: "source.spm.model",
    target_tokenizer: "target.spm.model",
  };
  for (const key of ["encoder", "decoder", "source_tokenizer", "target_tokenizer"]) {
    const bytes = real[names[key]];
    writeFileSync(path.join(dir, key), bytes);
    meta.files[key] = { path: key, sha256: createHash("sha256").update(bytes).digest("hex") };
  }
  for (const [key, bytes] of Object.entries(extra)) {
    writeFileSync(path.join(dir, `${key}.bin`), bytes);
    meta.files[key] = { path: `${key}.bin`, sha256: createHash("sha256").update(bytes).digest("hex") };
  }
  edit(meta);
  mkdirSync(dir, { recursive: true });
  writeFileSync(path.join(dir, "bundle.json"), JSON.stringify(meta));
  return dir;
}

/** The Node platform with the fake sessions and tokenizer; `log` collects each decoder step. */
export function fakePlatform(log = []) {
  return { ...nodePlatform, ort: fakeOrt(log), loadTokenizer: fakeTokenizer };
}
