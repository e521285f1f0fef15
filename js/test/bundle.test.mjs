// src/bundle.js on the Node platform: every check of docs/bundle-format.md "Checks a host must do",
// on a bundle directory of stand-in files (the checks come before anything is loaded).
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { after, test } from "node:test";
import { BundleError, readBundle } from "../src/bundle.js";
import { nodePlatform } from "../src/platform-node.js";

const root = mkdtempSync(path.join(tmpdir(), "seq2onnx-js-bundle-"));
after(() => rmSync(root, { recursive: true, force: true }));
let count = 0;

/** A bundle directory whose bundle.json is `edit(meta)`; returns its path. */
function bundle(edit = (meta) => meta) {
  const dir = path.join(root, `b${count++}`);
  mkdirSync(dir);
  const meta = { format: "seq2onnx-bundle", format_version: 1, model: {}, special_ids: {}, decoding: {}, graphs: {}, dtype: "float32", files: {} };
  for (const [key, name] of [["encoder", "encoder.onnx"], ["decoder", "decoder.onnx"], ["source_tokenizer", "source.spm.model"],
    ["target_tokenizer", "target.spm.model"]]) {
    const bytes = Buffer.from(`stand-in for ${name}`);
    writeFileSync(path.join(dir, name), bytes);
    meta.files[key] = { path: name, sha256: createHash("sha256").update(bytes).digest("hex") };
  }
  const out = edit(meta);
  writeFileSync(path.join(dir, "bundle.json"), typeof out === "string" ? out : JSON.stringify(out));
  return dir;
}

const rejects = (dir, pattern, options) => assert.rejects(readBundle(dir, nodePlatform, options), (e) => {
  assert.ok(e instanceof BundleError, `${e}`);
  assert.match(e.message, pattern);
  return true;
});

test("a sound bundle reads, with the bytes that were hashed", async () => {
  const dir = bundle();
  const b = await readBundle(dir, nodePlatform);
  assert.equal(b.meta.format_version, 1);
  assert.deepEqual(Object.keys(b.files).sort(), ["decoder", "encoder", "source_tokenizer", "target_tokenizer"]);
  assert.equal(new TextDecoder().decode(b.files.decoder), "stand-in for decoder.onnx");
});

test("no bundle.json, invalid JSON, another format, another version, a missing field", async () => {
  await rejects(path.join(root, "nowhere"), /bundle\.json: missing; .* is not a seq2onnx bundle/);
  await rejects(bundle(() => "{not json"), /invalid JSON/);
  await rejects(bundle(() => "[1, 2]"), /not a seq2onnx-bundle description/);
  await rejects(bundle((m) => ({ ...m, format: "other" })), /not a seq2onnx-bundle description \(format="other"\)/);
  for (const version of [0, 2, "1"]) {
    await rejects(bundle((m) => ({ ...m, format_version: version })), /format_version .*this host reads version 1; re-export/);
  }
  await rejects(bundle(({ graphs, ...m }) => m), /missing the field 'graphs'/);
});

test("file paths that leave the bundle are refused, symbolic links followed", async () => {
  writeFileSync(path.join(root, "outside.onnx"), "x");
  await rejects(bundle((m) => { m.files.encoder.path = "../outside.onnx"; return m; }), /files\.encoder\.path "\.\.\/outside\.onnx" points outside/);
  await rejects(bundle((m) => { m.files.decoder.path = path.join(root, "outside.onnx"); return m; }), /files\.decoder\.path .* points outside/);
  const dir = bundle((m) => { m.files.encoder.path = "link.onnx"; return m; });
  symlinkSync(path.join(root, "outside.onnx"), path.join(dir, "link.onnx"));
  await rejects(dir, /files\.encoder\.path "link\.onnx" points outside/);
  await rejects(bundle((m) => { delete m.files.source_tokenizer.path; return m; }), /files\.source_tokenizer is missing or has no path/);
});

test("a missing file and a damaged file are refused; checkHashes: false skips only the hash", async () => {
  await rejects(bundle((m) => { m.files.decoder.path = "gone.onnx"; return m; }), /gone\.onnx: missing from the bundle \(files\.decoder/);
  const dir = bundle((m) => { m.files.target_tokenizer.sha256 = "0".repeat(64); return m; });
  await rejects(dir, /target\.spm\.model: sha256 differs from bundle\.json \(files\.target_tokenizer\)/);
  const b = await readBundle(dir, nodePlatform, { checkHashes: false });
  assert.equal(b.files.target_tokenizer.length, "stand-in for target.spm.model".length);
});
