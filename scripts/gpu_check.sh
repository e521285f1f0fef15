#!/usr/bin/env bash
# The GPU check of issue 39 in one call (docs/gpu.md): install the carried onnxruntime-gpu, then
# scripts/gpu_check.py's steps (train, export, tests, verify, copies, bench); tables and logs under $OUT.
#
#   bash scripts/gpu_check.sh           on the GPU machine, in the call that carries the last folder
#                                          of .gpupack/ (scripts/gpu_pack.sh), after the calls that
#                                          carried the others
#   bash scripts/gpu_check.sh --cpu     the same steps on the CPU provider, a tiny model (CI runs this)
#   bash scripts/gpu_check.sh --install-only [PACK TARGET]
#                                          join the parts, check every sha256, pip install --target
#
# OUT (default /tmp/gpu-check-out) gets summary.md, results.json, logs.tar.xz, and install.log in gpu mode.
# GPU_CHECK_BUDGET_S (default 440) bounds the Python steps; the install takes ~20 s before them.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1

say() { echo "install: $*"; }

# install PACK TARGET: the parts in order, each checked against MANIFEST, then the wheel; pip --target.
install() {
  local pack=$1 target=$2 manifest n name d f want got
  manifest=$(ls "$pack"/[0-9]*/MANIFEST 2>/dev/null | head -1)
  if [ -z "$manifest" ]; then
    say "no $pack/N/MANIFEST: carry the folders that scripts/gpu_pack.sh wrote"
    return 2
  fi
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
  if [ "$(awk '$1 == "compression" {print $2}' "$manifest")" = none ]; then  # gpu_pack.sh GPU_PACK_XZ=0
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

mode=gpu
case "${1:-}" in
  --cpu) mode=cpu ;;
  --install-only) install "${2:-.gpupack}" "${3:-/tmp/ort-gpu}"; exit $? ;;
  "") ;;
  *) echo "usage: bash scripts/gpu_check.sh [--cpu | --install-only [PACK TARGET]]"; exit 2 ;;
esac
OUT=${OUT:-/tmp/gpu-check-out}
mkdir -p "$OUT"
work=${GPU_CHECK_WORK:-/tmp/gpu-check-work}
mkdir -p "$work"
data=()
if [ "$mode" = gpu ]; then
  t0=$(date +%s)
  install .gpupack /tmp/ort-gpu > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 2; }
  {  # braces, not a subshell: the exports below stay for the check
    # The image's CPU onnxruntime shares the import name `onnxruntime`, and the runtime refuses two
    # flavours (runtime/ort_install.py): this machine is thrown away after the lease.
    if "$py" -m pip show -q onnxruntime >/dev/null 2>&1; then "$py" -m pip uninstall -y -q onnxruntime; fi
    export PYTHONPATH=/tmp/ort-gpu${PYTHONPATH:+:$PYTHONPATH}
    # seq2onnx from this checkout without pip (nothing can be fetched there): the repository root is the
    # package `seq2onnx` (pyproject.toml's package-dir), so a link named seq2onnx to it is importable.
    if ! "$py" -c "import seq2onnx" 2>/dev/null; then
      mkdir -p /tmp/s2o && ln -sfn "$root" /tmp/s2o/seq2onnx && export PYTHONPATH=/tmp/s2o:$PYTHONPATH
    fi
    "$py" -c "import onnxruntime as o; o.preload_dlls(); print(o.__version__, o.get_available_providers())"
    last=$(ls -d .gpupack/[0-9]* | sort -t/ -k2 -n | tail -1)
    if [ -f "$last/cmn.txt.xz" ]; then
      xz -dc "$last/cmn.txt.xz" > "$work/cmn.txt" && echo "data: Tatoeba cmn.txt"
    fi
    echo "install took $(( $(date +%s) - t0 )) s"
  } >> "$OUT/install.log" 2>&1
  cat "$OUT/install.log"
  [ -f "$work/cmn.txt" ] && data=(--data "$work/cmn.txt")
fi
budget=${GPU_CHECK_BUDGET_S:-$([ "$mode" = gpu ] && echo 440 || echo 600)}
exec "$py" scripts/gpu_check.py --mode "$mode" --out "$OUT" --work "$work" "${data[@]}" \
  --budget-s "$budget"
