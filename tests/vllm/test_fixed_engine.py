"""vLLM PR #56449's fixed-engine probe through vLLM 0.33's scheduler at 65,536 tokens
(relaykv/vllm/fixed_engine.py): stock vLLM (`legacy`) reuses nothing on the decode engine
after a load; relaykv's `per-group` reuses all of the shared prefix x but at most two blocks
for x+b after x+a, on the gpt-oss-20b-like and DeepSeek-V4-Flash-like geometries."""

from __future__ import annotations

import pytest

from tests.vllm.conftest import SKIP_REASON

pytest.importorskip("vllm", reason=SKIP_REASON)

from relaykv.vllm.fixed_engine import model_geometry, run_fixed_engine_probe

PREFIX = 65536


@pytest.mark.parametrize("model", ["gpt-oss-20b", "dsv4-flash"])
def test_stock_vllm_reuses_nothing_and_per_group_reuses_the_prefix(model, model_dirs) -> None:
    geometry = model_geometry(model)
    legacy = run_fixed_engine_probe(geometry, "legacy", prefix_len=PREFIX, dirs=model_dirs)
    for phase, records in legacy["phases"].items():
        assert [r["local_tokens"] for r in records] == [0] * len(records), phase
        assert records[0]["vllm_local_hit_tokens"] == 0

    per_group = run_fixed_engine_probe(geometry, "per-group", prefix_len=PREFIX, dirs=model_dirs)
    b = geometry.groups[0].block_size  # the full group: a block of every prefix token
    x_blocks = PREFIX // b
    first, x_a, x_b = per_group["phases"]["first_load"] + per_group["phases"]["serial"]
    assert first["local_tokens"] == 0
    assert x_b["local_tokens"] >= (x_blocks - 2) * b
    # vLLM's own counter (on its scheduler block grid) sees the same reuse.
    assert x_b["vllm_local_hit_tokens"] >= (x_blocks - 2) * b
    assert x_a["local_tokens"] >= x_b["local_tokens"]
    # x+b received only its own tail: a few blocks per group, not the 65k prompt.
    assert sum(x_b["received_blocks"]) <= 16
    overlap = per_group["phases"]["overlap"]
    assert all(r["local_tokens"] >= (x_blocks - 2) * b for r in overlap)
