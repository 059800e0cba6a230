"""Attention plans: where each token's KV goes and which pages each query reads.

A plan is built once per step and KV group and shared by all layers of the group. It
holds three things, all as tensors so a CUDA backend can use them unchanged:

* the write slots of every token of the pass (block id, offset in block), in row order;
* `chunks`: long query runs (prefill chunks), each attended on its own in query
  sub-blocks of at most `query_block` tokens; a sliding sub-block reads only the pages its
  window touches (the "chunked for sliding windows" path), a full one reads `[0, end)`;
* `batched`: the short query runs (decode tokens, speculative verification windows)
  padded into `[S, Qmax]` batches, each with one `[S, NB]` page table and one mask; runs
  are bucketed by length (1, 2, 3-4, 5-8, ...) so a decode token is never padded to the
  length of a 30-token chunk.

Rules enforced here (docs/design.md §1, §4): block id 0 is the null block and is never
written; every page a query reads inside its window must be a real block (non-null), and
positions below a sliding window may be null. Violations are engine bugs and raise
`ValueError` naming the request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from relaykv.kvcache.geometry import cdiv


@dataclass(slots=True)
class QueryRun:
    """One sequence's consecutive query tokens in one forward pass."""

    request_id: str
    row_start: int  # first row of the pass's flat token tensor
    num_tokens: int
    start_position: int
    block_table: Sequence[int]


@dataclass(slots=True)
class ChunkPlan:
    """One query sub-block of a long run, attended on its own."""

    row_start: int
    row_end: int
    block_ids: torch.Tensor  # [nb] pages read, in order
    # [m, nb * block_size] bool, True = attend; None: plain causal attention over the
    # first `m` keys (queries start at position 0 and no window cuts in), which lets SDPA
    # use its causal kernel and skip the masked half.
    mask: torch.Tensor | None
    # tensors a backend derives from `mask` (e.g. an additive mask with rows per query
    # head), built by the group's first layer and reused by the others
    derived: dict[object, torch.Tensor] = field(default_factory=dict)


@dataclass(slots=True)
class BatchedPlan:
    """Short runs padded into one batch: query rows [S, Qmax], pages [S, NB]."""

    rows: torch.Tensor  # [S, Qmax] row index per query slot (padding repeats a real row)
    valid: torch.Tensor  # [S, Qmax] bool, False on padding
    valid_rows: torch.Tensor  # rows[valid]: where each real query's output goes
    contiguous: bool  # no padding and rows are consecutive: outputs need no scatter
    first_row: int  # the first row when contiguous
    block_ids: torch.Tensor  # [S, NB] (padding pages are the null block, masked out)
    mask: torch.Tensor  # [S, 1, Qmax, NB * block_size] bool
    derived: dict[object, torch.Tensor] = field(default_factory=dict)  # as `ChunkPlan.derived`


@dataclass(slots=True)
class GroupPlan:
    """Everything one KV group's layers need for one forward pass."""

    block_size: int
    window: int | None
    num_rows: int
    slot_blocks: torch.Tensor  # [T] block id of each token's KV
    slot_offsets: torch.Tensor  # [T] offset inside that block
    chunks: list[ChunkPlan]
    batched: list[BatchedPlan]


def _checked_blocks(run: QueryRun, first: int, last: int, what: str) -> list[int]:
    table = run.block_table
    if last > len(table):
        raise ValueError(
            f"request {run.request_id}: block table has {len(table)} entries but {what} "
            f"needs block index {last - 1}"
        )
    blocks = list(table[first:last])
    for index, block in enumerate(blocks):
        if block <= 0:
            raise ValueError(
                f"request {run.request_id}: block index {first + index} is the null block "
                f"but {what} needs it"
            )
    return blocks


def _key_start(position: int, window: int | None) -> int:
    return 0 if window is None else max(0, position - window + 1)


def visible(qpos: torch.Tensor, kpos: torch.Tensor, window: int | None) -> torch.Tensor:
    """`[..., q, k]` bool: a query at `qpos` reads the key at `kpos` (causal, inside `window`).

    The one statement of the model's attention read window; dense contexts build their masks
    from it too."""
    allowed = kpos.unsqueeze(-2) <= qpos.unsqueeze(-1)
    if window is not None:
        allowed &= kpos.unsqueeze(-2) > qpos.unsqueeze(-1) - window
    return allowed


def build_group_plan(
    runs: Sequence[QueryRun],
    block_size: int,
    window: int | None,
    device: torch.device | str = "cpu",
    batch_threshold: int = 32,
    query_block: int = 512,
    causal_block: int = 8192,
) -> GroupPlan:
    """Plan one group's writes and reads for one pass (see module docstring)."""
    b = block_size
    slot_blocks: list[int] = []
    slot_offsets: list[int] = []
    chunks: list[ChunkPlan] = []
    short: list[QueryRun] = []
    num_rows = 0
    for run in runs:
        s, m = run.start_position, run.num_tokens
        if m <= 0:
            raise ValueError(f"request {run.request_id}: a query run needs at least one token")
        if s < 0:
            raise ValueError(f"request {run.request_id}: negative start position {s}")
        written = _checked_blocks(run, s // b, cdiv(s + m, b), "writing its KV")
        base = (s // b) * b
        for p in range(s, s + m):
            slot_blocks.append(written[(p - base) // b])
            slot_offsets.append(p % b)
        num_rows = max(num_rows, run.row_start + m)
        if m <= batch_threshold:
            short.append(run)
            continue
        qs = s
        while qs < s + m:
            causal = qs == 0
            # from position 0 a causal block needs no mask, so it need not be split
            qe = min(s + m, qs + (causal_block if causal else query_block))
            if causal and window is not None and window < qe:
                qe = min(s + m, qs + query_block)
                causal = window >= qe
            first = _key_start(qs, window) // b
            last = cdiv(qe, b)
            blocks = _checked_blocks(run, first, last, "attention")
            mask = None
            if not causal:
                mask = visible(torch.arange(qs, qe), torch.arange(first * b, last * b), window)
            chunks.append(
                ChunkPlan(
                    row_start=run.row_start + qs - s,
                    row_end=run.row_start + qe - s,
                    block_ids=torch.tensor(blocks, dtype=torch.long, device=device),
                    mask=None if mask is None else mask.to(device),
                )
            )
            qs = qe
    buckets: dict[int, list[QueryRun]] = {}
    for run in short:
        buckets.setdefault((run.num_tokens - 1).bit_length(), []).append(run)
    batched = [_batched_plan(group, b, window, device) for _, group in sorted(buckets.items())]
    return GroupPlan(
        block_size=b,
        window=window,
        num_rows=num_rows,
        slot_blocks=torch.tensor(slot_blocks, dtype=torch.long, device=device),
        slot_offsets=torch.tensor(slot_offsets, dtype=torch.long, device=device),
        chunks=chunks,
        batched=batched,
    )


def _batched_plan(
    runs: Sequence[QueryRun], b: int, window: int | None, device: torch.device | str
) -> BatchedPlan:
    # Built from Python lists with one tensor per field: this runs every step.
    q_max = max(r.num_tokens for r in runs)
    firsts = [_key_start(r.start_position, window) // b for r in runs]
    lasts = [cdiv(r.start_position + r.num_tokens, b) for r in runs]
    nb_max = max(last - first for first, last in zip(firsts, lasts, strict=True))
    block_rows, row_rows, q_starts, counts = [], [], [], []
    for run, first, last in zip(runs, firsts, lasts, strict=True):
        blocks = _checked_blocks(run, first, last, "attention")
        block_rows.append(blocks + [0] * (nb_max - len(blocks)))
        m = run.num_tokens
        # padding query slots repeat the run's last row (and position): never fully masked
        row_rows.append([run.row_start + min(j, m - 1) for j in range(q_max)])
        q_starts.append(run.start_position)
        counts.append(m)
    j = torch.arange(q_max)
    count = torch.tensor(counts)
    valid = j[None, :] < count[:, None]
    qpos = torch.tensor(q_starts)[:, None] + torch.minimum(j[None, :], count[:, None] - 1)
    kpos = torch.tensor(firsts)[:, None] * b + torch.arange(nb_max * b)[None, :]
    real = kpos < torch.tensor(lasts)[:, None] * b
    mask = visible(qpos, kpos, window) & real.unsqueeze(1)
    rows = torch.tensor(row_rows)
    uniform = bool(valid.all()) and torch.equal(
        rows.flatten(), torch.arange(rows.numel()) + int(rows[0, 0])
    )
    return BatchedPlan(
        rows=rows.to(device),
        valid=valid.to(device),
        valid_rows=rows[valid].to(device),
        contiguous=uniform,
        first_row=int(rows[0, 0]),
        block_ids=torch.tensor(block_rows, dtype=torch.long).to(device),
        mask=mask.unsqueeze(1).to(device),
    )
