// Stands in for Node's "buffer" in the browser: @sctg/sentencepiece-js imports Buffer for its
// base64 loader only, which the host never calls. Left undefined so that the page keeps no global
// Buffer that other code could take for Node's.
export const Buffer = undefined;
export default { Buffer };
