#!/usr/bin/env bash
# The GPU checks of a session with a lent GPU, in one command (device time is scarce). The default
# (about 8 minutes on one H200): the kernel tests compiled for CUDA (Triton embedding and
# interaction kernels, the native library's bad-input checks, CUDA graph, fused MLP, precision),
# the executor bench (dlrm-criteo-kaggle tf32 at 4096/16384/65536, dlrm-mlperf bf16 at 65536,
# dcn-v2/deepfm/wide-deep tf32 at 16384, each against the planner's prediction and plain PyTorch),
# the step floor of the same plans with the kernels a step launches, and a profile of one steady
# step. JSON results go to $OUT (default ./gpu-out; at most 8 files, the logs as one logs.tgz),
# long logs to $LOGS. Knobs: TEST_S GPU_TESTS PYTEST_K EMB_DIMS EXECUTOR_S STEPS EXECUTOR_ARGS
# (more bench_executor_gpu.py flags) EXECUTOR_VARIANT (its output's suffix) FLOOR_S FLOOR_ARGS HW_FILE (floor rates)
# OVERHEAD_BATCHES PROFILE_S VERIFY_BATCH VERIFY_S HOST_TEST_S HOST_S HOST_STEPS CALIBRATE_S VALIDATE_S VALIDATE_PLANS
# VALIDATE_FIT HW.
#
#   bash bench/gpu_session.sh [stage ...]     stages: info test executor floor profile pack (the default),
#                                             embedding overhead verify host calibrate validate
#
# Packages the GPU image lacks (simpy, plotly) travel as wheels in an ignored .whl/ folder:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl simpy plotly
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
LOGS=${LOGS:-/tmp/picasso-gpu-logs}  # long logs; results (JSON) go to $OUT
mkdir -p "$OUT" "$LOGS"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD
fi
if [ -z "${CUDA_HOME:-}" ] && command -v nvcc >/dev/null; then
  CUDA_HOME=$(dirname "$(dirname "$(command -v nvcc)")"); export CUDA_HOME
fi
export MAX_JOBS=${MAX_JOBS:-16} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
PY=python3
stages=${*:-info test executor floor profile pack}
WORK=${WORK:-$(mktemp -d)}  # data and plans shared by the executor, floor and profile stages
t0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }

for s in $stages; do
  case $s in
  info)
    stamp info
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    $PY -c "import torch,sys,triton;print('python',sys.version.split()[0],'torch',torch.__version__,'triton',triton.__version__,'cuda',torch.version.cuda,torch.cuda.get_device_name(0))"
    ;;
  test)  # on the GPU the kernels run compiled: the ahead-of-time sm_90 builds (for CPU-only CI) are left out
    stamp test
    timeout ${TEST_S:-120} $PY -m pytest -q -p no:cacheprovider -m "not dist" ${GPU_TESTS:-tests/test_interaction_triton.py \
      tests/test_kernels_triton.py tests/test_kernels_native.py tests/test_dense_mlp_fused.py tests/test_dense_cross_fused.py \
      tests/test_cuda_graph.py \
      tests/test_dense_bf16_gemms.py tests/test_executor_precision.py} -k "${PYTEST_K:-not for_hopper}" 2>&1 \
      | tee "$LOGS/gpu_tests.log" | tail -15
    ;;
  embedding)  # the pack's embedding kernels alone, Triton against torch, and the byte floor
    stamp embedding
    for dim in ${EMB_DIMS:-16 128}; do
      timeout 60 $PY bench/bench_embedding_gpu.py --dim $dim -o "$OUT/embedding_gpu_d$dim.json" 2>&1 | tail -16
    done
    ;;
  executor)
    stamp executor
    timeout ${EXECUTOR_S:-235} $PY bench/bench_executor_gpu.py --steps ${STEPS:-12} --variants graph --work "$WORK" \
      --extra-variant compiled --extra-models dlrm-criteo-kaggle \
      --models dlrm-criteo-kaggle,dlrm-mlperf,dcn-v2,deepfm,wide-deep ${EXECUTOR_ARGS:-} \
      -o "$OUT/executor_gpu${EXECUTOR_VARIANT:+-$EXECUTOR_VARIANT}.json" 2>&1 \
      | tee "$LOGS/bench_executor_gpu.log" | grep -v "^$"
    ;;
  floor)  # the same plans' step floor (h200 preset rates, or HW_FILE's), their measured steps, kernels per step
    stamp floor
    hwf=${HW_FILE:-}; if [ -z "$hwf" ] && [ -f "$OUT/hw_gpu.json" ]; then hwf=$OUT/hw_gpu.json; fi  # calibrate's, if it ran
    timeout ${FLOOR_S:-70} $PY bench/bench_step_floor.py --work "$WORK" --executor-json "$OUT/executor_gpu.json" \
      --mlperf-row-cap 1000000 ${hwf:+--hardware "$hwf"} ${FLOOR_ARGS:-} -o "$OUT/step_floor.json" 2>&1 \
      | tee "$LOGS/step_floor.log" | grep -v "Warn"
    ;;
  pack)  # every log in one file ($OUT holds at most 8)
    stamp pack
    tar -czf "$OUT/logs.tgz" -C "$LOGS" . 2>/dev/null; ls "$OUT"
    ;;
  overhead)  # host time against GPU time of a step, eager and as a CUDA graph; the graph's own line in a real run
    stamp overhead
    d=$(mktemp -d)
    $PY -m picasso synth --preset criteo-kaggle --rows 70000 -o "$d/data.tsv" --seed 1 >/dev/null
    $PY -m picasso analyze "$d/data.tsv" --format criteo -o "$d/profile.json" >/dev/null
    for b in ${OVERHEAD_BATCHES:-4096 65536}; do
      $PY -m picasso plan --model dlrm-criteo-kaggle --hardware ${HW:-h200} --set gpus_per_node=1 --profile "$d/profile.json" \
        --batch-size $b --dense-dtype tf32 -o "$d/plan$b.json" >/dev/null
      timeout 60 $PY bench/step_overhead_gpu.py "$d/plan$b.json" --data "$d/data.tsv" -o "$OUT/step_overhead_$b.json" 2>&1 \
        | grep -v Warn | tail -22
    done
    timeout 60 $PY -m picasso run "$d/plan4096.json" --data "$d/data.tsv" --format criteo --nproc 1 --steps 30 --preload \
      --cuda-graph on --json >"$LOGS/graph_run.json" 2>"$LOGS/graph_run.err"; echo "graph run rc=$?"; grep -i "graph\|error" "$LOGS/graph_run.err" | head -5
    $PY -c "import json;d=json.load(open('$LOGS/graph_run.json'));print(d['samples_per_s'], d['iteration_ms'])" 2>/dev/null
    ;;
  profile)  # one steady step of the kaggle plan at 65536 (the executor stage's), Triton against torch kernels
    stamp profile
    if [ ! -f "$WORK/dlrm-criteo-kaggle-65536-full.json" ]; then
      $PY -m picasso synth --preset criteo-kaggle --rows 70000 -o "$WORK/data.tsv" --seed 1 >/dev/null
      $PY -m picasso analyze "$WORK/data.tsv" --format criteo -o "$WORK/profile.json" >/dev/null
      $PY -m picasso plan --model dlrm-criteo-kaggle --hardware ${HW:-h200} --set gpus_per_node=1 --profile "$WORK/profile.json" \
        --batch-size 65536 --dense-dtype tf32 -o "$WORK/dlrm-criteo-kaggle-65536-full.json" >/dev/null
    fi
    timeout ${PROFILE_S:-40} $PY bench/profile_gpu_step.py "$WORK/dlrm-criteo-kaggle-65536-full.json" --data "$WORK/data.tsv" \
      -o "$OUT/profile_gpu_step.json" 2>&1 | grep -v Warning | cut -c1-150
    ;;
  verify)
    stamp verify
    d=$(mktemp -d)
    $PY -m picasso synth --preset criteo-kaggle --rows 60000 -o "$d/data.tsv" --seed 1 >/dev/null
    $PY -m picasso analyze "$d/data.tsv" --format criteo -o "$d/profile.json" >/dev/null
    for tdt in fp32 fp16; do
      $PY - "$tdt" "$d" <<'PY'
import json, sys
from planner.presets import get_model
m = get_model("dlrm-criteo-kaggle").to_dict()
for t in m["tables"]:
    t["dtype"] = sys.argv[1]
json.dump(m, open(f"{sys.argv[2]}/model-{sys.argv[1]}.json", "w"))
PY
      $PY -m picasso plan --model "$d/model-$tdt.json" --hardware ${HW:-h200} --set gpus_per_node=1 --row-cap 1000000 \
        --profile "$d/profile.json" --batch-size ${VERIFY_BATCH:-16384} -o "$d/plan-$tdt.json" >/dev/null 2>"$LOGS/plan-$tdt.err" || tail -2 "$LOGS/plan-$tdt.err"
      timeout ${VERIFY_S:-90} $PY -m picasso run "$d/plan-$tdt.json" --data "$d/data.tsv" --format criteo --nproc 1 --steps 3 --verify \
        --json >"$OUT/verify_$tdt.json" 2>"$LOGS/verify_$tdt.err"; echo "verify $tdt rc=$?"; tail -2 "$LOGS/verify_$tdt.err"
      $PY -c "import json;d=json.load(open('$OUT/verify_$tdt.json'));print({k:v for k,v in d.items() if 'verif' in k})" 2>/dev/null
    done
    ;;
  host)  # host-placed rows mapped into the GPU: the mapping's own test, then the host plan against its all-HBM twin
    stamp host
    timeout ${HOST_TEST_S:-60} $PY -m pytest -q -p no:cacheprovider tests/test_host_access.py 2>&1 | tail -3
    timeout ${HOST_S:-300} $PY bench/bench_host_placement.py --device cuda --steps ${HOST_STEPS:-12} \
      --out "$OUT/host_placement.json" 2>&1 | grep -v Warn | tail -8
    ;;
  calibrate)
    stamp calibrate
    timeout ${CALIBRATE_S:-120} $PY -m picasso calibrate --device cuda --base ${HW:-h200} -o "$OUT/hw_gpu.json" 2>&1 | tail -5
    ;;
  validate)
    stamp validate
    d=$(mktemp -d)
    $PY -m picasso synth --preset criteo-kaggle --rows 300000 -o "$d/data.tsv" --seed 0 >/dev/null
    timeout ${VALIDATE_S:-300} $PY -m picasso validate --data "$d/data.tsv" --format criteo --hardware "$OUT/hw_gpu.json" \
      --nproc-max 1 --batch-sizes 1024,4096,16384,65536 --plans ${VALIDATE_PLANS:-20} --fit-plans ${VALIDATE_FIT:-6} \
      --variants gpu --steps 5 --max-steps 10 --timed-seconds 0.3 --warmup 2 --repeats 1 --run-timeout 45 \
      -o "$d/val" --results "$OUT/validate_gpu.json" --json 2>&1 >/dev/null | tee "$LOGS/validate.err" | grep -E "measured|failed|MAPE|Spearman"
    echo "validate rc=${PIPESTATUS[0]}"; tail -4 "$LOGS/validate.err"
    ;;
  esac
done
stamp done
