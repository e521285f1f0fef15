// src/platform-web.js over a fake fetch (an in-memory web server): the bundle checks of
// src/bundle.js through URLs, the SHA-256 fallback for pages outside secure contexts, and the
// onnxruntime-web settings (local WASM file, one thread). The real browser runs in tests/test_web.py.
import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { test } from "node:test";
import { BundleError, readBundle } from "../src/bundle.js";
import { configureOrt, sha256Hex, webPlatform } from "../src/platform-web.js";
import { Translator } from "../src/translator.js";
import { EOS, fakeBundle, fakeOrt, fakeTokenizer, VOCAB } from "./fake-host.mjs";
import { soundMeta, vocabBytes } from "./fixtures.mjs";

const BASE = "http://127.0.0.1:8000/bundle/";
const hash = (bytes) => createHash("sha256").update(bytes).digest("hex");

/** A fetch serving `files` (URL -> bytes) and recording the requests. */
function server(files) {
  const requests = [];
  const fetch = async (url, { method = "GET" } = {}) => {
    requests.push(`${method} ${url}`);
    const body = files.get(url);
    return {
      ok: body !== undefined,
      status: body === undefined ? 404 : 200,
      arrayBuffer: async () => body.buffer.slice(body.byteOffset, body.byteOffset + body.byteLength),
    };
  };
  return { fetch, requests };
}

function site(edit = (meta) => meta) {
  const files = new Map();
  const meta = { ...soundMeta(), files: {} }; // fields readBundle checks; the files are stand-ins
  for (const [key, name] of [
    ["encoder", "encoder.onnx"],
    ["decoder", "decoder.onnx"],
    ["source_tokenizer", "source.spm.model"],
    ["target_tokenizer", "target.spm.model"],
  ]) {
    const bytes = new TextEncoder().encode(`stand-in for ${name}`);
    files.set(BASE + name, bytes);
    meta.files[key] = { path: name, sha256: hash(bytes) };
  }
  files.set(`${BASE}bundle.json`, new TextEncoder().encode(JSON.stringify(edit(meta))));
  return files;
}

const rejects = (promise, pattern) =>
  assert.rejects(promise, (e) => {
    assert.ok(e instanceof BundleError, `${e}`);
    assert.match(e.message, pattern);
    return true;
  });

test("the JavaScript SHA-256 is node:crypto's on lengths around the block edges", () => {
  for (const n of [0, 1, 3, 55, 56, 57, 63, 64, 65, 119, 120, 128, 1000, 4099]) {
    const bytes = new Uint8Array(randomBytes(n));
    assert.equal(sha256Hex(bytes), hash(bytes), `length ${n}`);
  }
  assert.equal(
    sha256Hex(new TextEncoder().encode("abc")),
    "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
  );
});

test("a bundle reads over HTTP, with crypto.subtle and without it", async () => {
  for (const subtle of [globalThis.crypto.subtle, null]) {
    const { fetch } = server(site());
    const bundle = await readBundle(BASE, webPlatform({}, { fetch, subtle }));
    assert.equal(new TextDecoder().decode(bundle.files.decoder), "stand-in for decoder.onnx");
  }
  const { fetch, requests } = server(site());
  await readBundle(BASE.slice(0, -1), webPlatform({}, { fetch })); // the folder URL without its "/"
  assert.ok(requests.includes(`GET ${BASE}bundle.json`), requests.join("\n"));
});

test("a damaged file, a missing file, a missing bundle.json are BundleErrors naming the URL", async () => {
  const damaged = site();
  damaged.set(`${BASE}decoder.onnx`, new TextEncoder().encode("replaced"));
  for (const subtle of [globalThis.crypto.subtle, null]) {
    await rejects(
      readBundle(BASE, webPlatform({}, { fetch: server(damaged).fetch, subtle })),
      /decoder\.onnx: sha256 differs from bundle\.json \(files\.decoder\)/,
    );
  }
  const missing = site();
  missing.delete(`${BASE}target.spm.model`);
  await rejects(
    readBundle(BASE, webPlatform({}, { fetch: server(missing).fetch })),
    /target\.spm\.model: missing from the bundle \(files\.target_tokenizer/,
  );
  await rejects(
    readBundle("http://127.0.0.1:8000/elsewhere/", webPlatform({}, { fetch: server(site()).fetch })),
    /bundle\.json: missing; .* is not a seq2onnx bundle/,
  );
});

test("paths that could leave the bundle folder are refused before any request", async () => {
  for (const bad of [
    "../secret.onnx",
    "a/../../b.onnx",
    "/etc/passwd",
    "http://evil.example/x.onnx",
    "a\\..\\b",
    "%2e%2e/x.onnx",
    "a//b.onnx",
    "",
    "data:,x",
  ]) {
    const { fetch, requests } = server(
      site((m) => {
        m.files.encoder.path = bad;
        return m;
      }),
    );
    await rejects(
      readBundle(BASE, webPlatform({}, { fetch })),
      /files\.encoder\.path .* points outside the bundle/,
    );
    assert.ok(
      requests.every((r) => r.startsWith(`GET ${BASE}`)),
      requests.join("\n"),
    );
  }
  const deeper = site((m) => {
    m.files.encoder.path = "graphs/encoder.onnx";
    return m;
  });
  deeper.set(`${BASE}graphs/encoder.onnx`, deeper.get(`${BASE}encoder.onnx`));
  await readBundle(BASE, webPlatform({}, { fetch: server(deeper).fetch }));
});

test("readFile gives ENOENT on 404 and names other HTTP failures", async () => {
  const platform = webPlatform(
    {},
    {
      fetch: async (url) => ({ ok: false, status: url.endsWith("a") ? 404 : 500 }),
    },
  );
  await assert.rejects(platform.readFile("http://x/a"), (e) => e.code === "ENOENT");
  await assert.rejects(
    platform.readFile("http://x/b"),
    (e) => e.code === undefined && /HTTP 500/.test(e.message),
  );
  assert.throws(() => webPlatform({}, { fetch: null }), /needs fetch/);
});

test("onnxruntime-web is pointed at the local .wasm, one thread, no proxy worker", () => {
  const ort = { env: { wasm: {} } };
  configureOrt(ort, "http://127.0.0.1:8000/ort/");
  assert.deepEqual(ort.env.wasm, {
    wasmPaths: { wasm: "http://127.0.0.1:8000/ort/ort-wasm-simd-threaded.wasm" },
    numThreads: 1,
    proxy: false,
  });
  assert.throws(() => configureOrt(ort, "http://127.0.0.1:8000/ort"), /must end with "\/"/);
});

test("the browser build carries the vocabulary maps and the tokens section: fetched, hashed, used", async () => {
  const root = mkdtempSync(path.join(tmpdir(), "seq2onnx-js-web-"));
  try {
    const maps = {
      source_vocab: vocabBytes(Array.from({ length: VOCAB }, (_, p) => (p < 4 ? p : 19 - p))),
      target_vocab: vocabBytes(Array.from({ length: VOCAB }, (_, i) => (i >= 13 ? -1 : i))),
    };
    const dir = fakeBundle(
      root,
      (meta) => {
        meta.tokens = { source_prefix: [13], target_prefix: [14], languages: { de: 13, fr: 15 } };
      },
      maps,
    );
    const files = new Map(
      readdirSync(dir).map((name) => [BASE + name, new Uint8Array(readFileSync(path.join(dir, name)))]),
    );
    const { fetch, requests } = server(files);
    const platform = { ...webPlatform(fakeOrt([]), { fetch, subtle: null }), loadTokenizer: fakeTokenizer };
    const t = await Translator.load(BASE, { platform });
    assert.ok(
      ["source_vocab.bin", "target_vocab.bin"].every((f) => requests.includes(`GET ${BASE}${f}`)),
      requests.join("\n"),
    );
    const [r] = await t.translateBatch(["one two"], { beamSize: 2, targetLang: "fr" });
    assert.equal(r.tokenIds[0][0], 15);
    assert.equal(r.hypotheses[0], r.tokenIds[0].filter((id) => id < 13).join("-"));
    assert.deepEqual(t.prepareSource("one two", { sourceLang: "fr" }).ids, [15, 12, 12, EOS]);
    files.set(`${BASE}target_vocab.bin`, vocabBytes([1, 2, 3]));
    await rejects(
      Translator.load(BASE, { platform }),
      /target_vocab\.bin: sha256 differs from bundle\.json \(files\.target_vocab\)/,
    );
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
});

test("the page lets go of the weights' bytes once both sessions have them", async () => {
  const root = mkdtempSync(path.join(tmpdir(), "seq2onnx-js-web-"));
  try {
    const weights = new Uint8Array(64).fill(7);
    const dir = fakeBundle(root, () => {}, { weights });
    const files = new Map(
      readdirSync(dir).map((name) => [BASE + name, new Uint8Array(readFileSync(path.join(dir, name)))]),
    );
    const ort = fakeOrt([]);
    const platform = {
      ...webPlatform(ort, { fetch: server(files).fetch, subtle: null }),
      loadTokenizer: fakeTokenizer,
    };
    const t = await Translator.load(BASE, { platform });
    // each session was handed the checked bytes (onnxruntime-web copies what it reads) ...
    assert.deepEqual(
      ort.created.map((o) => o.externalData.map((f) => [f.path, f.data.length])),
      [[["weights.bin", 64]], [["weights.bin", 64]]],
    );
    // ... and the Translator keeps none of them, while it still translates
    assert.equal(t.bundle.files.weights, undefined);
    const [r] = await t.translateBatch(["one two"], { beamSize: 1 });
    assert.ok(r.tokenIds[0].length > 0);
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
});
