// The decoding options as spec/capabilities.json states them (generated from the Python runtime's one
// declaration, runtime/options.py): their names here (js), kinds, defaults and limits. translateBatch reads its
// options through readOptions, so that both hosts accept and refuse the same values (spec/cases/options.json)
// and no module of this host spells a limit of its own.
import { CAPABILITIES } from "./spec.js";

/** Every option by its Python name: {js, http, cli, kind, default, bundle_default, nullable, min, max, ...}. */
export const OPTIONS = CAPABILITIES.options;
/** Python name by JS name: beamSize -> beam_size. */
const NAMES = Object.fromEntries(Object.entries(OPTIONS).map(([name, o]) => [o.js, name]));
// JS-only: an integer past 2^53 can only travel as a BigInt, which the seed alone takes (Python's ints are exact)
const BIG = new Set(["seed"]);

/** A refused option value: the message names the option (here by its JS name), the value and the fix. */
export class OptionError extends RangeError {
  /**
   * @param {string} option  the Python name of the option (OPTIONS' key)
   * @param {string} shown  the value as the message shows it
   * @param {string} says  the words between the value and the fix, with their punctuation
   * @param {string} hint  the fix
   */
  constructor(option, shown, says, hint) {
    super(`${OPTIONS[option].js}=${shown}${says}${hint}`);
    Object.assign(this, { option, shown, says, hint });
  }

  /** The message with the option called `name` (a flag: "--beam 0: give ..."), its value after `sep`. */
  named(name, sep = " ") {
    return `${name}${sep}${this.shown}${this.says}${this.hint}`;
  }
}

const show = (value) => (typeof value === "string" ? JSON.stringify(value) : String(value));

/**
 * Checks one option's value against its spec entry (a null where the option is nullable; ids are checked
 * against the model elsewhere).
 * @param {string} name  the Python name
 * @param {*} value
 * @returns {*} the value
 * @throws {OptionError}
 */
export function checkOption(name, value) {
  const o = OPTIONS[name];
  if ((value == null && o.nullable) || o.kind === "ids") return value;
  let ok;
  if (o.kind === "int") {
    ok =
      typeof value === "bigint"
        ? BIG.has(name) && value >= BigInt(o.min)
        : Number.isSafeInteger(value) && value >= o.min;
  } else if (o.kind === "number") {
    ok = typeof value === "number" && (o.min_open ? value > o.min : value >= o.min) && value <= o.max; // NaN: neither
  } else {
    ok = typeof value === (o.kind === "bool" ? "boolean" : "string");
  }
  if (ok) return value;
  const big =
    BIG.has(name) && Number.isInteger(value) && !Number.isSafeInteger(value) ? " (a BigInt above 2^53)" : "";
  throw new OptionError(name, show(value), ": ", o.hint + big);
}

/**
 * translateBatch's options read and checked: every option of the spec by its JS name, the bundle's default
 * (decoding.<bundle_default>) or the spec's where it is left out, then the checks between options that hold
 * without the model (numHypotheses within the beam, the minimum length below the maximum).
 * @param {object} given  the options passed, by JS name
 * @param {object} [decoding]  bundle.json's decoding
 * @returns {object} every option by JS name
 * @throws {TypeError} an unknown option, naming it and the options; {OptionError} a value refused
 */
export function readOptions(given, decoding = {}) {
  const unknown = Object.keys(given).filter((key) => !(key in NAMES));
  if (unknown.length) {
    throw new TypeError(
      `unknown option ${JSON.stringify(unknown[0])}; translateBatch takes ${Object.keys(NAMES).join(", ")}`,
    );
  }
  const read = {};
  for (const [name, o] of Object.entries(OPTIONS)) {
    const fallback = o.bundle_default ? (decoding[o.bundle_default] ?? o.default) : o.default;
    read[o.js] = checkOption(name, given[o.js] ?? fallback);
  }
  const { beamSize, numHypotheses, minDecodingLength, maxDecodingLength, samplingTemperature } = read;
  if (samplingTemperature == null && numHypotheses > beamSize) {
    throw new OptionError(
      "num_hypotheses",
      show(numHypotheses),
      ` must lie in [1, beamSize=${beamSize}]: `,
      "raise beamSize or lower numHypotheses",
    );
  }
  if (maxDecodingLength != null && minDecodingLength >= maxDecodingLength) {
    throw new OptionError(
      "min_decoding_length",
      show(minDecodingLength),
      ` must be below maxDecodingLength=${maxDecodingLength}: `,
      "lower the minimum or raise the maximum",
    );
  }
  return read;
}
