"""Offline generation over a `ModelRunner`: a minimal second driver the tests compare the
engine (and `relaykv generate`) against; a test helper, not part of relaykv.

Not the engine's scheduler (no prefix cache, no preemption, no window freeing): every
request gets private blocks from a free list for its whole length, prompts are prefilled
in chunks of at most `chunk_tokens` under a per-step token budget, and all running
requests decode together. With a draft model it keeps the speculative bookkeeping the
runner's contract asks of an engine (`relaykv.common.messages.steps`): k lookahead slots, the
next prompt token for non-final chunks, rollback to `start + n + accepted`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from relaykv.common.messages.steps import (
    GREEDY,
    SamplingParams,
    SequenceWork,
    StepBatch,
    TokenLogprobs,
)
from relaykv.model.runner import ModelRunner


@dataclass(slots=True)
class GenerationResult:
    prompt_ids: list[int]
    output_ids: list[int]
    logprobs: list[TokenLogprobs] | None
    finish_reason: str  # "stop" (a stop token) or "length"
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0


@dataclass(slots=True)
class _Request:
    rid: str
    prompt: list[int]
    params: SamplingParams
    max_tokens: int
    tables: list[list[int]]
    computed: int = 0  # positions whose KV is committed
    output: list[int] = field(default_factory=list)
    drafts: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    finish: str | None = None
    drafted: int = 0
    accepted: int = 0

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output


class BlockFreeList:
    """Block ids 1..n-1 (0 is the null block), handed out and taken back."""

    def __init__(self, num_blocks: int) -> None:
        self._free = list(range(num_blocks - 1, 0, -1))

    def take(self) -> int:
        if not self._free:
            raise RuntimeError("out of KV blocks: raise num_blocks")
        return self._free.pop()

    def give_back(self, blocks: Sequence[int]) -> None:
        self._free.extend(b for b in reversed(blocks) if b)

    @property
    def num_free(self) -> int:
        return len(self._free)

    def check_invariants(self, num_blocks: int) -> None:
        """Free ids are distinct, real (never the null block 0) and in range."""
        assert len(set(self._free)) == len(self._free), "a block is free twice"
        assert all(0 < b < num_blocks for b in self._free), "free list holds an invalid id"


class OfflineGenerator:
    """Generate for a list of prompts to completion (see module docstring)."""

    def __init__(
        self, runner: ModelRunner, chunk_tokens: int = 512, step_tokens: int = 2048
    ) -> None:
        self.runner = runner
        self.chunk_tokens = chunk_tokens
        self.step_tokens = step_tokens
        self.blocks = BlockFreeList(runner.kv.num_blocks)
        self.num_steps = 0

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_tokens: int,
        params: SamplingParams | Sequence[SamplingParams] = GREEDY,
        stop_token_ids: Sequence[int] = (),
        on_step: Callable[[int], None] | None = None,
    ) -> list[GenerationResult]:
        if max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        per = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        if len(per) != len(prompts):
            raise ValueError("one SamplingParams per prompt")
        groups = len(self.runner.layout.shapes)
        reqs = [
            _Request(f"r{i}", list(p), sp, max_tokens, [[] for _ in range(groups)])
            for i, (p, sp) in enumerate(zip(prompts, per, strict=True))
        ]
        for req in reqs:
            if not req.prompt:
                raise ValueError(f"prompt {req.rid} is empty")
        stops = set(stop_token_ids)
        while any(r.finish is None for r in reqs):
            works, owners = self._schedule([r for r in reqs if r.finish is None])
            out = self.runner.execute(StepBatch(works))
            self.num_steps += 1
            for req, work, res in zip(owners, works, out.sequences, strict=True):
                self._absorb(
                    req,
                    work,
                    res.token_ids,
                    res.draft_token_ids,
                    res.logprobs,
                    res.num_draft_tokens,
                    res.num_accepted_tokens,
                    stops,
                )
            if on_step is not None:
                on_step(sum(len(w.token_ids) + len(w.draft_token_ids) for w in works))
        for req in reqs:
            for table in req.tables:
                self.blocks.give_back(table)
        return [
            GenerationResult(
                r.prompt,
                r.output,
                r.logprobs if r.params.logprobs else None,
                r.finish or "length",
                r.drafted,
                r.accepted,
            )
            for r in reqs
        ]

    def _ensure(self, req: _Request, upto: int) -> None:
        b = self.runner.layout.block_size
        for table in req.tables:
            while len(table) * b < upto:
                table.append(self.blocks.take())

    def _schedule(self, running: list[_Request]) -> tuple[list[SequenceWork], list[_Request]]:
        k = self.runner.num_speculative_tokens
        works, owners, budget = [], [], self.step_tokens
        decoding = [r for r in running if r.computed >= len(r.prompt)]
        prefilling = [r for r in running if r.computed < len(r.prompt)]
        for req in decoding:
            tokens = req.tokens
            drafts = req.drafts[: max(0, req.max_tokens - len(req.output) - 1)]
            start = len(tokens) - 1
            self._ensure(req, start + 1 + len(drafts) + k)
            works.append(
                SequenceWork(
                    req.rid,
                    [tokens[-1]],
                    start,
                    req.tables,
                    sample=True,
                    sampling=req.params,
                    draft_token_ids=drafts,
                )
            )
            owners.append(req)
            budget -= 1 + len(drafts)
        for req in prefilling:
            if budget <= 0 and works:
                break
            start = req.computed
            n = min(self.chunk_tokens, len(req.prompt) - start, max(budget, 1))
            last = start + n == len(req.prompt)
            self._ensure(req, start + n + k)
            works.append(
                SequenceWork(
                    req.rid,
                    req.prompt[start : start + n],
                    start,
                    req.tables,
                    sample=last,
                    sampling=req.params,
                    next_token_id=None if last else req.prompt[start + n],
                )
            )
            owners.append(req)
            budget -= n
        return works, owners

    def _absorb(
        self,
        req: _Request,
        work: SequenceWork,
        new: list[int],
        drafts: list[int],
        logprobs: list[TokenLogprobs] | None,
        drafted: int,
        accepted: int,
        stops: set[int],
    ) -> None:
        req.computed = work.start_position + len(work.token_ids) + accepted
        req.drafted += drafted
        req.accepted += accepted
        req.drafts = drafts
        for j, token in enumerate(new):
            req.output.append(token)
            if logprobs is not None:
                req.logprobs.append(logprobs[j])
            if token in stops:
                req.finish = "stop"
                return
            if len(req.output) >= req.max_tokens:
                req.finish = "length"
                return
