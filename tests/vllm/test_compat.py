"""The plugin refuses to load on a vLLM release it was not tested with (relaykv/vllm/compat.py)."""

from __future__ import annotations

import pytest

from tests.vllm.conftest import SKIP_REASON

vllm = pytest.importorskip("vllm", reason=SKIP_REASON)

from relaykv.vllm.compat import (  # noqa: E402
    TESTED_VLLM_VERSION,
    UnsupportedVLLMVersion,
    check_vllm_version,
    version_problem,
)


def test_the_installed_release_is_the_tested_one() -> None:
    assert vllm.__version__ == TESTED_VLLM_VERSION
    assert version_problem(vllm.__version__) is None
    check_vllm_version()


@pytest.mark.parametrize("other", ["0.32.1", "0.33.1", "0.34.0", "0.33.0rc1"])
def test_another_release_is_refused_with_a_clear_message(monkeypatch, other: str) -> None:
    monkeypatch.setattr(vllm, "__version__", other)
    with pytest.raises(UnsupportedVLLMVersion) as info:
        check_vllm_version()
    message = str(info.value)
    assert other in message and TESTED_VLLM_VERSION in message
    assert f"vllm=={TESTED_VLLM_VERSION}" in message
