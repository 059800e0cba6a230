"""Forward contexts: what a layer's attention runs against in one pass.

`PagedContext` is the serving path: K/V go into the page store at the plan's slots and
queries attend over pages. `DenseContext` attends within one batch of equal-length
sequences with no cache at all (used to distill the tiny draft with autograd).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F

from relaykv.model.attention.backend import AttentionBackend
from relaykv.model.attention.plan import GroupPlan, visible
from relaykv.model.kv_layout import KVSlot, LayerKey
from relaykv.model.kv_pages import KVPageStore
from relaykv.model.rope import RotaryEmbedding


class RotaryCache:
    """The rotary cos/sin of a pass's positions, computed once per rope kind; the base of
    every forward context (`AttentionContext.rotary`)."""

    def __init__(
        self, rotaries: dict[str, RotaryEmbedding], positions: torch.Tensor, dtype: torch.dtype
    ) -> None:
        self._rotaries = rotaries
        self._positions = positions
        self._dtype = dtype
        self._cache: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def rotary(self, rope_key: str) -> tuple[torch.Tensor, torch.Tensor]:
        found = self._cache.get(rope_key)
        if found is None:
            found = self._rotaries[rope_key].cos_sin(self._positions, self._dtype)
            self._cache[rope_key] = found
        return found


class PagedContext(RotaryCache):
    """One pass over paged KV: positions [T], one `GroupPlan` per group it touches."""

    def __init__(
        self,
        rotaries: dict[str, RotaryEmbedding],
        positions: torch.Tensor,
        dtype: torch.dtype,
        plans: dict[int, GroupPlan],
        store: KVPageStore,
        backend: AttentionBackend,
        slots: Mapping[LayerKey, KVSlot],
    ) -> None:
        super().__init__(rotaries, positions, dtype)
        self.slots = slots
        self.plans = plans
        self.store = store
        self.backend = backend

    def attention(
        self,
        layer_key: LayerKey,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        scale: float,
        window: int | None,
    ) -> torch.Tensor:
        slot = self.slots[layer_key]
        plan = self.plans[slot.group]
        if plan.window != window:
            raise RuntimeError(f"layer window {window} does not match its group's {plan.window}")
        k_pages, v_pages = self.store.layer_pages(slot)
        self.backend.write_kv(plan, k, v, k_pages, v_pages)
        return self.backend.attend(plan, q, k_pages, v_pages, scale)


class DenseContext(RotaryCache):
    """Causal (optionally sliding) attention inside `batch` sequences of equal length.

    Rows are `[batch * length]`, sequence-major; positions restart at 0 in each sequence.
    """

    def __init__(
        self,
        rotaries: dict[str, RotaryEmbedding],
        batch: int,
        length: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> None:
        positions = torch.arange(length, device=device).repeat(batch)
        super().__init__(rotaries, positions, dtype)
        self.batch, self.length = batch, length

    def attention(
        self,
        layer_key: LayerKey,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        scale: float,
        window: int | None,
    ) -> torch.Tensor:
        n, t = self.batch, self.length
        pos = torch.arange(t, device=q.device)
        mask = visible(pos, pos, window)
        out = F.scaled_dot_product_attention(
            q.view(n, t, *q.shape[1:]).transpose(1, 2),
            k.view(n, t, *k.shape[1:]).transpose(1, 2),
            v.view(n, t, *v.shape[1:]).transpose(1, 2),
            attn_mask=mask,
            scale=scale,
            enable_gqa=True,
        )
        return out.transpose(1, 2).reshape(n * t, *q.shape[1:])
