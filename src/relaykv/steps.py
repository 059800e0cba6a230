"""Records exchanged between a scheduler and an executor (one step in, one step out).

A leaf module at the package root, pure Python, importing nothing of relaykv: the engine
(`relaykv.engine.executor`), the model runner and the simulator all speak these records, so
the engine reaches the model only through the `Executor` protocol (docs/architecture.md layering).

KV positions the runner writes for one `SequenceWork` with `n = len(token_ids)`,
`d = len(draft_token_ids)`, `s = start_position`, `k` = the runner's speculative tokens
(0 when no draft model), `a` = accepted drafts (0..d, reported in the output):

* target layers (every group): positions `[s, s + n + d)`. After verification the KV of
  `[s, s + n + a)` is committed; `[s + n + a, s + n + d)` holds rejected drafts, which the
  engine rolls back simply by treating them as not computed (the next step rewrites
  them before anything reads them).
* draft layer (the draft-marked group), only when the runner has a draft and `k > 0`:
  - a prefill chunk that does not sample: `[s, s + n)`; the draft KV at `s + n - 1`
    needs the next prompt token, so `next_token_id` is required;
  - a sampling entry: committed `[s, s + n + a)` (the last one uses the token sampled in
    this step), then speculative `[s + n + a, s + n + a + k - 1)` while proposing
    (`propose=False` skips the proposals and these speculative positions: a prefill
    engine that hands the request over needs the committed draft KV only).
  So every group's block table must have real blocks for positions
  `[s, s + n + d + k - 1)` (the engine's lookahead slots; `k` of them is always enough),
  and the committed length after the step is `s + n + a`.
* reads: a query at position p reads `[p - W + 1, p]` (sliding) or `[0, p]` (full); those
  blocks must be real; entries below a window may be the null block 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to pick tokens: temperature 0 is greedy (top_p / top_k are then ignored)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = no top-k
    seed: int | None = None  # None: the runner's own generator (not reproducible)
    logprobs: int = 0  # top-K log-probabilities to return per sampled token (0 = none)

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if self.logprobs < 0:
            raise ValueError(f"logprobs must be >= 0, got {self.logprobs}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


GREEDY = SamplingParams()


@dataclass(slots=True)
class SequenceWork:
    """One request's share of a step.

    * `token_ids` are computed at positions `start_position ...` (a chunk may start
      anywhere: after a prefix hit, or mid-prompt under chunked prefill);
    * `block_tables[g]` is group g's block id per block index, from position 0 (0 = null,
      allowed only below a sliding window);
    * `sample`: sample after the last token (the last prompt chunk, or a decode step);
    * `draft_token_ids`: proposals to verify (they follow `token_ids`; `sample` required);
    * `next_token_id`: the prompt token after this chunk, for a non-final chunk when the
      runner has a draft (the draft KV of the chunk's last position needs it);
    * `propose`: with a draft, return `k` proposals for the next step (False: write the
      committed draft KV only, e.g. on a prefill engine that hands the request over).
    """

    request_id: str
    token_ids: Sequence[int]
    start_position: int
    block_tables: Sequence[Sequence[int]]
    sample: bool = False
    sampling: SamplingParams = GREEDY
    draft_token_ids: Sequence[int] = ()
    next_token_id: int | None = None
    propose: bool = True


@dataclass(slots=True)
class StepBatch:
    sequences: Sequence[SequenceWork]


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """Log-probabilities of one generated position, from the raw model logits."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # the top-K (token id, logprob), best first


@dataclass(slots=True)
class SequenceOutput:
    """What one `SequenceWork` produced (same order as the batch)."""

    request_id: str
    token_ids: list[int] = field(default_factory=list)  # 1..d+1 new tokens when sampling
    draft_token_ids: list[int] = field(default_factory=list)  # proposals for the next step
    logprobs: list[TokenLogprobs] | None = None  # one per new token when asked
    num_draft_tokens: int = 0  # d: proposals verified this step
    num_accepted_tokens: int = 0  # a: of those, accepted


@dataclass(slots=True)
class StepOutput:
    sequences: list[SequenceOutput]

    def by_request(self) -> dict[str, SequenceOutput]:
        return {out.request_id: out for out in self.sequences}


@dataclass(slots=True)
class SpeculativeStats:
    """Cumulative acceptance counters (vLLM's spec_decode_num_* metrics)."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0
