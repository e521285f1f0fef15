// spec/capabilities.json from the JavaScript side: translateBatch takes exactly the options the table
// marks as the Node host's (the browser host runs the same translateBatch), every option names shared
// cases that exist or a gap whose test files exist, and a host lacking an option says why.
// tests/test_capabilities.py reads the same table for the Python host.
import assert from "node:assert/strict";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { test } from "node:test";
import { Translator } from "../src/index.js";
import { fakeBundle, fakePlatform } from "./fake-host.mjs";

const REPO = new URL("../../", import.meta.url);
const TABLE = JSON.parse(readFileSync(new URL("spec/capabilities.json", REPO), "utf8"));
const OPTIONS = Object.entries(TABLE.options);

/** The option names translateBatch reads, recorded by a Proxy as its destructuring reads them. */
async function optionsRead() {
  const dir = mkdtempSync(path.join(tmpdir(), "seq2onnx-caps-"));
  try {
    const t = await Translator.load(fakeBundle(dir), { platform: fakePlatform([]) });
    const read = new Set();
    const get = (_target, key) => {
      if (typeof key === "string") read.add(key);
      return undefined;
    };
    const spy = new Proxy({}, { get });
    assert.deepEqual(await t.translateBatch([], spy), []);
    await t.release();
    return read;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

test("translateBatch takes exactly the options the table gives the Node host", async () => {
  const read = await optionsRead();
  const supported = OPTIONS.filter(([, o]) => o.hosts.node === true).map(([, o]) => o.js);
  assert.deepEqual([...read].sort(), supported.sort());
});

test("the browser host is the same translateBatch: the table gives it what it gives Node", () => {
  for (const [name, o] of OPTIONS) assert.equal(o.hosts.browser, o.hosts.node, name);
});

test("every host of every option is supported (true) or says why not", () => {
  for (const [name, o] of OPTIONS) {
    assert.deepEqual(Object.keys(o.hosts).sort(), Object.keys(TABLE.hosts).sort(), name);
    for (const [host, v] of Object.entries(o.hosts)) {
      const said = v === true || (typeof v === "string" && v.length > 10);
      assert.ok(said, `${name} on ${host}: true or the reason`);
    }
  }
});

test("every option has shared cases that exercise it, or a gap naming where each host tests it", () => {
  for (const [name, o] of OPTIONS) {
    for (const ref of o.cases) {
      const [file, field] = ref.split(":");
      const spec = JSON.parse(readFileSync(new URL(`spec/cases/${file}`, REPO), "utf8"));
      assert.ok(
        spec.cases.some((c) => field in c),
        `${name}: no case of ${file} has ${field}`,
      );
    }
    if (o.cases.length) continue;
    const files = o.gap?.match(/(tests|js\/test|js\/web)\/[\w.-]+/g) ?? [];
    const both = files.some((f) => f.startsWith("tests/")) && files.some((f) => f.startsWith("js/"));
    assert.ok(both, `${name}: the gap names no test file of each host`);
    for (const f of files) {
      assert.ok(existsSync(new URL(f, REPO)), `${name}: ${f} does not exist`);
      const word = f.endsWith(".py") ? name : o.js; // each language's name of it
      const text = readFileSync(new URL(f, REPO), "utf8");
      assert.ok(text.includes(word), `${name}: ${f} never mentions ${word}`);
    }
  }
});
