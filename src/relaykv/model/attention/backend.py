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
    """SDPA over gathered pages with explicit masks (see `attention.plan`).

    Pages are gathered with `index_select`. A masked call folds each KV head's query heads
    into query rows (`[.., kv_heads, group * m, d]`) with an additive mask that the group's
    first layer derives from the plan's boolean one (`_folded_mask`, kept on the plan). A
    float32/64 chunk runs as two matmuls and a softmax when its score matrix has at most
    `matmul_elements` entries (0: never), else as SDPA; batched runs always use SDPA.
    Why: docs/model.md, "Paged attention"."""

    def __init__(self, matmul_elements: int = 1 << 22) -> None:
        self.matmul_elements = matmul_elements

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
        heads, d = q.shape[1:]
        kv_heads = k_pages.shape[2]
        group = heads // kv_heads
        for chunk in plan.chunks:
            # [nb, b, kvh, d] -> [N, kvh, d] -> [1, kvh, N, d]
            keys = _gather(k_pages, chunk.block_ids, q.dtype).transpose(0, 1).unsqueeze(0)
            values = _gather(v_pages, chunk.block_ids, q.dtype).transpose(0, 1).unsqueeze(0)
            m = chunk.row_end - chunk.row_start
            rows = q[chunk.row_start : chunk.row_end]
            if chunk.mask is None:  # queries 0..m-1 over keys 0..m-1: plain causal
                result = F.scaled_dot_product_attention(
                    rows.transpose(0, 1).unsqueeze(0),
                    keys[:, :, :m],
                    values[:, :, :m],
                    is_causal=True,
                    scale=scale,
                    enable_gqa=True,
                )
                out[chunk.row_start : chunk.row_end] = result[0].transpose(0, 1)
                continue
            # [m, heads, d] -> [1, kvh, group * m, d], row j * m + i = token i, head kvh * group + j
            query = rows.reshape(m, kv_heads, group, d).permute(1, 2, 0, 3)
            result = self._masked(
                query.reshape(1, kv_heads, group * m, d),
                keys,
                values,
                _folded_mask(chunk.derived, chunk.mask, group, q.dtype),
                scale,
            )
            out[chunk.row_start : chunk.row_end] = (
                result.view(kv_heads, group, m, d).permute(2, 0, 1, 3).reshape(m, heads, d)
            )
        for batched in plan.batched:
            n = batched.block_ids.shape[0]
            keys = _gather(k_pages, batched.block_ids.flatten(), q.dtype)  # [S * NB * b, kvh, d]
            values = _gather(v_pages, batched.block_ids.flatten(), q.dtype)
            keys = keys.view(n, -1, kv_heads, d).transpose(1, 2)  # [S, kvh, NB * b, d]
            values = values.view(n, -1, kv_heads, d).transpose(1, 2)
            q_max = batched.rows.shape[1]
            query = q[batched.rows].view(n, q_max, kv_heads, group, d).permute(0, 2, 3, 1, 4)
            result = F.scaled_dot_product_attention(
                query.reshape(n, kv_heads, group * q_max, d),
                keys,
                values,
                attn_mask=_folded_mask(batched.derived, batched.mask, group, q.dtype),
                scale=scale,
            )
            # [S, kvh, group * Qmax, d] -> [S, Qmax, heads, d]
            result = result.view(n, kv_heads, group, q_max, d).permute(0, 3, 1, 2, 4)
            result = result.reshape(n, q_max, heads, d)
            if batched.contiguous:
                first = batched.first_row
                out[first : first + batched.valid_rows.numel()] = result.flatten(0, 1)
            else:
                out[batched.valid_rows] = result[batched.valid]
        return out

    def _masked(
        self,
        query: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        bias: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        """Attention of `query` `[1, kvh, R, d]` over `keys`/`values` `[1, kvh, N, d]` with
        the additive `bias` `[R, N]`."""
        entries = query.shape[1] * query.shape[2] * keys.shape[2]
        # half precision keeps SDPA, which accumulates the softmax in float32
        if entries > self.matmul_elements or query.dtype not in _WIDE:
            return F.scaled_dot_product_attention(query, keys, values, attn_mask=bias, scale=scale)
        scores = torch.matmul(query * scale, keys.transpose(-1, -2))
        scores.add_(bias)
        scores.sub_(scores.amax(dim=-1, keepdim=True)).exp_()
        return torch.matmul(scores, values).div_(scores.sum(dim=-1, keepdim=True))


_WIDE = (torch.float32, torch.float64)


def _gather(pages: torch.Tensor, block_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Pages `block_ids` of `[num_blocks, b, kvh, d]` as `[len(block_ids) * b, kvh, d]`."""
    return pages.index_select(0, block_ids).flatten(0, 1).to(dtype)


def _folded_mask(
    derived: dict[object, torch.Tensor], mask: torch.Tensor, group: int, dtype: torch.dtype
) -> torch.Tensor:
    """`mask` `[..., m, N]` (True = attend) as an additive `[..., group * m, N]` mask in
    `dtype`, row `j * m + i` = row i (the folded query rows); cached in `derived`."""
    key = ("folded", group, dtype)
    found = derived.get(key)
    if found is None:
        rows = mask.repeat(*([1] * (mask.dim() - 2)), group, 1)
        found = torch.zeros(rows.shape, dtype=dtype, device=mask.device)
        found.masked_fill_(~rows, float("-inf"))
        derived[key] = found
    return found
