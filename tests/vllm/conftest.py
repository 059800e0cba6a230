"""The relaykv.vllm plugin's tests run where vLLM 0.33.0 is installed: in the vLLM venv
(`tools/vllm_venv.sh`, then `.venv-vllm/bin/python -m pytest tests/vllm`; `make test` does
both). Elsewhere every test here skips and names that command."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

SKIP_REASON = (
    "vLLM 0.33.0 is not installed in this interpreter: tools/vllm_venv.sh, then "
    ".venv-vllm/bin/python -m pytest tests/vllm"
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")


def vllm_or_skip() -> None:
    pytest.importorskip("vllm", reason=SKIP_REASON)


@pytest.fixture(scope="session")
def model_dirs() -> Iterator[tuple[str, str]]:
    """Config-only target and EAGLE draft directories, shared by the session."""
    vllm_or_skip()
    from relaykv.vllm.probe import model_dirs as make

    with make() as dirs:
        yield dirs
