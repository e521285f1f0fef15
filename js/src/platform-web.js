// The browser platform: onnxruntime-web (WebAssembly), fetch() and SubtleCrypto. It imports
// nothing itself: the caller hands it the onnxruntime-web module (src/index-web.js does), so that
// Node can test it with a fake fetch and the page decides where the WASM files are served from.

const SCHEME = /^[a-zA-Z][a-zA-Z0-9+.-]*:/;

/**
 * Points onnxruntime-web at WASM files served beside the page, one thread: nothing is fetched from
 * a CDN (sites behind firewalls), and one thread needs no cross-origin isolation headers, so any
 * static file server (`python -m http.server`) serves the site.
 * @param {any} ort  the onnxruntime-web module
 * @param {string} wasmBase  URL of the folder holding ort-wasm-simd-threaded.wasm, ending in "/"
 */
export function configureOrt(ort, wasmBase) {
  if (!wasmBase.endsWith("/"))
    throw new RangeError(`wasmBase ${JSON.stringify(wasmBase)} must end with "/" (a folder URL)`);
  // Only the .wasm: a folder prefix would also redirect the JavaScript glue, which the bundled
  // build (ort.wasm.bundle.min.mjs) carries inside itself.
  ort.env.wasm.wasmPaths = { wasm: `${wasmBase}ort-wasm-simd-threaded.wasm` };
  ort.env.wasm.numThreads = 1;
  ort.env.wasm.proxy = false;
  ort.env.logLevel = "error";
}

/**
 * A platform (see src/bundle.js) reading a bundle served over HTTP. Bundle paths are URLs: `dir`
 * is the bundle folder's URL (relative to the page or absolute).
 * @param {any} ort  the onnxruntime-web module
 * @param {{fetch?: typeof fetch, subtle?: SubtleCrypto | null}} [options]  defaults: the global
 *   fetch and crypto.subtle (absent outside secure contexts: then SHA-256 is computed in JS)
 * @returns {import("./bundle.js").Platform}
 */
export function webPlatform(
  ort,
  { fetch: fetchFn = globalThis.fetch, subtle = globalThis.crypto?.subtle ?? null } = {},
) {
  if (typeof fetchFn !== "function")
    throw new TypeError("webPlatform needs fetch() (a browser, or Node >= 18)");
  const join = (dir, rel) => (dir.endsWith("/") ? dir : `${dir}/`) + rel;
  return {
    name: "web",
    ort,
    join,
    async readFile(url) {
      const response = await fetchFn(url);
      if (!response.ok) {
        const error = new Error(`${url}: HTTP ${response.status}`);
        if (response.status === 404) error.code = "ENOENT";
        throw error;
      }
      return new Uint8Array(await response.arrayBuffer());
    },
    async resolveInside(dir, rel) {
      // A server has no symbolic links to follow: what is refused is a path that could leave the
      // folder once the URL is resolved (.., a scheme, an absolute path, backslashes, an encoded byte).
      const parts = rel.split("/");
      const inside =
        rel.length > 0 &&
        !SCHEME.test(rel) &&
        !rel.startsWith("/") &&
        !/[\\%?#]/.test(rel) &&
        parts.every((p) => p !== ".." && p !== "");
      const url = join(dir, rel);
      if (!inside) return { inside: false, exists: false, path: url };
      const response = await fetchFn(url, { method: "HEAD" });
      return { inside: true, exists: response.ok, path: url };
    },
    async sha256(bytes) {
      if (subtle) return hex(new Uint8Array(await subtle.digest("SHA-256", bytes)));
      return sha256Hex(bytes);
    },
    keepsWeights: true, // onnxruntime-web takes a bundle's weights file as bytes (externalData)
    weightsOptions(options, bundle) {
      return {
        ...options,
        externalData: [{ path: bundle.meta.files.weights.path, data: bundle.files.weights }],
      };
    },
  };
}

const hex = (bytes) => Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");

const K = new Uint32Array([
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98,
  0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
  0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8,
  0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
  0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819,
  0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
  0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
  0xc67178f2,
]);

/**
 * SHA-256 (FIPS 180-4) in plain JavaScript, for pages served over plain HTTP from another host than
 * localhost: browsers give crypto.subtle to secure contexts only, and the hashes must still be checked.
 * @param {Uint8Array} bytes
 * @returns {string} lowercase hex digest
 */
export function sha256Hex(bytes) {
  const bitLength = bytes.length * 8;
  const padded = new Uint8Array(Math.ceil((bytes.length + 9) / 64) * 64);
  padded.set(bytes);
  padded[bytes.length] = 0x80;
  const view = new DataView(padded.buffer);
  view.setUint32(padded.length - 8, Math.floor(bitLength / 2 ** 32));
  view.setUint32(padded.length - 4, bitLength >>> 0);
  const h = new Uint32Array([
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
  ]);
  const w = new Uint32Array(64);
  const rotr = (x, n) => (x >>> n) | (x << (32 - n));
  for (let offset = 0; offset < padded.length; offset += 64) {
    for (let t = 0; t < 16; t++) w[t] = view.getUint32(offset + 4 * t);
    for (let t = 16; t < 64; t++) {
      const s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >>> 3);
      const s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >>> 10);
      w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    let [a, b, c, d, e, f, g, hh] = h;
    for (let t = 0; t < 64; t++) {
      const t1 = hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K[t] + w[t];
      const t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      [hh, g, f, e, d, c, b, a] = [g, f, e, (d + t1) >>> 0, c, b, a, (t1 + t2) >>> 0];
    }
    [a, b, c, d, e, f, g, hh].forEach((x, i) => {
      h[i] = (h[i] + x) >>> 0;
    });
  }
  return hex(
    new Uint8Array(Array.from(h, (x) => [x >>> 24, (x >>> 16) & 255, (x >>> 8) & 255, x & 255]).flat()),
  );
}
