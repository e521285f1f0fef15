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
import { fakeBundle, fakePlatform } from "./fake-host.mjs";

const root = mkdtempSync(path.join(tmpdir(), "seq2onnx-js-cli-"));
after(() => rmSync(root, { recursive: true, force: true }));
const BIN = fileURLToPath(new URL("../bin/seq2onnx-js.mjs", import.meta.url));

/** Runs the CLI on `input` (a string or bytes) over a fake bundle; returns {code, out, err, loads}. */
async function run(args, input, { cores = 4 } = {}) {
  let out = "";
  let err = "";
  const loads = [];
  const dir = fakeBundle(root);
  const code = await main(args.map((a) => (a === "BUNDLE" ? dir : a)), {
    stdin: () => (typeof input === "string" ? new TextEncoder().encode(input) : input),
    stdout: (text) => { out += text; },
    stderr: (text) => { err += text; },
    load: (bundle, options) => { loads.push(options); return Translator.load(bundle, { platform: fakePlatform(), ...options }); },
    cores,
  });
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
  assert.equal(err, "seq2onnx-js: warning: line 2: more tokens than the 12 positions this model was exported for " +
    "(max_positions in bundle.json): wrote an empty line (--truncate translates its first 11 tokens and the end token)\n");
  assert.ok(!/truncate: true/.test(err), "the flag is named, not the API option");
  // the same lines, one at a time: the same answers (a bad line changes nothing for the others)
  for (const i of [0, 2, 4]) assert.equal(lines((await run(["translate", "BUNDLE", "--beam", "1"], `${input.split("\n")[i]}\n`)).out)[0], got[i]);
});

test("--truncate translates an over-long line cut to the positions, with a warning naming the line", async () => {
  const { code, out, err } = await run(["translate", "BUNDLE", "--truncate", "--json"], `${words(30)}\nshort line\n`);
  assert.equal(code, 0, err);
  const [cut, short] = lines(out).map((l) => JSON.parse(l));
  assert.equal(cut.source_ids.length, 12);
  assert.equal(cut.source_ids.at(-1), 3);
  assert.ok(cut.hypotheses[0].length > 0);
  assert.deepEqual(short.source_ids, [9, 8, 3]); // a word's id is 4 + its length
  assert.match(err, /^seq2onnx-js: warning: line 1: more tokens than the 12 positions .*: translated its first 11 and the end token \(--truncate\)\n$/);
});

test("invalid UTF-8 is replaced per line with a warning naming the line and the byte; the line is still answered", async () => {
  const bytes = Buffer.concat([Buffer.from("one two\n"), Buffer.from([0x61, 0x20, 0xff, 0xfe, 0x20, 0x62, 0x0a]),
    Buffer.from("x \xe6\xbc y\r\n", "latin1"), Buffer.from("last")]);
  const { code, out, err } = await run(["translate", "BUNDLE", "--json"], new Uint8Array(bytes));
  assert.equal(code, 0, err);
  const got = lines(out).map((l) => JSON.parse(l));
  assert.equal(got.length, 4);
  assert.deepEqual(got[1].source_ids, [5, 6, 5, 3], "a, U+FFFD U+FFFD, b: three words");
  assert.deepEqual(got[2].source_ids, [5, 5, 5, 3], "x, U+FFFD (a truncated sequence is one), y; the \\r dropped");
  assert.equal(err,
    "seq2onnx-js: warning: line 2: invalid UTF-8 (byte ff at byte 3 of the line, perhaps more after it) replaced by U+FFFD\n" +
    "seq2onnx-js: warning: line 3: invalid UTF-8 (byte e6 bc at byte 3 of the line, perhaps more after it) replaced by U+FFFD\n");
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
  assert.match(warned[9], /line 10: .* \(further lines with more tokens than the model's positions are counted, not shown\)$/);
  assert.equal(warned[10], "seq2onnx-js: warning: 13 lines in all had more tokens than the model's positions");
});

test("--ids: a line that is not an array of ids of the vocabulary gets an empty line and a warning", async () => {
  const { code, out, err } = await run(["translate", "BUNDLE", "--ids", "--json"], "[7, 8]\nnot json\n[99]\n[5, 3]\n");
  assert.equal(code, 0, err);
  const got = lines(out).map((l) => JSON.parse(l));
  assert.deepEqual(got.map((g) => g.source_ids), [[7, 8, 3], [], [], [5, 3]]);
  assert.deepEqual(got[1].hypotheses, [""]);
  assert.match(err, /line 2: --ids wants a JSON array of token ids, got "not json"; wrote an empty line/);
  assert.match(err, /line 3: token ids \[99\] are outside the source vocabulary \[0, 16\); wrote an empty line/);
});

test("--threads above the cores is refused before the bundle loads, naming the value, the limit and the fix", async () => {
  const refused = await run(["translate", "BUNDLE", "--threads", "99999"], "one\n", { cores: 2 });
  assert.equal(refused.code, 2);
  assert.equal(refused.err, "seq2onnx-js: error: --threads 99999: this machine has 2 cores; give 1 to 2, or 0 to use them all\n");
  assert.deepEqual(refused.loads, [], "nothing loaded");
  for (const bad of ["3", "-1", "1.5", "x"]) assert.equal((await run(["translate", "BUNDLE", "--threads", bad], "", { cores: 2 })).code, 2);
  const ok = await run(["translate", "BUNDLE", "--threads", "2"], "one\n", { cores: 2 });
  assert.equal(ok.code, 0, ok.err);
  assert.deepEqual(ok.loads, [{ threads: 2 }]);
});

test("option errors that need the model name the flag", async () => {
  const nBest = await run(["translate", "BUNDLE", "--n-best", "5"], "one\n");
  assert.equal(nBest.code, 2);
  assert.match(nBest.err, /^seq2onnx-js: error: --n-best 5 is more than the beam size 4; give --beam 5 or more, or a smaller --n-best\n$/);
  const maxLength = await run(["translate", "BUNDLE", "--max-length", "13"], "one\n");
  assert.match(maxLength.err, /^seq2onnx-js: error: --max-length 13: this model has 12 positions \(max_positions in bundle\.json\); give 1 to 12\n$/);
});

test("bin/seq2onnx-js.mjs: --threads 99999 ends at once with one line, status 2; a missing bundle with status 1", () => {
  const threads = spawnSync(process.execPath, [BIN, "translate", path.join(root, "nowhere"), "--threads", "99999"], { input: "x\n", encoding: "utf8", timeout: 60000 });
  assert.equal(threads.status, 2);
  assert.match(threads.stderr, /^seq2onnx-js: error: --threads 99999: this machine has \d+ cores; give 1 to \d+, or 0 to use them all\n$/);
  assert.equal(threads.stdout, "");
  const missing = spawnSync(process.execPath, [BIN, "translate", path.join(root, "nowhere")], { input: "x\n", encoding: "utf8", timeout: 60000 });
  assert.equal(missing.status, 1);
  assert.match(missing.stderr, /^seq2onnx-js: error: .*nowhere\/bundle\.json: missing; .* is not a seq2onnx bundle/);
});
