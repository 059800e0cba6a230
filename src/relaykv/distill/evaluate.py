"""Acceptance of a draft on held-out prompts, measured on the real engine.

`top1_agreement` is the cheap check beside it: on recorded positions (the target's own
hidden state as input, as for the first draft of a step) how often the draft's argmax over
the full vocabulary is the target's; on training and on held-out shards it shows whether
the draft generalises or memorises.

For each K the prompts are generated greedily by `LLMEngine` over a `ModelRunner` with
the draft and K speculative tokens, and once without speculation; the outputs must be
equal token for token (greedy verification is exact), and the engine's speculation
counters give the acceptance. `mean_accepted_length` is EAGLE's tau: tokens emitted per
verification step (accepted drafts + the target's own token).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from relaykv.distill.corpus import engine_for
from relaykv.distill.labels import label_hidden
from relaykv.distill.trainer import Batchable
from relaykv.engine import SamplingParams
from relaykv.model import CausalLM, EagleDraft, ModelRunner, SpeculativeStats
from relaykv.model.forward_context import DenseContext


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
        outputs, counters = greedy_outputs(target, prompts, max_tokens, eos, draft, k)
        stats = SpeculativeStats(*counters)
        results.append(
            Acceptance(
                k=k,
                acceptance_rate=stats.acceptance_rate,
                mean_accepted_length=stats.mean_accepted_length,
                steps=stats.num_drafts,
                equal_prompts=sum(a == b for a, b in zip(outputs, plain, strict=True)),
                prompts=len(prompts),
            )
        )
    return results


@torch.no_grad()
def top1_agreement(
    target: CausalLM, draft: EagleDraft, data: Batchable, max_sequences: int = 16
) -> float:
    """Share of the first `max_sequences` sequences' positions where the draft's argmax
    (full vocabulary, the target's LM head) equals the target's own choice."""
    n = min(max_sequences, len(data.tokens))
    span = data.tokens.shape[1] - 2
    embeds = target.embed(data.tokens[:n, 1 : span + 1].flatten()).float()
    rotaries = draft.build_rotaries()
    out = draft.float()(
        embeds, data.hidden[:n, :span].flatten(0, 1), DenseContext(rotaries, n, span, torch.float32)
    )
    mask = data.loss_reg[:n].flatten()
    predicted, _ = label_hidden(target, draft.head_input(out[mask]), 1)
    wanted = data.labels[:n, 1 : span + 1].flatten()[mask]
    return float((predicted == wanted).float().mean()) if len(wanted) else 0.0
