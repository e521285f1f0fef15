// spec/bundle.json is this host's one source of the bundle format's names and limits: src/spec.js
// loads it, src/bundle.js's constants are its values, validateMeta's per-field checks are its
// `fields` table (row by row, in order), and no module of src/ spells a name of the spec in a
// string (the Python runtime reads the same file, so a name changed there changes both hosts).
import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { test } from "node:test";
import * as B from "../src/bundle.js";
import { SPEC, SPEC_URL } from "../src/spec.js";

const SPEC_FILE = new URL("../../spec/bundle.json", import.meta.url);
const SRC = new URL("../src/", import.meta.url);
const BASE = JSON.parse(
  readFileSync(new URL("../../spec/cases/bundle-json.json", import.meta.url), "utf8"),
).base;

test("src/spec.js reads the repository's spec/bundle.json, once, frozen", () => {
  assert.equal(SPEC_URL.href, SPEC_FILE.href);
  assert.deepEqual(SPEC, JSON.parse(readFileSync(SPEC_FILE, "utf8")));
  assert.ok(Object.isFrozen(SPEC) && Object.isFrozen(SPEC.names) && Object.isFrozen(SPEC.fields[0]));
});

test("bundle.js's names and limits are the spec's", () => {
  assert.equal(B.FORMAT, SPEC.format);
  assert.equal(B.FORMAT_VERSION, SPEC.format_version);
  assert.equal(B.BUNDLE_JSON, SPEC.bundle_json);
  assert.equal(B.MAX_JSON_BYTES, SPEC.max_json_bytes);
  assert.deepEqual(B.FILE_KEYS, Object.keys(SPEC.files.required));
  assert.deepEqual(B.OPTIONAL_FILE_KEYS, Object.keys(SPEC.files.optional));
  assert.deepEqual(B.FILE_NAMES, { ...SPEC.files.required, ...SPEC.files.optional });
  assert.deepEqual(B.DTYPES, SPEC.dtypes);
  assert.deepEqual(B.QUANTIZATIONS, SPEC.quantizations);
  assert.deepEqual(B.DECODER_LABELS, SPEC.decoders);
  assert.equal(B.CONTRIB_DOMAIN, SPEC.contrib_domain);
  assert.ok(B.FILE_KEYS.includes(B.ENCODER_LABEL) && B.FILE_KEYS.includes(B.DECODER_LABELS[B.STANDARD]));
  assert.ok(B.OPTIONAL_FILE_KEYS.includes(B.DECODER_LABELS[B.FUSED]));
  // every graph input/output name of the spec is exported under its key in capitals (src_ids: SRC_IDS)
  // biome-ignore lint/performance/noDynamicNamespaceImportAccess: the test walks the module's exports by name
  for (const [key, name] of Object.entries(SPEC.names)) assert.equal(B[key.toUpperCase()], name, key);
  const layer = (kind, i) => SPEC.layer_names[kind].replaceAll("{i}", String(i));
  for (const i of [0, 1, 11]) {
    for (const kind of Object.keys(SPEC.layer_names)) {
      assert.equal(B.layerName(kind, i), layer(kind, i));
      assert.ok(B.isLayerName(kind, layer(kind, i)), `${kind} ${i}`);
    }
  }
  assert.ok(
    !B.isLayerName("past_key", layer("past_key", "x")) && !B.isLayerName("past_key", layer("present_key", 0)),
  );
  assert.deepEqual(B.crossNames(2), [
    layer("key_cross", 0),
    layer("value_cross", 0),
    layer("key_cross", 1),
    layer("value_cross", 1),
  ]);
  assert.deepEqual(B.pastNames(2), [
    layer("past_key", 0),
    layer("past_value", 0),
    layer("past_key", 1),
    layer("past_value", 1),
  ]);
  assert.deepEqual(B.presentNames(1), [layer("present_key", 0), layer("present_value", 0)]);
});

/** The object holding a dotted field of `meta`, and the field's key in it. */
function locate(meta, field) {
  const path = field.split(".");
  const key = path.pop();
  return [path.reduce((node, k) => node[k], meta), key];
}
const WRONG = { integer: "x", number: "x", string: 7, ids: "x", id_map: [5], boolean: 1 }; // a value of another type, for each type
// Further wrong values of the types made of parts: each must be refused as the whole value is.
const WRONG_PARTS = {
  ids: [[1, -1], [true], [1.5], [[2]], {}],
  id_map: [{ de: -1 }, { de: "6" }, { de: true }, null],
  boolean: ["true", 0, []],
};
const WANT = {
  ids: "expected a list of token ids (integers >= 0)",
  id_map: "expected an object of language codes to token ids (integers >= 0)",
  boolean: "expected true or false",
};
// A sound tokens section (bundles imported from Hugging Face), added to BASE where a row needs it.
const TOKENS = {
  source_prefix: [4],
  source_suffix: [3],
  target_prefix: [5],
  languages: { de: 6, en: 7 },
  target_lang_in: "target_prefix",
  text_language_codes: true,
  strip_text: false,
};
const withTokens = () => ({ ...structuredClone(BASE), tokens: structuredClone(TOKENS) });

const refusal = (field, want) => (e) => {
  assert.ok(e instanceof B.BundleError, `${field}: ${e}`);
  assert.ok(e.message.startsWith(`B/bundle.json: ${field} is `), `${field}: ${e.message}`);
  if (want)
    assert.ok(e.message.includes(want), `${field}: ${e.message} does not say ${JSON.stringify(want)}`);
  return true;
};

test("validateMeta checks each row of the spec's fields table: type, min, choices, nullable, required", () => {
  assert.ok(SPEC.fields.length > 0);
  B.validateMeta(structuredClone(BASE), "B/bundle.json");
  B.validateMeta(withTokens(), "B/bundle.json");
  for (const row of SPEC.fields) {
    const check = (edit, want) => {
      const meta = withTokens();
      const [parent, key] = locate(meta, row.field);
      edit(parent, key);
      if (want === null) B.validateMeta(meta, "B/bundle.json");
      else assert.throws(() => B.validateMeta(meta, "B/bundle.json"), refusal(row.field, want), row.field);
    };
    const choices = typeof row.choices === "string" ? SPEC[row.choices] : row.choices;
    const expected =
      row.type === "integer"
        ? `expected an integer >= ${row.min ?? 0}`
        : row.type === "number"
          ? `expected a finite number${row.min !== undefined ? ` >= ${row.min}` : ""}`
          : (WANT[row.type] ?? (choices ? `expected one of ${choices.join(", ")}` : "expected a string"));
    assert.ok(row.type in WRONG, `a test value for the type ${row.type}`);
    check((p, k) => {
      p[k] = WRONG[row.type];
    }, expected);
    for (const value of WRONG_PARTS[row.type] ?? [])
      check(
        (p, k) => {
          p[k] = value;
        },
        `is ${JSON.stringify(value)}, ${expected}`,
      );
    check(
      (p, k) => {
        delete p[k];
      },
      row.required === false ? null : `${row.field} is missing, ${expected}`,
    );
    check(
      (p, k) => {
        p[k] = null;
      },
      row.nullable ? null : `is null, ${expected}`,
    );
    if (row.min !== undefined)
      check(
        (p, k) => {
          p[k] = row.min - 1;
        },
        `is ${row.min - 1}, ${expected}`,
      );
    if (choices) {
      check((p, k) => {
        p[k] = `${choices[0]}-not-a-choice`;
      }, expected);
      for (const choice of choices)
        check((p, k) => {
          p[k] = choice;
        }, null);
    }
  }
});

test("validateMeta reports the first wrong field in the order of the spec's fields table", () => {
  for (let first = 0; first < SPEC.fields.length; first++) {
    const meta = withTokens();
    for (const row of SPEC.fields.slice(first)) {
      const [parent, key] = locate(meta, row.field);
      parent[key] = WRONG[row.type];
    }
    assert.throws(() => B.validateMeta(meta, "B/bundle.json"), refusal(SPEC.fields[first].field));
  }
});

test("optional rows under an absent object are skipped; an object on the way must be an object", () => {
  const optional = SPEC.fields.filter((row) => row.required === false && row.field.includes("."));
  const parents = new Set(optional.map((row) => row.field.split(".")[0]).filter((p) => !(p in BASE)));
  assert.ok(parents.has("tokens"), [...parents].join(", "));
  for (const parent of parents) {
    B.validateMeta(structuredClone(BASE), "B/bundle.json"); // BASE lacks it: nothing to check
    for (const value of [[], 5, null, "x"]) {
      assert.throws(
        () => B.validateMeta({ ...structuredClone(BASE), [parent]: value }, "B/bundle.json"),
        refusal(parent, `is ${JSON.stringify(value)}, expected an object`),
      );
    }
    B.validateMeta({ ...structuredClone(BASE), [parent]: {} }, "B/bundle.json"); // every field of it optional
  }
});

/**
 * The string literals of a JavaScript source: quoted strings and the text of template literals
 * (comments and regular expressions skipped), each with its line. Throws where the source ends
 * inside one, so that a lexer lost in a file fails the test rather than passing it.
 */
function stringLiterals(src) {
  const out = [];
  let i = 0;
  let line = 1;
  let last = ""; // the last significant character of code, to tell a regular expression from a division
  let word = ""; // the last identifier or keyword of code
  const braces = []; // for each open `{`: whether it opened a template substitution
  const advance = (n = 1) => {
    for (let k = 0; k < n; k++) if (src[i++] === "\n") line++;
  };
  const template = () => {
    // from the character after ` (or after the } that closes a substitution)
    let text = "";
    const start = line;
    while (i < src.length) {
      const c = src[i];
      if (c === "\\") {
        text += src.slice(i, i + 2);
        advance(2);
      } else if (c === "`") {
        advance();
        out.push({ text, line: start });
        return;
      } else if (c === "$" && src[i + 1] === "{") {
        advance(2);
        out.push({ text, line: start });
        braces.push(true);
        last = "{";
        return;
      } else {
        text += c;
        advance();
      }
    }
    throw new Error(`the source ends inside a template literal (line ${start})`);
  };
  const beforeRegex = [
    "return",
    "typeof",
    "case",
    "of",
    "in",
    "void",
    "delete",
    "throw",
    "new",
    "else",
    "do",
    "yield",
    "await",
  ];
  while (i < src.length) {
    const c = src[i];
    const next = src[i + 1];
    if (c === "/" && next === "/") {
      while (i < src.length && src[i] !== "\n") advance();
    } else if (c === "/" && next === "*") {
      const end = src.indexOf("*/", i + 2);
      if (end < 0) throw new Error(`the source ends inside a comment (line ${line})`);
      advance(end + 2 - i);
    } else if (c === '"' || c === "'") {
      const start = line;
      let text = "";
      advance();
      while (src[i] !== c) {
        if (i >= src.length || src[i] === "\n") throw new Error(`an unterminated string (line ${start})`);
        const n = src[i] === "\\" ? 2 : 1;
        text += src.slice(i, i + n);
        advance(n);
      }
      advance();
      out.push({ text, line: start });
      [last, word] = [c, ""];
    } else if (c === "`") {
      advance();
      template();
      [last, word] = ["`", ""];
    } else if (
      c === "/" &&
      (last === "" || "(,=:[!&|?{};+-*%<>~^".includes(last) || beforeRegex.includes(word))
    ) {
      const start = line;
      let inClass = false;
      advance();
      while (inClass || src[i] !== "/") {
        if (i >= src.length || src[i] === "\n")
          throw new Error(`an unterminated regular expression (line ${start})`);
        if (src[i] === "\\") advance();
        else if (src[i] === "[") inClass = true;
        else if (src[i] === "]") inClass = false;
        advance();
      }
      advance();
      while (/[a-z]/.test(src[i] ?? "")) advance();
      [last, word] = ["/", ""];
    } else if (c === "}" && braces.length && braces.pop()) {
      advance();
      template();
      [last, word] = ["`", ""];
    } else if (/[\w$]/.test(c)) {
      let w = "";
      while (i < src.length && /[\w$]/.test(src[i])) {
        w += src[i];
        advance();
      }
      [last, word] = ["a", w];
    } else {
      if (c === "{") braces.push(false);
      if (!/\s/.test(c)) [last, word] = [c, ""];
      advance();
    }
  }
  if (braces.some((b) => b)) throw new Error("the source ends inside a template substitution");
  return out;
}

/**
 * What no module but spec.js may spell in a string: every string value of the spec (graph and
 * file names, format, labels, domain, dtypes) as a whole string, and those that cannot be a plain
 * word (with "_", "." or "-": graph names, the per-layer names' fixed parts, file names, the
 * format) anywhere inside one.
 */
function forbidden() {
  const names = new Set();
  const walk = (value, key) => {
    if (key === "$comment" || key === "fields") return;
    if (typeof value === "string") names.add(value);
    else if (value !== null && typeof value === "object")
      for (const [k, v] of Object.entries(value)) walk(v, k);
  };
  walk(SPEC);
  for (const template of Object.values(SPEC.layer_names))
    for (const part of template.split("{i}")) if (part) names.add(part);
  return [...names];
}

function offences(source, names) {
  const found = [];
  for (const { text, line } of stringLiterals(source)) {
    for (const name of names) {
      if (text === name || (/[_.-]/.test(name) && text.includes(name)))
        found.push(`line ${line}: ${JSON.stringify(name)} in ${JSON.stringify(text)}`);
    }
  }
  for (const limit of [String(SPEC.max_json_bytes), `1 << ${Math.log2(SPEC.max_json_bytes)}`]) {
    if (source.includes(limit)) found.push(`the limit ${limit}`);
  }
  return found;
}

test("the check below finds a hand copy in a string, a template and a limit, never in a comment or a regex", () => {
  const names = forbidden();
  const layer = SPEC.layer_names.past_key.split("{i}")[0];
  const fused = SPEC.files.optional.decoder_fused;
  const sample = [
    `// ${fused} and "${SPEC.format}" in a comment`,
    `/* '${SPEC.contrib_domain}' */ const re = /"${fused}"|\\/x/g; const d = 8 / 2 / 1;`,
    `const a = [\`${layer}\${i}\`, "${SPEC.names.topk_log_probs}", '${SPEC.files.required.encoder}'];`,
    `const b = \`\${\`\${{ x: "${SPEC.format}" }.x}\`}\`; const limit = ${SPEC.max_json_bytes};`,
  ].join("\n");
  const found = offences(sample, names);
  for (const what of [layer, SPEC.names.topk_log_probs, SPEC.files.required.encoder]) {
    assert.ok(
      found.some((o) => o.startsWith(`line 3: ${JSON.stringify(what)} in`)),
      `${what}: ${found.join("; ")}`,
    );
  }
  assert.ok(
    found.includes(`line 4: ${JSON.stringify(SPEC.format)} in ${JSON.stringify(SPEC.format)}`),
    found.join("; "),
  );
  assert.ok(found.includes(`the limit ${SPEC.max_json_bytes}`), found.join("; "));
  assert.deepEqual(
    found.filter((o) => /^line [12]:/.test(o)),
    [],
  );
  assert.deepEqual(
    // biome-ignore lint/suspicious/noTemplateCurlyInString: the input is JavaScript source with a template in it
    stringLiterals("const x = `a${`b${'c'}d`}e`; // `f`").map((l) => l.text),
    ["a", "b", "c", "d", "e"],
  );
});

test("no module of src/ but spec.js spells a name or a limit of the spec", () => {
  const names = forbidden();
  for (const required of ["past_key", "key_cross"]) assert.ok(SPEC.layer_names[required], required);
  const files = readdirSync(SRC).filter((f) => f.endsWith(".js") && f !== "spec.js");
  assert.ok(
    files.includes("bundle.js") && files.includes("translator.js") && files.includes("checks.js"),
    files.join(", "),
  );
  const found = files.flatMap((f) =>
    offences(readFileSync(new URL(f, SRC), "utf8"), names).map((o) => `src/${f} ${o}`),
  );
  assert.deepEqual(
    found,
    [],
    `hand copies of spec/bundle.json's names (take them from src/bundle.js):\n${found.join("\n")}`,
  );
});
