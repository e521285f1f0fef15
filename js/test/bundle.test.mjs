// src/bundle.js on the Node platform: checks 1-4 of docs/bundle-format.md "Checks a host must do"
// (bundle.json, its fields' types and ranges, paths, hashes), on bundle directories of small but
// real files (test/fixtures.mjs). Each refusal must name the field, the value and the fix.
import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { after, test } from "node:test";
import { BundleError, MAX_JSON_BYTES, readBundle, validateMeta } from "../src/bundle.js";
import { nodePlatform } from "../src/platform-node.js";
import { hash, soundFiles, soundMeta } from "./fixtures.mjs";

const root = mkdtempSync(path.join(tmpdir(), "seq2onnx-js-bundle-"));
after(() => rmSync(root, { recursive: true, force: true }));
let count = 0;

/** A sound bundle directory whose bundle.json is `edit(meta)` (a string is written as is); returns its path. */
function bundle(edit = (meta) => meta) {
  const dir = path.join(root, `b${count++}`);
  mkdirSync(dir);
  const { bytes, files } = soundFiles();
  for (const [name, data] of Object.entries(bytes)) writeFileSync(path.join(dir, name), data);
  const meta = { ...soundMeta(), files };
  const out = edit(meta) ?? meta;
  writeFileSync(path.join(dir, "bundle.json"), typeof out === "string" ? out : JSON.stringify(out));
  return dir;
}

const rejects = (dir, pattern, options) => assert.rejects(readBundle(dir, nodePlatform, options), (e) => {
  assert.ok(e instanceof BundleError, `${e}`);
  assert.match(e.message, pattern);
  return true;
});

test("a sound bundle reads, with the bytes that were hashed and where each file was found", async () => {
  const dir = bundle();
  const b = await readBundle(dir, nodePlatform);
  assert.equal(b.meta.format_version, 1);
  assert.equal(b.metaPath, path.join(dir, "bundle.json"));
  assert.deepEqual(Object.keys(b.files).sort(), ["decoder", "encoder", "source_tokenizer", "target_tokenizer"]);
  assert.deepEqual(b.files.decoder, soundFiles().bytes["decoder.onnx"]);
  assert.equal(b.paths.target_tokenizer, path.join(await nodePlatform.resolveInside(dir, ".").then((w) => w.path), "target.spm.model"));
});

test("no bundle.json, invalid JSON, another format, another version, a missing field, an over-large file", async () => {
  await rejects(path.join(root, "nowhere"), /bundle\.json: missing; .* is not a seq2onnx bundle \(make one with `seq2onnx export/);
  await rejects(bundle(() => "{not json"), /invalid JSON/);
  await rejects(bundle(() => "[1, 2]"), /not a seq2onnx-bundle description/);
  await rejects(bundle((m) => ({ ...m, format: "other" })), /not a seq2onnx-bundle description \(format="other"\)/);
  for (const version of [0, 2, "1", true, null]) {
    await rejects(bundle((m) => ({ ...m, format_version: version })),
      /format_version .*, this host reads version 1 \(an integer\); re-export the bundle with a matching seq2onnx/);
  }
  await rejects(bundle(({ graphs, ...m }) => m), /missing the field 'graphs'; re-export the bundle with `seq2onnx export`/);
  await rejects(bundle((m) => JSON.stringify({ ...m, padding: "x".repeat(MAX_JSON_BYTES) })),
    /bundle\.json: \d+ bytes, more than the 1048576 a bundle description can be/);
});

// [what, edit, the message's field and value, what was expected]: runtime/bundle.py's validate_meta, field by field
const FIELD_CASES = [
  ["a vocabulary size that is a string", (m) => { m.model.src_vocab_size = "16"; }, /model\.src_vocab_size is "16", expected an integer >= 1/],
  ["zero heads", (m) => { m.model.n_heads = 0; }, /model\.n_heads is 0, expected an integer >= 1/],
  ["a boolean layer count", (m) => { m.model.n_decoder_layers = true; }, /model\.n_decoder_layers is true, expected an integer >= 1/],
  ["d_model not a multiple of n_heads", (m) => { m.model.d_model = 9; }, /model\.d_model is 9, expected a multiple of model\.n_heads=2/],
  ["max_positions stated twice, differently", (m) => { m.max_positions = 13; }, /max_positions is 13, expected model\.max_positions=12 \(the same value twice\)/],
  ["a special id outside the vocabulary", (m) => { m.special_ids.eos = 16; m.model.eos_id = 16; }, /special_ids\.eos is 16, expected an id inside the vocabulary \[0, 16\)/],
  ["a special id stated twice, differently", (m) => { m.special_ids.eos = 5; }, /special_ids\.eos is 5, expected model\.eos_id=3 \(the same id twice\)/],
  ["a missing special id", (m) => { delete m.special_ids.pad; }, /special_ids\.pad is missing, expected an integer >= 0/],
  ["an unknown dtype", (m) => { m.dtype = "bfloat16"; }, /dtype is "bfloat16", expected one of float32, float16/],
  ["an unknown quantization", (m) => { m.quantization = "int4"; }, /quantization is "int4", expected one of int8/],
  ["a zero beam", (m) => { m.decoding.beam_size = 0; }, /decoding\.beam_size is 0, expected an integer >= 1/],
  ["an infinite length penalty (JSON has none: a string)", (m) => { m.decoding.length_penalty = "inf"; }, /decoding\.length_penalty is "inf", expected a finite number/],
  ["a negative max_length_a", (m) => { m.decoding.max_length_a = -1; }, /decoding\.max_length_a is -1, expected a finite number >= 0/],
  ["a fractional min_length", (m) => { m.decoding.min_length = 0.5; }, /decoding\.min_length is 0\.5, expected an integer >= 0/],
  ["a file entry without sha256", (m) => { delete m.files.decoder.sha256; }, /files\.decoder\.sha256 is missing, expected a string/],
  ["a file entry without path", (m) => { delete m.files.source_tokenizer.path; }, /files\.source_tokenizer\.path is missing, expected a string/],
  ["a missing file entry", (m) => { delete m.files.encoder; }, /missing the field 'files\.encoder'/],
  ["a fused decoder file without its graph", (m) => { m.files.decoder_fused = { path: "decoder.onnx", sha256: m.files.decoder.sha256 }; },
    /graphs\.decoder_fused is missing, expected because files\.decoder_fused is present/],
  ["a fused decoder graph without its file", (m) => { m.graphs.decoder_fused = m.graphs.decoder; }, /files\.decoder_fused is missing, expected because graphs\.decoder_fused is present/],
  ["a standard graph called fused", (m) => { m.graphs.decoder.variant = "fused"; }, /graphs\.decoder\.variant is "fused", expected one of standard/],
  ["domains that are not strings", (m) => { m.graphs.encoder.domains = [1]; }, /graphs\.encoder\.domains is \[1\], expected a list of operator domains/],
  ["no outputs", (m) => { m.graphs.encoder.outputs = []; }, /graphs\.encoder\.outputs is \[\], expected a non-empty list/],
  ["an input without dtype", (m) => { delete m.graphs.decoder.inputs[1].dtype; }, /graphs\.decoder\.inputs\[1\]\.dtype is missing, expected a string/],
  ["a negative fixed size", (m) => { m.graphs.decoder.inputs[0].shape = ["rows", -1]; }, /graphs\.decoder\.inputs\[0\]\.shape is \["rows",-1\], expected a list of sizes/],
  ["a fingerprint without pieces", (m) => { delete m.tokenizers.target.pieces; }, /tokenizers\.target\.pieces is missing, expected an integer >= 1/],
];

test("every field the host reads has its type and range; the message names the field, the value and the fix", async () => {
  for (const [what, edit, pattern] of FIELD_CASES) {
    const meta = { ...soundMeta(), files: soundFiles().files };
    edit(meta);
    assert.throws(() => validateMeta(meta, "B/bundle.json"), (e) => {
      assert.ok(e instanceof BundleError, what);
      assert.match(e.message, pattern, what);
      assert.match(e.message, /^B\/bundle\.json: .*(re-export the bundle with `seq2onnx export`)/, what);
      return true;
    }, what);
  }
  // optional fields may be absent; a long value is cut in the message
  const meta = { ...soundMeta(), files: soundFiles().files };
  delete meta.tokenizers;
  delete meta.model.n_encoder_layers;
  delete meta.decoding.min_length;
  delete meta.quantization;
  validateMeta(meta, "B/bundle.json");
  meta.dtype = "x".repeat(200);
  assert.throws(() => validateMeta(meta, "B/bundle.json"), /dtype is "x{56}\.\.\., expected/);
  // and readBundle applies them before touching any file
  await rejects(bundle((m) => { m.model.n_heads = 3; }), /model\.d_model is 8, expected a multiple of model\.n_heads=3/);
});

test("file paths that leave the bundle are refused, symbolic links followed", async () => {
  writeFileSync(path.join(root, "outside.onnx"), "x");
  await rejects(bundle((m) => { m.files.encoder.path = "../outside.onnx"; }), /files\.encoder\.path "\.\.\/outside\.onnx" points outside/);
  await rejects(bundle((m) => { m.files.decoder.path = path.join(root, "outside.onnx"); }), /files\.decoder\.path .* points outside/);
  const dir = bundle((m) => { m.files.encoder.path = "link.onnx"; });
  symlinkSync(path.join(root, "outside.onnx"), path.join(dir, "link.onnx"));
  await rejects(dir, /files\.encoder\.path "link\.onnx" points outside/);
});

test("a missing file and a damaged file are refused; checkHashes: false skips only the hash", async () => {
  await rejects(bundle((m) => { m.files.decoder.path = "gone.onnx"; }), /gone\.onnx: missing from the bundle \(files\.decoder/);
  const dir = bundle((m) => { m.files.target_tokenizer.sha256 = "0".repeat(64); });
  await rejects(dir, /target\.spm\.model: sha256 differs from bundle\.json \(files\.target_tokenizer\); .* re-export the bundle/);
  const b = await readBundle(dir, nodePlatform, { checkHashes: false });
  assert.deepEqual(b.files.target_tokenizer, soundFiles().bytes["target.spm.model"]);
});

test("a listed fused decoder is checked like every file (the Python runtime's list), but not kept", async () => {
  const withFused = (sha) => (m) => {
    m.files.decoder_fused = { path: "decoder_fused.onnx", sha256: sha };
    m.graphs.decoder_fused = { ...m.graphs.decoder, variant: "fused" };
  };
  const good = bundle(withFused(hash(Buffer.from("fused graph"))));
  writeFileSync(path.join(good, "decoder_fused.onnx"), "fused graph");
  const b = await readBundle(good, nodePlatform);
  assert.equal(b.files.decoder_fused, undefined);
  assert.ok(b.paths.decoder_fused.endsWith("decoder_fused.onnx"));
  const damaged = bundle(withFused(hash(Buffer.from("fused graph"))));
  writeFileSync(path.join(damaged, "decoder_fused.onnx"), "fused graph, altered");
  await rejects(damaged, /decoder_fused\.onnx: sha256 differs from bundle\.json \(files\.decoder_fused\)/);
  await rejects(bundle(withFused("0".repeat(64))), /decoder_fused\.onnx: missing from the bundle \(files\.decoder_fused/);
});
