#!/usr/bin/env bash
# Compile-check every CUDA source of csrc/ for sm_80 and sm_90 (no torch needed: the .cu files
# use raw pointers only). Skips with a message when nvcc is absent. Usage: csrc/check_cuda.sh
set -euo pipefail
cd "$(dirname "$0")"
NVCC="${NVCC:-$(command -v nvcc || true)}"
if [ -z "$NVCC" ] && [ -n "${CUDA_HOME:-}" ] && [ -x "$CUDA_HOME/bin/nvcc" ]; then
  NVCC="$CUDA_HOME/bin/nvcc"
fi
if [ -z "$NVCC" ]; then
  echo "check_cuda: nvcc not found (set CUDA_HOME or PATH); skipping the CUDA compile check"
  exit 0
fi
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
status=0
shopt -s nullglob
for src in *.cu; do
  for arch in 80 90; do
    if "$NVCC" -c -std=c++17 -O3 -I. \
        -gencode "arch=compute_${arch},code=sm_${arch}" \
        -Xcompiler -Wall -Werror all-warnings \
        "$src" -o "$out/${src%.cu}.sm${arch}.o"; then
      echo "check_cuda: $src sm_${arch} ok"
    else
      echo "check_cuda: $src sm_${arch} FAILED"
      status=1
    fi
  done
done
exit "$status"
