"""Sampling: greedy, temperature, top-k, top-p, per-request seeds, log-probabilities.

Reproducibility rule: the random numbers behind the token at sequence index i of a
request with seed s come from a generator seeded with `mix(s, i)` and nothing else, so
the same request samples the same tokens whatever else is in the batch, across
preemptions, and on the prefill and decode engines of a P/D pair alike.
"""

from __future__ import annotations

import torch

from relaykv.common.messages.steps import SamplingParams, TokenLogprobs

_MASK64 = (1 << 64) - 1


def mix_seed(seed: int, index: int) -> int:
    """A 64-bit seed for (request seed, token index): splitmix64 of the pair."""
    z = (seed * 0x9E3779B97F4A7C15 + index + 0x632BE59BD9B4E019) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


class GeneratorSource:
    """Per-token generators: seeded from (seed, index), or the runner's own stream."""

    def __init__(self, device: torch.device | str = "cpu", seed: int | None = None) -> None:
        self.device = torch.device(device)
        self._shared = torch.Generator(device=self.device)
        if seed is None:
            self._shared.seed()
        else:
            self._shared.manual_seed(seed)

    def for_token(self, params: SamplingParams, index: int) -> torch.Generator:
        if params.seed is None:
            return self._shared
        gen = torch.Generator(device=self.device)
        gen.manual_seed(mix_seed(params.seed, index))
        return gen


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The sampling distribution of one row: temperature, then top-k, then top-p."""
    x = logits.float() / params.temperature
    vocab = x.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(x, params.top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_x, order = torch.sort(x, descending=True)
        sorted_p = torch.softmax(sorted_x, dim=-1)
        before = torch.cumsum(sorted_p, dim=-1) - sorted_p
        drop_sorted = before >= params.top_p  # keep the smallest prefix reaching top_p
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return torch.softmax(x, dim=-1)


def sample_from(probs: torch.Tensor, gen: torch.Generator) -> int:
    return int(torch.multinomial(probs, 1, generator=gen).item())


def token_logprobs(logits: torch.Tensor, tokens: list[int], k: int) -> list[TokenLogprobs]:
    """Raw-logit log-probabilities of `tokens` (row j for token j) and the top-k of each row."""
    logp = torch.log_softmax(logits[: len(tokens)].float(), dim=-1)
    top_vals, top_ids = torch.topk(logp, min(k, logp.shape[-1]), dim=-1) if k else (None, None)
    out = []
    for j, token in enumerate(tokens):
        top: tuple[tuple[int, float], ...] = ()
        if top_ids is not None and top_vals is not None:
            top = tuple(zip(top_ids[j].tolist(), top_vals[j].tolist(), strict=True))
        out.append(TokenLogprobs(token, float(logp[j, token]), top))
    return out
