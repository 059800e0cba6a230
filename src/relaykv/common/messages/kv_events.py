"""The KV-event wire schema: vLLM's records, written once (docs/kv-events.md).

An engine publishes (`relaykv.engine.kv_events`) and a router reads (`relaykv.router.index`,
`relaykv.router.kv_subscriber`) the same messages, so both use these definitions:

* a batch is the `array_like` `KVEventBatch` `[ts, events, data_parallel_rank]`, msgpack;
* its events are tagged structs (`{"type": "BlockStored", ...}`): `BlockStored`,
  `BlockRemoved`, `AllBlocksCleared`, with vLLM's fields (`vllm/distributed/kv_events.py`);
  the fields vLLM requires have no default here either, so an encoded event always carries
  them (vLLM's own decoder needs them) and a batch that lacks one does not decode;
* a batch travels as `(topic, sequence number, payload)`; the sequence number is 8 bytes
  big-endian, and a replay answer ends with the number -1 (`END_SEQ`) and an empty payload.
"""

from __future__ import annotations

from typing import Any

import msgspec

MEDIUM_GPU = "GPU"  # the device pool's `medium`
SEQ_BYTES = 8
END_SEQ = (-1).to_bytes(SEQ_BYTES, "big", signed=True)

# relaykv group kind -> vLLM's `kv_cache_spec_kind`
VLLM_SPEC_KIND = {
    "full": "full_attention",
    "sliding": "sliding_window",
    "chunked": "chunked_local_attention",
}


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base of the tagged events (`{"type": "BlockStored", ...}` on the wire)."""


class BlockStored(KVCacheEvent):
    # vLLM's ExternalBlockHash is `bytes | int`; relaykv's keys are bytes
    block_hashes: list[bytes | int]
    parent_block_hash: bytes | int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[bytes | int]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


WireEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(EventBatch):
    events: list[WireEvent]


_DECODER = msgspec.msgpack.Decoder(KVEventBatch)


def batch_encoder() -> msgspec.msgpack.Encoder:
    """An encoder for `KVEventBatch` payloads (one per thread: encoders are not shared)."""
    return msgspec.msgpack.Encoder()


def decode_batch(payload: bytes) -> KVEventBatch:
    """A batch from its msgpack payload; raises `msgspec.DecodeError` when it is not one."""
    return _DECODER.decode(payload)


def seq_frame(seq: int) -> bytes:
    """The sequence-number frame of batch `seq` (-1: the end of a replay)."""
    return seq.to_bytes(SEQ_BYTES, "big", signed=seq < 0)


def frame_seq(frame: bytes, *, signed: bool = False) -> int:
    """The sequence number a frame carries (`signed` in a replay answer, whose end is -1)."""
    return int.from_bytes(frame, "big", signed=signed)
