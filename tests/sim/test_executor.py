"""The cost-model executor honours the step contract (`relaykv.common.messages.steps`) and
the acceptance rate."""

from __future__ import annotations

import pytest

from relaykv.common.messages.steps import SequenceWork, StepBatch
from relaykv.sim.executor import CostModelExecutor
from relaykv.sim.hardware import HARDWARE
from relaykv.sim.model_presets import model_spec


def _work(rid: str, start: int, n: int, sample: bool, drafts: list[int] = ()) -> SequenceWork:
    return SequenceWork(
        rid, list(range(n)), start, [[1], [1]], sample=sample, draft_token_ids=list(drafts)
    )


def test_tokens_drafts_and_acceptance_rate() -> None:
    ex = CostModelExecutor(
        model_spec("tiny-hybrid"), HARDWARE["h100"], num_speculative_tokens=4, acceptance_rate=0.6
    )
    assert ex.geometry.eagle and ex.num_speculative_tokens == 4
    out = ex.execute(StepBatch([_work("a", 0, 10, False), _work("b", 0, 5, True)])).sequences
    assert out[0].token_ids == [] and out[0].draft_token_ids == []
    assert len(out[1].token_ids) == 1 and len(out[1].draft_token_ids) == 4
    assert ex.last_cost is not None and ex.last_cost.seconds > 0
    drafted = accepted = 0
    for step in range(50):
        drafts = [100 + step, 101, 102, 103]
        (o,) = ex.execute(StepBatch([_work("b", 5 + step, 1, True, drafts)])).sequences
        a = o.num_accepted_tokens
        assert o.num_draft_tokens == 4 and 0 <= a <= 4
        assert o.token_ids[:a] == drafts[:a] and len(o.token_ids) == a + 1
        assert all(t > 2 for t in o.token_ids)  # never an EOS-like id
        drafted, accepted = drafted + 4, accepted + a
    assert accepted / drafted == pytest.approx(0.6, abs=0.01)


def test_bad_acceptance_rate() -> None:
    with pytest.raises(ValueError, match="acceptance"):
        CostModelExecutor(model_spec("tiny-hybrid"), HARDWARE["h100"], acceptance_rate=1.5)
