// The Node platform and the library's own limits (not only the CLI's): a bundle file that is not a
// regular file (a link to /dev/zero, a named pipe, a directory) is refused before a byte is read,
// bundle.json from its size before it is read, format_version and integer fields written as floats
// (1.0) as Python refuses them, more onnxruntime threads than cores, and a graph onnxruntime cannot
// load named by its file.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import {
  closeSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  rmSync,
  symlinkSync,
  truncateSync,
  unlinkSync,
} from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { after, test } from "node:test";
import { BundleError, MAX_JSON_BYTES, numberLiterals, readBundle } from "../src/bundle.js";
import { Translator as NodeTranslator } from "../src/index.js";
import { CORES, nodePlatform } from "../src/platform-node.js";
import { checkThreads, Translator } from "../src/translator.js";
import { fakeBundle, fakeOrt, fakePlatform } from "./fake-host.mjs";
import { writeBundle } from "./fixtures.mjs";

const root = mkdtempSync(path.join(tmpdir(), "seq2onnx-js-platform-"));
after(() => rmSync(root, { recursive: true, force: true }));
let count = 0;

/** A sound bundle directory; bundle.json is JSON.stringify(edit(meta), null, 2) or the string edit returns. */
function bundle(edit = (meta) => meta) {
  return writeBundle(path.join(root, `b${count++}`), edit, (meta) => JSON.stringify(meta, null, 2));
}

const refused = (promise, pattern) =>
  assert.rejects(promise, (e) => {
    assert.ok(e instanceof BundleError, `${e}`);
    assert.match(e.message, pattern);
    assert.ok(!e.message.includes("\n"), "one line");
    return true;
  });

const mkfifo = (file) => {
  try {
    execFileSync("mkfifo", [file]);
    return true;
  } catch {
    return false;
  }
};

test("bundle.json linked to /dev/zero is refused at once, before reading, naming the file, what it is and the fix", {
  timeout: 20000,
  skip: !existsSync("/dev/zero") && "no /dev/zero here",
}, async () => {
  const dir = bundle();
  unlinkSync(path.join(dir, "bundle.json"));
  symlinkSync("/dev/zero", path.join(dir, "bundle.json"));
  await refused(
    readBundle(dir, nodePlatform),
    /bundle\.json: not a regular file \(a character device\); a bundle holds files: re-export it with `seq2onnx export`/,
  );
});

test("a named pipe as bundle.json or as a listed file is refused at once (no writer is waited for)", {
  timeout: 20000,
}, async (t) => {
  const dir = bundle();
  unlinkSync(path.join(dir, "bundle.json"));
  if (!mkfifo(path.join(dir, "bundle.json"))) return t.skip("no mkfifo here");
  await refused(
    readBundle(dir, nodePlatform),
    /bundle\.json: not a regular file \(a named pipe\); a bundle holds files: re-export/,
  );
  const other = bundle();
  unlinkSync(path.join(other, "encoder.onnx"));
  mkfifo(path.join(other, "encoder.onnx"));
  await refused(
    readBundle(other, nodePlatform),
    /encoder\.onnx: not a regular file \(a named pipe; files\.encoder in bundle\.json\); a bundle holds files: re-export/,
  );
  return undefined;
});

test("a directory where a file is listed is named as such, not as missing", async () => {
  const dir = bundle();
  unlinkSync(path.join(dir, "decoder.onnx"));
  mkdirSync(path.join(dir, "decoder.onnx"));
  await refused(
    readBundle(dir, nodePlatform),
    /decoder\.onnx: not a regular file \(a directory; files\.decoder in bundle\.json\)/,
  );
});

test("an over-large bundle.json is refused from its size, before it is read", async () => {
  const dir = bundle();
  const file = path.join(dir, "bundle.json");
  truncateSync(file, 8 * 1024 ** 3); // 8 GiB, sparse: reading it would fail or take the memory
  await refused(
    readBundle(dir, nodePlatform),
    new RegExp(
      `bundle\\.json: ${8 * 1024 ** 3} bytes, more than the ${MAX_JSON_BYTES} a bundle description can be; .*re-export`,
    ),
  );
  truncateSync(file, MAX_JSON_BYTES + 1);
  await refused(readBundle(dir, nodePlatform), /bundle\.json: 1048577 bytes, more than the 1048576/);
  // the platform itself: EFBIG from fstat's size, ENOTREG for a directory
  await assert.rejects(
    nodePlatform.readFile(file, { maxBytes: 10 }),
    (e) => e.code === "EFBIG" && e.size === MAX_JSON_BYTES + 1,
  );
  await assert.rejects(nodePlatform.readFile(dir), (e) => e.code === "ENOTREG" && e.kind === "a directory");
  const small = path.join(root, "small.bin");
  closeSync(openSync(small, "w"));
  assert.deepEqual(await nodePlatform.readFile(small, { maxBytes: 0 }), new Uint8Array());
});

test("format_version written 1.0 (or 1e0) is refused as another version, as Python refuses it", async () => {
  const versionAs = (literal) =>
    bundle((m) =>
      JSON.stringify(m, null, 2).replace('"format_version": 1,', `"format_version": ${literal},`),
    );
  for (const literal of ["1.0", "1e0", "1.00", "10E-1"]) {
    await refused(
      readBundle(versionAs(literal), nodePlatform),
      new RegExp(
        `bundle\\.json: format_version ${literal.replace(".", "\\.")}, this host reads version 1 \\(an integer\\); ` +
          "re-export the bundle with a matching seq2onnx",
      ),
    );
  }
  await readBundle(versionAs("1"), nodePlatform); // the integer, however spaced
  await readBundle(
    bundle((m) => JSON.stringify(m)),
    nodePlatform,
  );
});

test("an integer field written as a float (2.0) is refused naming the field and the literal", async () => {
  const edit = (from, to) =>
    bundle((m) => {
      const text = JSON.stringify(m, null, 2);
      assert.ok(text.includes(from));
      return text.replace(from, to);
    });
  await refused(
    readBundle(edit('"n_heads": 2', '"n_heads": 2.0'), nodePlatform),
    /bundle\.json: model\.n_heads is 2\.0, expected an integer >= 1; re-export the bundle/,
  );
  await refused(
    readBundle(edit('"beam_size": 4', '"beam_size": 4e0'), nodePlatform),
    /decoding\.beam_size is 4e0, expected an integer >= 1/,
  );
  // numbers of fields that may be fractional stay as they are
  await readBundle(edit('"length_penalty": 1', '"length_penalty": 1.0'), nodePlatform);
});

test("numberLiterals: the fractional numbers of a JSON text by the path of keys to them", () => {
  const text =
    '{"a": 1.0, "b": {"c": 2, "d": -3.5e2, "e": [1.5, {"f": 2.0}], "g\\"h": 4.0}, "a2": 1, "s": "1.0", "b2": {"x": 1E3}}';
  JSON.parse(text);
  assert.deepEqual(
    [...numberLiterals(text)],
    [
      ["a", "1.0"],
      ["b.d", "-3.5e2"],
      ['b.g"h', "4.0"],
      ["b2.x", "1E3"],
    ],
  );
  assert.deepEqual([...numberLiterals('{"v": 1.0, "v": 1}')], []); // the last of a repeated key, as JSON.parse
  assert.deepEqual([...numberLiterals("[1.0]")], []);
  const deep = `${'{"a":'.repeat(100000)}1.5${"}".repeat(100000)}`;
  assert.equal(numberLiterals(deep).size, 1); // no recursion: any depth JSON.parse takes
});

test("threads are bounded by the machine's cores in the library, before anything is read", async () => {
  assert.ok(Number.isInteger(CORES) && CORES >= 1);
  let reads = 0;
  const platform = {
    ...nodePlatform,
    readFile: async (...a) => {
      reads++;
      return nodePlatform.readFile(...a);
    },
  };
  const dir = bundle();
  for (const threads of [99999, CORES + 1, -1, 1.5, "2"]) {
    await assert.rejects(Translator.load(dir, { platform, threads }), (e) => {
      assert.ok(e instanceof RangeError, `${e}`);
      assert.match(
        e.message,
        new RegExp(
          `^threads=${JSON.stringify(threads).replace(".", "\\.")}: this machine has ${CORES} cores ` +
            `\\(os\\.(availableParallelism\\(\\)|cpus\\(\\)\\.length)\\); give an integer from 0 \\(onnxruntime's default: one per core\\) to ${CORES}$`,
        ),
      );
      return true;
    });
  }
  await assert.rejects(
    NodeTranslator.load(dir, { threads: 99999 }),
    /^RangeError: threads=99999: this machine has/,
  );
  assert.equal(reads, 0, "refused before the bundle is read");
  assert.equal(checkThreads(0, platform), 0);
  assert.equal(checkThreads(CORES, platform), CORES);
  assert.equal(checkThreads(64, {}), 64); // a platform that does not know its cores (the browser's single thread)
  assert.throws(
    () => checkThreads(2, { cores: 1, coresSource: "test" }),
    /^RangeError: threads=2: this machine has 1 cores \(test\); give an integer from 0/,
  );
});

test("a graph onnxruntime cannot load is named by its file; the other session is released", async () => {
  const released = [];
  const broken = (which) => {
    const ort = fakeOrt([]);
    const { encoder, decoder } = ort.sessions;
    encoder.release = async () => {
      released.push("encoder");
    };
    return {
      ...fakePlatform(),
      ort: {
        ...ort,
        InferenceSession: {
          create: async (bytes) => {
            const isEncoder = new TextDecoder().decode(bytes).includes("encoder");
            if ((which === "encoder") === isEncoder)
              throw new Error("Failed to load model because protobuf parsing failed.");
            return isEncoder ? encoder : decoder;
          },
        },
      },
    };
  };
  const dir = fakeBundle(root);
  await refused(
    Translator.load(dir, { platform: broken("decoder") }),
    /\/decoder: onnxruntime cannot load this graph \(Failed to load model because protobuf parsing failed\.\); re-export the bundle/,
  );
  assert.deepEqual(released, ["encoder"]);
  await refused(
    Translator.load(dir, { platform: broken("encoder") }),
    /\/encoder: onnxruntime cannot load this graph \(.*\); re-export/,
  );
});
