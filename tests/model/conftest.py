"""Shared fixtures for the model tests: the tiny model, runners and block tables."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from relaykv.kvcache.geometry import cdiv
from relaykv.model import ModelRunner, load_model
from relaykv.model.loading import LoadedModel


@pytest.fixture(scope="session")
def tiny() -> LoadedModel:
    return load_model("tiny-hybrid")


@pytest.fixture(scope="session")
def gemma3_270m() -> LoadedModel:
    """Gemma-3-270M, loaded once for the session (a GGUF dequantised on CPU takes ~10 s).
    The tests that use it only read it; the caller skips when the package is missing."""
    return load_model("gemma3-270m")


@pytest.fixture(scope="session")
def tiny_draft(tiny: LoadedModel):
    from relaykv.model import default_draft

    return default_draft("tiny-hybrid", tiny.config)


class TableMaker:
    """Hands out fresh block ids (never 0) and builds per-group tables."""

    def __init__(self, runner: ModelRunner, first: int = 1) -> None:
        self.runner = runner
        self.next = first

    def fresh(self, length: int) -> list[list[int]]:
        """One table per group covering positions [0, length)."""
        b = self.runner.layout.block_size
        tables = []
        for _ in self.runner.layout.shapes:
            n = cdiv(length, b)
            tables.append(list(range(self.next, self.next + n)))
            self.next += n
        assert self.next <= self.runner.kv.num_blocks, "test needs more blocks"
        return tables

    def extend(self, tables: Sequence[list[int]], length: int) -> None:
        b = self.runner.layout.block_size
        for table in tables:
            while len(table) * b < length:
                table.append(self.next)
                self.next += 1
        assert self.next <= self.runner.kv.num_blocks, "test needs more blocks"


def random_tokens(n: int, vocab: int, seed: int, low: int = 3) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(low, vocab, (n,), generator=gen).tolist()
