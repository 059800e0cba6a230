"""Fast corpus generation (`distill.generate`) against the engine and a dense forward.

Reference: the engine's own generation (`corpus.collect_shard`: scheduler, chunked
prefill, paged attention) of the same prompts, and the dense forward it is itself tested
against (`test_corpus.py`). Prompt lengths differ (left padding) and the continuations run
past tiny-hybrid's 64-token sliding window.
"""

from __future__ import annotations

import torch

from relaykv.distill.corpus import collect_shard
from relaykv.distill.generate import (
    continue_batch,
    generated_shard,
    greedy_picker,
    sampling_picker,
)
from relaykv.distill.labels import ShortlistHead
from relaykv.model import load_model


def test_batched_greedy_generation_equals_the_engine() -> None:
    target = load_model("tiny-hybrid").model
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 259, (n,), generator=gen).tolist() for n in (5, 17, 33, 9)]
    engine = collect_shard(target, prompts, 40, (), concurrency=2, candidates=3)
    head = ShortlistHead(target)
    done = continue_batch(target, prompts, 40, greedy_picker(head.top))
    shard = generated_shard(target, prompts, done, 3, head)
    assert torch.equal(shard.tokens, engine.tokens)
    assert torch.equal(shard.lengths, engine.lengths)
    assert torch.equal(shard.prompt_lens, engine.prompt_lens)
    torch.testing.assert_close(shard.hidden, engine.hidden, atol=2e-4, rtol=1e-4)
    assert torch.equal(shard.labels, engine.labels)


def test_generation_stops_at_eos_and_sampling_is_seeded() -> None:
    target = load_model("tiny-hybrid").model
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13]]
    head = ShortlistHead(target)
    free = continue_batch(target, prompts, 12, greedy_picker(head.top))
    eos = free.sequences[0][5]  # the third generated token of the first prompt
    cut = continue_batch(target, prompts, 12, greedy_picker(head.top), eos=(eos,))
    first = free.sequences[0]
    assert cut.sequences[0] == first[: first.index(eos, 3) + 1]
    assert len(cut.hidden[0]) == len(cut.sequences[0]) - 1
    a = continue_batch(target, prompts, 6, sampling_picker(target, seed=11)).sequences
    b = continue_batch(target, prompts, 6, sampling_picker(target, seed=11)).sequences
    assert a == b and all(len(s) == len(p) + 6 for s, p in zip(a, prompts, strict=True))
