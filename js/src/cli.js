// The Node host's command line (bin/seq2onnx-js.mjs runs it), the twin of `seq2onnx translate`.
//
//   seq2onnx-js translate BUNDLE [--beam N] [--n-best N] [--json] [--ids] [--timing] ...  < lines
//   seq2onnx-js tokenize BUNDLE [--side source|target]                                  < lines
//
// translate writes one line per input line: the best translation, or with --json a JSON object
// {"source_ids", "hypotheses", "token_ids", "scores"} (source_ids as fed to the encoder, prefix and
// end token included; token_ids without the end token, a forced target prefix included).
// --source-lang, --target-lang and --target-prefix are the API's sourceLang, targetLang and one
// targetPrefix for every line (docs/bundle-format.md, "The tokens section"); an unknown language
// code is refused before any line is read, naming the code and the known ones. --ids reads each line as a JSON array of source
// token ids instead of text. --timing adds one last line to standard error,
// `seq2onnx-js: timing {"load_s", "translate_s", "sources"}`: the seconds spent loading the bundle
// and inside translateBatch (what `seq2onnx verify-host` reports as the Node host's speed).
// tokenize writes {"ids", "decoded"} per line.
//
// As `seq2onnx translate`, a bad line costs only a warning on standard error naming it, and output
// line i is always the answer to input line i: invalid UTF-8 is replaced by U+FFFD; a line with more
// tokens than the model's positions gets an empty line (--truncate: its first max_positions - 1
// tokens and the end token are translated, or as many as the bundle's source prefix and suffix leave
// room for); with --ids, a line that is not an array of ids of the source vocabulary gets an empty line.
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { BUNDLE_JSON } from "./bundle.js";
import { Translator } from "./index.js";
import { OPTIONS, OptionError } from "./options.js";
import { CORES } from "./platform-node.js";
import { checkSampling } from "./sampling.js";

const USAGE = `usage: seq2onnx-js translate BUNDLE [--beam N] [--n-best N] [--length-penalty A] [--max-length N]
                                 [--min-length N] [--threads N] [--batch-size N] [--truncate] [--json] [--ids]
                                 [--timing] [--source-lang CODE] [--target-lang CODE] [--target-prefix IDS]
                                 [--sampling-temperature T [--sampling-topk K] [--sampling-topp P] [--seed N]]
       seq2onnx-js tokenize BUNDLE [--side source|target]
Reads lines from standard input and writes one line (or one JSON object) per input line.
Multilingual models (imported from Hugging Face; their codes are tokens.languages in ${BUNDLE_JSON}):
  --source-lang CODE   the source language: its token replaces the source prefix the bundle puts before each text
  --target-lang CODE   the target language: its token is forced first in every translation (M2M100, NLLB), or
                       leads each source where the bundle says so (multilingual Marian)
  --target-prefix IDS  target token ids forced at the start of every translation, separated by commas (as
                       CTranslate2's target prefix); they replace the bundle's and --target-lang's
Random sampling (the Python runtime's sampling_* options and stream: the same seed draws the same tokens):
  --sampling-temperature T  sample from softmax(log-probs / T) instead of beam search (--n-best N: N samples)
  --sampling-topk K         among the K likeliest tokens (0: all)
  --sampling-topp P         ... and the smallest set whose probability reaches P (1: all)
  --seed N                  the seed, an integer >= 0 (default: a fresh one per run)`;

class UsageError extends Error {}

// The decoding options' flags, as `seq2onnx translate` has them (spec/capabilities.json's cli), each read as text
const OPTION_FLAGS = Object.fromEntries(
  Object.values(OPTIONS)
    .filter((o) => o.cli)
    .map((o) => [o.cli.slice(2), { type: "string" }]),
);

const PROGRAM = "seq2onnx-js";
const WARNINGS_SHOWN = 10; // per kind, as `seq2onnx translate`; the rest are counted in one closing line

/** Warnings on standard error, one line each, naming the input line; after WARNINGS_SHOWN of a kind, counted. */
class Warnings {
  constructor(stderr) {
    this.stderr = stderr;
    this.counts = new Map();
  }

  warn(kind, message) {
    const n = (this.counts.get(kind) ?? 0) + 1;
    this.counts.set(kind, n);
    if (n > WARNINGS_SHOWN) return;
    const more = n === WARNINGS_SHOWN ? ` (further lines with ${kind} are counted, not shown)` : "";
    this.stderr(`${PROGRAM}: warning: ${message}${more}\n`);
  }

  close() {
    for (const [kind, n] of this.counts) {
      if (n > WARNINGS_SHOWN) this.stderr(`${PROGRAM}: warning: ${n} lines in all had ${kind}\n`);
    }
  }
}

function integer(options, name, { min = 0, max, fallback } = {}) {
  const raw = options[name];
  if (raw === undefined) return fallback;
  const value = Number(raw);
  if (!Number.isInteger(value) || value < min || (max !== undefined && value > max)) {
    throw new UsageError(
      `--${name} ${raw}: give an integer ${max === undefined ? `>= ${min}` : `from ${min} to ${max}`}`,
    );
  }
  return value;
}

/** An int option's flag, by spec/capabilities.json's cli, min and default (undefined: the bundle's or none). */
function intOption(options, name) {
  const o = OPTIONS[name];
  return integer(options, o.cli.slice(2), {
    min: o.min,
    fallback: o.bundle_default ? undefined : (o.default ?? undefined),
  });
}

/** --sampling-*: the API's sampling options (undefined when --sampling-temperature is not given). */
function samplingOptions(options) {
  const number = (name) => {
    const raw = options[name];
    if (raw === undefined) return undefined;
    const value = Number(raw);
    if (raw.trim() === "" || !Number.isFinite(value)) throw new UsageError(`--${name} ${raw}: give a number`);
    return value;
  };
  const samplingTemperature = number("sampling-temperature");
  const given = ["sampling-topk", "sampling-topp", "seed"].filter((name) => options[name] !== undefined);
  if (samplingTemperature === undefined) {
    if (given.length) {
      const flag = `--${given[0]}`;
      throw new UsageError(`${flag} needs --sampling-temperature (sampling); give it, or drop ${flag}`);
    }
    return {};
  }
  const seedRaw = options.seed;
  if (seedRaw !== undefined && !/^\d+$/.test(seedRaw)) {
    throw new UsageError(`--seed ${seedRaw}: give an integer >= 0`);
  }
  const seed = seedRaw === undefined ? undefined : BigInt(seedRaw);
  const found = {
    samplingTemperature,
    samplingTopk: integer(options, "sampling-topk", { fallback: 0 }),
    samplingTopp: number("sampling-topp") ?? 1,
    seed,
  };
  try {
    const { samplingTopk: topK, samplingTopp: topP } = found;
    checkSampling({ temperature: samplingTemperature, topK, topP, seed });
  } catch (e) {
    // the API's words with the option's flag (spec/capabilities.json's cli): "--sampling-topp 1.5: give a number in (0, 1] ..."
    if (e instanceof OptionError && OPTIONS[e.option].cli)
      throw new UsageError(e.named(OPTIONS[e.option].cli));
    throw e;
  }
  return found;
}

/** --threads: 0 (all cores) to this machine's cores, refused before the bundle loads (as `seq2onnx translate`). */
function threadsOption(options, cores) {
  const raw = options.threads;
  if (raw === undefined) return 0;
  const value = Number(raw);
  if (!/^\d+$/.test(raw.trim()) || value > cores) {
    throw new UsageError(
      `--threads ${raw}: this machine has ${cores} cores; give 1 to ${cores}, or 0 to use them all`,
    );
  }
  return value;
}

/**
 * Where the first invalid UTF-8 sequence of `bytes` lies, as Python's UnicodeDecodeError gives it:
 * {start, end} (end: after the maximal subpart, the bytes that one U+FFFD replaces), or null.
 */
function firstInvalidUtf8(bytes) {
  for (let i = 0; i < bytes.length; ) {
    const b = bytes[i];
    if (b < 0x80) {
      i++;
      continue;
    }
    // Unicode table 3-7: the sequence length and the range of the second byte for each lead byte
    let need;
    let low = 0x80;
    let high = 0xbf;
    if (b >= 0xc2 && b <= 0xdf) need = 1;
    else if (b >= 0xe0 && b <= 0xef)
      [need, low, high] = [2, b === 0xe0 ? 0xa0 : 0x80, b === 0xed ? 0x9f : 0xbf];
    else if (b >= 0xf0 && b <= 0xf4)
      [need, low, high] = [3, b === 0xf0 ? 0x90 : 0x80, b === 0xf4 ? 0x8f : 0xbf];
    else return { start: i, end: i + 1 };
    let j = 1;
    for (; j <= need; j++) {
      const c = bytes[i + j];
      const [lo, hi] = j === 1 ? [low, high] : [0x80, 0xbf];
      if (c === undefined || c < lo || c > hi) return { start: i, end: i + j };
    }
    i += need + 1;
  }
  return null;
}

const strictUtf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });
const lenientUtf8 = new TextDecoder("utf-8", { ignoreBOM: true });

/**
 * Standard input's lines as bytes, split at "\n" only (as the Python CLI does), each decoded with a
 * final "\r" removed; invalid UTF-8 is replaced by U+FFFD with a warning naming the line.
 */
function readLines(input, warnings) {
  const lines = [];
  for (let start = 0; start < input.length; ) {
    let end = input.indexOf(0x0a, start);
    if (end < 0) end = input.length;
    let raw = input.subarray(start, end);
    if (raw.length && raw[raw.length - 1] === 0x0d) raw = raw.subarray(0, raw.length - 1);
    let text;
    try {
      text = strictUtf8.decode(raw);
    } catch {
      const bad = firstInvalidUtf8(raw) ?? { start: 0, end: 0 };
      const hex = Array.from(raw.subarray(bad.start, bad.end), (x) => x.toString(16).padStart(2, "0")).join(
        " ",
      );
      warnings.warn(
        "invalid UTF-8",
        `line ${lines.length + 1}: invalid UTF-8 (byte ${hex} at byte ${bad.start + 1} of the line, ` +
          "perhaps more after it) replaced by U+FFFD",
      );
      text = lenientUtf8.decode(raw);
    }
    lines.push(text);
    start = end + 1;
  }
  return lines;
}

/**
 * One line's source ids as translateBatch is given them (prefix and suffix included; [] for an empty
 * line), or null when the line cannot be translated: each case warned about, naming the line (1-based).
 * `layout`: the source prefix and suffix for --source-lang/--target-lang (Tokens.layout).
 */
function sourceIds(translator, line, n, options, warnings, layout) {
  const limit = translator.maxPositions;
  let ids;
  let cut;
  let prefix = layout.prefix;
  if (options.ids) {
    let parsed;
    try {
      parsed = JSON.parse(line);
    } catch {
      parsed = undefined;
    }
    if (!Array.isArray(parsed)) {
      warnings.warn(
        "no JSON array of ids",
        `line ${n}: --ids wants a JSON array of token ids, got ${JSON.stringify(line.slice(0, 40))}; ` +
          "wrote an empty line",
      );
      return null;
    }
    try {
      ({ ids, truncated: cut } = translator._sourceIds(n - 1, parsed, true, layout) ?? {
        ids: [],
        truncated: false,
      });
    } catch (e) {
      warnings.warn(
        "ids outside the source vocabulary",
        `line ${n}: ${e.message.replace(/^source \d+: /, "")}; wrote an empty line`,
      );
      return null;
    }
    prefix = []; // ids are the whole row but the suffix
  } else {
    ({ ids, truncated: cut } = translator._prepareText(line, true, layout));
    const [code] = translator.tokens.splitCode(line); // a text's leading >>code<< (Marian) is its prefix
    if (code !== null) prefix = [code];
  }
  if (!cut) return ids;
  const what = `line ${n}: more tokens than the ${limit} positions this model was exported for (max_positions in ${BUNDLE_JSON})`;
  const { suffix } = layout;
  const kept = limit - prefix.length - suffix.length;
  // our own exports add only the end token; imported models may add a prefix and another suffix
  const added =
    !prefix.length && suffix.length === 1 && suffix[0] === translator.eosId
      ? "the end token"
      : `the ${prefix.length + suffix.length} ids the model adds around them`;
  if (!options.truncate) {
    warnings.warn(
      "more tokens than the model's positions",
      `${what}: wrote an empty line ` + `(--truncate translates its first ${kept} tokens and ${added})`,
    );
    return null;
  }
  warnings.warn(
    "more tokens than the model's positions",
    `${what}: translated its first ${kept} and ${added} (--truncate)`,
  );
  return ids;
}

/** --target-prefix: one or more token ids separated by commas (as `seq2onnx translate`), or undefined. */
function idsOption(options, name) {
  const raw = options[name];
  if (raw === undefined) return undefined;
  if (!/^\s*\d+\s*(,\s*\d+\s*)*$/.test(raw)) {
    throw new UsageError(
      `--${name} ${JSON.stringify(raw)}: give one or more token ids >= 0, separated by commas (as 128022 or 5,17)`,
    );
  }
  return raw.split(",").map(Number);
}

/**
 * Option errors that need the bundle, named by their flags (as `seq2onnx translate`), before any line
 * is read; returns the source prefix and suffix and the target prefix of --source-lang/--target-lang.
 */
function checkAgainstModel(
  translator,
  { beamSize, numHypotheses, maxDecodingLength, sourceLang, targetLang, targetPrefix, sampling },
) {
  const beam = beamSize ?? translator.bundle.meta.decoding.beam_size;
  if (numHypotheses > beam && !sampling) {
    throw new UsageError(
      `--n-best ${numHypotheses} is more than the beam size ${beam}; give --beam ${numHypotheses} or more, ` +
        "or a smaller --n-best",
    );
  }
  const limit = translator.maxPositions;
  if (maxDecodingLength !== undefined && maxDecodingLength > limit) {
    throw new UsageError(
      `--max-length ${maxDecodingLength}: this model has ${limit} positions (max_positions in ${BUNDLE_JSON}); ` +
        `give 1 to ${limit}`,
    );
  }
  const bad = (targetPrefix ?? []).filter((id) => id >= translator.tgtVocab || id === translator.eosId);
  if (bad.length) {
    throw new UsageError(
      `--target-prefix ${targetPrefix.join(",")}: ids ${JSON.stringify(bad.slice(0, 5))} outside ` +
        `[0, ${translator.tgtVocab}) or the end token ${translator.eosId}; give target ids of the text before the translation`,
    );
  }
  try {
    return translator.tokens.layout(
      { sourceLang, targetLang },
      { sourceLang: "--source-lang", targetLang: "--target-lang" },
    );
  } catch (e) {
    // the words of `seq2onnx translate`: "--target-lang "xx" is not a language of this model; ..."
    if (e instanceof RangeError || e instanceof TypeError)
      throw new UsageError(e.message.replace(/^(--[a-z-]+)=/, "$1 "));
    throw e;
  }
}

async function translate(bundle, options, io) {
  const beamSize = intOption(options, "beam_size");
  const numHypotheses = intOption(options, "num_hypotheses");
  const threads = threadsOption(options, io.cores);
  const maxBatchSize = intOption(options, "max_batch_size");
  const maxDecodingLength = intOption(options, "max_decoding_length");
  const minDecodingLength = intOption(options, "min_decoding_length");
  const lp = options["length-penalty"];
  const lengthPenalty = lp === undefined ? undefined : Number(lp);
  if (lengthPenalty !== undefined && !Number.isFinite(lengthPenalty))
    throw new UsageError(`--length-penalty ${lp}: give a number`);
  const { "source-lang": sourceLang, "target-lang": targetLang } = options;
  const targetPrefix = idsOption(options, "target-prefix");
  const sampling = samplingOptions(options);
  const started = performance.now();
  const translator = await io.load(bundle, { threads });
  const loadSeconds = (performance.now() - started) / 1000;
  const layout = checkAgainstModel(translator, {
    beamSize,
    numHypotheses,
    maxDecodingLength,
    sourceLang,
    targetLang,
    targetPrefix,
    sampling: "samplingTemperature" in sampling,
  });
  let translateSeconds = 0;
  const warnings = new Warnings(io.stderr);
  const lines = readLines(io.stdin(), warnings);
  const chunk = 256; // as the Python CLI: the same lines share translate_batch calls
  const write = io.stdout;
  try {
    for (let start = 0; start < lines.length; start += chunk) {
      const part = lines
        .slice(start, start + chunk)
        .map((line, j) => sourceIds(translator, line, start + j + 1, options, warnings, layout));
      const before = performance.now();
      // a line that cannot be translated is given as [], which translates to "" (its place kept)
      const results = await translator.translateBatch(
        part.map((ids) => ids ?? []),
        {
          beamSize,
          numHypotheses,
          lengthPenalty,
          returnScores: true,
          maxDecodingLength,
          minDecodingLength,
          maxBatchSize,
          targetPrefix: part.map(() => targetPrefix ?? layout.targetPrefix), // the lines are ids already: the target side's
          ...sampling,
        },
      );
      translateSeconds += (performance.now() - before) / 1000;
      let out = "";
      results.forEach((r, j) => {
        if (options.json) {
          out += `${JSON.stringify({ source_ids: part[j] ?? [], hypotheses: r.hypotheses, token_ids: r.tokenIds, scores: r.scores })}\n`;
        } else if (numHypotheses > 1) {
          r.hypotheses.forEach((text, h) => {
            out += `${start + j} ||| ${text} ||| ${r.scores[h].toFixed(4)}\n`;
          });
        } else {
          out += `${r.hypotheses[0]}\n`;
        }
      });
      write(out);
    }
  } finally {
    warnings.close();
  }
  await translator.release();
  if (options.timing) {
    const timing = { load_s: loadSeconds, translate_s: translateSeconds, sources: lines.length };
    io.stderr(`${PROGRAM}: timing ${JSON.stringify(timing)}\n`);
  }
}

async function tokenize(bundle, options, io) {
  const side = options.side ?? "source";
  if (side !== "source" && side !== "target") throw new UsageError(`--side ${side}: choose source or target`);
  const translator = await io.load(bundle, {});
  const tokenizer = side === "source" ? translator.sourceTokenizer : translator.targetTokenizer;
  const warnings = new Warnings(io.stderr);
  for (const line of readLines(io.stdin(), warnings)) {
    const ids = tokenizer.encode(line);
    io.stdout(`${JSON.stringify({ ids, decoded: tokenizer.decode(ids) })}\n`);
  }
  warnings.close();
  await translator.release();
}

/**
 * @typedef {object} CliIO  where the command line reads and writes, and what it loads with (tests give their own)
 * @property {() => Uint8Array} stdin  all of standard input
 * @property {(text: string) => void} stdout
 * @property {(text: string) => void} stderr
 * @property {(bundle: string, options: {threads?: number}) => Promise<any>} load  Translator.load
 * @property {number} cores  the most --threads
 */

/** @type {CliIO} */
export const NODE_IO = {
  stdin: () => readFileSync(0),
  stdout: (text) => {
    process.stdout.write(text);
  },
  stderr: (text) => {
    process.stderr.write(text);
  },
  load: (bundle, options) => Translator.load(bundle, options),
  cores: CORES,
};

/**
 * Runs the command line; never throws: an error is one line on stderr, `seq2onnx-js: error: ...`.
 * @param {string[]} argv  the arguments after the program
 * @param {Partial<CliIO>} [io]
 * @returns {Promise<number>} the exit status: 0, 1 (the bundle or the input), 2 (the command line)
 */
export async function main(argv, io = {}) {
  const env = { ...NODE_IO, ...io };
  try {
    const { values, positionals } = parseArgs({
      args: argv,
      allowPositionals: true,
      strict: true,
      options: {
        ...OPTION_FLAGS,
        threads: { type: "string" },
        truncate: { type: "boolean" },
        json: { type: "boolean" },
        ids: { type: "boolean" },
        timing: { type: "boolean" },
        side: { type: "string" },
        help: { type: "boolean", short: "h" },
      },
    });
    if (values.help) {
      env.stdout(`${USAGE}\n`);
      return 0;
    }
    const [command, bundle, ...extra] = positionals;
    if (!["translate", "tokenize"].includes(command) || !bundle || extra.length) throw new UsageError(USAGE);
    await (command === "translate" ? translate : tokenize)(bundle, values, env);
    return 0;
  } catch (e) {
    const usage =
      e instanceof UsageError ||
      e?.code === "ERR_PARSE_ARGS_UNKNOWN_OPTION" ||
      e?.code === "ERR_PARSE_ARGS_INVALID_OPTION_VALUE";
    env.stderr(`${PROGRAM}: error: ${e?.message ?? e}\n`);
    return usage ? 2 : 1;
  }
}
