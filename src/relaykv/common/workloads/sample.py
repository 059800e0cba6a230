"""The request record every dataset produces, and the checks that name a bad flag."""

from __future__ import annotations

from dataclasses import dataclass


class DatasetError(ValueError):
    """Bad dataset or load parameters; the message names the flag (CLI exit status 2)."""


@dataclass(slots=True)
class SampleRequest:
    """One benchmark request.

    `prompt_ids` is the exact token sequence; `prompt` is its text form when prompts are
    sent as text (then `prompt_ids` is the re-encoded text, so `prompt_len` stays exact).
    """

    prompt_ids: list[int]
    output_len: int
    prompt: str | None = None

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)


def require_non_negative(value: int, flag: str) -> None:
    if value < 0:
        raise DatasetError(f"{flag} must be >= 0, got {value}")


def require_positive(value: int, flag: str) -> None:
    if value <= 0:
        raise DatasetError(f"{flag} must be > 0, got {value}")
