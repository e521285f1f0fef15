#!/usr/bin/env bash
# Issue 57's real-size GPU benchmark in one call (docs/gpu.md, "Real sizes"): install the packs carried by
# the calls before (scripts/gpu_pack.sh --setup), then scripts/hf_real_sizes.py --device cuda; tables under $OUT.
#
#   bash scripts/gpu_sizes.sh          on the GPU machine, in the call after the transfer calls
#   bash scripts/gpu_sizes.sh --cpu    tiny configs on the CPU provider (what tests/test_gpu_sizes.py runs)
#   other arguments go to scripts/hf_real_sizes.py (--models, --engines, --ours-variants, --budget-s)
#
# The packs (bash scripts/gpu_pack.sh --all writes those missing, here): .gpupack (onnxruntime-gpu 1.31.1,
# CUDA 13), .gpupack-hf (transformers 5.24.0: pyproject's pin; the image has 5.17), .gpupack-ct2
# (ctranslate2 4.8.5), .gpupack-cublas12 (nvidia-cublas-cu12: ctranslate2 dlopens libcublas.so.12, the
# image has cuBLAS 13 only; CT2_CUBLAS_SHIM=1 without it tries cuBLAS 13 under the .so.12 names, untried).
# A pack that is absent is said once: the engines that need it fail with their reason, the others run.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
mode=gpu
if [ "${1:-}" = --cpu ]; then mode=cpu; shift; fi
OUT=${OUT:-/tmp/gpu-sizes-out}
mkdir -p "$OUT"
case " $* " in *" -h "*|*" --help "*) mode=help ;; esac  # --help: hf_real_sizes.py's, nothing installed
if [ $mode = gpu ]; then
  bash scripts/gpu_pack.sh --setup /tmp/gpu-sizes-env.sh > "$OUT/install.log" 2>&1
  cat "$OUT/install.log"
  # shellcheck disable=SC1091
  . /tmp/gpu-sizes-env.sh
fi
engines=ours-fp16,ct2-float16,generate-fp32,generate-fp16,ours-fp32,ct2-int8_float16,ct2-float32  # the GPU's
if [ $mode = cpu ]; then set -- --device cpu --tiny --engines "$engines" "$@"; else set -- --device cuda "$@"; fi
exec "$py" scripts/hf_real_sizes.py --out "$OUT" "$@"
