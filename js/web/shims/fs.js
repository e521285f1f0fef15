// Stands in for Node's "fs" in the browser: @sctg/sentencepiece-js imports it at the top for its
// load(path), which the host never calls (it hands the model's bytes to _loadModel instead).
export function readFileSync(path) {
  throw new Error(`readFileSync(${JSON.stringify(path)}): there is no file system in the browser`);
}
export default { readFileSync };
