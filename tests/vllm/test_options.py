"""The plugin's settings from vLLM's configs (relaykv/vllm/options.py)."""

from __future__ import annotations

import pytest

from tests.vllm.conftest import SKIP_REASON

pytest.importorskip("vllm", reason=SKIP_REASON)

from relaykv.kvcache.pd_config import PDPolicy, Role
from relaykv.vllm.options import PluginOptions


def test_defaults_per_group_and_auto_retention() -> None:
    decode = PluginOptions.parse({}, "x", Role.DECODE)
    assert decode.pd_policy is PDPolicy.PER_GROUP and decode.retention == "boundaries"
    assert PluginOptions.parse({}, "x", Role.PREFILL).retention == "dense"
    assert PluginOptions.parse({"pd_policy": "legacy"}, "x", Role.DECODE).legacy


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"pd_policy": "fast"}, "where.pd_policy"),
        ({"retention": "sometimes"}, "where.retention"),
        ({"eagle_reuse": "peek"}, "where.eagle_reuse"),
    ],
)
def test_a_bad_value_names_its_key(raw: dict[str, str], key: str) -> None:
    with pytest.raises(ValueError, match=key.replace(".", "\\.")):
        PluginOptions.parse(raw, "where", Role.DECODE)
