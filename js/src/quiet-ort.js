// Evaluated before onnxruntime-node (platform-node.js imports it first). onnxruntime's official Linux and
// macOS builds report usage to Microsoft by default (1DS: a device id in TMPDIR/.ses, events uploaded from a
// thread, and a mat-debug-PID.log left in TMPDIR by every process); ORT_DISABLE_TELEMETRY=1, set before it
// loads, turns all of that off. An app that embeds this host should not start reporting because of it: off
// unless the app set the variable itself. The Python package does the same (its __init__.py).
process.env.ORT_DISABLE_TELEMETRY ??= "1";
