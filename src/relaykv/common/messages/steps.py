"""Records exchanged between a scheduler and an executor (one step in, one step out).

On the shared floor (`relaykv.common`), pure Python, importing nothing of relaykv: the engine
(`relaykv.engine.executor`), the model runner and the simulator all speak these records, so
the engine reaches the model only through the `Executor` protocol (docs/architecture.md).

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
* `kv_copies`: `(group, source, destination)` whole pages the runner copies before the step
  computes anything (a prefix hit's last block made private, so that recomputing its last
  position writes no shared block: docs/design.md §4, `eagle_reuse=recompute`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

# vLLM's _SAMPLING_EPS: a temperature below it samples greedily (dividing logits by 1e-300
# would overflow them to inf and the distribution to NaN).
GREEDY_BELOW = 1e-5
SEED_RANGE = (-(1 << 63), (1 << 64) - 1)  # a seed fits in 64 bits, signed or unsigned
MAX_LOGPROBS = 20


class InvalidRequest(ValueError):
    """A request the engine refuses; `field` names the offending parameter (HTTP 400)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _finite(value: float) -> bool:
    return value == value and value not in (float("inf"), float("-inf"))


@dataclass(frozen=True, slots=True, kw_only=True)
class SamplingParams:
    """A request's sampling parameters: the one record from the API to the sampler.

    vLLM's semantics and defaults: `temperature` 1.0 (0, or anything below `GREEDY_BELOW`,
    is greedy, which ignores top_p / top_k), `top_k` 0 or -1 disables top-k, `seed` None
    uses the runner's own generator;
    `stop` strings end the output (excluded from the text), `stop_token_ids` and EOS end it
    too (unless `ignore_eos`), but never before `min_tokens`; `logprobs` top-K per token.

    Construction checks everything that does not need the model (`InvalidRequest` naming the
    field: finite numbers, ranges, 64-bit seeds); `validate(vocab_size)` adds what does
    (top_k and stop token ids against the vocabulary).
    """

    max_tokens: int = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int = 0

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise InvalidRequest(
                "max_tokens", f"max_tokens must be at least 1, got {self.max_tokens}"
            )
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise InvalidRequest(
                "min_tokens", f"min_tokens must be in [0, max_tokens], got {self.min_tokens}"
            )
        if not (_finite(self.temperature) and self.temperature >= 0):
            raise InvalidRequest(
                "temperature", f"temperature must be a finite number >= 0, got {self.temperature}"
            )
        if not (_finite(self.top_p) and 0 < self.top_p <= 1):
            raise InvalidRequest("top_p", f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise InvalidRequest("top_k", f"top_k must be -1, 0 or positive, got {self.top_k}")
        if self.seed is not None and not SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]:
            raise InvalidRequest(
                "seed", f"seed must fit in 64 bits ([-2^63, 2^64 - 1]), got {self.seed}"
            )
        if not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise InvalidRequest(
                "logprobs", f"logprobs must be in [0, {MAX_LOGPROBS}], got {self.logprobs}"
            )
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidRequest("stop", "stop strings must be non-empty strings")

    def validate(self, vocab_size: int | None = None) -> None:
        """The checks that need the model's vocabulary (construction did the rest)."""
        if vocab_size and self.top_k > vocab_size:
            raise InvalidRequest(
                "top_k",
                f"top_k must be -1, 0 (off) or at most the vocabulary size {vocab_size}, "
                f"got {self.top_k}",
            )
        for token in self.stop_token_ids:
            if (
                not isinstance(token, int)
                or isinstance(token, bool)
                or token < 0
                or (vocab_size and token >= vocab_size)
            ):
                raise InvalidRequest("stop_token_ids", f"invalid stop token id {token!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW


GREEDY = SamplingParams(temperature=0.0)


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
      committed draft KV only, e.g. on a prefill engine that hands the request over);
    * `kv_copies`: pages to copy before the step (module docstring).
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
    kv_copies: Sequence[tuple[int, int, int]] = ()


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

    @property
    def mean_accepted_length(self) -> float:
        """EAGLE's tau: tokens per verification step (accepted drafts + the target's own)."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0
