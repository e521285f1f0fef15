// The Node platform: onnxruntime-node, the file system and node:crypto. The browser build swaps
// this one module for src/platform-web.js: onnxruntime-web, fetch() and crypto.subtle.
import { createHash } from "node:crypto";
import { readFile, realpath, stat } from "node:fs/promises";
import path from "node:path";
import * as ort from "onnxruntime-node";

/** @type {import("./bundle.js").Platform} */
export const nodePlatform = {
  name: "node",
  ort,
  join: (dir, rel) => path.join(dir, rel),
  async readFile(file) {
    const buffer = await readFile(file);
    return new Uint8Array(buffer.buffer, buffer.byteOffset, buffer.byteLength);
  },
  async resolveInside(dir, rel) {
    const root = await realpath(dir);
    let target = path.resolve(root, rel);
    let exists = true;
    try {
      target = await realpath(target); // symbolic links followed, as Python's Path.resolve does
      exists = (await stat(target)).isFile();
    } catch {
      exists = false;
    }
    return { inside: target.startsWith(root + path.sep), exists, path: target };
  },
  async sha256(bytes) {
    return createHash("sha256").update(bytes).digest("hex");
  },
};
