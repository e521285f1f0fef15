#!/usr/bin/env node
// seq2onnx-js: the Node host's command line, the twin of `seq2onnx translate`.
//
//   seq2onnx-js translate BUNDLE [--beam N] [--n-best N] [--json] [--ids] [--timing] ...  < lines
//   seq2onnx-js tokenize BUNDLE [--side source|target]                                  < lines
//
// translate writes one line per input line: the best translation, or with --json a JSON object
// {"source_ids", "hypotheses", "token_ids", "scores"} (source_ids as fed to the encoder, end token
// included; token_ids without the end token). --ids reads each line as a JSON array of source
// token ids instead of text. --timing adds one last line to standard error,
// `seq2onnx-js: timing {"load_s", "translate_s", "sources"}`: the seconds spent loading the bundle
// and inside translateBatch (what `seq2onnx verify-host` reports as the Node host's speed).
// tokenize writes {"ids", "decoded"} per line.
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { Translator } from "../src/index.js";

const USAGE = `usage: seq2onnx-js translate BUNDLE [--beam N] [--n-best N] [--length-penalty A] [--max-length N]
                                 [--min-length N] [--threads N] [--batch-size N] [--truncate] [--json] [--ids]
                                 [--timing]
       seq2onnx-js tokenize BUNDLE [--side source|target]
Reads lines from standard input and writes one line (or one JSON object) per input line.`;

class UsageError extends Error {}

function integer(options, name, { min = 0, fallback } = {}) {
  const raw = options[name];
  if (raw === undefined) return fallback;
  const value = Number(raw);
  if (!Number.isInteger(value) || value < min) throw new UsageError(`--${name} ${raw}: give an integer >= ${min}`);
  return value;
}

/** Standard input's lines, split at "\n" only (as the Python CLI does), a final "\r" removed. */
function readLines() {
  const text = readFileSync(0, "utf-8");
  const lines = text.split("\n");
  if (lines.length && lines[lines.length - 1] === "") lines.pop();
  return lines.map((line) => (line.endsWith("\r") ? line.slice(0, -1) : line));
}

function parseIds(line, n) {
  let ids;
  try {
    ids = JSON.parse(line);
  } catch {
    throw new UsageError(`line ${n + 1}: --ids wants a JSON array of token ids, got ${JSON.stringify(line.slice(0, 40))}`);
  }
  if (!Array.isArray(ids)) throw new UsageError(`line ${n + 1}: --ids wants a JSON array of token ids`);
  return ids;
}

async function translate(bundle, options) {
  const beamSize = integer(options, "beam", { min: 1 });
  const numHypotheses = integer(options, "n-best", { min: 1, fallback: 1 });
  const threads = integer(options, "threads", { fallback: 0 });
  const lp = options["length-penalty"];
  const lengthPenalty = lp === undefined ? undefined : Number(lp);
  if (lengthPenalty !== undefined && !Number.isFinite(lengthPenalty)) throw new UsageError(`--length-penalty ${lp}: give a number`);
  const started = performance.now();
  const translator = await Translator.load(bundle, { threads });
  const loadSeconds = (performance.now() - started) / 1000;
  let translateSeconds = 0;
  const lines = readLines();
  const sources = options.ids ? lines.map(parseIds) : lines;
  const chunk = 256; // as the Python CLI: the same lines share translate_batch calls
  const write = (s) => process.stdout.write(s);
  for (let start = 0; start < sources.length; start += chunk) {
    const part = sources.slice(start, start + chunk);
    const before = performance.now();
    const results = await translator.translateBatch(part, {
      beamSize, numHypotheses, lengthPenalty, returnScores: true, truncate: Boolean(options.truncate),
      maxDecodingLength: integer(options, "max-length", { min: 1 }), minDecodingLength: integer(options, "min-length"),
      maxBatchSize: integer(options, "batch-size", { min: 1, fallback: 32 }),
    });
    translateSeconds += (performance.now() - before) / 1000;
    results.forEach((r, j) => {
      if (options.json) {
        const item = part[j];
        const sourceIds = typeof item === "string" ? translator.prepareSource(item, { truncate: Boolean(options.truncate) }).ids
          : translator._sourceIds(start + j, item, Boolean(options.truncate)) ?? [];
        write(`${JSON.stringify({ source_ids: sourceIds, hypotheses: r.hypotheses, token_ids: r.tokenIds, scores: r.scores })}\n`);
      } else if (numHypotheses > 1) {
        r.hypotheses.forEach((text, h) => write(`${start + j} ||| ${text} ||| ${r.scores[h].toFixed(4)}\n`));
      } else {
        write(`${r.hypotheses[0]}\n`);
      }
    });
  }
  await translator.release();
  if (options.timing) {
    const timing = { load_s: loadSeconds, translate_s: translateSeconds, sources: sources.length };
    process.stderr.write(`seq2onnx-js: timing ${JSON.stringify(timing)}\n`);
  }
}

async function tokenize(bundle, options) {
  const side = options.side ?? "source";
  if (side !== "source" && side !== "target") throw new UsageError(`--side ${side}: choose source or target`);
  const translator = await Translator.load(bundle, {});
  const tokenizer = side === "source" ? translator.sourceTokenizer : translator.targetTokenizer;
  for (const line of readLines()) {
    const ids = tokenizer.encode(line);
    process.stdout.write(`${JSON.stringify({ ids, decoded: tokenizer.decode(ids) })}\n`);
  }
  await translator.release();
}

async function main(argv) {
  const { values, positionals } = parseArgs({
    args: argv, allowPositionals: true, strict: true,
    options: {
      beam: { type: "string" }, "n-best": { type: "string" }, "length-penalty": { type: "string" },
      "max-length": { type: "string" }, "min-length": { type: "string" }, threads: { type: "string" },
      "batch-size": { type: "string" }, truncate: { type: "boolean" }, json: { type: "boolean" },
      ids: { type: "boolean" }, timing: { type: "boolean" }, side: { type: "string" }, help: { type: "boolean", short: "h" },
    },
  });
  if (values.help) {
    process.stdout.write(`${USAGE}\n`);
    return 0;
  }
  const [command, bundle, ...extra] = positionals;
  if (!["translate", "tokenize"].includes(command) || !bundle || extra.length) throw new UsageError(USAGE);
  await (command === "translate" ? translate : tokenize)(bundle, values);
  return 0;
}

main(process.argv.slice(2)).then(
  (code) => { process.exitCode = code; },
  (e) => {
    const usage = e instanceof UsageError || e?.code === "ERR_PARSE_ARGS_UNKNOWN_OPTION" || e?.code === "ERR_PARSE_ARGS_INVALID_OPTION_VALUE";
    process.stderr.write(`seq2onnx-js: error: ${e.message}\n`);
    process.exitCode = usage ? 2 : 1;
  },
);
