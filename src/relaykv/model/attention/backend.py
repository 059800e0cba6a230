"""Paged attention backends.

`AttentionBackend` is the contract a backend implements; `TorchPagedAttention` is the
portable implementation on `torch.nn.functional.scaled_dot_product_attention` (CPU and
CUDA alike: no CPU-only call in it). A fused CUDA kernel drops in by implementing the
same two methods against the same `GroupPlan`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
import torch.nn.functional as F

from relaykv.model.attention.plan import GroupPlan


class AttentionBackend(ABC):
    """Writes a pass's K/V into pages, then attends every query over its pages.

    Contract:
    * `k_pages` / `v_pages` are one layer's page views `[num_blocks, block_size, kv_heads,
      head_dim]` of the KV buffer; writes go through them in place.
    * `write_kv` stores token t's K/V at `(plan.slot_blocks[t], plan.slot_offsets[t])`
      and nothing else (never block 0: the plan already rejected it).
    * `attend` runs after `write_kv` of the same layer, so a query sees the pass's own
      tokens; it returns `[T, heads, head_dim]` in row order. A query at position p sees
      exactly the keys at positions `[p - W + 1, p]` (sliding) or `[0, p]` (full).
    """

    @abstractmethod
    def write_kv(
        self,
        plan: GroupPlan,
        k: torch.Tensor,
        v: torch.Tensor,
        k_pages: torch.Tensor,
        v_pages: torch.Tensor,
    ) -> None: ...

    @abstractmethod
    def attend(
        self,
        plan: GroupPlan,
        q: torch.Tensor,
        k_pages: torch.Tensor,
        v_pages: torch.Tensor,
        scale: float,
    ) -> torch.Tensor: ...


class TorchPagedAttention(AttentionBackend):
    """SDPA over gathered pages with explicit boolean masks (see `attention.plan`)."""

    def write_kv(
        self,
        plan: GroupPlan,
        k: torch.Tensor,
        v: torch.Tensor,
        k_pages: torch.Tensor,
        v_pages: torch.Tensor,
    ) -> None:
        index = (plan.slot_blocks, plan.slot_offsets)
        k_pages.index_put_(index, k.to(k_pages.dtype))
        v_pages.index_put_(index, v.to(v_pages.dtype))

    def attend(
        self,
        plan: GroupPlan,
        q: torch.Tensor,
        k_pages: torch.Tensor,
        v_pages: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        out = torch.empty_like(q)
        b = plan.block_size
        for chunk in plan.chunks:
            # [nb, b, kvh, d] -> [1, kvh, nb*b, d]
            keys = k_pages[chunk.block_ids].flatten(0, 1).transpose(0, 1).unsqueeze(0)
            values = v_pages[chunk.block_ids].flatten(0, 1).transpose(0, 1).unsqueeze(0)
            query = q[chunk.row_start : chunk.row_end].transpose(0, 1).unsqueeze(0)
            if chunk.mask is None:  # queries 0..m-1 over keys 0..m-1: plain causal
                m = chunk.row_end - chunk.row_start
                keys, values = keys[:, :, :m], values[:, :, :m]
            result = F.scaled_dot_product_attention(
                query,
                keys.to(q.dtype),
                values.to(q.dtype),
                attn_mask=chunk.mask,
                is_causal=chunk.mask is None,
                scale=scale,
                enable_gqa=True,
            )
            out[chunk.row_start : chunk.row_end] = result[0].transpose(0, 1)
        for batched in plan.batched:
            n, nb = batched.block_ids.shape
            keys = k_pages[batched.block_ids.flatten()].view(n, nb * b, *k_pages.shape[2:])
            values = v_pages[batched.block_ids.flatten()].view(n, nb * b, *v_pages.shape[2:])
            query = q[batched.rows]  # [S, Qmax, heads, d]
            result = F.scaled_dot_product_attention(
                query.transpose(1, 2),
                keys.transpose(1, 2).to(q.dtype),
                values.transpose(1, 2).to(q.dtype),
                attn_mask=batched.mask,
                scale=scale,
                enable_gqa=True,
            )
            result = result.transpose(1, 2)  # [S, Qmax, heads, d]
            if batched.contiguous:
                first = batched.first_row
                out[first : first + batched.valid_rows.numel()] = result.flatten(0, 1)
            else:
                out[batched.valid_rows] = result[batched.valid]
        return out
