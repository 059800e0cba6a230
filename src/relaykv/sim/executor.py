"""The cost-model `Executor`: returns a step's tokens at once and its modelled duration.

It satisfies `relaykv.engine.executor.Executor`, so the real scheduler drives it exactly as
it drives the model runner. Per sequence (the position contract of `relaykv.common.messages.steps`):

* a non-sampling prefill chunk produces nothing;
* a sampling entry with d drafts accepts `a` of them and returns a + 1 tokens; `a` follows
  the acceptance rate R exactly in aggregate: a running total of R * d drafts is kept
  over all steps and each entry accepts the integer part it adds (deterministic, no
  per-request state);
* a sampling entry that proposes returns k draft tokens for the next step.

Token values are never an EOS id (the simulated runs are `ignore_eos` length runs): each
is a function of the position, which keeps output blocks distinct across positions.
After `execute`, `last_cost` holds the step's `StepCost` (its `seconds` is the duration).
"""

from __future__ import annotations

import math

from relaykv.common.messages.steps import SequenceOutput, StepBatch, StepOutput
from relaykv.kvcache import Geometry
from relaykv.sim.cost_model import SeqShape, StepCost, step_cost
from relaykv.sim.hardware import HardwareSpec
from relaykv.sim.models import ModelSpec


class CostModelExecutor:
    def __init__(
        self,
        model: ModelSpec,
        hardware: HardwareSpec,
        *,
        tp: int = 1,
        num_speculative_tokens: int = 0,
        acceptance_rate: float = 0.7,
    ) -> None:
        if not 0.0 <= acceptance_rate <= 1.0:
            raise ValueError(f"acceptance rate must be in [0, 1], got {acceptance_rate}")
        self.model = model
        self.hardware = hardware
        self.tp = tp
        self.k = num_speculative_tokens
        self.acceptance_rate = acceptance_rate
        self._geometry = model.geometry(with_draft=num_speculative_tokens > 0)
        self._accepted_total = 0.0
        self._span = max(1, model.vocab_size - 3)
        self.last_cost: StepCost | None = None

    @property
    def geometry(self) -> Geometry:
        return self._geometry

    @property
    def kv_buffer(self) -> None:
        """No KV bytes exist in the simulation (the `Executor` protocol's cost-model case)."""
        return None

    @property
    def num_speculative_tokens(self) -> int:
        return self.k

    def _token(self, position: int) -> int:
        # A spread of ids that are never 0..2 (BOS/EOS-like specials of the presets).
        return 3 + (position * 7919) % self._span

    def execute(self, batch: StepBatch) -> StepOutput:
        shapes: list[SeqShape] = []
        outputs: list[SequenceOutput] = []
        for work in batch.sequences:
            n = len(work.token_ids) + len(work.draft_token_ids)
            proposes = work.sample and work.propose and self.k > 0
            shapes.append(SeqShape(work.start_position, n, self.k if proposes else 0))
            out = SequenceOutput(work.request_id)
            if work.sample:
                d = len(work.draft_token_ids)
                before = math.floor(self._accepted_total)
                self._accepted_total += self.acceptance_rate * d
                a = min(d, math.floor(self._accepted_total) - before)
                end = work.start_position + len(work.token_ids) + a
                # Accepted drafts are the proposals themselves, then the bonus token.
                out.token_ids = [*work.draft_token_ids[:a], self._token(end)]
                out.num_draft_tokens = d
                out.num_accepted_tokens = a
                if proposes:
                    out.draft_token_ids = [self._token(end + 1 + i) for i in range(self.k)]
            outputs.append(out)
        self.last_cost = step_cost(self.model, self.hardware, self.tp, shapes)
        return StepOutput(outputs)
