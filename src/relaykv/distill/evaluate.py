"""Acceptance of a draft on held-out prompts, measured on the real engine.

For each K the prompts are generated greedily by `LLMEngine` over a `ModelRunner` with
the draft and K speculative tokens, and once without speculation; the outputs must be
equal token for token (greedy verification is exact), and the engine's speculation
counters give the acceptance. `mean_accepted_length` is EAGLE's tau: tokens emitted per
verification step (accepted drafts + the target's own token).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from relaykv.distill.corpus import engine_for
from relaykv.engine import SamplingParams
from relaykv.model import CausalLM, EagleDraft, ModelRunner


@dataclass(frozen=True, slots=True)
class Acceptance:
    k: int
    acceptance_rate: float  # accepted / proposed draft tokens
    mean_accepted_length: float  # tokens per verification step (tau)
    steps: int  # verification steps
    equal_prompts: int  # prompts whose speculative output equals plain greedy output
    prompts: int

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def greedy_outputs(
    target: CausalLM,
    prompts: Sequence[Sequence[int]],
    max_tokens: int,
    eos: Sequence[int],
    draft: EagleDraft | None = None,
    k: int = 0,
) -> tuple[list[list[int]], tuple[int, int, int]]:
    """Greedy outputs on the engine, and its (drafts, draft tokens, accepted) counters."""
    max_len = max(len(p) for p in prompts) + max_tokens + k

    def runner(blocks: int) -> ModelRunner:
        return ModelRunner(target, num_blocks=blocks, draft=draft, num_speculative_tokens=k)

    engine = engine_for(runner, target, max_len, len(prompts), eos)
    reqs = engine.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0.0))
    m = engine.metrics
    counters = (m.spec_num_drafts, m.spec_num_draft_tokens, m.spec_num_accepted_tokens)
    return [r.output_ids for r in reqs], counters


def measure_acceptance(
    target: CausalLM,
    draft: EagleDraft,
    prompts: Sequence[Sequence[int]],
    max_tokens: int,
    eos: Sequence[int],
    ks: Sequence[int] = (1, 3),
) -> list[Acceptance]:
    plain, _ = greedy_outputs(target, prompts, max_tokens, eos)
    results = []
    for k in ks:
        outputs, (drafts, proposed, accepted) = greedy_outputs(
            target, prompts, max_tokens, eos, draft, k
        )
        results.append(
            Acceptance(
                k=k,
                acceptance_rate=accepted / proposed if proposed else 0.0,
                mean_accepted_length=1.0 + accepted / drafts if drafts else 1.0,
                steps=drafts,
                equal_prompts=sum(a == b for a, b in zip(outputs, plain, strict=True)),
                prompts=len(prompts),
            )
        )
    return results
