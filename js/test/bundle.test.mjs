// src/bundle.js on the Node platform: checks 1-4 of docs/bundle-format.md "Checks a host must do"
// (bundle.json, its fields' types and ranges, paths, hashes), on bundle directories of small but
// real files (test/fixtures.mjs). Each refusal must name the field, the value and the fix.
import assert from "node:assert/strict";
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { after, test } from "node:test";
import zlib from "node:zlib";
import { BundleError, MAX_JSON_BYTES, readBundle, validateMeta } from "../src/bundle.js";
import { nodePlatform } from "../src/platform-node.js";
import { hash, soundFiles, soundMeta, vocabBytes, writeBundle } from "./fixtures.mjs";

const root = mkdtempSync(path.join(tmpdir(), "seq2onnx-js-bundle-"));
after(() => rmSync(root, { recursive: true, force: true }));
let count = 0;

/** A sound bundle directory whose bundle.json is `edit(meta)` (a string is written as is); returns its path. */
function bundle(edit = (meta) => meta) {
  return writeBundle(path.join(root, `b${count++}`), edit);
}

const rejects = (dir, pattern, options) =>
  assert.rejects(readBundle(dir, nodePlatform, options), (e) => {
    assert.ok(e instanceof BundleError, `${e}`);
    assert.match(e.message, pattern);
    return true;
  });

test("a sound bundle reads, with the bytes that were hashed and where each file was found", async () => {
  const dir = bundle();
  const b = await readBundle(dir, nodePlatform);
  assert.equal(b.meta.format_version, 1);
  assert.equal(b.metaPath, path.join(dir, "bundle.json"));
  assert.deepEqual(Object.keys(b.files).sort(), [
    "decoder",
    "encoder",
    "source_tokenizer",
    "target_tokenizer",
  ]);
  assert.deepEqual(b.files.decoder, soundFiles().bytes["decoder.onnx"]);
  assert.equal(
    b.paths.target_tokenizer,
    path.join(await nodePlatform.resolveInside(dir, ".").then((w) => w.path), "target.spm.model"),
  );
});

test("no bundle.json, invalid JSON, another format, another version, a missing field, an over-large file", async () => {
  await rejects(
    path.join(root, "nowhere"),
    /bundle\.json: missing; .* is not a seq2onnx bundle \(make one with `seq2onnx export/,
  );
  await rejects(
    bundle(() => "{not json"),
    /invalid JSON/,
  );
  await rejects(
    bundle(() => "[1, 2]"),
    /not a seq2onnx-bundle description/,
  );
  await rejects(
    bundle((m) => ({ ...m, format: "other" })),
    /not a seq2onnx-bundle description \(format="other"\)/,
  );
  for (const version of [0, 2, "1", true, null]) {
    await rejects(
      bundle((m) => ({ ...m, format_version: version })),
      /format_version .*, this host reads version 1 \(an integer\); re-export the bundle with a matching seq2onnx/,
    );
  }
  await rejects(
    bundle(({ graphs, ...m }) => m),
    /missing the field 'graphs'; re-export the bundle with `seq2onnx export`/,
  );
  await rejects(
    bundle((m) => JSON.stringify({ ...m, padding: "x".repeat(MAX_JSON_BYTES) })),
    /bundle\.json: \d+ bytes, more than the 1048576 a bundle description can be/,
  );
});

// The field cases every host shares (spec/cases/bundle-json.json, read by the Python tests too):
// `base` is a sound bundle.json; each case edits a copy of it and must be refused with a message
// matching `message` that also says how to fix it (`fix`).
const SHARED = JSON.parse(
  readFileSync(new URL("../../spec/cases/bundle-json.json", import.meta.url), "utf8"),
);

/** `base` with a case's edits applied (set, delete, copy: see the file's $comment). */
function applyEdits(base, edits) {
  const meta = structuredClone(base);
  const parentOf = (path) => {
    let node = meta;
    for (const key of path.slice(0, -1)) {
      assert.ok(
        node !== null && typeof node === "object" && key in node,
        `no ${JSON.stringify(path)} in base`,
      );
      node = node[key];
    }
    return [node, path[path.length - 1]];
  };
  for (const edit of edits) {
    const [parent, key] = parentOf(edit.path);
    if (edit.op === "set") parent[key] = structuredClone(edit.value);
    else if (edit.op === "delete") {
      assert.ok(key in parent, `delete: no ${JSON.stringify(edit.path)} in base`);
      if (Array.isArray(parent)) parent.splice(key, 1);
      else delete parent[key];
    } else if (edit.op === "copy") {
      const [from, fromKey] = parentOf(edit.from);
      assert.ok(fromKey in from, `copy: no ${JSON.stringify(edit.from)} in base`);
      parent[key] = structuredClone(from[fromKey]);
    } else assert.fail(`unknown edit op ${JSON.stringify(edit.op)}`);
  }
  return meta;
}

test("the shared cases: base passes, each case is refused naming the field, the value and the fix", () => {
  assert.ok(SHARED.cases.length > 0);
  assert.equal(typeof SHARED.fix, "string");
  validateMeta(structuredClone(SHARED.base), "B/bundle.json");
  for (const { what, edits, message } of SHARED.cases) {
    const meta = applyEdits(SHARED.base, edits);
    assert.throws(
      () => validateMeta(meta, "B/bundle.json"),
      (e) => {
        assert.ok(e instanceof BundleError, `${what}: ${e}`);
        assert.match(e.message, new RegExp(message), what);
        assert.ok(e.message.startsWith("B/bundle.json: "), `${what}: ${e.message}`);
        assert.ok(
          e.message.includes(SHARED.fix),
          `${what}: ${e.message} does not say ${JSON.stringify(SHARED.fix)}`,
        );
        return true;
      },
      what,
    );
  }
});

test("optional fields may be absent; a long value is cut; readBundle applies the checks before touching any file", async () => {
  const meta = { ...soundMeta(), files: soundFiles().files };
  validateMeta(meta, "B/bundle.json"); // the node tests' own sound bundle.json passes too
  delete meta.tokenizers;
  delete meta.model.n_encoder_layers;
  delete meta.decoding.min_length;
  delete meta.quantization;
  validateMeta(meta, "B/bundle.json");
  meta.quantization = null;
  validateMeta(meta, "B/bundle.json");
  meta.dtype = "x".repeat(200);
  assert.throws(() => validateMeta(meta, "B/bundle.json"), /dtype is "x{56}\.\.\., expected/);
  const refusedWith = (pattern) => (e) => e instanceof BundleError && pattern.test(e.message);
  assert.throws(
    () => validateMeta({ ...soundMeta(), files: soundFiles().files, model: [] }, "B/bundle.json"),
    refusedWith(
      /^B\/bundle\.json: model is \[\], expected an object; re-export the bundle with `seq2onnx export` \(or correct the field\)$/,
    ),
  );
  const { model, ...noModel } = soundMeta();
  assert.throws(
    () => validateMeta({ ...noModel, files: soundFiles().files }, "B/bundle.json"),
    refusedWith(/^B\/bundle\.json: missing the field 'model'; re-export the bundle with `seq2onnx export`$/),
  );
  await rejects(
    bundle((m) => {
      m.model.n_heads = 3;
    }),
    /model\.d_model is 8, expected a multiple of model\.n_heads=3/,
  );
});

test("file paths that leave the bundle are refused, symbolic links followed", async () => {
  writeFileSync(path.join(root, "outside.onnx"), "x");
  await rejects(
    bundle((m) => {
      m.files.encoder.path = "../outside.onnx";
    }),
    /files\.encoder\.path "\.\.\/outside\.onnx" points outside/,
  );
  await rejects(
    bundle((m) => {
      m.files.decoder.path = path.join(root, "outside.onnx");
    }),
    /files\.decoder\.path .* points outside/,
  );
  const dir = bundle((m) => {
    m.files.encoder.path = "link.onnx";
  });
  symlinkSync(path.join(root, "outside.onnx"), path.join(dir, "link.onnx"));
  await rejects(dir, /files\.encoder\.path "link\.onnx" points outside/);
});

test("a missing file and a damaged file are refused; checkHashes: false skips only the hash", async () => {
  await rejects(
    bundle((m) => {
      m.files.decoder.path = "gone.onnx";
    }),
    /gone\.onnx: missing from the bundle \(files\.decoder/,
  );
  const dir = bundle((m) => {
    m.files.target_tokenizer.sha256 = "0".repeat(64);
  });
  await rejects(
    dir,
    /target\.spm\.model: sha256 differs from bundle\.json \(files\.target_tokenizer\); .* re-export the bundle/,
  );
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
  await rejects(
    bundle(withFused("0".repeat(64))),
    /decoder_fused\.onnx: missing from the bundle \(files\.decoder_fused/,
  );
});

test("the weights file is held to its size before it is read and to its sha256 always, a CRC-32 fix-up refused", async () => {
  const weights = Buffer.from("sixty-four bytes of weights, more or less, for the check".padEnd(64, "."));
  const crc = (bytes) => zlib.crc32(bytes).toString(16).padStart(8, "0");
  const withWeights = (entry) => (m) => {
    m.files.weights = { path: "weights.bin", ...entry };
  };
  const write = (dir, bytes = weights) => {
    writeFileSync(path.join(dir, "weights.bin"), bytes);
    return dir;
  };
  // a wrong sha256 beside a right CRC-32 (an edit whose CRC-32 was fixed up): the sha256 refuses it
  await rejects(
    write(bundle(withWeights({ sha256: "0".repeat(64), crc32: crc(weights) }))),
    /weights\.bin: sha256 differs from bundle\.json \(files\.weights\)/,
  );
  const altered = Buffer.from(weights);
  altered[20] ^= 1;
  await rejects(
    write(bundle(withWeights({ sha256: hash(weights), crc32: crc(altered) })), altered),
    /weights\.bin: sha256 differs from bundle\.json \(files\.weights\)/,
  );
  // another size than files.weights.size: refused by its size, as the Python runtime words it
  await rejects(
    write(bundle(withWeights({ sha256: hash(weights), size: 65 }))),
    /weights\.bin: 64 bytes, bundle\.json records 65 \(size\); the file is damaged or was replaced/,
  );
  const loaded = await readBundle(
    write(bundle(withWeights({ sha256: hash(weights), size: 64 }))),
    nodePlatform,
  );
  assert.equal(loaded.weightsSize, 64);
  // the copy that onnxruntime is pointed at: a private folder, holding exactly the bytes hashed
  assert.notEqual(loaded.paths.weightsFolder, path.dirname(loaded.paths.weights));
  assert.deepEqual(readFileSync(path.join(loaded.paths.weightsFolder, "weights.bin")), weights);
  nodePlatform.releaseCopy(loaded);
  assert.equal(existsSync(loaded.paths.weightsFolder), false);
  for (const bad of ["1234567", "ABCDEF01", 305419896]) {
    await rejects(
      write(bundle(withWeights({ sha256: hash(weights), crc32: bad }))),
      /files\.weights\.crc32 is .*, expected 8 lowercase hex digits \(the file's CRC-32\)/,
    );
  }
});

test("files.<key>.path of 400 KB or with a NUL, and a malformed sha256 or size, are refused by name", async () => {
  await rejects(
    bundle((m) => {
      m.files.encoder.path = "a/".repeat(200_000);
    }),
    /files\.encoder\.path is .*expected a path of at most 1024 characters/,
  );
  await rejects(
    bundle((m) => {
      m.files.encoder.path = "encoder\u0000.onnx";
    }),
    /files\.encoder\.path is .*expected a path without a NUL character/,
  );
  await rejects(
    bundle((m) => {
      m.files.encoder.sha256 = "ABC";
    }),
    /files\.encoder\.sha256 is "ABC", expected 64 lowercase hex digits/,
  );
  await rejects(
    bundle((m) => {
      m.files.encoder.size = -1;
    }),
    /files\.encoder\.size is -1, expected an integer >= 0/,
  );
});

test("the vocabulary maps are hashed like every file and kept, also with checkHashes: false", async () => {
  const source = vocabBytes([4, 5, 6]);
  const withMaps = (sha) => (m) => {
    m.files.source_vocab = { path: "source.vocab.bin", sha256: sha };
    m.files.target_vocab = { path: "maps/target.vocab.bin", sha256: hash(vocabBytes([-1, 0])) };
  };
  const write = (dir) => {
    writeFileSync(path.join(dir, "source.vocab.bin"), source);
    mkdirSync(path.join(dir, "maps"));
    writeFileSync(path.join(dir, "maps", "target.vocab.bin"), vocabBytes([-1, 0]));
    return dir;
  };
  const good = write(bundle(withMaps(hash(source))));
  for (const checkHashes of [true, false]) {
    const b = await readBundle(good, nodePlatform, { checkHashes });
    assert.deepEqual(b.files.source_vocab, source);
    assert.deepEqual(b.files.target_vocab, vocabBytes([-1, 0]));
    assert.equal(b.files.decoder_fused, undefined);
  }
  await rejects(
    write(bundle(withMaps("0".repeat(64)))),
    /source\.vocab\.bin: sha256 differs from bundle\.json \(files\.source_vocab\)/,
  );
  await rejects(
    bundle(withMaps(hash(source))),
    /source\.vocab\.bin: missing from the bundle \(files\.source_vocab/,
  );
  // a map is a file, not a graph: no graphs entry is wanted for it
  await rejects(
    write(
      bundle((m) => {
        withMaps(hash(source))(m);
        m.files.source_vocab.path = 5;
      }),
    ),
    /files\.source_vocab\.path is 5, expected a string/,
  );
});

test("the tokens section: absent, empty or full is sound; a language id written 6.0 is refused as Python reads it", async () => {
  const tokens = {
    source_prefix: [4],
    source_suffix: [3],
    target_prefix: [],
    languages: { de: 6, en: 7 },
    target_lang_in: "source_prefix",
    text_language_codes: true,
    strip_text: true,
  };
  for (const t of [undefined, {}, tokens])
    await readBundle(
      bundle((m) => ({ ...m, tokens: t })),
      nodePlatform,
    );
  const written = (m) => JSON.stringify({ ...m, tokens }).replace('"en":7', '"en":7.0');
  await rejects(
    bundle(written),
    /bundle\.json: tokens\.languages is \{"de":6,"en":7\.0\}, expected an object of language codes to token ids \(integers >= 0\); re-export/,
  );
});
