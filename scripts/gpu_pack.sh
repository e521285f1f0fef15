#!/usr/bin/env bash
# What the GPU machine lacks, carried in parts of at most 58 MiB (docs/gpu.md): its image has CUDA 13 and
# Python 3.12 but the CPU onnxruntime only, reaches no registry, and a call carries at most 64 MiB.
#
#   bash scripts/gpu_pack.sh [SPEC]    here: SPEC's wheel (default onnxruntime-gpu==1.31.1) into .gpupack/N
#   bash scripts/gpu_pack.sh --all     here: every pack of docs/gpu.md that is missing (issue 57's run)
#   bash scripts/gpu_pack.sh --install PACK TARGET   there: join the parts, check every sha256, pip --target
#   bash scripts/gpu_pack.sh --setup ENV             there: install every pack carried, write ENV's exports
#
# Packing: download the cp312 manylinux wheel; for onnxruntime-gpu refuse one whose CUDA major is not 13
# (Requires-Dist nvidia-cuda-runtime~=13, readelf -d of the provider: libcudart.so.13) and drop the TensorRT
# provider (never loaded); write the wheel again stored (xz sees the raw bytes), xz -9e, split into equal
# parts in folders 1..N with a MANIFEST of every sha256; Tatoeba's cmn.txt (GPU_DATA) xz'd in the last.
# Knobs: GPU_PACK_OUT (default .gpupack), PART_MIB (58) or PART_BYTES, GPU_PACK_ANY=1 (not onnxruntime:
# no CUDA checks), GPU_PACK_XZ=0 (split as published: MANIFEST says "compression none").
# .gpupack*/ are ignored (.gitignore): never committed.
set -uo pipefail
py=${PYTHON:-python3}
say() { echo "install: $*"; }

# install PACK TARGET: the parts in order, each checked against MANIFEST, then the wheel; pip --target.
install() {
  local pack=$1 target=$2 manifest n name d f want got
  manifest=$(ls "$pack"/[0-9]*/MANIFEST 2>/dev/null | head -1)
  [ -n "$manifest" ] || { say "no $pack/N/MANIFEST: carry the folders that scripts/gpu_pack.sh wrote"; return 2; }
  n=$(awk '$1 == "parts" {print $2}' "$manifest")
  name=$(awk '$1 == "wheel" {print $2}' "$manifest")
  rm -rf "$pack/.joined" "$pack/.wheel" && mkdir -p "$pack/.wheel"
  for d in $(seq 1 "$n"); do
    f=$(ls "$pack/$d"/wheel.xz.* 2>/dev/null | head -1)
    if [ -z "$f" ]; then
      say "part $d of $n is missing ($pack/$d): the machine went back between calls; carry $pack/$d again"
      return 2
    fi
    want=$(awk -v n="$(basename "$f")" '$1 == "sha256" && $3 == n {print $2}' "$manifest")
    got=$(sha256sum "$f" | cut -d' ' -f1)
    if [ "$want" != "$got" ]; then
      say "$f has sha256 $got, MANIFEST says $want: a damaged transfer; carry $pack/$d again"
      return 2
    fi
    cat "$f" >> "$pack/.joined"
  done
  if [ "$(awk '$1 == "compression" {print $2}' "$manifest")" = none ]; then
    mv "$pack/.joined" "$pack/.wheel/$name"
  else
    xz -dc "$pack/.joined" > "$pack/.wheel/$name" || { say "xz could not decompress the parts"; return 2; }
  fi
  rm -f "$pack/.joined"
  want=$(awk -v n="$name" '$1 == "sha256" && $3 == n {print $2}' "$manifest")
  got=$(sha256sum "$pack/.wheel/$name" | cut -d' ' -f1)
  [ "$want" = "$got" ] || { say "$name has sha256 $got, MANIFEST says $want"; return 2; }
  "$py" -m pip install -q --no-deps --no-index --no-compile --no-cache-dir --upgrade --target "$target" \
    "$pack/.wheel/$name" || { say "pip could not install $name"; return 2; }
  rm -rf "$pack/.wheel"
  say "$name from $n part(s), every sha256 checked, installed into $target"
}

# setup ENV: every pack carried installed; ENV gets the exports that make the check's Python see them.
setup() {
  local env=$1 spec pack target lib so lt sites rc=0
  : > "$env"
  for spec in .gpupack:/tmp/ort-gpu .gpupack-hf:/tmp/site .gpupack-ct2:/tmp/site .gpupack-cublas12:/tmp/cublas12
  do
    pack=${spec%%:*} target=${spec#*:}
    if ls "$pack"/[0-9]*/MANIFEST >/dev/null 2>&1; then
      install "$pack" "$target" || { say "$pack FAILED (above)"; [ "$pack" != .gpupack ] || rc=2; }
    else
      say "no $pack here (not carried): what needs it fails, named in the tables"
    fi
  done
  # The image's CPU onnxruntime shares the import name, and the runtime refuses two flavours
  # (runtime/ort_install.py); that machine is thrown away after the lease (never on one without a GPU).
  if [ -d /tmp/ort-gpu/onnxruntime ] && command -v nvidia-smi >/dev/null &&
      "$py" -m pip show -q onnxruntime >/dev/null 2>&1; then
    "$py" -m pip uninstall -y -q onnxruntime
  fi
  echo "export PYTHONPATH=/tmp/site:/tmp/ort-gpu\${PYTHONPATH:+:\$PYTHONPATH}" >> "$env"
  lib=/tmp/cublas12/nvidia/cublas/lib
  if [ ! -d "$lib" ] && [ "${CT2_CUBLAS_SHIM:-0}" = 1 ]; then
    # Untried (docs/gpu.md): the image's cuBLAS 13 under the names ctranslate2 dlopens; believe the
    # CTranslate2 rows only if ct2-float32's ids equal generate()'s.
    sites=$("$py" -c "import site; print(' '.join(site.getsitepackages()))")
    # shellcheck disable=SC2086  # the site folders, one word each
    so=$(find $sites -name 'libcublas.so.13*' 2>/dev/null | head -1)
    # shellcheck disable=SC2086
    lt=$(find $sites -name 'libcublasLt.so.13*' 2>/dev/null | head -1)
    if [ -n "$so" ] && [ -n "$lt" ]; then
      lib=/tmp/cublas-shim && mkdir -p $lib && ln -sfn "$so" $lib/libcublas.so.12 && ln -sfn "$lt" $lib/libcublasLt.so.12
      say "CT2_CUBLAS_SHIM: $lib/libcublas.so.12 -> $so, libcublasLt.so.12 -> $lt"
    fi
  fi
  [ -d "$lib" ] && echo "export LD_LIBRARY_PATH=$lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" >> "$env"
  # seq2onnx from this checkout without pip: the repository root is the package (pyproject's package-dir)
  if ! "$py" -c "import seq2onnx" 2>/dev/null; then
    mkdir -p /tmp/s2o && ln -sfn "$PWD" /tmp/s2o/seq2onnx && echo "export PYTHONPATH=/tmp/s2o:\$PYTHONPATH" >> "$env"
  fi
  last=$(ls -d .gpupack/[0-9]* 2>/dev/null | sort -t/ -k2 -n | tail -1)
  if [ -n "$last" ] && [ -f "$last/cmn.txt.xz" ]; then
    xz -dc "$last/cmn.txt.xz" > /tmp/cmn.txt && echo "export GPU_DATA=/tmp/cmn.txt" >> "$env"
  fi
  # shellcheck disable=SC1090
  (. "$env" && "$py" -c "
import importlib.metadata as md
for d in ('onnxruntime-gpu', 'onnxruntime', 'transformers', 'ctranslate2', 'nvidia-cublas-cu12', 'torch'):
    try: print('install:', d, md.version(d))
    except md.PackageNotFoundError: print('install:', d, 'absent')
import onnxruntime as o; o.preload_dlls(); print('install: providers', o.get_available_providers())") ||
    say "onnxruntime did not load (above): the steps that need it fail with their reason"
  return $rc
}

case "${1:-}" in
  -h|--help) sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
  --install) install "${2:-.gpupack}" "${3:-/tmp/ort-gpu}"; exit $? ;;
  --setup) cd "$(dirname "$0")/.." && setup "$2"; exit $? ;;
  --all)  # pinned as measured (docs/gpu.md); transformers' dependencies are the image's
    cd "$(dirname "$0")/.." || exit 1
    [ -d .gpupack/1 ] || bash "$0" onnxruntime-gpu==1.31.1 || exit 1
    for spec in .gpupack-hf:transformers==5.24.0 .gpupack-ct2:ctranslate2==4.8.5 \
                .gpupack-cublas12:nvidia-cublas-cu12==12.9.3.13; do
      out=${spec%%:*}
      [ -d "$out/1" ] && continue
      xz=1 && [ "$out" = .gpupack-cublas12 ] && xz=0  # 581 MB as published: split, not recompressed
      GPU_PACK_ANY=1 GPU_PACK_XZ=$xz GPU_DATA=/nonexistent GPU_PACK_OUT=$out bash "$0" "${spec#*:}" || exit 1
    done
    du -sb .gpupack*/[0-9]*; exit 0 ;;
esac
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
