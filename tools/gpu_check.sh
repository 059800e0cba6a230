#!/usr/bin/env bash
# The GPU check (docs/model.md, "The GPU path"): one prepared script for a machine with an
# NVIDIA GPU (under 8 minutes on one H200).
#
#   tools/gpu_check.sh            # on the GPU machine
#   tools/gpu_check.sh --dry-run  # here: the same steps on CPU at toy sizes (checks the script)
#
# 1. the model tests on the device (tests/model/test_device.py with RELAYKV_TEST_DEVICE):
#    logits vs transformers for Gemma-3 and Qwen3 checkpoints, paged == dense, EAGLE lossless;
# 2. benchmarks/bench_model.py --device: Gemma-3-270M shapes, random bf16 weights, prefill
#    tokens/s at 1k/8k/32k, decode tokens/s at batch 1/16/64, roofline ratios; one JSON line,
#    the script's last line of output.
# Needs python with torch (a CUDA build on the GPU machine) and relaykv's core dependencies;
# transformers for the logits test (skipped without it). PYTHON overrides the interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

dry_run=0
case "${1:-}" in
  --dry-run) dry_run=1 ;;
  "") ;;
  *) echo "usage: tools/gpu_check.sh [--dry-run]" >&2; exit 2 ;;
esac

if [[ $dry_run == 1 ]]; then
  device=cpu
  bench=(--device cpu --dtype float32 --prefill-lens 64,128 --decode-batches 1,2
         --decode-context 32 --decode-tokens 3 --peak-tflops 0 --hbm-tbps 0)
else
  if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu_check: torch sees no CUDA device (run with --dry-run for the CPU part)" >&2
    exit 1
  fi
  device=cuda
  bench=(--device cuda --dtype bfloat16 --prefill-lens 1024,8192,32768 --decode-batches 1,16,64
         --decode-context 1024 --decode-tokens 64)
fi

"$PY" -c 'import torch; print("gpu_check: torch", torch.__version__, "cuda", torch.version.cuda)' >&2
echo "gpu_check: 1/2 model tests on $device" >&2
RELAYKV_TEST_DEVICE=$device timeout 300 "$PY" -m pytest -q -p no:cacheprovider \
  tests/model/test_device.py >&2
echo "gpu_check: 2/2 bench_model on $device" >&2
timeout 240 "$PY" benchmarks/bench_model.py "${bench[@]}"
