"""Paged attention equals dense attention (an independent loop-and-softmax reference).

Random block tables (shuffled ids, null below the window), random chunk starts and
lengths (prefix hits and chunked prefill start anywhere), windows from 1 up to beyond
the context, GQA, and both backend paths: short runs batched with padding, long runs
split into query sub-blocks. Unused and stale page slots hold large finite garbage, so a
masking mistake shows up as a large error.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from relaykv.kvcache.geometry import cdiv
from relaykv.model.attention import QueryRun, TorchPagedAttention, build_group_plan
from relaykv.model.attention import backend as backend_module


def reference(q, keys, values, positions, window, scale):
    """q [m, H, D] at `positions`; keys/values [P, KVH, D] for positions 0..P-1."""
    heads, kv_heads = q.shape[1], keys.shape[1]
    group = heads // kv_heads
    out = torch.zeros_like(q, dtype=torch.float64)
    for i, p in enumerate(positions):
        lo = 0 if window is None else max(0, p - window + 1)
        for h in range(heads):
            k = keys[lo : p + 1, h // group].double()
            v = values[lo : p + 1, h // group].double()
            weights = torch.softmax(k @ q[i, h].double() * scale, dim=0)
            out[i, h] = weights @ v
    return out.float()


def _case(seed: int):
    rng = random.Random(seed)
    b = rng.choice([1, 2, 4, 8, 16])
    window = rng.choice([None, 1, 3, 7, 16, 40, 1000])
    kv_heads, group, dim = rng.choice([(1, 4, 8), (2, 2, 16), (4, 1, 8)])
    seqs = []
    for _ in range(rng.randint(1, 4)):
        past = rng.choice([0, 0, rng.randint(1, 60)])
        new = rng.choice([1, 1, rng.randint(2, 5), rng.randint(6, 50)])
        seqs.append((past, new))
    return b, window, kv_heads, group, dim, seqs, rng


# both masked paths: SDPA (0) and matmuls + softmax (every score matrix of these cases)
PATHS = [0, 1 << 22]


@pytest.mark.parametrize("matmul_elements", PATHS)
@pytest.mark.parametrize("seed", range(40))
def test_paged_equals_dense(seed, matmul_elements):
    b, window, kv_heads, group, dim, seqs, rng = _case(seed)
    heads = kv_heads * group
    torch.manual_seed(seed)
    need = sum(cdiv(p + n, b) for p, n in seqs)
    num_blocks = need + 8
    garbage = 1000.0
    k_pages = torch.randn(num_blocks, b, kv_heads, dim) * garbage
    v_pages = torch.randn(num_blocks, b, kv_heads, dim) * garbage
    k_pages[0] = 0.0  # the null block is zeros, as in the page store
    v_pages[0] = 0.0
    ids = list(range(1, num_blocks))
    rng.shuffle(ids)
    runs, q_rows, k_new, v_new, histories = [], [], [], [], []
    row = 0
    for i, (past, new) in enumerate(seqs):
        total = past + new
        keys, values = torch.randn(total, kv_heads, dim), torch.randn(total, kv_heads, dim)
        table = [ids.pop() for _ in range(cdiv(total, b))]
        lowest = 0 if window is None else max(0, past - window + 1)
        for blk in range(lowest // b):
            table[blk] = 0  # below the window: null, as the engine leaves it
        for p in range(lowest, past):  # the cached prefix, written by an earlier step
            k_pages[table[p // b], p % b] = keys[p]
            v_pages[table[p // b], p % b] = values[p]
        runs.append(QueryRun(f"s{i}", row, new, past, table))
        q_rows.append(torch.randn(new, heads, dim))
        k_new.append(keys[past:])
        v_new.append(values[past:])
        histories.append((keys, values))
        row += new
    plan = build_group_plan(
        runs, b, window, batch_threshold=rng.choice([1, 3, 8]), query_block=rng.choice([4, 7, 512])
    )
    backend = TorchPagedAttention(matmul_elements)
    backend.write_kv(plan, torch.cat(k_new), torch.cat(v_new), k_pages, v_pages)
    for run, (keys, values) in zip(runs, histories, strict=True):
        for p in range(run.start_position, run.start_position + run.num_tokens):
            blk = run.block_table[p // b]
            assert torch.equal(k_pages[blk, p % b], keys[p])
            assert torch.equal(v_pages[blk, p % b], values[p])
    assert not k_pages[0].any() and not v_pages[0].any()
    scale = 1 / math.sqrt(dim)
    out = backend.attend(plan, torch.cat(q_rows), k_pages, v_pages, scale)
    for run, q, (keys, values) in zip(runs, q_rows, histories, strict=True):
        positions = range(run.start_position, run.start_position + run.num_tokens)
        ref = reference(q, keys, values, positions, window, scale)
        got = out[run.row_start : run.row_start + run.num_tokens]
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)


def test_plan_rejects_null_and_missing_blocks():
    run = QueryRun("r", 0, 4, 8, [1, 0, 3])  # writes positions 8..11 -> block index 2
    build_group_plan([run], 4, window=1)  # block 1 (positions 4..7) is below the window
    with pytest.raises(ValueError, match="null block"):
        build_group_plan([run], 4, window=None)  # full attention reads block 1
    with pytest.raises(ValueError, match="null block"):
        build_group_plan([QueryRun("r", 0, 1, 4, [1, 0])], 4, window=None)  # write into null
    with pytest.raises(ValueError, match="block table has"):
        build_group_plan([QueryRun("r", 0, 5, 8, [1, 2, 3])], 4, window=None)


@pytest.mark.parametrize("matmul_elements", PATHS)
@pytest.mark.parametrize("kv_heads", [1, 2])
def test_layers_of_a_group_share_a_plan_with_their_own_head_shapes(
    kv_heads, matmul_elements, monkeypatch
):
    """One plan serves every layer of its group: the additive masks the backend derives from
    it (rows repeated per query head) are kept per head group and dtype, never mixed up."""
    sdpa_calls = []
    sdpa = backend_module.F.scaled_dot_product_attention

    def counted(*args, **kwargs):
        sdpa_calls.append(1)
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(backend_module.F, "scaled_dot_product_attention", counted)
    b, window, dim = 4, 16, 8
    seqs = [(37, 20), (50, 1), (9, 3)]  # a masked chunk and two batched runs
    runs, row, next_block = [], 0, 1
    for i, (past, new) in enumerate(seqs):
        n = cdiv(past + new, b)
        runs.append(QueryRun(f"s{i}", row, new, past, list(range(next_block, next_block + n))))
        row, next_block = row + new, next_block + n
    plan = build_group_plan(runs, b, window, batch_threshold=3, query_block=512)
    assert plan.chunks[0].mask is not None and len(plan.batched) == 2
    backend = TorchPagedAttention(matmul_elements)
    torch.manual_seed(0)
    shapes = [(4, torch.float32), (2, torch.float32), (4, torch.float64), (4, torch.bfloat16)]
    for group, dtype in shapes * 2:
        heads = kv_heads * group
        k_pages = torch.randn(next_block, b, kv_heads, dim, dtype=dtype)
        v_pages = torch.randn(next_block, b, kv_heads, dim, dtype=dtype)
        q = torch.randn(row, heads, dim, dtype=dtype)
        sdpa_calls.clear()
        out = backend.attend(plan, q, k_pages, v_pages, 0.3)
        # batched runs always use SDPA; the small masked chunk only when told to or in bf16
        chunk_sdpa = matmul_elements == 0 or dtype == torch.bfloat16
        assert len(sdpa_calls) == len(plan.batched) + chunk_sdpa
        for run in runs:
            end = run.start_position + run.num_tokens
            slots = [(run.block_table[p // b], p % b) for p in range(end)]
            keys = torch.stack([k_pages[blk, off] for blk, off in slots]).float()
            values = torch.stack([v_pages[blk, off] for blk, off in slots]).float()
            rows = slice(run.row_start, run.row_start + run.num_tokens)
            positions = range(run.start_position, end)
            ref = reference(q[rows].float(), keys, values, positions, window, 0.3)
            tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
            torch.testing.assert_close(out[rows].float(), ref, atol=tol, rtol=tol)
    for entry in [*plan.chunks, *plan.batched]:  # built by the first layer of each shape
        assert len(entry.derived) == 4
