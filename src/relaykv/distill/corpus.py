"""Corpus shards, and the engine's generation of them (the reference for `generate.py`).

`collect_shard` runs prompts through `LLMEngine` over a `ModelRunner` (the same scheduler,
chunked prefill and paged attention that serve requests) and records, through the
runner's `hidden_observer`, the target's final-norm hidden state at every computed
position. Prefix caching is off so that every position is computed, hence recorded;
a position computed twice (preemption) keeps its last value, which is the same.

A shard is one safetensors file: `tokens [n, L]` (-1 padded), `lengths [n]`,
`prompt_lens [n]`, `hidden [n, L - 1, H]` (hidden of position p, p < length - 1: the
last token is sampled, never fed back), and the target's own choice after each of those
positions, `labels [n, L - 1]` (its argmax) with `cands [n, L - 1, C]` (its top C,
`labels.label_hidden`). Shards are written whole under a temporary name and renamed, so
an interrupted run resumes at the first missing shard. `prefill.text_shard` builds the
same records from offline text in one forward pass, and `generate.generated_shard` from
the batched generator that builds recipes' corpora (tests check it against `collect_shard`).

While the corpus is generated the runner's LM head is the labels' shortlisted one
(`labels.ShortlistHead`: bfloat16 ranking, float32 rescoring): greedy tokens are the
target's own at about a fifth of the full float32 head's cost, which is most of a step at
Gemma's 262k vocabulary (the temperature-1 sampling of prompt tails keeps the full head).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from relaykv.distill.labels import ShortlistHead, label_hidden
from relaykv.engine import EngineConfig, LLMEngine, SamplingParams, SchedulerConfig
from relaykv.model import CausalLM, ModelRunner, SequenceWork, derive_layout

BLOCK_SIZE = 16


@dataclass(frozen=True, slots=True)
class Shard:
    tokens: torch.Tensor  # [n, L] int64, -1 after each sequence's length
    lengths: torch.Tensor  # [n]
    prompt_lens: torch.Tensor  # [n]
    hidden: torch.Tensor  # [n, L - 1, H]
    labels: torch.Tensor  # [n, L - 1] the target's argmax after position p (-1 past the end)
    cands: torch.Tensor  # [n, L - 1, C] its top C (cands[..., 0] == labels)

    @property
    def num_tokens(self) -> int:
        return int(self.lengths.sum())


class HiddenRecorder:
    """A runner `hidden_observer` keeping each request's hidden states by position."""

    def __init__(self, max_len: int, hidden_size: int, dtype: torch.dtype) -> None:
        self.max_len, self.hidden_size, self.dtype = max_len, hidden_size, dtype
        self.rows: dict[str, torch.Tensor] = {}

    def __call__(
        self, seqs: Sequence[SequenceWork], starts: Sequence[int], hidden: torch.Tensor
    ) -> None:
        for work, start in zip(seqs, starts, strict=True):
            buf = self.rows.get(work.request_id)
            if buf is None:
                buf = torch.zeros(self.max_len, self.hidden_size, dtype=self.dtype)
                self.rows[work.request_id] = buf
            n = len(work.token_ids)
            p = work.start_position
            buf[p : p + n] = hidden[start : start + n].to("cpu", self.dtype)


def engine_for(
    runner_factory: Callable[[int], ModelRunner],
    target: CausalLM,
    max_len: int,
    concurrency: int,
    eos: Sequence[int],
) -> LLMEngine:
    """An engine whose pool holds `concurrency` sequences of `max_len` tokens (no caching)."""
    geometry = derive_layout(target.config, BLOCK_SIZE, target.dtype).geometry
    per_seq = math.ceil(max_len / BLOCK_SIZE) + 1
    num_blocks = len(geometry.groups) * per_seq * concurrency + 1
    runner = runner_factory(num_blocks)
    config = EngineConfig(
        num_blocks=num_blocks,
        enable_prefix_caching=False,
        scheduler=SchedulerConfig(
            max_num_batched_tokens=2048, max_num_seqs=concurrency, max_model_len=max_len + 8
        ),
    )
    return LLMEngine(runner, config, eos_token_ids=eos, vocab_size=runner.vocab_size)


@contextmanager
def runner_head(target: CausalLM, logits: Callable[[torch.Tensor], torch.Tensor]) -> Iterator[None]:
    """Within the block, `target.logits` (what the runner samples from) is `logits`."""
    target.logits = logits  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        del target.logits


def collect_shard(
    target: CausalLM,
    prompts: Sequence[Sequence[int]],
    gen_len: int,
    eos: Sequence[int],
    concurrency: int = 32,
    on_step: Callable[[int], object] | None = None,
    candidates: int = 1,
) -> Shard:
    """Greedy continuations of `prompts` and the target's hidden states along them."""
    max_len = max(len(p) for p in prompts) + gen_len
    recorder = HiddenRecorder(max_len, target.config.hidden_size, torch.float32)

    def recording_runner(blocks: int) -> ModelRunner:
        runner = ModelRunner(target, num_blocks=blocks)
        runner.hidden_observer = recorder
        return runner

    engine = engine_for(recording_runner, target, max_len, concurrency, eos)
    params = SamplingParams(max_tokens=gen_len, temperature=0.0)
    reqs = [engine.add_request(f"distill-{i}", list(p), params) for i, p in enumerate(prompts)]
    head = ShortlistHead(target)
    with runner_head(target, head.greedy_logits):
        while engine.has_unfinished():
            outs = engine.step()
            if on_step is not None:
                on_step(sum(len(o.new_token_ids) for o in outs))
    n = len(reqs)
    tokens = torch.full((n, max_len), -1, dtype=torch.long)
    hidden = torch.zeros(n, max_len - 1, target.config.hidden_size, dtype=torch.float32)
    lengths, prompt_lens = torch.zeros(n, dtype=torch.long), torch.zeros(n, dtype=torch.long)
    for i, req in enumerate(reqs):
        seq = req.prompt_ids + req.output_ids
        tokens[i, : len(seq)] = torch.tensor(seq)
        lengths[i], prompt_lens[i] = len(seq), len(req.prompt_ids)
        hidden[i, : len(seq) - 1] = recorder.rows.pop(req.request_id)[: len(seq) - 1]
    return labelled_shard(target, tokens, lengths, prompt_lens, hidden, candidates, head)


def labelled_shard(
    target: CausalLM,
    tokens: torch.Tensor,
    lengths: torch.Tensor,
    prompt_lens: torch.Tensor,
    hidden: torch.Tensor,
    candidates: int,
    head: ShortlistHead | None = None,
) -> Shard:
    """A shard with the target's labels computed from `hidden` (float32, before storage)."""
    n, width = hidden.shape[:2]
    valid = torch.arange(width)[None, :] < (lengths[:, None] - 1)
    labels = torch.full((n, width), -1, dtype=torch.long)
    cands = torch.full((n, width, candidates), -1, dtype=torch.long)
    picked, top = label_hidden(target, hidden[valid], candidates, head)
    labels[valid], cands[valid] = picked, top
    return Shard(tokens, lengths, prompt_lens, hidden, labels, cands)


def save_shard(shard: Shard, path: Path) -> None:
    scratch = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    save_file(
        {
            "tokens": shard.tokens,
            "lengths": shard.lengths,
            "prompt_lens": shard.prompt_lens,
            "hidden": shard.hidden.to(torch.bfloat16),
            "labels": shard.labels.to(torch.int32),
            "cands": shard.cands.to(torch.int32),
        },
        str(scratch),
    )
    os.replace(scratch, path)


def load_shard(path: Path) -> Shard:
    t = load_file(str(path))
    return Shard(
        t["tokens"],
        t["lengths"],
        t["prompt_lens"],
        t["hidden"].float(),
        t["labels"].long(),
        t["cands"].long(),
    )
