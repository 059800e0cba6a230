"""The KV-event wire schema: what an engine encodes, a router decodes (docs/kv-events.md).

The engine's side against vLLM's documented format is tests/engine/test_kv_events.py (an
independent schema); here the floor's records themselves: the batch round-trips, the fields
vLLM requires are always written and must be there to decode, and the sequence frames.
"""

from __future__ import annotations

import msgspec
import pytest

from relaykv.common.messages.kv_events import (
    END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    batch_encoder,
    decode_batch,
    frame_seq,
    seq_frame,
)


def _stored(**kw: object) -> BlockStored:
    base: dict[str, object] = dict(
        block_hashes=[b"a" * 16, b"b" * 16],
        parent_block_hash=None,
        token_ids=[1, 2, 3, 4],
        block_size=2,
        lora_id=None,
        medium="GPU",
        lora_name=None,
    )
    return BlockStored(**{**base, **kw})  # type: ignore[arg-type]


def test_batch_round_trip() -> None:
    batch = KVEventBatch(
        ts=1.5,
        events=[
            _stored(
                group_idx=1, kv_cache_spec_kind="sliding_window", kv_cache_spec_sliding_window=8
            ),
            BlockRemoved(block_hashes=[b"a" * 16], medium="CPU", group_idx=0),
            AllBlocksCleared(),
        ],
        data_parallel_rank=0,
    )
    assert decode_batch(batch_encoder().encode(batch)) == batch


def test_required_fields_are_written_even_when_nil() -> None:
    raw = msgspec.msgpack.decode(batch_encoder().encode(KVEventBatch(0.0, [_stored()])))
    assert raw[0] == 0.0 and isinstance(raw[1], list)  # array_like: [ts, events, dp rank]
    event = raw[1][0]
    assert event["type"] == "BlockStored"
    for key in ("parent_block_hash", "lora_id", "lora_name"):  # vLLM's decoder needs them
        assert key in event and event[key] is None
    for key in ("extra_keys", "group_idx", "kv_cache_spec_kind"):  # optional: left out
        assert key not in event


def test_integer_block_hashes_decode() -> None:
    # vLLM's ExternalBlockHash is bytes | int; a reader must take both
    payload = batch_encoder().encode(KVEventBatch(0.0, [_stored(block_hashes=[7, b"k" * 16])]))
    assert decode_batch(payload).events[0].block_hashes == [7, b"k" * 16]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "payload",
    [
        b"not msgpack",
        msgspec.msgpack.encode([0.0, [{"type": "BlockStored", "block_hashes": [b"x"]}]]),
        msgspec.msgpack.encode([0.0, [{"type": "Unknown"}]]),
        msgspec.msgpack.encode({"ts": 0.0}),
    ],
)
def test_what_is_not_a_batch_is_a_decode_error(payload: bytes) -> None:
    with pytest.raises(msgspec.DecodeError):
        decode_batch(payload)


def test_sequence_frames() -> None:
    assert seq_frame(0) == bytes(8) and seq_frame(258) == bytes(6) + b"\x01\x02"
    assert frame_seq(seq_frame(2**40 + 3)) == 2**40 + 3
    assert seq_frame(-1) == END_SEQ and frame_seq(END_SEQ, signed=True) == -1
    assert frame_seq(END_SEQ) == 2**64 - 1  # a live frame is unsigned
