"""Fast corpus generation: many prompts continued at once in dense batches with a KV cache.

The engine (`corpus.collect_shard`) pays per-sequence scheduling, paged gathers and a
`[batch, vocab]` logits tensor every step; on a 2-core CPU it generated Gemma-3-270M text
at ~40-60 tokens/s at batch 64-256 (docs/model.md, "Distilling a draft"). Here the whole
batch is one left-padded tensor: each step runs the target once over `[n, t]` rows with a
contiguous K/V cache per layer (`PaddedStepContext`), so a step is the model's matmuls and
one SDPA call per layer, nothing per sequence.

Left padding keeps every row's next slot at the same column: row i's prompt sits in slots
`[pad_i, L)`, its RoPE positions are `slot - pad_i` and its queries see only keys at slots
`>= pad_i` (inside the window for sliding layers). A padded query sees its own slot only,
so no softmax row is empty; its output is discarded. Greedy tokens are the target's
float32 argmax (`labels.ShortlistHead`, as the engine's corpus head); tests check tokens
and hidden states against the engine's `collect_shard` and a dense forward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from relaykv.distill.corpus import Shard, labelled_shard
from relaykv.distill.labels import ShortlistHead
from relaykv.model import CausalLM
from relaykv.model.attention.plan import visible
from relaykv.model.forward_context import RotaryCache
from relaykv.model.kv_layout import LayerKey
from relaykv.model.rope import RotaryEmbedding

Picker = Callable[[torch.Tensor, int], torch.Tensor]  # (last hidden [n, H], step) -> ids [n]


class PaddedStepContext(RotaryCache):
    """One forward step of `n` left-padded rows over slots `[start, start + length)`.

    `cache` maps each layer to its `(keys, values)` `[n, capacity, kv_heads, head_dim]`,
    created on first use and shared by the steps of one batch."""

    def __init__(
        self,
        rotaries: dict[str, RotaryEmbedding],
        cache: dict[LayerKey, tuple[torch.Tensor, torch.Tensor]],
        pad: torch.Tensor,
        start: int,
        length: int,
        capacity: int,
        dtype: torch.dtype,
    ) -> None:
        slots = torch.arange(start, start + length)
        super().__init__(rotaries, (slots[None, :] - pad[:, None]).clamp(min=0).flatten(), dtype)
        self.cache, self.pad = cache, pad
        self.start, self.length, self.capacity = start, length, capacity
        self._masks: dict[int | None, torch.Tensor] = {}

    def _mask(self, window: int | None) -> torch.Tensor:
        """`[n, 1, length, end]` bool: query slot q sees key slot j."""
        found = self._masks.get(window)
        if found is None:
            end = self.start + self.length
            q = torch.arange(self.start, end)
            j = torch.arange(end)
            seen = visible(q, j, window)[None] & (j[None, None, :] >= self.pad[:, None, None])
            found = (seen | (j[None, :] == q[:, None])).unsqueeze(1)
            self._masks[window] = found
        return found

    def attention(
        self,
        layer_key: LayerKey,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        scale: float,
        window: int | None,
    ) -> torch.Tensor:
        n, t, end = len(self.pad), self.length, self.start + self.length
        store = self.cache.get(layer_key)
        if store is None:
            shape = (n, self.capacity, *k.shape[1:])
            store = (k.new_zeros(shape), v.new_zeros(shape))
            self.cache[layer_key] = store
        keys, values = store
        keys[:, self.start : end] = k.view(n, t, *k.shape[1:])
        values[:, self.start : end] = v.view(n, t, *v.shape[1:])
        out = F.scaled_dot_product_attention(
            q.view(n, t, *q.shape[1:]).transpose(1, 2),
            keys[:, :end].transpose(1, 2),
            values[:, :end].transpose(1, 2),
            attn_mask=self._mask(window),
            scale=scale,
            enable_gqa=True,
        )
        return out.transpose(1, 2).reshape(n * t, *q.shape[1:])


@dataclass(frozen=True, slots=True)
class Continued:
    """Each prompt followed by its new tokens (up to and including an EOS)."""

    sequences: list[list[int]]
    hidden: list[torch.Tensor]  # [len(seq) - 1, H]: final-norm hidden at p, p < len - 1


@torch.no_grad()
def continue_batch(
    target: CausalLM,
    prompts: Sequence[Sequence[int]],
    new_tokens: int,
    pick: Picker,
    eos: Sequence[int] = (),
    on_step: Callable[[int], object] | None = None,
) -> Continued:
    """Continue every prompt by `new_tokens` tokens chosen by `pick` (stops at an EOS)."""
    n = len(prompts)
    lens = torch.tensor([len(p) for p in prompts])
    width = int(lens.max())
    pad = width - lens
    capacity = width + new_tokens
    ids = torch.zeros(n, capacity, dtype=torch.long)
    for i, prompt in enumerate(prompts):
        ids[i, int(pad[i]) : width] = torch.tensor(list(prompt), dtype=torch.long)
    hidden = torch.zeros(n, capacity, target.config.hidden_size, dtype=torch.float32)
    ends = torch.full((n,), capacity)
    done = torch.zeros(n, dtype=torch.bool)
    stop = torch.tensor(list(eos), dtype=torch.long)
    rotaries = target.rotaries or target.build_rotaries()
    cache: dict[LayerKey, tuple[torch.Tensor, torch.Tensor]] = {}
    start, length = 0, width
    for step in range(new_tokens):
        ctx = PaddedStepContext(rotaries, cache, pad, start, length, capacity, target.dtype)
        rows = ids[:, start : start + length].flatten().to(target.device)
        out = target(rows, ctx).float().cpu().view(n, length, -1)
        hidden[:, start : start + length] = out
        slot = start + length
        ids[:, slot] = pick(out[:, -1], step)
        ended = ~done & torch.isin(ids[:, slot], stop)
        ends[ended], done = slot + 1, done | ended
        if on_step is not None:
            on_step(int((~done | ended).sum()))
        if bool(done.all()):
            break
        start, length = slot, 1
    sequences, states = [], []
    for i in range(n):
        first, last = int(pad[i]), int(ends[i])
        sequences.append(ids[i, first:last].tolist())
        states.append(hidden[i, first : last - 1])
    return Continued(sequences, states)


def greedy_picker(head: Callable[[torch.Tensor, int], torch.Tensor]) -> Picker:
    """The target's greedy token: `head(hidden, 1)` is `labels.ShortlistHead.top`."""
    return lambda last, _step: head(last, 1)[:, 0]


def sampling_picker(target: CausalLM, seed: int, top_p: float = 0.95) -> Picker:
    """Temperature-1 nucleus sampling over the full head (seeded: one generator per batch)."""
    gen = torch.Generator().manual_seed(seed)

    def pick(last: torch.Tensor, _step: int) -> torch.Tensor:
        probs = torch.softmax(target.logits(last.to(target.dtype)).float(), dim=-1)
        sorted_p, order = probs.sort(dim=-1, descending=True)
        keep = sorted_p.cumsum(-1) - sorted_p < top_p  # the smallest set reaching top_p
        sorted_p = sorted_p * keep
        choice = torch.multinomial(sorted_p, 1, generator=gen)
        return order.gather(1, choice)[:, 0]

    return pick


def generated_shard(
    target: CausalLM,
    prompts: Sequence[Sequence[int]],
    done: Continued,
    candidates: int,
    head: ShortlistHead | None = None,
) -> Shard:
    """A corpus shard (`corpus.Shard`) of `done`'s sequences, labelled by the target."""
    n = len(prompts)
    width = max(len(s) for s in done.sequences)
    tokens = torch.full((n, width), -1, dtype=torch.long)
    hidden = torch.zeros(n, width - 1, target.config.hidden_size, dtype=torch.float32)
    for i, seq in enumerate(done.sequences):
        tokens[i, : len(seq)] = torch.tensor(seq)
        hidden[i, : len(seq) - 1] = done.hidden[i]
    lengths = torch.tensor([len(s) for s in done.sequences])
    prompt_lens = torch.tensor([len(p) for p in prompts])
    return labelled_shard(target, tokens, lengths, prompt_lens, hidden, candidates, head)
