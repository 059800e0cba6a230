"""relaykv's KV events as vLLM's own event objects (docs/kv-events.md, docs/vllm.md).

vLLM's consumers (its ZMQ publisher, Dynamo's and llm-d's KV routers) read `BlockStored`
with the group index, the group's spec kind and sliding window, `BlockRemoved` with the
group index, and `AllBlocksCleared`. relaykv's engine already writes exactly these records
(`relaykv.engine.kv_events.wire_event`, on the floor's copies of vLLM's structs); the plugin
takes that one conversion and re-creates each record as the vLLM class of the same name, so
vLLM's publisher and aggregator handle them as their own.
"""

from __future__ import annotations

from vllm.distributed import kv_events as vllm_kv_events
from vllm.distributed.kv_events import KVCacheEvent

from relaykv.engine.kv_events import wire_event
from relaykv.kvcache.geometry import Geometry
from relaykv.kvcache.pool import KVEvent


def to_vllm_event(event: KVEvent, geometry: Geometry) -> KVCacheEvent:
    """One relaykv pool event as vLLM's event object."""
    record = wire_event(event, geometry)
    cls = getattr(vllm_kv_events, type(record).__name__)
    fields = {name: getattr(record, name) for name in record.__struct_fields__}
    return cls(**fields)
