#!/usr/bin/env node
// seq2onnx-js: the Node host's command line, the twin of `seq2onnx translate` (src/cli.js).
//
//   seq2onnx-js translate BUNDLE [--beam N] [--n-best N] [--json] [--ids] [--timing] ...  < lines
//   seq2onnx-js tokenize BUNDLE [--side source|target]                                  < lines
import { main } from "../src/cli.js";

process.exitCode = await main(process.argv.slice(2));
