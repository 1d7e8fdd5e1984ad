#!/usr/bin/env bash
# The GPU checks of a session with a lent GPU, in one command (device time is scarce):
# build the CUDA kernels, run the `gpu` tests, the kernel bench, and one planned plan for
# real on the GPU with --verify. Logs and JSON go to $OUT (default ./gpu-out).
#
#   bash bench/gpu_session.sh [stage ...]     stages: info build test bench run (default: all)
#
# Packages the GPU image lacks (simpy, plotly) travel as wheels in .whl/ (see bench/README.md).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
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
stages=${*:-info build test bench run}
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
    $PY -m csrc.build -v >"$OUT/build.log" 2>&1; rc=$?; tail -5 "$OUT/build.log"; echo "build rc=$rc"
    $PY -m picasso doctor --json >"$OUT/doctor.json" 2>&1; cat "$OUT/doctor.json"
    ;;
  test)
    stamp test
    $PY -m pytest -q -p no:cacheprovider tests/test_kernels_cuda.py tests/test_kernels_dispatch.py \
      tests/test_kernels_native.py tests/test_executor_precision.py -m "gpu or not gpu" 2>&1 | tee "$OUT/gpu_tests.log" | tail -25
    ;;
  bench)
    stamp bench
    $PY bench/bench_kernels.py --repeats 20 --threads 16 -o "$OUT/kernels_gpu.json" 2>&1 | tee "$OUT/bench_kernels.log"
    ;;
  run)
    stamp run
    d=$(mktemp -d)
    $PY -m picasso synth --preset criteo-kaggle --rows 200000 -o "$d/data.tsv" --seed 1 >/dev/null
    $PY -m picasso analyze "$d/data.tsv" --format criteo -o "$d/profile.json" >/dev/null
    $PY -m picasso plan --model dlrm-criteo-kaggle --hardware dgx-h100 --set gpus_per_node=1 --row-cap 1000000 --profile "$d/profile.json" \
      --batch-size 4096 -o "$d/plan.json" --explain 2>&1 | tail -30
    $PY -m picasso run "$d/plan.json" --data "$d/data.tsv" --format criteo --nproc 1 --steps 4 --verify \
      --json >"$OUT/run_verify.json" 2>"$OUT/run_verify.err"; echo "verify rc=$?"; tail -3 "$OUT/run_verify.err"
    $PY -c "import json;d=json.load(open('$OUT/run_verify.json'));print({k:v for k,v in d.items() if 'verif' in k or k in ('backend','device','samples_per_s')})"
    $PY -m picasso run "$d/plan.json" --data "$d/data.tsv" --format criteo --nproc 1 --steps 40 --preload \
      --trace "$OUT/run_trace.json" --json >"$OUT/run.json" 2>"$OUT/run.err"; echo "run rc=$?"
    tail -3 "$OUT/run.err"; head -c 2000 "$OUT/run.json"; echo
    cp "$d/plan.json" "$OUT/plan_gpu.json"
    ;;
  esac
done
stamp done
