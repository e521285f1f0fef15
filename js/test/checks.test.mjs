// src/checks.js: checks 5-8 of docs/bundle-format.md (what bundle.json states must be what the
// tokenizers and graphs state), as runtime/checks.py. The tokenizers and graph tables are small
// real protobufs (test/fixtures.mjs); the sessions are stand-ins with onnxruntime's session API
// (inputNames, outputNames, inputMetadata, outputMetadata) built from a graph signature, so that
// each one can be made to disagree with bundle.json in exactly one way.
import assert from "node:assert/strict";
import { test } from "node:test";
import { BundleError } from "../src/bundle.js";
import { checkGraphs, checkScheme, checkTokenizers, gatherTables, readVocabulary } from "../src/checks.js";
import { nodePlatform } from "../src/platform-node.js";
import {
  fingerprint,
  graphSignature,
  onnxModel,
  soundFiles,
  soundMeta,
  spmModel,
  vocabBytes,
} from "./fixtures.mjs";

/** A bundle as readBundle returns it, for soundMeta's sizes; `edit(meta, bytes)` before it is made. */
function bundle(edit = () => {}) {
  const { bytes, files } = soundFiles();
  const meta = { ...soundMeta(), files };
  edit(meta, bytes);
  const byKey = Object.fromEntries(Object.entries(meta.files).map(([key, f]) => [key, bytes[f.path]]));
  const paths = Object.fromEntries(Object.entries(meta.files).map(([key, f]) => [key, `/b/${f.path}`]));
  return { path: "/b", metaPath: "/b/bundle.json", meta, files: byKey, paths };
}

/** A stand-in session of one graph of a signature; `metadata: false` as onnxruntime before 1.22. */
function session(graph, { metadata = true } = {}) {
  const meta = (list) => list.map(({ name, dtype, shape }) => ({ name, isTensor: true, type: dtype, shape }));
  return {
    inputNames: graph.inputs.map((i) => i.name),
    outputNames: graph.outputs.map((o) => o.name),
    ...(metadata ? { inputMetadata: meta(graph.inputs), outputMetadata: meta(graph.outputs) } : {}),
  };
}

/** Sessions whose graphs are `signature` (default: the sound bundle's, as exported). */
function sessions(signature = graphSignature(), options) {
  return [session(signature.encoder, options), session(signature.decoder, options)];
}

const refused = (fn, pattern, what = "") =>
  assert.throws(
    fn,
    (e) => {
      assert.ok(e instanceof BundleError, `${what}: ${e}`);
      assert.match(e.message, pattern, what);
      return true;
    },
    what,
  );
const refusedAsync = (promise, pattern) =>
  assert.rejects(promise, (e) => {
    assert.ok(e instanceof BundleError, `${e}`);
    assert.match(e.message, pattern);
    return true;
  });

test("a SentencePiece model's pieces and special ids, as the Python processor gives them", () => {
  const v = readVocabulary(spmModel(10));
  assert.equal(v.pieces.length, 10);
  assert.deepEqual(v.pieces.slice(0, 5), ["<pad>", "<unk>", "<s>", "</s>", "\u2581p4"]);
  assert.deepEqual(v.special, { pad: 0, unk: 1, bos: 2, eos: 3 });
  // trainer_spec names other special pieces: the ids follow them, and a piece that is not of the
  // right type (or absent) gives -1, as pad_id() does for a model trained without padding
  const renamed = readVocabulary(
    spmModel(10, {
      trainer: { 46: "<bos>", 48: "\u2581p5" },
      edit: (p) => {
        p[2] = ["<bos>", 3];
        return p;
      },
    }),
  );
  assert.deepEqual(renamed.special, { pad: -1, unk: 1, bos: 2, eos: 3 });
  const noPad = readVocabulary(spmModel(10, { edit: (p) => p.slice(1) }));
  assert.deepEqual(noPad.special, { pad: -1, unk: 0, bos: 1, eos: 2 });
  assert.throws(() => readVocabulary(new TextEncoder().encode("not a model, just text")), /./);
  assert.throws(() => readVocabulary(new Uint8Array()), /no pieces/);
});

test("sound tokenizers pass; a wrong size, a wrong special id, a wrong or exchanged vocabulary are named", async () => {
  await checkTokenizers(bundle(), nodePlatform);
  // an older bundle.json without fingerprints is checked for sizes and ids only
  await checkTokenizers(
    bundle((m) => {
      delete m.tokenizers;
    }),
    nodePlatform,
  );
  await refusedAsync(
    checkTokenizers(
      bundle((m) => {
        m.model.tgt_vocab_size = 20;
      }),
      nodePlatform,
    ),
    /^\/b\/bundle\.json: model\.tgt_vocab_size=20, but target\.spm\.model \(get_piece_size\(\)\) has 16; re-export the bundle .*, or set model\.tgt_vocab_size to 16 if only bundle\.json is wrong$/,
  );
  await refusedAsync(
    checkTokenizers(
      bundle((_m, bytes) => {
        bytes["source.spm.model"] = spmModel(16, { edit: (p) => [p[1], p[0], ...p.slice(2)] });
      }),
      nodePlatform,
    ),
    /special_ids\.pad=0, but source\.spm\.model \(pad_id\(\)\) has 1/,
  );
  await refusedAsync(
    checkTokenizers(
      bundle((m) => {
        [m.files.source_tokenizer, m.files.target_tokenizer] = [
          m.files.target_tokenizer,
          m.files.source_tokenizer,
        ];
      }),
      nodePlatform,
    ),
    /\/b\/target\.spm\.model: its vocabulary is not the source vocabulary .*; it is the target tokenizer: the two \.model files are exchanged/,
  );
  // both files the source tokenizer: not "exchanged", but named as the other side's (runtime/checks.py's words)
  await refusedAsync(
    checkTokenizers(
      bundle((_m, bytes) => {
        bytes["target.spm.model"] = bytes["source.spm.model"];
      }),
      nodePlatform,
    ),
    /\/b\/target\.spm\.model: its vocabulary is not the target vocabulary .*; it is the source tokenizer \(the same vocabulary as source\.spm\.model\); re-export/,
  );
  await refusedAsync(
    checkTokenizers(
      bundle((m) => {
        m.tokenizers.target = fingerprint(16, { prefix: "z" });
      }),
      nodePlatform,
    ),
    /target\.spm\.model: its vocabulary is not the target vocabulary the model was exported with \(tokenizers\.target\.pieces_sha256/,
  );
  await refusedAsync(
    checkTokenizers(
      bundle((_m, bytes) => {
        bytes["target.spm.model"] = new TextEncoder().encode("\x08\x09");
      }),
      nodePlatform,
    ),
    /\/b\/target\.spm\.model: not a SentencePiece model \(.*\); re-export the bundle/,
  );
});

/**
 * A bundle of a model imported from Hugging Face: 20 source and 20 target ids over SentencePiece
 * models of 16 pieces; the source map sends piece p to id p + 4, the target map id i to piece i - 4
 * (ids 0-3 are the model's own special tokens, never written: -1). `edit(meta, maps)` may change the
 * maps' entries (arrays), replace their bytes (maps.bytes) or add vocab_texts (maps.texts, as JSON).
 */
function mapped(edit = () => {}) {
  const maps = {
    source: Array.from({ length: 16 }, (_, p) => p + 4),
    target: Array.from({ length: 20 }, (_, i) => (i < 4 ? -1 : i - 4)),
    bytes: {},
  };
  return bundle((m, bytes) => {
    m.model.src_vocab_size = 20;
    m.model.tgt_vocab_size = 20;
    edit(m, maps);
    for (const side of ["source", "target"]) {
      bytes[`${side}.vocab.bin`] = maps.bytes[side] ?? vocabBytes(maps[side]);
      m.files[`${side}_vocab`] = { path: `${side}.vocab.bin`, sha256: "" };
    }
    if (maps.texts) {
      bytes["vocab.texts.json"] = new TextEncoder().encode(JSON.stringify(maps.texts));
      m.files.vocab_texts = { path: "vocab.texts.json", sha256: "" };
    }
  });
}

test("vocabulary maps: sound maps are returned, and replace the size and special-id checks of their side", async () => {
  const maps = await checkTokenizers(mapped(), nodePlatform);
  assert.deepEqual(
    [...maps.source],
    Array.from({ length: 16 }, (_, p) => p + 4),
  );
  assert.deepEqual([...maps.target].slice(0, 6), [-1, -1, -1, -1, 0, 1]);
  assert.ok(maps.source instanceof Int32Array && maps.target.length === 20);
  assert.deepEqual(maps.texts, { source: new Map(), target: new Map() });
  assert.deepEqual(await checkTokenizers(bundle(), nodePlatform), {
    source: null,
    target: null,
    texts: { source: new Map(), target: new Map() },
  });
  // the SentencePiece model's own special ids are not the model's where a map translates them
  await checkTokenizers(
    mapped((m) => {
      m.special_ids.pad = 5;
      m.model.pad_id = 5;
    }),
    nodePlatform,
  );
  // the fingerprints are still checked
  await refusedAsync(
    checkTokenizers(
      mapped((m) => {
        m.tokenizers.target = fingerprint(16, { prefix: "z" });
      }),
      nodePlatform,
    ),
    /target\.spm\.model: its vocabulary is not the target vocabulary/,
  );
  // a side without a map keeps its checks
  await refusedAsync(
    checkTokenizers(
      bundle((m, bytes) => {
        m.model.tgt_vocab_size = 20;
        bytes["source.vocab.bin"] = vocabBytes(Array.from({ length: 16 }, (_, p) => p));
        m.files.source_vocab = { path: "source.vocab.bin", sha256: "" };
      }),
      nodePlatform,
    ),
    /model\.tgt_vocab_size=20, but target\.spm\.model \(get_piece_size\(\)\) has 16/,
  );
});

test("vocabulary maps that do not fit are refused naming the file, the value, the limit and the fix (runtime/vocab.py's words)", async () => {
  const FIX = "; re-export the bundle with `seq2onnx export`";
  const cases = [
    [
      (_m, maps) => {
        maps.bytes.source = new Uint8Array(63);
      },
      "/b/source.vocab.bin: 63 bytes is not a whole number of int32 entries",
    ],
    [
      (_m, maps) => {
        maps.bytes.target = new Uint8Array(6);
      },
      "/b/target.vocab.bin: 6 bytes is not a whole number of int32 entries",
    ],
    [
      (_m, maps) => {
        maps.source.pop();
      },
      "/b/source.vocab.bin: 15 entries, expected 16",
    ], // the source model's pieces
    [
      (_m, maps) => {
        maps.target.push(-1);
      },
      "/b/target.vocab.bin: 21 entries, expected 20",
    ], // model.tgt_vocab_size
    [
      (_m, maps) => {
        maps.source[3] = 20;
      },
      "/b/source.vocab.bin: entry 3 is 20, expected an id in [0, 20)",
    ],
    [
      (_m, maps) => {
        maps.source[0] = -1;
      },
      "/b/source.vocab.bin: entry 0 is -1, expected an id in [0, 20)",
    ],
    [
      (_m, maps) => {
        maps.target[5] = 16;
      },
      "/b/target.vocab.bin: entry 5 is 16, expected an id in [-2, 16)",
    ],
    [
      (_m, maps) => {
        maps.target[19] = -3;
      },
      "/b/target.vocab.bin: entry 19 is -3, expected an id in [-2, 16)",
    ],
    // a piece the target model lacks (-2) needs its text in vocab_texts, when the bundle has them
    [
      (_m, maps) => {
        maps.target[7] = -2;
        maps.texts = { target: { 8: "x" } };
      },
      "/b/vocab.texts.json: no text for target id 7, which target_vocab marks -2",
    ],
    [
      (_m, maps) => {
        maps.texts = { source: { "\u2581x": 20 } };
      },
      "/b/vocab.texts.json: a source id outside [0, 20)",
    ],
    [
      (_m, maps) => {
        maps.texts = [1];
      },
      "/b/vocab.texts.json: not the vocabulary texts the spec describes (not an object)",
    ],
    [
      (_m, maps) => {
        maps.texts = { source: { a: "5" } };
      },
      '/b/vocab.texts.json: not the vocabulary texts the spec describes (source["a"] is "5", not an id)',
    ],
    [
      (_m, maps) => {
        maps.texts = { target: { x: "a" } };
      },
      '/b/vocab.texts.json: not the vocabulary texts the spec describes (target["x"] is not an id\'s text)',
    ],
  ];
  for (const [edit, message] of cases) {
    await assert.rejects(checkTokenizers(mapped(edit), nodePlatform), (e) => {
      assert.ok(e instanceof BundleError, `${e}`);
      assert.equal(e.message, message + FIX);
      return true;
    });
  }
  // a -2 entry without vocab_texts is sound (it decodes to nothing, as in the Python runtime)
  await checkTokenizers(
    mapped((_m, maps) => {
      maps.target[7] = -2;
    }),
    nodePlatform,
  );
  const { texts } = await checkTokenizers(
    mapped((_m, maps) => {
      maps.target[7] = -2;
      maps.texts = { source: { "\u2581zz": 19 }, target: { 7: "\u2581qq" } };
    }),
    nodePlatform,
  );
  assert.deepEqual(texts, { source: new Map([["\u2581zz", 19]]), target: new Map([[7, "\u2581qq"]]) });
});

test("the tables gathered by src_ids and step are found in the graph's protobuf, through Constant and Cast", () => {
  const buf = onnxModel([
    { name: "emb", indices: "src_ids", dims: [300, 8] },
    { name: "pos", indices: "step", dims: [128, 8], via: "Constant" },
    { name: "half", indices: "tokens", dims: [5, 4], via: "Cast" },
  ]);
  assert.deepEqual(gatherTables(buf), [
    ["src_ids", [300, 8]],
    ["step", [128, 8]],
    ["tokens", [5, 4]],
  ]);
  assert.throws(() => gatherTables(new Uint8Array([0x3a, 0x05, 0x01])), /runs past the end|ends inside/);
});

test("sound graphs pass, with metadata and without", () => {
  checkGraphs(bundle(), ...sessions());
  checkGraphs(bundle(), ...sessions(graphSignature(), { metadata: false }));
});

test("graphs that disagree with bundle.json are refused, naming the field, both values and the fix", () => {
  const sig = () => graphSignature();
  const cases = [
    [
      "an input bundle.json does not list",
      () => {
        const s = sig();
        s.decoder.inputs.push({ name: "extra", dtype: "int64", shape: [1] });
        return [bundle(), s];
      },
      /^\/b\/decoder\.onnx: its inputs\/outputs .*"extra".* differ from bundle\.json's graphs\.decoder .*; re-export the bundle/,
    ],
    [
      "an element type",
      () => {
        const s = sig();
        s.encoder.inputs[0].dtype = "int32";
        return [bundle(), s];
      },
      /graphs\.encoder\.inputs\[src_ids\]\.dtype="int64", but encoder\.onnx has "int32"/,
    ],
    [
      "a fixed size",
      () => {
        const s = sig();
        s.decoder.outputs[0].shape = ["rows", 17];
        return [bundle(), s];
      },
      /graphs\.decoder\.outputs\[log_probs\]\.shape=\["rows",16\], but decoder\.onnx has \["rows",17\]/,
    ],
    [
      "a rank",
      () => {
        const s = sig();
        s.decoder.inputs[1].shape = [];
        return [bundle(), s];
      },
      /graphs\.decoder\.inputs\[step\]\.shape=\[1\], but decoder\.onnx has \[\]/,
    ],
    [
      "the layer count",
      () => [
        bundle((m) => {
          m.model.n_decoder_layers = 2;
          m.model.n_encoder_layers = 2;
        }),
        sig(),
      ],
      /model\.n_decoder_layers=2, but decoder\.onnx \(its past_key_self_\*\/past_value_self_\* inputs, layers\) has 1/,
    ],
    [
      "the head count",
      () => [
        bundle((m) => {
          m.model.n_heads = 4;
        }),
        sig(),
      ],
      /model\.n_heads=4, but decoder\.onnx \(input past_key_self_0 of shape \["prev_rows",2,"past",4\]\) has 2/,
    ],
    [
      "d_model",
      () => [
        bundle((m) => {
          m.model.d_model = 16;
        }),
        sig(),
      ],
      /model\.d_model=16, but decoder\.onnx \(input past_key_self_0 of shape \["prev_rows",2,"past",4\]: head size 4 x 2 heads\) has 8/,
    ],
    [
      "dtype",
      () => [
        bundle((m) => {
          m.dtype = "float16";
        }),
        sig(),
      ],
      /dtype="float16", but decoder\.onnx \(input past_key_self_0 .*\) has "float32"/,
    ],
    [
      "the target vocabulary",
      () => [
        bundle((m) => {
          m.model.tgt_vocab_size = 20;
        }),
        sig(),
      ],
      /model\.tgt_vocab_size=20, but decoder\.onnx \(output log_probs of shape \["rows",16\]\) has 16/,
    ],
    [
      "the source vocabulary (the embedding's rows)",
      () => [
        bundle((m) => {
          m.model.src_vocab_size = 20;
        }),
        sig(),
      ],
      /model\.src_vocab_size=20, but encoder\.onnx \(source embedding of shape \[16, 8\]\) has 16; .* or set model\.src_vocab_size to 16/,
    ],
    [
      "max_positions (the positional table's rows)",
      () => [
        bundle((m) => {
          m.model.max_positions = 64;
          m.max_positions = 64;
        }),
        sig(),
      ],
      /model\.max_positions=64, but decoder\.onnx \(positional table of shape \[12, 8\]\) has 12/,
    ],
    [
      "no positional table",
      () => [
        bundle((_m, bytes) => {
          bytes["decoder.onnx"] = onnxModel([{ name: "w", indices: "tokens", dims: [16, 8] }]);
        }),
        sig(),
      ],
      /\/b\/decoder\.onnx: no positional table \(a Gather of step\) found; re-export/,
    ],
    [
      "a graph file that is not ONNX",
      () => [
        bundle((_m, bytes) => {
          bytes["encoder.onnx"] = new Uint8Array([0x3a, 0x7f]);
        }),
        sig(),
      ],
      /\/b\/encoder\.onnx: cannot be read for its tables/,
    ],
  ];
  for (const [what, make, pattern] of cases) {
    const [b, s] = make();
    refused(() => checkGraphs(b, ...sessions(s)), pattern, what);
  }
  // without a top_k input (a bundle from before it existed) the search cannot fetch its candidates
  const s = sig();
  for (const g of [s.decoder]) g.inputs = g.inputs.filter((i) => i.name !== "top_k");
  refused(
    () =>
      checkGraphs(
        bundle((m) => {
          m.graphs.decoder = s.decoder;
        }),
        ...sessions(s),
      ),
    /decoder\.onnx: no top_k input/,
  );
});

test("without session metadata, element types and dims go unchecked but names, layers and tables do not", () => {
  const s = graphSignature();
  s.encoder.inputs[0].dtype = "int32";
  checkGraphs(bundle(), ...sessions(s, { metadata: false }));
  refused(
    () =>
      checkGraphs(
        bundle((m) => {
          m.model.src_vocab_size = 20;
        }),
        ...sessions(graphSignature(), { metadata: false }),
      ),
    /model\.src_vocab_size=20/,
  );
});

test("checkScheme refuses a scheme it does not know, or one its onnxruntime is too old for, by name", () => {
  const withScheme = (scheme) => ({ metaPath: "/b/bundle.json", meta: { quantization_scheme: scheme } });
  refused(
    () => checkScheme(withScheme({ name: "int3-future" }), "1.30.0"),
    /quantization_scheme\.name="int3-future" is not a scheme this host runs \(int8-per-row-u8s8, .*int4-matmulnbits\)/,
  );
  refused(
    () => checkScheme(withScheme({ name: "int4-matmulnbits" }), "1.22.0"),
    /"int4-matmulnbits" \(MatMulNBits, GatherBlockQuantized\) needs onnxruntime >= 1\.30\.0, and this host has onnxruntime 1\.22\.0/,
  );
  refused(
    () => checkScheme(withScheme({ name: "int4-matmulnbits" }), "1.9.9"),
    /needs onnxruntime >= 1\.30\.0/,
  );
  checkScheme(withScheme({ name: "int4-matmulnbits" }), "1.30.0");
  checkScheme(withScheme({ name: "int4-matmulnbits" }), "1.32.1-dev.20260101");
  checkScheme(withScheme({ name: "int4-matmulnbits" }), undefined); // a package that does not say: the name only
  checkScheme(withScheme({ name: "int8-per-row-u8s8" }), "1.18.0");
  checkScheme({ metaPath: "/b/bundle.json", meta: { quantization_scheme: null } }, "1.0.0"); // fp32
});
