// The package's Node entry point: the Translator bound to onnxruntime-node and the file system.
// src/translator.js, src/search.js and src/bundle.js import nothing from Node; the browser entry
// point, src/index-web.js, binds the same Translator to onnxruntime-web (src/platform-web.js).
import { nodePlatform } from "./platform-node.js";
import { Translator as PortableTranslator } from "./translator.js";

export { BundleError, FORMAT, FORMAT_VERSION, readBundle } from "./bundle.js";
export { beamSearch, candidatesNeeded, forcePrefix, greedySearch } from "./search.js";
export { SentencePiece, Tokens } from "./tokenizer.js";
export { nodePlatform, PortableTranslator };

/** The Translator on onnxruntime-node: `await Translator.load(bundleDir, {threads})`. */
export class Translator extends PortableTranslator {
  /**
   * @param {string} bundleDir
   * @param {Omit<Parameters<typeof PortableTranslator.load>[1], "platform"> & {platform?: any}} [options]
   * @returns {Promise<PortableTranslator>}
   */
  static async load(bundleDir, options = {}) {
    return PortableTranslator.load(bundleDir, { platform: nodePlatform, ...options });
  }
}
