"""vLLM's own cache structures as live views of relaykv's (docs/vllm.md "vLLM's structures").

Under the plugin vLLM's block pool and per-group managers decide nothing, but vLLM's
components still read them: NIXL's scheduler half asks each allocated block whether it
carries a hash (`KVCacheBlock.block_hash`: those that do are local hits, not filled), the
auxiliary-output connector asks the pool whether a block hash is still cached
(`BlockPool.get_cached_block`), the CPU offload connector walks the free queue, and tests
read the per-group block lists. Each structure is replaced by a view that answers from
relaykv's state when it is read: nothing is copied per step, so a view cannot drift.

* `single_type_managers[g].req_to_blocks`: `RequestBlocks`, request id -> its group-`g`
  blocks (vLLM's null block where relaykv freed a window block), for every request that
  holds blocks;
* `single_type_managers[g].num_cached_block`: `CachedBlockCounts`, request id -> the
  blocks of group `g` relaykv has considered for keying (`CacheRequest.num_cached_blocks`);
* `block_pool.free_block_queue`: `FreeBlockQueue`, relaykv's free queue in eviction order;
* `block_pool.cached_block_hash_to_block` and `get_cached_block`: `CachedBlocks`,
  relaykv's keyed blocks found by vLLM's block hashes;
* every `KVCacheBlock`: `RelayKVCacheBlock`, its `ref_cnt` relaykv's reference count and
  its `block_hash` vLLM's hash of the key relaykv gave it (None while unkeyed).

relaykv keys blocks with its own hashes; vLLM names the same prefix with its block hashes
(`request.block_hashes`, at the pool's `hash_block_size`). `BlockNames` pairs the two per
group for every block relaykv caches (after each of the plugin's calls that may key
blocks, over the blocks considered since); pairs whose key left the cache are dropped once
they outnumber twice the pool.

The views are read-only: an attempt to change one (vLLM's own pool operations) raises, as
relaykv's pool is the only one that allocates.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_utils import (
    BlockHash,
    BlockHashWithGroupId,
    KVCacheBlock,
    get_block_hash,
    get_group_id,
    make_block_hash_with_group_id,
)
from vllm.v1.request import Request

from relaykv.kvcache.manager import KVCacheManager
from relaykv.kvcache.pool import BlockPool as RelayBlockPool
from relaykv.kvcache.request import CacheRequest

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_coordinator import KVCacheCoordinator


def _read_only(what: str) -> NoReturn:
    raise RuntimeError(
        f"relaykv.vllm: vLLM's {what} is a read-only view of relaykv's cache under the "
        "plugin (relaykv's pool allocates, keys and frees)"
    )


class BlockNames:
    """vLLM's block hash for relaykv's key of the same block, per group, both ways."""

    def __init__(self, relay: KVCacheManager, hash_block_size: int) -> None:
        self.relay = relay
        self.scale: list[int] = []
        for rule in relay.rules:
            if rule.block_size % hash_block_size:
                raise ValueError(
                    f"relaykv.vllm: group {rule.index}'s block size {rule.block_size} is not "
                    f"a multiple of vLLM's hash block size {hash_block_size}"
                )
            self.scale.append(rule.block_size // hash_block_size)
        groups = range(len(relay.rules))
        self.of_key: list[dict[bytes, BlockHash]] = [{} for _ in groups]
        self.of_hash: list[dict[BlockHash, bytes]] = [{} for _ in groups]
        # request id -> (vLLM's hash list, relaykv's request, blocks checked per group)
        self._named: dict[str, tuple[list[BlockHash], CacheRequest, list[int]]] = {}
        self._limit = [2 * relay.pool.num_blocks for _ in groups]

    def name(self, request: Request, creq: CacheRequest) -> None:
        """Pair each key relaykv cached of `creq`'s blocks with `request`'s vLLM hash of the
        same block. Call after every change that may key blocks: it checks the blocks
        relaykv considered for keying since (`num_cached_blocks`), nothing while none."""
        entry = self._named.get(creq.request_id)
        if entry is None:
            entry = (request.block_hashes, creq, [0] * len(self.scale))
            self._named[creq.request_id] = entry
        elif entry[2] == creq.num_cached_blocks:
            return
        self._name(*entry)

    def _name(self, hashes: list[BlockHash], creq: CacheRequest, done: list[int]) -> None:
        maps = self.relay.pool.maps
        for g, s in enumerate(self.scale):
            end = min(creq.num_cached_blocks[g], len(hashes) // s)
            start, done[g] = done[g], end
            if end <= start:
                continue
            cached = maps[g]
            pairs = [
                (key, name)
                for key, name in zip(
                    creq.keys(g)[start:end], hashes[(start + 1) * s - 1 : end * s : s], strict=True
                )
                if key in cached
            ]
            if pairs:
                self.of_key[g].update(pairs)
                self.of_hash[g].update((name, key) for key, name in pairs)
                if len(self.of_key[g]) > self._limit[g]:
                    self._prune(g)

    def forget(self, request_id: str) -> None:
        """`request_id` left relaykv's cache: its pairs stay while its keys are cached."""
        self._named.pop(request_id, None)

    def _prune(self, g: int) -> None:
        cached = self.relay.pool.maps[g]
        kept = {k: h for k, h in self.of_key[g].items() if k in cached}
        self.of_key[g] = kept
        self.of_hash[g] = {h: k for k, h in kept.items()}
        self._limit[g] = max(2 * self.relay.pool.num_blocks, 2 * len(kept))

    def _find(self, block: int, group: int) -> BlockHash | None:
        """The name of a keyed block `name` has not seen keyed (a P/D load keys received
        blocks before relaykv counts them considered): found in a live request's table."""
        key = self.relay.pool.block_key[block]
        s = self.scale[group]
        for hashes, creq, _ in self._named.values():
            table = creq.tables[group]
            keys = creq.keys(group)
            for k in range(min(len(table), len(keys), len(hashes) // s)):
                if table[k] == block and keys[k] == key:
                    name = hashes[(k + 1) * s - 1]
                    self.of_key[group][keys[k]] = name
                    self.of_hash[group][name] = keys[k]
                    return name
        return None

    def block_hash(self, block: int) -> BlockHashWithGroupId | None:
        """vLLM's hash of the key `block` carries in relaykv's pool (None: unkeyed)."""
        pool = self.relay.pool
        key = pool.block_key[block]
        if key is None:
            return None
        group = pool.block_group[block]
        name = self.of_key[group].get(key) or self._find(block, group)
        if name is None:
            raise RuntimeError(
                f"relaykv.vllm: block {block} carries a key with no vLLM block hash "
                f"(group {group}): a keyed request was not named"
            )
        return make_block_hash_with_group_id(name, group)

    def cached_block(self, block_hash: BlockHash, group: int) -> int | None:
        """relaykv's cached block of group `group` under vLLM's `block_hash` (None: none)."""
        if not 0 <= group < len(self.of_hash):
            return None
        key = self.of_hash[group].get(block_hash)
        return None if key is None else self.relay.pool.maps[group].get(key)


class RelayKVCacheBlock(KVCacheBlock):
    """vLLM's `KVCacheBlock` whose reference count and hash are relaykv's (read live).

    The plugin turns vLLM's own block objects into this class in place (`adopt_blocks`):
    block tables, connector metadata and the worker see the same objects as before.
    `pool` is the `RelayBlockPoolView` they belong to."""

    __slots__ = ()

    @property
    def ref_cnt(self) -> int:
        return 0 if self.is_null else self.pool.relay.ref_cnt[self.block_id]

    @ref_cnt.setter
    def ref_cnt(self, value: int) -> None:
        _read_only("KVCacheBlock.ref_cnt")

    @property
    def _block_hash(self) -> BlockHashWithGroupId | None:
        if self.is_null:
            return None
        return self.pool.names.block_hash(self.block_id)

    @_block_hash.setter
    def _block_hash(self, value: BlockHashWithGroupId | None) -> None:
        _read_only("KVCacheBlock.block_hash")


class RequestBlocks(Mapping[str, list[KVCacheBlock]]):
    """`req_to_blocks` of group `group`: request id -> its blocks, for the requests that
    hold blocks. Reading an absent id gives an empty list without adding it (vLLM's is a
    `defaultdict(list)`)."""

    def __init__(self, relay: KVCacheManager, group: int, blocks: Sequence[KVCacheBlock]):
        self.relay, self.group, self.blocks = relay, group, blocks

    def _table(self, request_id: str) -> list[int] | None:
        creq = self.relay.requests.get(request_id)
        if creq is None or not any(creq.tables):
            return None
        return creq.tables[self.group]

    def __getitem__(self, request_id: str) -> list[KVCacheBlock]:
        table = self._table(request_id)
        blocks = self.blocks
        return [] if table is None else [blocks[b] for b in table]

    def __contains__(self, request_id: object) -> bool:
        return isinstance(request_id, str) and self._table(request_id) is not None

    def get(self, request_id: str, default: Any = None) -> Any:
        if self._table(request_id) is None:
            return default
        return self[request_id]

    def __iter__(self) -> Iterator[str]:
        return iter([rid for rid, creq in self.relay.requests.items() if any(creq.tables)])

    def __len__(self) -> int:
        return sum(1 for creq in self.relay.requests.values() if any(creq.tables))


class CachedBlockCounts(Mapping[str, int]):
    """`num_cached_block` of group `group`: request id -> the request's blocks relaykv has
    considered for keying, for the requests that hold blocks."""

    def __init__(self, relay: KVCacheManager, group: int) -> None:
        self.relay, self.group = relay, group

    def __getitem__(self, request_id: str) -> int:
        creq = self.relay.requests.get(request_id)
        if creq is None or not any(creq.tables):
            raise KeyError(request_id)
        return creq.num_cached_blocks[self.group]

    def __iter__(self) -> Iterator[str]:
        return iter([rid for rid, creq in self.relay.requests.items() if any(creq.tables)])

    def __len__(self) -> int:
        return sum(1 for creq in self.relay.requests.values() if any(creq.tables))


class FreeBlockQueue:
    """vLLM's `FreeKVCacheBlockQueue`: relaykv's free queue, next victim first."""

    def __init__(self, pool: RelayBlockPool, blocks: Sequence[KVCacheBlock]) -> None:
        self.pool, self.blocks = pool, blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        blocks = self.blocks
        return [blocks[b] for b in self.pool.free_queue()]

    def iter_blocks_after(self, cursor: KVCacheBlock | None) -> Iterator[KVCacheBlock]:
        queue = self.pool.free_queue()
        start = 0
        if cursor is not None:
            start = queue.index(cursor.block_id) + 1 if cursor.block_id in queue else len(queue)
        blocks = self.blocks
        return iter([blocks[b] for b in queue[start:]])

    def popleft(self) -> NoReturn:
        _read_only("free block queue")

    popleft_n = remove = append = append_n = prepend_n = popleft


class CachedBlocks:
    """vLLM's `BlockHashToBlockMap`: relaykv's keyed blocks under vLLM's block hashes."""

    def __init__(self, pool: RelayBlockPool, names: BlockNames, blocks: Sequence[KVCacheBlock]):
        self.pool, self.names, self.blocks = pool, names, blocks

    def get_one_block(self, key: BlockHashWithGroupId) -> KVCacheBlock | None:
        block = self.names.cached_block(get_block_hash(key), get_group_id(key))
        return None if block is None else self.blocks[block]

    def contain(self, key: BlockHashWithGroupId, block_id: int) -> bool:
        return self.names.cached_block(get_block_hash(key), get_group_id(key)) == block_id

    def __len__(self) -> int:
        return sum(len(m) for m in self.pool.maps)

    def insert(self, key: BlockHashWithGroupId, block: KVCacheBlock) -> NoReturn:
        _read_only("block hash map")

    pop = insert


class RelayBlockPoolView(BlockPool):
    """vLLM's block pool object, answered from relaykv's pool (`relay`): capacity, the free
    queue, cached blocks by vLLM's hashes, and its blocks' counts and hashes."""

    def __init__(self, stock: BlockPool, relay: KVCacheManager, names: BlockNames) -> None:
        self.__dict__.update(stock.__dict__)
        self.relay: RelayBlockPool = relay.pool
        self.names = names
        self.free_block_queue = FreeBlockQueue(relay.pool, self.blocks)
        self.cached_block_hash_to_block = CachedBlocks(relay.pool, names, self.blocks)
        self.cached_block_hashes_by_block: dict[int, set[bytes]] = {}

    def get_num_free_blocks(self) -> int:
        return self.relay.num_free

    def get_cached_block(
        self, block_hash: BlockHash, kv_cache_group_ids: list[int]
    ) -> list[KVCacheBlock] | None:
        out = []
        for group in kv_cache_group_ids:
            block = self.names.cached_block(block_hash, group)
            if block is None:
                return None
            out.append(self.blocks[block])
        return out

    def get_new_blocks(self, num_blocks: int) -> NoReturn:
        _read_only("block pool")

    def touch(self, blocks: Any) -> NoReturn:
        _read_only("block pool")

    def free_blocks(self, ordered_blocks: Any) -> NoReturn:
        _read_only("block pool")

    def cache_full_blocks(self, *args: Any, **kwargs: Any) -> NoReturn:
        _read_only("block pool")

    def evict_blocks(self, block_ids: set[int]) -> None:
        self.relay.uncache(sorted(block_ids))


def adopt_blocks(
    stock: BlockPool, coordinator: KVCacheCoordinator, relay: KVCacheManager
) -> RelayBlockPoolView:
    """Put relaykv's views in place of vLLM's pool and per-group structures (the module
    docstring); returns the pool view. vLLM's block objects become `RelayKVCacheBlock`s of
    the view, in place."""
    names = BlockNames(relay, stock.hash_block_size)
    view = RelayBlockPoolView(stock, relay, names)
    for block in view.blocks:
        block.__class__ = RelayKVCacheBlock
        block.pool = view
    coordinator.block_pool = view
    for g, single in enumerate(coordinator.single_type_managers):
        single.block_pool = view
        single.req_to_blocks = RequestBlocks(relay, g, view.blocks)
        single.num_cached_block = CachedBlockCounts(relay, g)
    return view
