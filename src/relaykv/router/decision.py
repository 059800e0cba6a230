"""The record of one routing choice (`GET /routing?recent=1`, docs/routing.md)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Decision:
    """One routing choice, kept in `Routing.recent` and shown by `GET /routing?recent=1`:
    the per-request record that tells routing losses from cache losses (docs/routing.md)."""

    role: str
    engine: str
    prefix: str  # the prompt's first block key (hex, 12 digits): equal prompts' heads match
    prompt_tokens: int
    scored_hit: int  # the usable hit the policy saw there (-1: only a bound was computed)
    cached_tokens: int | None = None  # the engine's own report (prefill: its usage)
