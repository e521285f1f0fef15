#!/usr/bin/env node
// Target tokens per second of the Node host on a file of source lines, counted as `seq2onnx
// bench` counts them (bench/rows.py: each best hypothesis' tokens plus its end token,
// at most its length limit), after one warm-up batch; the best of --repeat passes (a shared
// machine's load only ever slows a pass down). Prints one JSON line.
//
//   node bench.mjs BUNDLE SOURCES.txt [--beam N] [--threads N] [--batch-size N] [--repeat N]
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { Translator } from "./src/index.js";

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    beam: { type: "string", default: "1" },
    threads: { type: "string", default: "2" },
    "batch-size": { type: "string", default: "32" },
    repeat: { type: "string", default: "3" },
  },
});
if (positionals.length !== 2) {
  process.stderr.write(
    "usage: node bench.mjs BUNDLE SOURCES.txt [--beam N] [--threads N] [--batch-size N] [--repeat N]\n",
  );
  process.exit(2);
}
const [bundle, file] = positionals;
const beamSize = Number(values.beam);
const threads = Number(values.threads);
const maxBatchSize = Number(values["batch-size"]);
const lines = readFileSync(file, "utf-8")
  .split("\n")
  .filter((line) => line.trim());
const translator = await Translator.load(bundle, { threads });
await translator.translateBatch(lines.slice(0, maxBatchSize), { beamSize, maxBatchSize }); // warm-up
let seconds = Infinity;
let results;
for (let pass = 0; pass < Number(values.repeat); pass++) {
  const start = process.hrtime.bigint();
  results = await translator.translateBatch(lines, { beamSize, maxBatchSize });
  seconds = Math.min(seconds, Number(process.hrtime.bigint() - start) / 1e9);
}
const limits = translator.maxLengths(
  lines.map((line) => translator.prepareSource(line).ids),
  undefined,
);
const tokens = results.reduce((sum, r, i) => sum + Math.min(r.tokenIds[0].length + 1, limits[i]), 0);
process.stdout.write(
  `${JSON.stringify({
    host: "node",
    onnxruntime: translator.ort.env?.versions?.node ?? null,
    beam: beamSize,
    threads,
    batch_size: maxBatchSize,
    repeat: Number(values.repeat),
    sentences: lines.length,
    target_tokens: tokens,
    seconds,
    tokens_per_s: tokens / seconds,
  })}\n`,
);
await translator.release();
