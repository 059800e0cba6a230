#!/bin/bash
# Run vLLM 0.33.0's own scheduler, prefix-caching, hybrid-allocator and KV-connector
# scheduler-side unit tests three times: without relaykv.vllm (stock), with it (its default
# per-group policy) and with it under pd_policy=legacy (which must be stock vLLM exactly);
# then compare (docs/vllm.md "vLLM's own tests"). vLLM's tests ship in its sdist only: pip downloads it (its metadata
# step needs setuptools-rust and the version override). Needs the vLLM venv (tools/vllm_venv.sh).
#   tools/vllm_own_tests.sh [WORKDIR (default a temp dir)] [TEST PATHS...]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${RELAYKV_VLLM_PYTHON:-$ROOT/.venv-vllm/bin/python}
WORK=${1:-$(mktemp -d -t relaykv-vllm-own-XXXX)}
shift || true
TESTS=("$@")
if [ ${#TESTS[@]} -eq 0 ]; then
  TESTS=(tests/v1/core/test_scheduler.py tests/v1/core/test_prefix_caching.py
         tests/v1/core/test_single_type_kv_cache_manager.py
         tests/v1/core/test_swa_inflight_window_free.py
         tests/v1/kv_connector/unit/test_remote_prefill_lifecycle.py
         tests/v1/kv_connector/unit/test_remote_decode_lifecycle.py
         tests/v1/kv_connector/unit/test_nixl_connector_hma.py)
fi
mkdir -p "$WORK"
if [ ! -d "$WORK/vllm-0.33.0/tests" ]; then
  # A throwaway venv for the download (vLLM's setup needs a recent setuptools, setuptools-rust
  # and torch: the vLLM venv's packages are made visible, nothing is installed there).
  "$PY" -m venv "$WORK/dl"
  "$PY" -c 'import sys; print("\n".join(p for p in sys.path if p.endswith("-packages")))' \
    > "$("$WORK/dl/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz.pth"
  "$WORK/dl/bin/pip" install --quiet setuptools-rust setuptools-scm "setuptools>=77"
  VLLM_VERSION_OVERRIDE=0.33.0 "$WORK/dl/bin/pip" download --quiet --no-deps --no-binary :all: \
    --no-build-isolation vllm==0.33.0 -d "$WORK"
  tar xzf "$WORK/vllm-0.33.0.tar.gz" -C "$WORK" vllm-0.33.0/tests
  # vLLM's top-level conftest wants its GPU test fixtures; the unit tests here need none.
  mv "$WORK/vllm-0.33.0/tests/conftest.py" "$WORK/vllm-0.33.0/tests/conftest.py.off"
fi
# Our plugins go in as their own package: vLLM's tests are the package `tests`.
mkdir -p "$WORK/shim/relaykv_own_suite"
cp "$ROOT"/tests/vllm/own_suite_*.py "$WORK/shim/relaykv_own_suite/"
touch "$WORK/shim/relaykv_own_suite/__init__.py"
cd "$WORK/vllm-0.33.0"
export PYTHONPATH="$ROOT/src:$WORK/shim" VLLM_LOGGING_LEVEL=ERROR HF_HOME="$WORK/hf" HF_HUB_OFFLINE=1
# One pytest session per file: vLLM's test helpers register connectors at import and
# clash when two directories share a session.
for mode in stock plugin legacy; do
  extra=(-p relaykv_own_suite.own_suite_env)
  [ $mode != stock ] && extra+=(-p relaykv_own_suite.own_suite_plugin)
  settings=""
  [ $mode = legacy ] && settings='{"pd_policy": "legacy"}'
  for i in "${!TESTS[@]}"; do
    RELAYKV_OWN_SUITE_SETTINGS="$settings" "$PY" -m pytest "${TESTS[$i]}" -q -p no:cacheprovider \
      -o addopts="" "${extra[@]}" --junitxml="$WORK/$mode-$i.xml" > "$WORK/$mode-$i.log" 2>&1 || true
    echo "$mode ${TESTS[$i]}: $(tail -1 "$WORK/$mode-$i.log")"
  done
done
"$PY" "$ROOT/tests/vllm/own_suite_compare.py" "$WORK" ${#TESTS[@]} plugin legacy
