#!/bin/bash
# Build the side venv for relaykv's vLLM plugin (src/relaykv/vllm, docs/vllm.md): vLLM 0.33.0
# itself `--no-deps` plus the Python packages its scheduler, KV cache manager and KV connector
# code import on a CPU machine. It never installs torch: a .pth file makes the project venv's
# packages (torch 2.13.0+cpu, numpy, transformers, ...) and relaykv itself visible, so the CPU
# torch is reused and a CUDA build is never pulled.
#   tools/vllm_venv.sh [VENV_DIR (default .venv-vllm)] [PROJECT_VENV (default .venv)]
# then: RELAYKV_VLLM_VENV=VENV_DIR pytest tests/vllm  (the tests find .venv-vllm by default)
set -euo pipefail
VENV=${1:-.venv-vllm}
BASE=$(cd "${2:-.venv}" && pwd)
PY=$("$BASE/bin/python" -c 'import sys; print(sys.executable)')
"$PY" -m venv "$VENV"
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# `site.addsitedir`, not a bare path line: a bare line adds the directory but skips the .pth
# files inside it, and relaykv's editable install is one of those (CI: "No module named
# 'relaykv'" in a fresh clone).
BASE_SITE=$("$BASE/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "import site; site.addsitedir('$BASE_SITE')" > "$SITE/zz_project_venv.pth"
# vLLM's import chain for vllm.v1.core.sched, vllm.v1.core.kv_cache_manager and
# vllm.distributed.kv_transfer (scheduler half), found by importing them and installing each
# missing module (2026-12-03).
"$VENV/bin/pip" install --quiet --no-deps vllm==0.33.0 \
  cbor2 psutil openai-harmony cloudpickle pybase64 cachetools uvloop py-cpuinfo \
  prometheus-client partial-json-parser xgrammar apache-tvm-ffi llguidance watchfiles einops \
  orjson msgspec blake3 gguf
"$VENV/bin/python" -c "import vllm; assert vllm.__version__ == \"0.33.0\", vllm.__version__"
echo "vLLM venv ready: $VENV"
