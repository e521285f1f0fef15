#!/usr/bin/env bash
# Issue 57's real-size GPU benchmark in one call (docs/gpu.md, "Real sizes"): install what the device image
# lacks from the packs carried by the calls before, then scripts/gpu_sizes.py; tables under $OUT.
#
#   bash scripts/gpu_sizes.sh          on the GPU machine, in the call after the transfer calls
#   bash scripts/gpu_sizes.sh --cpu    tiny configs on the CPU provider (what tests/test_gpu_sizes.py runs)
#   bash scripts/gpu_sizes.sh --pack   here, before a GPU session: writes the packs below that are missing
#   other arguments go to scripts/gpu_sizes.py (--models, --engines, --ours-variants, --budget-s)
#
# The packs (scripts/gpu_pack.sh writes each; folders 1..N, each carried by one call):
#   .gpupack           onnxruntime-gpu 1.31.1 (CUDA 13)   -> /tmp/ort-gpu
#   .gpupack-hf        transformers 5.24.0 (pyproject's hf pin; the image has 5.17) -> /tmp/site
#   .gpupack-ct2       ctranslate2 4.8.5                  -> /tmp/site
#   .gpupack-cublas12  nvidia-cublas-cu12 (ctranslate2 dlopens libcublas.so.12; the image has cuBLAS 13 only)
#                                                         -> /tmp/cublas12, its lib folder on LD_LIBRARY_PATH
# CT2_CUBLAS_SHIM=1 (no .gpupack-cublas12): try the image's cuBLAS 13 under the .so.12 names (untried; below).
# A pack that is absent is said once and skipped: the engines that need it then fail with their own reason
# in the table, and the others still run.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
mode=gpu
if [ "${1:-}" = --cpu ]; then mode=cpu; shift; fi
if [ "${1:-}" = --pack ]; then
  # Pinned as measured (docs/gpu.md); transformers' dependencies are the image's (it has huggingface-hub 1.33,
  # tokenizers 0.23.2, safetensors 0.8.0: within 5.24.0's Requires-Dist).
  [ -d .gpupack/1 ] || bash scripts/gpu_pack.sh onnxruntime-gpu==1.31.1
  for spec in .gpupack-hf:transformers==5.24.0 .gpupack-ct2:ctranslate2==4.8.5 \
              .gpupack-cublas12:nvidia-cublas-cu12==12.9.3.13; do
    out=${spec%%:*}
    [ -d "$out/1" ] && continue
    xz=1 && [ "$out" = .gpupack-cublas12 ] && xz=0  # 581 MB as published: split, not recompressed
    GPU_PACK_ANY=1 GPU_PACK_XZ=$xz GPU_DATA=/nonexistent GPU_PACK_OUT=$out bash scripts/gpu_pack.sh "${spec#*:}" ||
      exit 1
  done
  du -sb .gpupack*/[0-9]* && exit 0
fi
OUT=${OUT:-/tmp/gpu-sizes-out}
mkdir -p "$OUT"
if [ "$mode" = gpu ]; then
  t0=$(date +%s)
  {
    for spec in .gpupack:/tmp/ort-gpu .gpupack-hf:/tmp/site .gpupack-ct2:/tmp/site .gpupack-cublas12:/tmp/cublas12
    do
      pack=${spec%%:*} target=${spec#*:}
      if ls "$pack"/[0-9]*/MANIFEST >/dev/null 2>&1; then
        bash scripts/gpu_check.sh --install-only "$pack" "$target" || echo "install: $pack FAILED (above)"
      else
        echo "install: no $pack here (not carried): what needs it will fail, named in the tables"
      fi
    done
    # The image's CPU onnxruntime shares the import name, and the runtime refuses two flavours
    # (runtime/ort_install.py); that machine is thrown away after the lease (never on one without a GPU).
    if [ -d /tmp/ort-gpu/onnxruntime ] && command -v nvidia-smi >/dev/null &&
        "$py" -m pip show -q onnxruntime >/dev/null 2>&1; then
      "$py" -m pip uninstall -y -q onnxruntime
    fi
    export PYTHONPATH=/tmp/site:/tmp/ort-gpu${PYTHONPATH:+:$PYTHONPATH}
    lib=/tmp/cublas12/nvidia/cublas/lib
    if [ ! -d "$lib" ] && [ "${CT2_CUBLAS_SHIM:-0}" = 1 ]; then
      # Untried (docs/gpu.md): the image's cuBLAS 13 under the names ctranslate2 dlopens. Its stub looks each
      # function up by name, so a missing one fails loudly; a changed meaning would show in the ids against
      # generate() (ct2-float32's row of the ids table): believe the CTranslate2 rows only if that is equal.
      sites=$("$py" -c "import site; print(' '.join(site.getsitepackages()))")
      # shellcheck disable=SC2086  # the site folders, one word each
      so=$(find $sites -name 'libcublas.so.13*' 2>/dev/null | head -1)
      # shellcheck disable=SC2086
      lt=$(find $sites -name 'libcublasLt.so.13*' 2>/dev/null | head -1)
      if [ -n "$so" ] && [ -n "$lt" ]; then
        lib=/tmp/cublas-shim && mkdir -p $lib && ln -sfn "$so" $lib/libcublas.so.12 && ln -sfn "$lt" $lib/libcublasLt.so.12
        echo "install: CT2_CUBLAS_SHIM: $lib/libcublas.so.12 -> $so, libcublasLt.so.12 -> $lt"
      fi
    fi
    [ -d "$lib" ] && export LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    # seq2onnx from this checkout without pip: the repository root is the package (pyproject's package-dir)
    if ! "$py" -c "import seq2onnx" 2>/dev/null; then
      mkdir -p /tmp/s2o && ln -sfn "$root" /tmp/s2o/seq2onnx && export PYTHONPATH=/tmp/s2o:$PYTHONPATH
    fi
    "$py" - <<'EOF'
import importlib.metadata as md
for d in ("onnxruntime-gpu", "onnxruntime", "transformers", "ctranslate2", "nvidia-cublas-cu12", "torch"):
    try:
        print(f"install: {d} {md.version(d)}")
    except md.PackageNotFoundError:
        print(f"install: {d} absent")
EOF
    echo "install took $(( $(date +%s) - t0 )) s"
  } > "$OUT/install.log" 2>&1
  cat "$OUT/install.log"
fi
exec "$py" scripts/gpu_sizes.py --mode "$mode" --out "$OUT" "$@"
