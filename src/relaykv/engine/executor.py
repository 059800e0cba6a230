"""The boundary between the scheduler and whatever computes a step.

The real engine plugs the model runner in (`relaykv.model.ModelRunner` satisfies this protocol
structurally); the simulator plugs a cost model. The records exchanged are in
`relaykv.common.messages.steps`, on the shared floor every layer may import, so the engine
never imports the model layer.

Contract: `execute` receives every scheduled sequence of one step and returns one
`SequenceOutput` per sequence, in order. Which KV positions it writes (and therefore what the
scheduler must allocate and may roll back) is specified in `relaykv.common.messages.steps`.
It must be deterministic for greedy sampling and must not keep per-request state beyond a step.
"""

from __future__ import annotations

from typing import Protocol

from relaykv.common.messages.steps import StepBatch, StepOutput
from relaykv.kvcache import Geometry


class Executor(Protocol):
    @property
    def geometry(self) -> Geometry:
        """The KV geometry the executor's model needs (groups, windows, draft group)."""
        ...

    @property
    def num_speculative_tokens(self) -> int:
        """k: draft tokens proposed per step (0 without a draft model)."""
        ...

    @property
    def kv_buffer(self) -> object | None:
        """The memory holding the KV pages, `[num_blocks, block_bytes]` bytes (a torch
        tensor for the model runner), which a P/D transport reads from and writes into;
        None for an executor without real KV (a cost model)."""
        ...

    def execute(self, batch: StepBatch) -> StepOutput: ...
