"""The one-buffer KV page store: views, page I/O, null block, byte ranges."""

from __future__ import annotations

import pytest
import torch

from relaykv.model.kv_layout import DraftAttention, KVSlot, derive_layout
from relaykv.model.kv_pages import KVPageStore
from relaykv.model.presets import tiny_hybrid_config


@pytest.fixture
def store():
    layout = derive_layout(tiny_hybrid_config(), 8, torch.float32, DraftAttention(2, 64, window=64))
    return KVPageStore(layout, num_blocks=10)


def test_views_alias_one_buffer(store):
    assert store.buffer.shape == (10, store.layout.geometry.block_bytes)
    k, v = store.layer_pages(KVSlot(1, 2))
    k[3, 1, 0, 5] = 7.0
    v[3, 1, 0, 5] = 9.0
    pages = store.read_pages(1, [3])
    assert pages[0, 2, 0, 1, 0, 5] == 7.0 and pages[0, 2, 1, 1, 0, 5] == 9.0
    store.check_invariants()


def test_page_bytes_match_buffer_ranges(store):
    for g in range(2):
        data = torch.randint(0, 256, (2, store.page_bytes(g)), dtype=torch.uint8)
        store.write_page_bytes(g, [4, 6], data.flatten().numpy().tobytes())
        assert torch.equal(store.read_page_bytes(g, [4, 6]), data)
        offset, nbytes = store.page_range(g, 6)
        flat = store.buffer.flatten()
        assert torch.equal(flat[offset : offset + nbytes], data[1])
        pages = store.read_pages(g, [4, 6])
        store.write_pages(g, [1, 2], pages)
        assert torch.equal(store.read_page_bytes(g, [1, 2]), data)
    store.check_invariants()


def test_null_block_is_never_written(store):
    with pytest.raises(ValueError, match="null block"):
        store.write_page_bytes(0, [0], bytes(store.page_bytes(0)))
    with pytest.raises(ValueError, match="null block"):
        store.write_pages(1, [2, 0], store.read_pages(1, [1, 1]))
    with pytest.raises(ValueError, match="out of range"):
        store.read_pages(0, [10])
    with pytest.raises(ValueError, match="bytes"):
        store.write_page_bytes(0, [1], b"xx")
    store.layer_pages(KVSlot(0, 0))[0][0, 0, 0, 0] = 1.0  # a bug writing block 0
    with pytest.raises(AssertionError, match="null block"):
        store.check_invariants()
