#!/usr/bin/env bash
# The GPU checks of a session with a lent GPU, in one command (device time is scarce):
# build the native CPU kernels, run the `gpu` tests, the kernel bench, and one planned plan for
# real on the GPU with --verify. JSON results go to $OUT (default ./gpu-out), logs to $LOGS.
#
#   bash bench/gpu_session.sh [stage ...]     stages: info build diag test bench executor profile validate run
#                                             (default: info build test bench executor run)
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
stages=${*:-info build test bench executor run}
t0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }

for s in $stages; do
  case $s in
  info)
    stamp info
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    $PY -c "import torch,sys;print('python',sys.version.split()[0],'torch',torch.__version__,'cuda',torch.version.cuda,torch.cuda.get_device_name(0))"
    echo "CUDA_HOME=$CUDA_HOME"; nvcc --version | tail -2
    ;;
  build)
    stamp build
    $PY -m csrc.build -v >"$LOGS/build.log" 2>&1; rc=$?; tail -5 "$LOGS/build.log"; echo "build rc=$rc"
    $PY -m picasso doctor --json >"$LOGS/doctor.json" 2>&1; cat "$LOGS/doctor.json"
    ;;
  test)
    stamp test
    $PY -m pytest -q -p no:cacheprovider tests/test_kernels_dispatch.py \
      tests/test_kernels_native.py tests/test_executor_precision.py ${PYTEST_K:+-k "$PYTEST_K"} 2>&1 | tee "$LOGS/gpu_tests.log" | tail -25
    ;;
  bench)
    stamp bench
    $PY bench/bench_kernels.py --repeats 20 --threads 16 -o "$OUT/kernels_gpu.json" 2>&1 | tee "$LOGS/bench_kernels.log"
    ;;
  diag)  # native errors raised across the library boundary, each in its own process
    stamp diag
    for w in kernel_throw torch_check; do $PY bench/native_errors_check.py $w 2>&1 | tail -4; done
    ldd csrc/_build/*/picasso_native.so | grep -E "stdc|gcc_s|gomp"; echo "CXX=${CXX:-} CC=${CC:-}"
    /opt/gcc/bin/g++ --version | head -1; /usr/bin/g++ --version | head -1
    $PY -c "import torch,glob,os;print(glob.glob(os.path.join(os.path.dirname(torch.__file__),'lib','libgomp*')))"
    ;;
  executor)  # issue 13's goals: the planner's plan vs its prediction and vs plain PyTorch
    stamp executor
    $PY -m pytest -q -p no:cacheprovider tests/test_executor_sync_budget.py 2>&1 | tail -3
    $PY bench/bench_executor_gpu.py -o "$OUT/executor_gpu.json" 2>&1 | tee "$LOGS/bench_executor_gpu.log"
    ;;
  profile)
    stamp profile
    $PY bench/profile_cuda_step.py --batch 4096 2>&1 | tee "$LOGS/profile_4k.log" | cut -c1-160 | head -80
    ;;
  validate)
    stamp validate
    d=$(mktemp -d)
    $PY -m picasso synth --preset criteo-kaggle --rows 100000 -o "$d/data.tsv" --seed 0 >/dev/null
    timeout 60 $PY -m picasso calibrate --nproc 1 --base dgx-h100 -o "$OUT/hw_h100.json" 2>&1 | tail -3
    timeout ${VALIDATE_S:-300} $PY -m picasso validate --data "$d/data.tsv" --format criteo --hardware "$OUT/hw_h100.json" \
      --row-cap 1000000 --plans ${VALIDATE_PLANS:-16} --fit-plans ${VALIDATE_FIT:-4} --nproc-max 1 --batch-sizes 1024,4096,16384 \
      --steps 5 --warmup 2 -o "$d/val" --results "$OUT/validate_h100.json" --json 2>&1 >/dev/null | tee "$LOGS/validate.err" | grep -E "measured|failed"
    echo "validate rc=${PIPESTATUS[0]}"; tail -4 "$LOGS/validate.err"
    ;;
  run)
    stamp run
    d=$(mktemp -d)
    $PY -m picasso synth --preset criteo-kaggle --rows 200000 -o "$d/data.tsv" --seed 1 >/dev/null
    $PY -m picasso analyze "$d/data.tsv" --format criteo -o "$d/profile.json" >/dev/null
    $PY -m picasso plan --model dlrm-criteo-kaggle --hardware dgx-h100 --set gpus_per_node=1 --row-cap 1000000 --profile "$d/profile.json" \
      --batch-size 4096 -o "$d/plan.json" --explain 2>&1 | tail -30
    $PY -m picasso run "$d/plan.json" --data "$d/data.tsv" --format criteo --nproc 1 --steps 4 --verify \
      --json >"$LOGS/run_verify.json" 2>"$LOGS/run_verify.err"; echo "verify rc=$?"; tail -3 "$LOGS/run_verify.err"
    $PY -c "import json;d=json.load(open('$LOGS/run_verify.json'));print({k:v for k,v in d.items() if 'verif' in k or k in ('backend','device','samples_per_s')})"
    $PY -m picasso run "$d/plan.json" --data "$d/data.tsv" --format criteo --nproc 1 --steps 40 --preload \
      --trace "$LOGS/run_trace.json" --json >"$LOGS/run.json" 2>"$LOGS/run.err"; echo "run rc=$?"
    tail -3 "$LOGS/run.err"; head -c 2000 "$LOGS/run.json"; echo
    cp "$d/plan.json" "$OUT/plan_gpu.json"
    ;;
  esac
done
stamp done
