"""Teacher-forced shards: the target's hidden states and choices over given text.

Where `corpus.collect_shard` has the target generate its training text token by token,
`text_shard` runs windows of existing text (`text_corpus`) through the target in one
dense causal forward pass per batch of windows and records, at every position, the
final-norm hidden state and the target's own argmax and top candidates for the next
token: thousands of labelled positions per forward instead of one per sequence per
engine step (docs/model.md, "Distilling a draft"). The dense forward equals the paged
engine's (tests/distill/test_corpus.py checks the engine's recordings against it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from relaykv.distill.corpus import Shard, labelled_shard
from relaykv.model import CausalLM
from relaykv.model.forward_context import DenseContext

WINDOWS_PER_FORWARD = 8


@torch.no_grad()
def text_shard(
    target: CausalLM,
    windows: Sequence[Sequence[int]],
    candidates: int,
    on_window: Callable[[int], object] | None = None,
    prompt_len: int = 0,
) -> Shard:
    """A shard over `windows` (all the same length L): hidden and labels at p < L - 1.

    `prompt_len` is recorded as every window's prompt length: 0 for text windows, 1 (the
    BOS) for windows sampled with the generated sequences (`trainer.stack_corpus`)."""
    length = len(windows[0])
    if any(len(w) != length for w in windows):
        raise ValueError("text windows must all have the same length")
    tokens = torch.tensor([list(w) for w in windows], dtype=torch.long)
    n = len(windows)
    hidden = torch.empty(n, length - 1, target.config.hidden_size, dtype=torch.float32)
    rotaries = target.rotaries or target.build_rotaries()
    for first in range(0, n, WINDOWS_PER_FORWARD):
        batch = tokens[first : first + WINDOWS_PER_FORWARD]
        b = len(batch)
        ctx = DenseContext(rotaries, b, length, target.dtype, target.device)
        out = target(batch.flatten().to(target.device), ctx).float().cpu()
        hidden[first : first + b] = out.view(b, length, -1)[:, : length - 1]
        if on_window is not None:
            on_window(b * length)
    lengths = torch.full((n,), length, dtype=torch.long)
    return labelled_shard(
        target, tokens, lengths, torch.full((n,), prompt_len), hidden, candidates
    )
