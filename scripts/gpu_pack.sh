#!/usr/bin/env bash
# Packs onnxruntime-gpu (the CUDA 13 build) for the GPU machine: its image has CUDA 13 and Python 3.12 but
# only the CPU onnxruntime, it reaches no registry, and the device tool carries at most 64 MiB per call.
#
#   bash scripts/gpu_pack.sh [SPEC]      (default: onnxruntime-gpu==1.31.1; docs/gpu.md)
#
#   1. downloads SPEC's wheel for CPython 3.12 on x86-64 Linux;
#   2. refuses a wheel whose CUDA major is not 13: its Requires-Dist must ask for nvidia-cuda-runtime~=13
#      and its CUDA provider library must link libcudart.so.13 (readelf -d), as the machine's torch
#      2.11+cu130 does; .gpupack/needed.txt lists the provider's NEEDED libraries;
#   3. drops what the check never loads (the TensorRT provider library) and writes the wheel again without
#      it, stored rather than deflated (so that xz sees the raw bytes), RECORD without its line;
#   4. compresses that with xz -9e and splits it into as few equal parts as fit beside the working tree
#      (PART_MIB each at most, default 58: the repository's files are ~3 MiB of a call's 64), part N in
#      its own folder .gpupack/N/;
#   5. adds the Tatoeba corpus (../shared/data/tatoeba-cmn-eng/cmn.txt, or GPU_DATA) to the last folder,
#      xz-compressed (~1 MiB), for the README's recipe model; without it the check uses the generated corpus;
#   6. writes MANIFEST (the wheel's name, its sha256, each part's) into every folder.
#
# Knobs: GPU_PACK_OUT (default .gpupack), PART_BYTES (instead of PART_MIB), GPU_PACK_ANY=1 (a wheel without
# onnxruntime's CUDA provider, e.g. ctranslate2 or transformers for scripts/gpu_sizes.sh: steps 2 and 3 are
# skipped), GPU_PACK_XZ=0 (steps 3 and 4 skipped: the wheel as published is split, for nvidia-cublas-cu12,
# whose 854 MB of libraries xz -9e would take most of an hour on 2 cores to save perhaps one call; MANIFEST
# says "compression none" and scripts/gpu_check.sh --install-only joins the parts without xz).
#
# .gpupack/ is ignored (.gitignore): the wheel and its parts are never committed. Call N of the transfer
# names `.gpupack/N` in `carry`; the last one runs `bash scripts/gpu_check.sh`, which joins the parts,
# checks every sha256 and installs the wheel (docs/gpu.md: the calls in order).
set -euo pipefail
spec=${1:-onnxruntime-gpu==1.31.1}
part_mib=${PART_MIB:-58}
python=${PYTHON:-python3}
root=$(git rev-parse --show-toplevel)
out=${GPU_PACK_OUT:-$root/.gpupack}
data="${GPU_DATA:-$root/../shared/data/tatoeba-cmn-eng/cmn.txt}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
die() { echo "gpu_pack: $*" >&2; exit 1; }

"$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$work/dl" "$spec"
whl=$(ls "$work"/dl/*.whl | head -1)
name=$(basename "$whl")
mkdir "$work/tree"
if [ "${GPU_PACK_ANY:-0}" != 1 ] || [ "${GPU_PACK_XZ:-1}" != 0 ]; then  # else nothing to read or rewrite
  unzip -q "$whl" -d "$work/tree"
fi
: > "$work/needed.txt"
if [ "${GPU_PACK_ANY:-0}" != 1 ]; then
  meta=$(ls "$work"/tree/*.dist-info/METADATA)
  if ! grep -q '^Requires-Dist: nvidia-cuda-runtime~=13' "$meta"; then
    asks=$(grep -o 'nvidia-cuda-runtime[^;]*' "$meta" || echo "no nvidia-cuda-runtime")
    die "$name asks for $asks, not CUDA 13 as the machine has: pick another version"
  fi
  provider="$work/tree/onnxruntime/capi/libonnxruntime_providers_cuda.so"
  [ -f "$provider" ] || die "$name has no CUDA provider (onnxruntime/capi/libonnxruntime_providers_cuda.so)"
  readelf -d "$provider" | awk '/NEEDED/ {gsub(/[][]/, "", $5); print $5}' > "$work/needed.txt"
  if ! grep -qx 'libcudart.so.13' "$work/needed.txt"; then
    die "$name's CUDA provider links $(tr '\n' ' ' < "$work/needed.txt"), not libcudart.so.13: pick another"
  fi

  # The TensorRT provider is never loaded: the check asks for CUDA and the CPU only.
  rm -f "$work"/tree/onnxruntime/capi/libonnxruntime_providers_tensorrt.so
fi
[ "${GPU_PACK_XZ:-1}" = 0 ] || "$python" - "$work/tree" "$work/$name" <<'EOF'
"""Writes the tree as a wheel, stored; RECORD keeps the files still there (pip rewrites it at install)."""
import os, sys, zipfile
tree, dest = sys.argv[1], sys.argv[2]
files = sorted(os.path.relpath(os.path.join(d, f), tree).replace(os.sep, "/")
               for d, _, fs in os.walk(tree) for f in fs)
record = next(f for f in files if f.endswith(".dist-info/RECORD"))
with open(os.path.join(tree, record)) as f:
    kept = [line for line in f if line.split(",")[0] in files]
with open(os.path.join(tree, record), "w") as f:
    f.writelines(kept)
with zipfile.ZipFile(dest, "w", zipfile.ZIP_STORED) as z:
    for name in [f for f in files if f != record] + [record]:  # RECORD last, as in the wheel
        info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
        info.external_attr = (0o755 if name.endswith(".so") or ".so." in name else 0o644) << 16
        with open(os.path.join(tree, name), "rb") as src:
            z.writestr(info, src.read())
EOF
if [ "${GPU_PACK_XZ:-1}" = 0 ]; then
  cp "$whl" "$work/$name" && cp "$whl" "$work/wheel.xz"  # the name stays: install reads MANIFEST's compression
else
  xz -9e -T0 -c "$work/$name" > "$work/wheel.xz"
fi

rm -rf "$out" && mkdir -p "$out"
size=$(stat -c %s "$work/wheel.xz")
limit=${PART_BYTES:-$((part_mib * 1024 * 1024))}
n=$(( (size + limit - 1) / limit ))
split -b $(( (size + n - 1) / n )) -d -a 2 "$work/wheel.xz" "$work/part-"  # equal parts: even calls
i=1
for p in "$work"/part-*; do
  mkdir -p "$out/$i" && mv "$p" "$out/$i/wheel.xz.$(printf %02d "$i")"
  i=$((i + 1))
done
[ -f "$data" ] && xz -9 -c "$data" > "$out/$n/cmn.txt.xz"
{
  echo "wheel $name"
  echo "parts $n"
  echo "compression $([ "${GPU_PACK_XZ:-1}" = 0 ] && echo none || echo xz)"
  (cd "$work" && sha256sum "$name" | sed 's/^/sha256 /')
  for d in $(seq 1 "$n"); do (cd "$out/$d" && sha256sum wheel.xz.* | sed 's/^/sha256 /'); done
} > "$work/MANIFEST"
for d in $(seq 1 "$n"); do cp "$work/MANIFEST" "$out/$d/MANIFEST"; done
cp "$work/needed.txt" "$out/needed.txt"
echo "$name: $(stat -c %s "$whl") bytes as published"
echo "its CUDA provider needs: $(tr '\n' ' ' < "$out/needed.txt")"
echo "stored wheel $(stat -c %s "$work/$name") bytes, xz $size bytes, in $n part(s); one call carries each:"
for d in $(seq 1 "$n"); do echo "  call $d: carry ${out#"$root"/}/$d ($(du -sb "$out/$d" | cut -f1) bytes)"; done
