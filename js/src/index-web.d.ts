// Types of the browser entry point (src/index-web.js); the shared ones live in index.d.ts.
import type { LoadOptions, Platform, PortableTranslator } from "./index.js";

export type { LoadOptions, Platform, TranslateOptions, TranslationResult } from "./index.js";
export { BundleError, FORMAT, FORMAT_VERSION, PortableTranslator, readBundle } from "./index.js";

export interface WebLoadOptions extends Omit<LoadOptions, "platform" | "threads"> {
  /** URL of the folder serving ort-wasm-simd-threaded.wasm, ending in "/" (default: ../ort/ beside src/). */
  wasmBase?: string;
  fetch?: typeof fetch;
}

/** The Translator on onnxruntime-web (WebAssembly, one thread); bundleUrl is the bundle folder's URL. */
export declare class Translator extends PortableTranslator {
  static load(bundleUrl: string, options?: WebLoadOptions): Promise<PortableTranslator>;
}

/** The onnxruntime-web module the translator runs on. */
export declare const ort: any;
export declare function configureOrt(ort: unknown, wasmBase: string): void;
export declare function webPlatform(
  ort: unknown,
  options?: { fetch?: typeof fetch; subtle?: SubtleCrypto | null },
): Platform;
