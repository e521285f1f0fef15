#!/usr/bin/env bash
# The GPU check of issue 39 in one call (docs/gpu.md): the package's own commands on the CUDA provider.
#
#   bash scripts/gpu_check.sh          on the GPU machine, in the call that carries .gpupack's last folder
#   bash scripts/gpu_check.sh --cpu    the same steps on the CPU provider, a tiny model (tests/test_gpu_check.py)
#
# Steps, each with its own time limit inside GPU_CHECK_BUDGET_S (default 440 s; 1200 with --cpu); one whose
# input failed, or that the budget does not reach, is "not run":
#   env         versions, providers, nvidia-smi; on the GPU it stops the check if CUDA cannot run
#   train       seq2onnx train --device cuda, the README's Tatoeba recipe (GPU_DATA) for one minute
#   export-*    seq2onnx export, fp32 and --dtype float16
#   tests       pytest -m gpu tests/test_gpu.py: ids against PyTorch (greedy, beam 4), fp16 verify, copies
#               per step (IO binding, Memcpy nodes, CUPTI), both decoders, training (each skips off CUDA)
#   verify-*    seq2onnx verify --device cuda on both bundles (tensors, greedy ids, BLEU)
#   bench       seq2onnx bench with the CUDA engines (ours fp32/fp16, CTranslate2 where it loads)
# OUT (default /tmp/gpu-check-out) gets summary.md (each step's status and output) and logs.tar.xz (logs,
# verify's and bench's JSON, pytest's junit XML), written after every step; install.log on the GPU.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
mode=gpu dev=cuda
case "${1:-}" in
  --cpu) mode=cpu dev=cpu; export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} ;;  # tiny models: one thread
  -h|--help) sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
  "") ;;
  *) echo "usage: bash scripts/gpu_check.sh [--cpu]"; exit 2 ;;
esac
OUT=${OUT:-/tmp/gpu-check-out} work=${GPU_CHECK_WORK:-/tmp/gpu-check-work}
mkdir -p "$OUT" "$work/logs" && OUT=$(cd "$OUT" && pwd)
if [ $mode = gpu ]; then
  bash scripts/gpu_pack.sh --setup "$work/env.sh" > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 2; }
  cat "$OUT/install.log"
  # shellcheck disable=SC1091
  . "$work/env.sh"
  budget=${GPU_CHECK_BUDGET_S:-440} n=500 tensor=50 threads=$(nproc)
  if [ -f "${GPU_DATA:-}" ]; then data=(--data "$GPU_DATA" --src-col 1 --tgt-col 0 --vocab-size 3000)
  else data=(--pairs 20000 --vocab-size 1000); fi
  train=(--d-model 256 --heads 4 --layers 3 --d-ff 1024 --max-minutes 1 --max-steps 100000 --eval-every 1000
         --bleu-sentences 200 "${data[@]}")
  bench=(--engines onnx-cuda-fp32,onnx-cuda-fp16,ct2-cuda-fp32,ct2-cuda-fp16 --sentences 100)
else
  budget=${GPU_CHECK_BUDGET_S:-1200} n=24 tensor=4 threads=1
  train=(--pairs 3000 --valid-size 50 --test-size 50 --vocab-size 120 --max-len 40 --d-model 32 --heads 4
         --layers 2 --d-ff 64 --dropout 0 --max-tokens 1500 --warmup 100 --lr 2.0 --max-steps 150
         --eval-every 150 --bleu-sentences 10)
  bench=(--engines onnx-cpu-fp32,ct2-cpu-fp32 --quick)
fi
s2o=("$py" -m seq2onnx.commands) t0=$(date +%s) steps=() failed=0
declare -A status seconds

# step NAME LIMIT NEEDS COMMAND...: runs COMMAND with its output in logs/NAME.log; then the summary again.
step() {
  local name=$1 limit=$2 need=$3 left start rc
  shift 3
  steps+=("$name") left=$(( t0 + budget - $(date +%s) ))
  [ $mode = cpu ] && limit=$(( limit * 2 ))  # a busy shared CPU: generous bounds
  if [ -n "$need" ] && [ "${status[$need]:-}" != ok ]; then status[$name]="not run: needs $need"
  elif [ $left -lt 10 ]; then status[$name]="not run: the budget ($budget s) was spent"
  else
    echo "[gpu_check $(( $(date +%s) - t0 )) s] $name ..."
    [ "$limit" -gt "$left" ] && limit=$left
    start=$(date +%s)
    echo "\$ $*" > "$work/logs/$name.log"
    timeout --kill-after=10 "$limit" "$@" >> "$work/logs/$name.log" 2>&1
    rc=$? seconds[$name]=$(( $(date +%s) - start ))
    if [ $rc = 0 ]; then status[$name]=ok
    elif [ $rc = 124 ]; then status[$name]="failed: timed out after $limit s"
    else status[$name]="failed (exit $rc): $(tail -n 1 "$work/logs/$name.log" | cut -c1-200)"; fi
  fi
  [ "${status[$name]}" = ok ] || failed=1
  echo "[gpu_check $(( $(date +%s) - t0 )) s] $name: ${status[$name]}"
  summary
}

summary() {
  local name
  {
    echo "# GPU check ($mode, $(git rev-parse --short HEAD 2>/dev/null), $(date -u '+%Y-%m-%d %H:%M UTC'))"
    echo; echo "| step | status | seconds |"; echo "|---|---|---|"
    for name in "${steps[@]}"; do echo "| $name | ${status[$name]} | ${seconds[$name]:-} |"; done
    for name in "${steps[@]}"; do
      [ -f "$work/logs/$name.log" ] || continue
      echo; echo "## $name"; echo; echo '```'
      tr '\r' '\n' < "$work/logs/$name.log" | grep -v '^\s*$' | tail -n 60; echo '```'
    done
  } > "$OUT/summary.md"
  # shellcheck disable=SC2046  # the JSON and XML files, one word each
  (cd "$work" && tar -cJf "$OUT/logs.tar.xz" logs $(ls -- *.json *.xml 2>/dev/null))
}

check_env="import onnxruntime as o, seq2onnx.runtime.devices as d; print(o.__version__, o.get_available_providers())
ok, why = d.cuda_usable(); print('CUDA usable:', ok, why); assert ok or '$mode' == 'cpu', why"
step env 60 "" bash -c "$py -c \"$check_env\"; [ $mode = cpu ] || nvidia-smi"
step train 150 env "${s2o[@]}" train "$work/run" --device $dev --force "${train[@]}"
for b in fp32 fp16; do
  step "export-$b" 120 train "${s2o[@]}" export "$work/run/best" "$work/$b" --force \
    $([ $b = fp16 ] && echo --dtype float16)
done
step tests 150 env "$py" -m pytest -q -n0 -rs -m gpu -p no:cacheprovider --junitxml="$work/tests.xml" \
  tests/test_gpu.py
for b in fp32 fp16; do
  step "verify-$b" 100 "export-$b" "${s2o[@]}" verify "$work/run/best" "$work/$b" --device $dev --quiet \
    --sentences $n --tensor-sentences $tensor --json "$work/verify-$b.json"
done
step bench 180 train "${s2o[@]}" bench "$work/run/best" "${bench[@]}" --threads "$threads" \
  --bundle-dir "$work/bench-bundles" --json "$work/bench.json"
cat "$OUT/summary.md"
exit $failed
