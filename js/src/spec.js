// The bundle spec, spec/bundle.json: the format's names and limits (file names, graph input and
// output names, dtypes, the per-field checks of bundle.json) for every host. The Python runtime
// reads the same file (runtime/bundle.py), so a name or a limit changed there changes both hosts;
// src/bundle.js takes every name and limit from here, and no other module of this host spells one.
//
// Loaded once, when this module is first imported (top-level await):
//   - in Node, from the repository's spec/ folder beside js/ (../../spec/bundle.json from here),
//     read with node:fs, imported dynamically so that a browser never asks for it;
//   - in a browser, fetched from ../spec/bundle.json relative to this module: the site that
//     `seq2onnx web` builds holds this module in SITE/host/ and the spec in SITE/spec/bundle.json.
// Not a JSON module import: import attributes print an ExperimentalWarning on Node 20.

const IN_NODE = Boolean(globalThis.process?.versions?.node);

/** Where the spec is read from: a file: URL in Node, an http(s): URL in a browser. */
export const SPEC_URL = new URL(IN_NODE ? "../../spec/bundle.json" : "../spec/bundle.json", import.meta.url);

async function loadSpec() {
  let text;
  try {
    if (IN_NODE) {
      const { readFile } = await import("node:fs/promises");
      text = await readFile(SPEC_URL, "utf-8");
    } else {
      const response = await fetch(SPEC_URL);
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      text = await response.text();
    }
  } catch (e) {
    throw new Error(`${SPEC_URL}: the seq2onnx bundle spec cannot be read (${e?.message ?? e}); ` +
      "the JS host needs the repository's spec/bundle.json (a site built by `seq2onnx web` serves it as spec/bundle.json)");
  }
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new Error(`${SPEC_URL}: the seq2onnx bundle spec is not valid JSON (${e.message})`);
  }
}

/** spec/bundle.json as parsed: read it, never change it (frozen). */
export const SPEC = deepFreeze(await loadSpec());

function deepFreeze(value) {
  if (value !== null && typeof value === "object") {
    for (const v of Object.values(value)) deepFreeze(v);
    Object.freeze(value);
  }
  return value;
}
