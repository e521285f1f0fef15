// The Node platform: onnxruntime-node, the file system and node:crypto. The browser build swaps
// this one module for src/platform-web.js: onnxruntime-web, fetch() and crypto.subtle.
import { createHash } from "node:crypto";
import { constants, rmSync } from "node:fs";
import { mkdir, mkdtemp, open, realpath, stat } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import zlib from "node:zlib";
import "./quiet-ort.js"; // before onnxruntime-node: its telemetry stays off
import * as ort from "onnxruntime-node";

/** This machine's cores, as onnxruntime counts them for its default thread pool (at least 1). */
export const CORES = Math.max(
  1,
  typeof os.availableParallelism === "function" ? os.availableParallelism() : os.cpus().length,
);
/** How CORES was found, for messages. */
export const CORES_SOURCE =
  typeof os.availableParallelism === "function" ? "os.availableParallelism()" : "os.cpus().length";

// The private copies of weights files not yet removed (privateCopy): removed at the latest when the process
// exits, by one listener for all of them.
const COPIES = new Set();
process.once("exit", () => {
  for (const folder of COPIES) rmSync(folder, { recursive: true, force: true });
});

function removeCopy(folder) {
  rmSync(folder, { recursive: true, force: true });
  COPIES.delete(folder);
}

/** What a file system entry is, in words, for a message. */
function kind(info) {
  if (info.isFIFO()) return "a named pipe";
  if (info.isCharacterDevice()) return "a character device";
  if (info.isBlockDevice()) return "a block device";
  if (info.isSocket()) return "a socket";
  if (info.isDirectory()) return "a directory";
  return "not a regular file";
}

/** @type {import("./bundle.js").Platform} */
export const nodePlatform = {
  name: "node",
  ort,
  cores: CORES,
  coresSource: CORES_SOURCE,
  join: (dir, rel) => path.join(dir, rel),
  /**
   * A regular file's bytes. Opened without blocking (a FIFO would wait for a writer) and checked
   * with fstat before any byte is read: anything but a regular file (a FIFO, /dev/zero or another
   * device, a socket, a directory; symbolic links followed) rejects with code "ENOTREG" and `kind`,
   * and a file larger than `maxBytes` with code "EFBIG" and `size`.
   */
  async readFile(file, { maxBytes, size } = {}) {
    const handle = await open(file, constants.O_RDONLY | (constants.O_NONBLOCK ?? 0));
    try {
      const info = await handle.stat();
      if (!info.isFile()) {
        throw Object.assign(new Error(`${file}: ${kind(info)}, not a regular file`), {
          code: "ENOTREG",
          kind: kind(info),
        });
      }
      if (size !== undefined && info.size !== size) {
        throw Object.assign(new Error(`${file}: ${info.size} bytes, not ${size}`), {
          code: "ESIZE",
          size: info.size,
        });
      }
      if (maxBytes !== undefined && info.size > maxBytes) {
        throw Object.assign(new Error(`${file}: ${info.size} bytes, more than ${maxBytes}`), {
          code: "EFBIG",
          size: info.size,
        });
      }
      const buffer = await handle.readFile();
      return new Uint8Array(buffer.buffer, buffer.byteOffset, buffer.byteLength);
    } finally {
      await handle.close();
    }
  },
  /**
   * Whether hashFile can give a file's CRC-32 (spec's weights.checksum): zlib.crc32, native, in Node
   * from 20.15 / 22.2; older Node checks the weights file's sha256 instead.
   */
  crc32: typeof zlib.crc32 === "function",
  /**
   * A regular file's sha256 (or, with `crc32`, its CRC-32 as 8 lowercase hex digits: the load's cheaper
   * check) and size, read in 16 MiB pieces: no copy of the file is kept (a weights file may be many GiB,
   * past what one Node buffer holds). Refuses what readFile refuses.
   */
  async hashFile(file, { crc32 = false } = {}) {
    const handle = await open(file, constants.O_RDONLY | (constants.O_NONBLOCK ?? 0));
    try {
      const info = await handle.stat();
      if (!info.isFile()) {
        throw Object.assign(new Error(`${file}: ${kind(info)}, not a regular file`), {
          code: "ENOTREG",
          kind: kind(info),
        });
      }
      const hash = crc32 ? null : createHash("sha256");
      const piece = Buffer.allocUnsafe(16 << 20);
      let size = 0;
      let crc = 0;
      for (;;) {
        const { bytesRead } = await handle.read(piece, 0, piece.length, null);
        if (bytesRead === 0) break;
        if (hash) hash.update(piece.subarray(0, bytesRead));
        else crc = zlib.crc32(piece.subarray(0, bytesRead), crc);
        size += bytesRead;
      }
      return hash ? { sha256: hash.digest("hex"), size } : { crc32: crc.toString(16).padStart(8, "0"), size };
    } finally {
      await handle.close();
    }
  },
  /**
   * Copies a regular file (of `size` bytes, where given: refused with code "ESIZE" before a byte is
   * read) into a fresh private folder (mode 0700, in os.tmpdir()) as `name`, hashing the bytes as they
   * are copied, from the one descriptor opened: onnxruntime then reads the copy, which no other process
   * rewrites or truncates under it (docs/bundle-format.md#weights). The folder is removed when this
   * process exits, or by releaseCopy once the sessions are made.
   * @returns {Promise<{sha256: string, size: number, folder: string}>}
   */
  async privateCopy(file, name, { size } = {}) {
    const handle = await open(file, constants.O_RDONLY | (constants.O_NONBLOCK ?? 0));
    let folder;
    try {
      const info = await handle.stat();
      if (!info.isFile()) {
        throw Object.assign(new Error(`${file}: ${kind(info)}, not a regular file`), {
          code: "ENOTREG",
          kind: kind(info),
        });
      }
      if (size !== undefined && info.size !== size) {
        throw Object.assign(new Error(`${file}: ${info.size} bytes, not ${size}`), {
          code: "ESIZE",
          size: info.size,
        });
      }
      folder = await mkdtemp(path.join(os.tmpdir(), "seq2onnx-weights-"));
      COPIES.add(folder);
      const dest = path.join(folder, name); // name: files.weights.path, checked inside the bundle (nested allowed)
      await mkdir(path.dirname(dest), { recursive: true, mode: 0o700 });
      const out = await open(dest, "wx", 0o600);
      const hash = createHash("sha256");
      const piece = Buffer.allocUnsafe(16 << 20);
      let copied = 0;
      try {
        for (;;) {
          const { bytesRead } = await handle.read(piece, 0, piece.length, copied);
          if (bytesRead === 0) break;
          hash.update(piece.subarray(0, bytesRead));
          await out.write(piece, 0, bytesRead, copied);
          copied += bytesRead;
        }
      } finally {
        await out.close();
      }
      return { sha256: hash.digest("hex"), size: copied, folder };
    } catch (e) {
      if (folder) removeCopy(folder);
      throw e;
    } finally {
      await handle.close();
    }
  },
  /** Removes a private copy's folder once the sessions are made (onnxruntime keeps what it read). */
  releaseCopy(bundle) {
    if (bundle.paths.weightsFolder) removeCopy(bundle.paths.weightsFolder);
  },
  async resolveInside(dir, rel) {
    const root = await realpath(dir);
    let target = path.resolve(root, rel);
    let exists = true;
    try {
      target = await realpath(target); // symbolic links followed, as Python's Path.resolve does
      await stat(target); // whatever it is: readFile refuses what is not a regular file, naming it
    } catch {
      exists = false;
    }
    return { inside: target.startsWith(root + path.sep), exists, path: target };
  },
  async sha256(bytes) {
    return createHash("sha256").update(bytes).digest("hex");
  },
  /**
   * Session options that let onnxruntime-node read a bundle's weights file itself (its externalData
   * option is the browser's): the private folder holding the very copy that was hashed (privateCopy),
   * as the Python runtime does; graphs name the file by files.weights.path, nested or not, inside it.
   */
  weightsOptions(options, bundle) {
    const session = {
      ...(options.extra?.session ?? {}),
      model_external_initializers_file_folder_path: bundle.paths.weightsFolder,
    };
    return { ...options, extra: { ...(options.extra ?? {}), session } };
  },
};
