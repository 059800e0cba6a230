"""The held-out prompts acceptance is reported on (never part of a training corpus)."""

from __future__ import annotations

import torch

from relaykv.distill.prompts import HELD_OUT
from relaykv.distill.recipes import Recipe
from relaykv.model import LoadedModel

HELD_OUT_SEED = 1_000_003  # random prompts: a seed no training shard uses


def held_out_prompts(recipe: Recipe, loaded: LoadedModel, count: int = 20) -> list[list[int]]:
    """`count` prompts: `prompts.HELD_OUT` (tokenized), or random ids for `random` recipes."""
    if recipe.prompt_source == "random":
        gen = torch.Generator().manual_seed(HELD_OUT_SEED)
        vocab = loaded.config.vocab_size
        return torch.randint(3, vocab, (count, recipe.prompt_tokens), generator=gen).tolist()
    tokenizer = loaded.tokenizer
    assert tokenizer is not None
    return [tokenizer.encode(text) for text in HELD_OUT[:count]]
