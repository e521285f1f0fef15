// The package's browser entry point: the Translator bound to onnxruntime-web (WebAssembly, one
// thread) and fetch(). `seq2onnx web BUNDLE OUT` serves it with an import map that resolves
// "onnxruntime-web" and "@sctg/sentencepiece-js" to files copied beside the page.
import * as ort from "onnxruntime-web";
import { configureOrt, webPlatform } from "./platform-web.js";
import { Translator as PortableTranslator } from "./translator.js";

export { BundleError, FORMAT, FORMAT_VERSION, readBundle } from "./bundle.js";
export { configureOrt, ort, PortableTranslator, webPlatform };

/** The Translator on onnxruntime-web: `await Translator.load(bundleUrl, {wasmBase})`. */
export class Translator extends PortableTranslator {
  /**
   * @param {string} bundleUrl  the bundle folder's URL (relative to the page or absolute)
   * @param {{wasmBase?: string, checkHashes?: boolean, fetch?: typeof fetch}} [options]
   *   wasmBase: the folder serving onnxruntime-web's .wasm files (default: ort/ beside this module's
   *   folder, as `seq2onnx web` lays the site out)
   * @returns {Promise<PortableTranslator>}
   */
  static async load(
    bundleUrl,
    { wasmBase = new URL("../ort/", import.meta.url).href, fetch, ...options } = {},
  ) {
    configureOrt(ort, wasmBase);
    // threads 0 lets onnxruntime-web choose; configureOrt has set it to one.
    return PortableTranslator.load(bundleUrl, {
      ...options,
      platform: webPlatform(ort, fetch ? { fetch } : {}),
      threads: 0,
    });
  }
}
