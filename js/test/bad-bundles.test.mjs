// The shared bad bundles (spec/cases/bad-bundles.json, which tests/test_bad_bundles.py runs on both
// hosts with a real exported bundle): the cases that need only the files (`needs: "files"`) are
// applied here to this suite's small fixture bundle, and readBundle must refuse each with a
// one-line message matching the case's. The cases that need real graphs run in the Python test.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  symlinkSync,
  unlinkSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { after, test } from "node:test";
import zlib from "node:zlib";
import { BundleError, readBundle } from "../src/bundle.js";
import { nodePlatform } from "../src/platform-node.js";
import { hash, soundFiles, soundMeta } from "./fixtures.mjs";

const CASES = JSON.parse(
  readFileSync(new URL("../../spec/cases/bad-bundles.json", import.meta.url), "utf8"),
).cases;
const root = mkdtempSync(path.join(tmpdir(), "seq2onnx-js-bad-"));
after(() => rmSync(root, { recursive: true, force: true }));

/** The fixture bundle with a case's damage applied (the cases file's $comment says how); null when this system cannot. */
function damaged(c, i) {
  const dir = path.join(root, `case${i}`);
  mkdirSync(dir);
  const { bytes, files } = soundFiles();
  for (const [name, data] of Object.entries(bytes)) writeFileSync(path.join(dir, name), data);
  const metaPath = path.join(dir, "bundle.json");
  writeFileSync(metaPath, JSON.stringify({ ...soundMeta(), files }, null, 2));
  for (const op of c.damage) {
    const target = path.join(dir, op.file ?? "bundle.json");
    if (op.op === "truncate") writeFileSync(target, bytes[op.file].subarray(0, op.bytes));
    else if (op.op === "copy") writeFileSync(target, bytes[op.from]);
    else if (op.op === "json") {
      const meta = JSON.parse(readFileSync(metaPath, "utf8"));
      const parent = op.path.slice(0, -1).reduce((node, key) => node[key], meta);
      parent[op.path.at(-1)] = op.value;
      writeFileSync(metaPath, JSON.stringify(meta, null, 2));
    } else if (op.op === "raw_json") {
      const text = readFileSync(metaPath, "utf8");
      assert.ok(text.includes(op.find), `${c.what}: ${op.find} not in the fixture's bundle.json`);
      writeFileSync(metaPath, text.replace(op.find, op.replace));
    } else if (op.op === "link_dev_zero") {
      if (!existsSync("/dev/zero")) return null;
      unlinkSync(target);
      symlinkSync("/dev/zero", target);
    } else if (op.op === "fifo") {
      unlinkSync(target);
      try {
        execFileSync("mkfifo", [target]);
      } catch {
        return null;
      }
    } else if (op.op === "pad_json") {
      writeFileSync(metaPath, Buffer.concat([readFileSync(metaPath), Buffer.alloc(op.bytes, " ")]));
    } else {
      assert.fail(`${c.what}: unknown damage ${op.op} in the cases file`);
    }
  }
  if (c.rehash) {
    const meta = JSON.parse(readFileSync(metaPath, "utf8"));
    for (const entry of Object.values(meta.files)) {
      const data = readFileSync(path.join(dir, entry.path));
      entry.sha256 = hash(data);
      // the weights file's load-time check (spec's weights.checksum)
      // (a Node without zlib.crc32 checks the sha256 instead: the entry then goes)
      if ("crc32" in entry && typeof zlib.crc32 === "function")
        entry.crc32 = zlib.crc32(data).toString(16).padStart(8, "0");
      else delete entry.crc32;
    }
    writeFileSync(metaPath, JSON.stringify(meta, null, 2));
  }
  return dir;
}

test("the shared bad bundles that need only files are refused, each with its one-line message", {
  timeout: 60000,
}, async () => {
  const cases = CASES.filter((c) => c.needs === "files");
  assert.ok(cases.length > 0, "no files cases in spec/cases/bad-bundles.json");
  for (const [i, c] of cases.entries()) {
    const dir = damaged(c, i);
    if (dir === null) continue; // no /dev/zero or mkfifo on this system
    await assert.rejects(readBundle(dir, nodePlatform), (e) => {
      assert.ok(e instanceof BundleError, `${c.what}: ${e}`);
      assert.match(e.message, new RegExp(c.message), c.what);
      assert.ok(!e.message.includes("\n"), `${c.what}: one line`);
      return true;
    });
  }
});
