// The decoding options as spec/capabilities.json states them (generated from runtime/options.py): the shared
// option cases (spec/cases/options.json, also run by tests/test_options_spec.py against the Python runtime)
// accepted or refused alike, by the option's name, and an unknown option refused naming it.
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { after, test } from "node:test";
import { Translator } from "../src/index.js";
import { OPTIONS, OptionError, readOptions } from "../src/options.js";
import { fakeBundle, fakePlatform } from "./fake-host.mjs";

const CASES = JSON.parse(
  readFileSync(new URL("../../spec/cases/options.json", import.meta.url), "utf8"),
).cases;
const js = (options) => Object.fromEntries(Object.entries(options).map(([name, v]) => [OPTIONS[name].js, v]));

for (const c of CASES) {
  test(`shared option case: ${c.name}`, () => {
    if (c.refused === null) {
      readOptions(js(c.options));
      return;
    }
    assert.throws(
      () => readOptions(js(c.options)),
      (e) =>
        e instanceof OptionError &&
        e.option === c.refused &&
        e.message.startsWith(`${OPTIONS[c.refused].js}=`),
    );
  });
}

test("the cases refuse an option by the spec's limit: moving the limit moves the answer", () => {
  const penalty = OPTIONS.length_penalty;
  assert.equal(penalty.max, 10);
  assert.throws(
    () => readOptions({ lengthPenalty: penalty.max + 1 }),
    /^RangeError: lengthPenalty=11: give a number in \[-10, 10\]/,
  );
  readOptions({ lengthPenalty: penalty.max });
});

test("translateBatch refuses an unknown option, naming it and the options, and the spec's limits", async () => {
  const root = mkdtempSync(path.join(tmpdir(), "seq2onnx-options-"));
  after(() => rmSync(root, { recursive: true, force: true }));
  const dir = fakeBundle(root);
  const t = await Translator.load(dir, { platform: fakePlatform([]) });
  await assert.rejects(
    t.translateBatch(["a"], { beam: 2 }),
    /^TypeError: unknown option "beam"; translateBatch takes beamSize, numHypotheses, /,
  );
  await assert.rejects(
    t.translateBatch(["a"], { beamSize: 2, lengthPenalty: 200 }),
    /^RangeError: lengthPenalty=200: give a number in \[-10, 10\]/,
  );
  await assert.rejects(
    t.translateBatch(["a"], { returnScores: 1 }),
    /^RangeError: returnScores=1: give True or False/,
  );
  await t.release();
});
