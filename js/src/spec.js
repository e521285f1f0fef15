// The specs every host reads, loaded once when this module is first imported (top-level await):
//   - spec/bundle.json, the bundle format's names and limits (file names, graph input and output names,
//     dtypes, the per-field checks of bundle.json); the Python runtime reads the same file
//     (runtime/bundle.py), so a name or a limit changed there changes both hosts; src/bundle.js takes
//     every name and limit from here, and no other module of this host spells one;
//   - spec/capabilities.json, every decoding option's names, kind, default and limits, generated from
//     the Python runtime's one declaration (runtime/options.py); src/options.js enforces them.
// Where from:
//   - in Node, from the package's own spec/ (../spec/ from here: `npm pack` copies the repository's
//     spec/ into it, package.json's prepack) where it is there, as in an installed package; else from
//     the repository's spec/ folder beside js/ (../../spec/), as in a checkout; read with node:fs,
//     imported dynamically so that a browser never asks for it;
//   - in a browser, fetched from ../spec/ relative to this module: the site that `seq2onnx web` builds
//     holds this module in SITE/host/ and the specs in SITE/spec/.
// Not a JSON module import: import attributes print an ExperimentalWarning on Node 20.
//
// Also here, because every host reads JSON as the Python runtime's json module does and this is
// the module about JSON texts: numberLiterals, which tells 2.0 from 2 (JSON.parse cannot).

const IN_NODE = Boolean(globalThis.process?.versions?.node);

const IN_CHECKOUT = IN_NODE && !(await packaged());
/** Where a spec file is read from: a file: URL in Node, an http(s): URL in a browser. */
const specUrl = (name) => new URL(IN_CHECKOUT ? `../../spec/${name}` : `../spec/${name}`, import.meta.url);
/** Where the bundle spec is read from. */
export const SPEC_URL = specUrl("bundle.json");
/** Where the options' spec is read from (spec/capabilities.json, generated from runtime/options.py). */
export const CAPABILITIES_URL = specUrl("capabilities.json");

/** Whether this module runs from a packed npm package (with its own spec/) rather than a checkout. */
async function packaged() {
  const { existsSync } = await import("node:fs");
  return existsSync(new URL("../spec/bundle.json", import.meta.url));
}

async function loadSpec(url, what) {
  let text;
  try {
    if (IN_NODE) {
      const { readFile } = await import("node:fs/promises");
      text = await readFile(url, "utf-8");
    } else {
      const response = await fetch(url);
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      text = await response.text();
    }
  } catch (e) {
    throw new Error(
      `${url}: the seq2onnx ${what} cannot be read (${e?.message ?? e}); ` +
        `the JS host needs the repository's spec/ folder, or its copy in the npm package ` +
        "(a site built by `seq2onnx web` serves it as spec/)",
    );
  }
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new Error(`${url}: the seq2onnx ${what} is not valid JSON (${e.message})`);
  }
}

/** spec/bundle.json as parsed: read it, never change it (frozen). */
export const SPEC = deepFreeze(await loadSpec(SPEC_URL, "bundle spec"));
/** spec/capabilities.json as parsed (frozen): every decoding option's names, kind, default and limits. */
export const CAPABILITIES = deepFreeze(await loadSpec(CAPABILITIES_URL, "options spec"));

function deepFreeze(value) {
  if (value !== null && typeof value === "object") {
    for (const v of Object.values(value)) deepFreeze(v);
    Object.freeze(value);
  }
  return value;
}

/**
 * The numbers of a JSON text written with a fraction or an exponent (2.0, 1e0, 1.5), by the dotted
 * path of object keys that leads to them ("format_version", "model.n_heads"); numbers inside arrays
 * are left out. JSON.parse reads 1.0 as 1, so this is how a host in JavaScript tells an integer from a
 * float as Python's json module does. The text must be valid JSON (JSON.parse it first); the walk is
 * iterative, so nesting depth costs no stack. A key given twice keeps its last value, as JSON.parse.
 * @param {string} text
 * @returns {Map<string, string>}  path -> the literal as written
 */
export function numberLiterals(text) {
  const found = new Map();
  const stack = []; // per open container: {array: boolean, path: string | null}; path null inside arrays
  let key = null; // the last key read in the innermost object
  let i = 0;
  const n = text.length;
  const skipSpace = () => {
    while (i < n && (text[i] === " " || text[i] === "\t" || text[i] === "\n" || text[i] === "\r")) i++;
  };
  const readString = () => {
    // at the opening quote; returns the raw literal
    const start = i++;
    while (i < n && text[i] !== '"') i += text[i] === "\\" ? 2 : 1;
    i++;
    return text.slice(start, i);
  };
  const here = () => {
    const top = stack[stack.length - 1];
    if (!top || top.path === null || top.array) return null;
    return top.path ? `${top.path}.${key}` : key;
  };
  while (i < n) {
    skipSpace();
    const c = text[i];
    if (c === undefined) break;
    const top = stack[stack.length - 1];
    if (c === "{" || c === "[") {
      const path = stack.length === 0 ? "" : here();
      stack.push({ array: c === "[", path });
      key = null;
      i++;
    } else if (c === "}" || c === "]") {
      stack.pop();
      i++;
    } else if (c === "," || c === ":") {
      i++;
    } else if (c === '"') {
      const literal = readString();
      skipSpace();
      if (top && !top.array && text[i] === ":") key = JSON.parse(literal); // a key, not a value
    } else {
      // a number, true, false or null
      const start = i;
      while (i < n && !",}] \t\n\r".includes(text[i])) i++;
      const literal = text.slice(start, i);
      const path = here();
      if (path !== null) {
        if (/^-?\d+$/.test(literal) || !/^-?\d/.test(literal)) found.delete(path);
        else found.set(path, literal);
      }
    }
  }
  return found;
}
