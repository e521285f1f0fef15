// src/cli.js (bin/seq2onnx-js.mjs) over the fake onnxruntime of test/fake-host.mjs: every good line
// is answered and output line i is input line i's answer, whatever the other lines hold. A line
// with more tokens than the model's positions gets an empty line and a warning naming the line and
// --truncate (with --truncate: translated, cut, with a warning); invalid UTF-8 is replaced per line
// with a warning naming the line and the byte, as `seq2onnx translate` does; option errors name the
// flag. The fake bundle has 12 positions and a tokenizer of words: 11 words + the end token fit.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { after, test } from "node:test";
import { fileURLToPath } from "node:url";
import { main } from "../src/cli.js";
import { Translator } from "../src/translator.js";
import { EOS, fakeBundle, fakePlatform, VOCAB } from "./fake-host.mjs";
import { vocabBytes } from "./fixtures.mjs";

const root = mkdtempSync(path.join(tmpdir(), "seq2onnx-js-cli-"));
after(() => rmSync(root, { recursive: true, force: true }));
const BIN = fileURLToPath(new URL("../bin/seq2onnx-js.mjs", import.meta.url));

/**
 * Runs the CLI on `input` (a string or bytes) over a fake bundle (`edit` and `extra` as fakeBundle's);
 * returns {code, out, err, loads}.
 */
async function run(args, input, { cores = 4, edit, extra } = {}) {
  let out = "";
  let err = "";
  const loads = [];
  const dir = fakeBundle(root, edit, extra);
  const code = await main(
    args.map((a) => (a === "BUNDLE" ? dir : a)),
    {
      stdin: () => (typeof input === "string" ? new TextEncoder().encode(input) : input),
      stdout: (text) => {
        out += text;
      },
      stderr: (text) => {
        err += text;
      },
      load: (bundle, options) => {
        loads.push(options);
        return Translator.load(bundle, { platform: fakePlatform(), ...options });
      },
      cores,
    },
  );
  return { code, out, err, loads };
}

const words = (n) => Array.from({ length: n }, (_, i) => `w${i}`).join(" ");
const lines = (text) => text.split("\n").slice(0, -1);

test("an over-long line gets an empty line and a warning naming it and --truncate; the other lines are answered", async () => {
  const input = ["one two", words(30), "three four five", "", words(11)].join("\n");
  const { code, out, err } = await run(["translate", "BUNDLE", "--beam", "1"], `${input}\n`);
  assert.equal(code, 0, err);
  const got = lines(out);
  assert.equal(got.length, 5, "one output line per input line");
  assert.equal(got[1], "", "the over-long line: empty");
  assert.equal(got[3], "", "the empty line: empty");
  for (const i of [0, 2, 4]) assert.notEqual(got[i], "", `line ${i + 1} is translated`);
  assert.equal(
    err,
    "seq2onnx-js: warning: line 2: more tokens than the 12 positions this model was exported for " +
      "(max_positions in bundle.json): wrote an empty line (--truncate translates its first 11 tokens and the end token)\n",
  );
  assert.ok(!/truncate: true/.test(err), "the flag is named, not the API option");
  // the same lines, one at a time: the same answers (a bad line changes nothing for the others)
  for (const i of [0, 2, 4])
    assert.equal(
      lines((await run(["translate", "BUNDLE", "--beam", "1"], `${input.split("\n")[i]}\n`)).out)[0],
      got[i],
    );
});

test("--truncate translates an over-long line cut to the positions, with a warning naming the line", async () => {
  const { code, out, err } = await run(
    ["translate", "BUNDLE", "--truncate", "--json"],
    `${words(30)}\nshort line\n`,
  );
  assert.equal(code, 0, err);
  const [cut, short] = lines(out).map((l) => JSON.parse(l));
  assert.equal(cut.source_ids.length, 12);
  assert.equal(cut.source_ids.at(-1), 3);
  assert.ok(cut.hypotheses[0].length > 0);
  assert.deepEqual(short.source_ids, [9, 8, 3]); // a word's id is 4 + its length
  assert.match(
    err,
    /^seq2onnx-js: warning: line 1: more tokens than the 12 positions .*: translated its first 11 and the end token \(--truncate\)\n$/,
  );
});

test("invalid UTF-8 is replaced per line with a warning naming the line and the byte; the line is still answered", async () => {
  const bytes = Buffer.concat([
    Buffer.from("one two\n"),
    Buffer.from([0x61, 0x20, 0xff, 0xfe, 0x20, 0x62, 0x0a]),
    Buffer.from("x \xe6\xbc y\r\n", "latin1"),
    Buffer.from("last"),
  ]);
  const { code, out, err } = await run(["translate", "BUNDLE", "--json"], new Uint8Array(bytes));
  assert.equal(code, 0, err);
  const got = lines(out).map((l) => JSON.parse(l));
  assert.equal(got.length, 4);
  assert.deepEqual(got[1].source_ids, [5, 6, 5, 3], "a, U+FFFD U+FFFD, b: three words");
  assert.deepEqual(
    got[2].source_ids,
    [5, 5, 5, 3],
    "x, U+FFFD (a truncated sequence is one), y; the \\r dropped",
  );
  assert.equal(
    err,
    "seq2onnx-js: warning: line 2: invalid UTF-8 (byte ff at byte 3 of the line, perhaps more after it) replaced by U+FFFD\n" +
      "seq2onnx-js: warning: line 3: invalid UTF-8 (byte e6 bc at byte 3 of the line, perhaps more after it) replaced by U+FFFD\n",
  );
  const tokenized = await run(["tokenize", "BUNDLE"], new Uint8Array(Buffer.from([0x61, 0xc3, 0x28, 0x0a])));
  assert.equal(tokenized.code, 0);
  assert.equal(lines(tokenized.out).length, 1);
  assert.match(tokenized.err, /line 1: invalid UTF-8 \(byte c3 at byte 2 of the line/);
});

test("after ten warnings of a kind the rest are counted in one closing line", async () => {
  const input = Array.from({ length: 13 }, () => words(20)).join("\n");
  const { code, out, err } = await run(["translate", "BUNDLE"], `${input}\n`);
  assert.equal(code, 0);
  assert.deepEqual(lines(out), new Array(13).fill(""));
  const warned = err.trim().split("\n");
  assert.equal(warned.length, 11);
  assert.match(
    warned[9],
    /line 10: .* \(further lines with more tokens than the model's positions are counted, not shown\)$/,
  );
  assert.equal(
    warned[10],
    "seq2onnx-js: warning: 13 lines in all had more tokens than the model's positions",
  );
});

test("--ids: a line that is not an array of ids of the vocabulary gets an empty line and a warning", async () => {
  const { code, out, err } = await run(
    ["translate", "BUNDLE", "--ids", "--json"],
    "[7, 8]\nnot json\n[99]\n[5, 3]\n",
  );
  assert.equal(code, 0, err);
  const got = lines(out).map((l) => JSON.parse(l));
  assert.deepEqual(
    got.map((g) => g.source_ids),
    [[7, 8, 3], [], [], [5, 3]],
  );
  assert.deepEqual(got[1].hypotheses, [""]);
  assert.match(err, /line 2: --ids wants a JSON array of token ids, got "not json"; wrote an empty line/);
  assert.match(
    err,
    /line 3: token ids \[99\] are outside the source vocabulary \[0, 16\); wrote an empty line/,
  );
});

test("--threads above the cores is refused before the bundle loads, naming the value, the limit and the fix", async () => {
  const refused = await run(["translate", "BUNDLE", "--threads", "99999"], "one\n", { cores: 2 });
  assert.equal(refused.code, 2);
  assert.equal(
    refused.err,
    "seq2onnx-js: error: --threads 99999: this machine has 2 cores; give 1 to 2, or 0 to use them all\n",
  );
  assert.deepEqual(refused.loads, [], "nothing loaded");
  for (const bad of ["3", "-1", "1.5", "x"])
    assert.equal((await run(["translate", "BUNDLE", "--threads", bad], "", { cores: 2 })).code, 2);
  const ok = await run(["translate", "BUNDLE", "--threads", "2"], "one\n", { cores: 2 });
  assert.equal(ok.code, 0, ok.err);
  assert.deepEqual(ok.loads, [{ threads: 2 }]);
});

test("option errors that need the model name the flag", async () => {
  const nBest = await run(["translate", "BUNDLE", "--n-best", "5"], "one\n");
  assert.equal(nBest.code, 2);
  assert.match(
    nBest.err,
    /^seq2onnx-js: error: --n-best 5 is more than the beam size 4; give --beam 5 or more, or a smaller --n-best\n$/,
  );
  const maxLength = await run(["translate", "BUNDLE", "--max-length", "13"], "one\n");
  assert.match(
    maxLength.err,
    /^seq2onnx-js: error: --max-length 13: this model has 12 positions \(max_positions in bundle\.json\); give 1 to 12\n$/,
  );
});

test("bin/seq2onnx-js.mjs: --threads 99999 ends at once with one line, status 2; a missing bundle with status 1", () => {
  const threads = spawnSync(
    process.execPath,
    [BIN, "translate", path.join(root, "nowhere"), "--threads", "99999"],
    { input: "x\n", encoding: "utf8", timeout: 60000 },
  );
  assert.equal(threads.status, 2);
  assert.match(
    threads.stderr,
    /^seq2onnx-js: error: --threads 99999: this machine has \d+ cores; give 1 to \d+, or 0 to use them all\n$/,
  );
  assert.equal(threads.stdout, "");
  const missing = spawnSync(process.execPath, [BIN, "translate", path.join(root, "nowhere")], {
    input: "x\n",
    encoding: "utf8",
    timeout: 60000,
  });
  assert.equal(missing.status, 1);
  assert.match(
    missing.stderr,
    /^seq2onnx-js: error: .*nowhere\/bundle\.json: missing; .* is not a seq2onnx bundle/,
  );
});

// A bundle imported from Hugging Face (M2M100-like): a source language token first, a target
// language token forced first, the fake tokenizer's pieces mapped to other model ids.
const M2M = {
  edit: (meta) => {
    meta.tokens = { source_prefix: [13], target_prefix: [14], languages: { de: 13, en: 14, fr: 15 } };
  },
  extra: {
    source_vocab: vocabBytes(Array.from({ length: VOCAB }, (_, p) => (p < 4 ? p : 19 - p))),
    target_vocab: vocabBytes(Array.from({ length: VOCAB }, (_, i) => (i >= 13 ? -1 : i))),
  },
};

test("--help names --source-lang, --target-lang and --target-prefix", async () => {
  const { code, out } = await run(["--help"], "");
  assert.equal(code, 0);
  for (const flag of ["--source-lang CODE", "--target-lang CODE", "--target-prefix IDS"])
    assert.ok(out.includes(flag), flag);
});

test("--source-lang, --target-lang and --target-prefix: the source prefix and the forced target prefix of every line", async () => {
  const json = async (args, input = "one two\nthree\n") => {
    const r = await run(["translate", "BUNDLE", "--json", "--beam", "2", ...args], input, M2M);
    assert.equal(r.code, 0, r.err);
    return lines(r.out).map((l) => JSON.parse(l));
  };
  const plain = await json([]);
  assert.deepEqual(plain[0].source_ids, [13, 12, 12, EOS]); // "one", "two": piece 4 + 3, model id 19 - 7
  for (const r of plain)
    for (const ids of r.token_ids) assert.equal(ids[0], 14, "the bundle's target prefix");
  const langs = await json(["--source-lang", "fr", "--target-lang", "de"]);
  assert.deepEqual(
    langs.map((r) => r.source_ids[0]),
    [15, 15],
  );
  for (const r of langs) assert.equal(r.token_ids[0][0], 13);
  const forced = await json(["--target-lang", "de", "--target-prefix", "5, 6"]);
  for (const r of forced) assert.deepEqual(r.token_ids[0].slice(0, 2), [5, 6]);
  const ids = await json(["--ids"], "[7, 8]\n");
  assert.deepEqual(ids[0].source_ids, [7, 8, EOS]);
  assert.equal(ids[0].token_ids[0][0], 14);
});

test("an unknown language code, target ids that are not ids or not the vocabulary's: refused naming the flag", async () => {
  const lang = await run(["translate", "BUNDLE", "--target-lang", "xx"], "one\n", M2M);
  assert.equal(lang.code, 2);
  assert.equal(
    lang.err,
    'seq2onnx-js: error: --target-lang "xx" is not a language of this model; choose one of de, en, fr\n',
  );
  assert.equal(lang.out, "");
  const none = await run(["translate", "BUNDLE", "--source-lang", "de"], "one\n");
  assert.match(
    none.err,
    /^seq2onnx-js: error: --source-lang "de" is not a language of this model; this model has no language tokens: leave it out\n$/,
  );
  assert.equal(none.code, 2);
  for (const raw of ["5,x", "", "-1", "5,"]) {
    const bad = await run(["translate", "BUNDLE", `--target-prefix=${raw}`], "one\n", M2M);
    assert.equal(bad.code, 2);
    assert.equal(
      bad.err,
      `seq2onnx-js: error: --target-prefix ${JSON.stringify(raw)}: give one or more token ids >= 0, separated by commas ` +
        "(as 128022 or 5,17)\n",
    );
    assert.deepEqual(bad.loads, [], "refused before the bundle loads");
  }
  const outside = await run(["translate", "BUNDLE", "--target-prefix", "5,16,3"], "one\n", M2M);
  assert.equal(outside.code, 2);
  assert.equal(
    outside.err,
    "seq2onnx-js: error: --target-prefix 5,16,3: ids [16,3] outside [0, 16) or the end token 3; " +
      "give target ids of the text before the translation\n",
  );
});

test("an over-long line of a bundle with a source prefix: the warning counts what the prefix and suffix leave", async () => {
  const cut = await run(["translate", "BUNDLE"], `${words(30)}\n`, M2M);
  assert.equal(
    cut.err,
    "seq2onnx-js: warning: line 1: more tokens than the 12 positions this model was exported for " +
      "(max_positions in bundle.json): wrote an empty line (--truncate translates its first 10 tokens and the 2 ids the model adds around them)\n",
  );
  const kept = await run(["translate", "BUNDLE", "--truncate", "--json"], `${words(30)}\n`, M2M);
  const [r] = lines(kept.out).map((l) => JSON.parse(l));
  assert.equal(r.source_ids.length, 12);
  assert.deepEqual([r.source_ids[0], r.source_ids[11]], [13, EOS]);
  assert.match(
    kept.err,
    /: translated its first 10 and the 2 ids the model adds around them \(--truncate\)\n$/,
  );
});
