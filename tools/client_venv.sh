#!/bin/bash
# Build a virtual environment with vLLM 0.33's `vllm bench serve` and SGLang's bench_serving
# for the third-party client tests (tests/bench/test_third_party_clients.py,
# docs/benchmarking.md). It never installs torch: everything is `--no-deps`, and a .pth file
# makes the project venv's packages (torch 2.13.0+cpu, transformers, aiohttp, ...) visible.
#   tools/client_venv.sh [VENV_DIR (default clientvenv)] [PROJECT_VENV (default .venv)]
# then: RELAYKV_CLIENT_VENV=VENV_DIR pytest tests/bench/test_third_party_clients.py
set -euo pipefail
VENV=${1:-clientvenv}
BASE=$(cd "${2:-.venv}" && pwd)
PY=$("$BASE/bin/python" -c 'import sys; print(sys.executable)')
"$PY" -m venv "$VENV"
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$BASE/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$SITE/zz_project_venv.pth"
# The import chains of `vllm bench serve` and `python -m sglang.bench_serving`, found by
# running them and installing each missing module (2026-12-01).
"$VENV/bin/pip" install --no-deps vllm==0.33.0 sglang==0.5.23 \
  cbor2 psutil openai-harmony cloudpickle pybase64 cachetools uvloop py-cpuinfo \
  partial-json-parser xgrammar apache-tvm-ffi llguidance watchfiles einops \
  triton ipython traitlets datasets multiprocess pandas pyarrow dill sentencepiece \
  compressed-tensors loguru
"$VENV/bin/vllm" bench serve --help > /dev/null
echo "client venv ready: RELAYKV_CLIENT_VENV=$VENV"
