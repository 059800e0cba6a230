# The README's two commands: `make demo` (relaykv's main job) and `make test`.
# Both create .venv on a fresh machine: torch==2.13.0 first (a CPU build on local disk;
# an unpinned torch would pull a multi-GB CUDA build), then relaykv with its dev extras.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test lint install clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(VENV)/bin/relaykv cache-probe --preset gpt-oss-like --prompt-len 1000 --pd-policy all

lint: $(VENV)/.installed
	$(PY) -m ruff check src tests benchmarks
	$(PY) tools/check_layers.py .

test: lint
	$(PY) -m pytest

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
