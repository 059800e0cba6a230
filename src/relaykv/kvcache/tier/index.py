"""The tier's index: slots keyed by block hashes, and the checkpoint tree (docs/tier.md "Index").

Slots hold blocks; `maps[g]` maps a group's block key to the slot holding it, and lists only
slots whose store has completed (a lookup never finds bytes still in flight). Checkpoints
(`plan.py`) are nodes of a tree: a node's parent is the previous checkpoint of the same
sequence, and a node owns the blocks `TierPlan.blocks(r, parent)` names. A slot is owned by
every node naming its key (sliding windows of neighbouring checkpoints overlap; identical
prefixes are one node) and lives while it has an owner, a pending store or a pinned load.

Group-consistent eviction: only leaves are evicted, least recently used first. Removing a
leaf drops its own full-group blocks and the window blocks no other node owns, so what stays
is always a set of complete checkpoints: every node's chain holds every group's `needed(r)`
(`check` verifies it). The tier never keeps a full-group prefix whose sliding checkpoint it
dropped: a full block lives only while a node that owns it lives, with that node's windows.

Every method runs on the engine's step thread; the index never touches bytes.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from relaykv.kvcache.tier.plan import TierPlan

# (kind, group, keys): what the tier can serve changed (KV events).
TierEventKind = Literal["stored", "removed"]
TierEventSink = Callable[[TierEventKind, int, tuple[bytes, ...]], None]


@dataclass(slots=True)
class _Slot:
    group: int
    key: bytes
    owners: set[bytes] = field(default_factory=set)
    pending: bool = True  # its store has not completed yet
    pins: int = 0  # loads reading it now


@dataclass(slots=True)
class _Node:
    r: int
    parent: bytes | None
    slots: list[int]
    children: int = 0
    pending: int = 0  # owned slots whose store has not completed
    last_used: int = 0


@dataclass(frozen=True, slots=True)
class NewSlot:
    """A slot `add_node` reserved for a block the tier does not hold yet: store it."""

    group: int
    index: int  # block index in the sequence
    key: bytes
    slot: int


class TierIndex:
    """Slots, keys and checkpoints of one tier."""

    def __init__(self, num_groups: int, capacity: int, on_event: TierEventSink | None = None):
        if capacity < 0:
            raise ValueError(f"a tier needs capacity >= 0 blocks, got {capacity}")
        self.capacity = capacity
        self.maps: list[dict[bytes, int]] = [{} for _ in range(num_groups)]
        self._pending: list[dict[bytes, int]] = [{} for _ in range(num_groups)]
        self._slots: dict[int, _Slot] = {}
        self._free: list[int] = []
        self._next_fresh = 0
        self.nodes: dict[bytes, _Node] = {}
        self._leaves: list[tuple[int, bytes]] = []  # heap of (last_used, node id), lazy
        self._clock = 0
        self.on_event = on_event
        self.evicted_nodes = 0
        self.evicted_blocks = 0

    # -- capacity -----------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free) + self.capacity - self._next_fresh

    @property
    def num_used(self) -> int:
        return self.capacity - self.num_free

    def holds(self, group: int, key: bytes) -> bool:
        """The tier has the block or is storing it."""
        return key in self.maps[group] or key in self._pending[group]

    def slot_of(self, group: int, key: bytes) -> int | None:
        """The slot holding a stored block (None: absent or still in flight)."""
        return self.maps[group].get(key)

    # -- checkpoints ---------------------------------------------------------------------
    def add_node(
        self,
        node_id: bytes,
        r: int,
        parent: bytes | None,
        items: Sequence[Sequence[tuple[int, bytes]]],
    ) -> list[NewSlot] | None:
        """Add checkpoint `node_id` at r under `parent` owning `items` (per group, the
        `(block index, key)` pairs of `TierPlan.blocks`). Returns the slots to store (keys the
        tier lacks); None when it cannot fit (nothing changed). An existing node is touched."""
        node = self.nodes.get(node_id)
        if node is not None:
            self._touch_node(node_id, node)
            return []
        if parent is not None and parent not in self.nodes:
            raise ValueError("a checkpoint's parent must be in the tier")
        wanted: dict[tuple[int, bytes], int] = {}
        for group, pairs in enumerate(items):
            for index, key in pairs:
                wanted.setdefault((group, key), index)
        missing = [
            (g, k, i)
            for (g, k), i in wanted.items()
            if k not in self.maps[g] and k not in self._pending[g]
        ]
        if len(missing) > self.capacity:
            return None
        node = _Node(r, parent, [])
        self.nodes[node_id] = node
        if parent is not None:
            self.nodes[parent].children += 1
        # Own what the tier has first, so evictions below cannot take it away.
        for g, k in wanted:
            slot = self.maps[g].get(k)
            if slot is None:
                slot = self._pending[g].get(k)
            if slot is not None:
                self._own(node_id, node, slot)
        while self.num_free < len(missing):
            if not self._evict_one(protect=node_id):
                self._remove_node(node_id)
                return None
        new: list[NewSlot] = []
        for g, k, i in missing:
            slot = self._free.pop() if self._free else self._fresh()
            self._slots[slot] = _Slot(g, k)
            self._pending[g][k] = slot
            self._own(node_id, node, slot)
            new.append(NewSlot(g, i, k, slot))
        self._touch_node(node_id, node)
        return new

    def stored(self, slots: Sequence[int], ok: bool) -> None:
        """A store of `slots` ended. OK: their keys become visible. Failed: every node owning
        one is dropped with its descendants (their chains are incomplete)."""
        visible: dict[int, list[bytes]] = {}  # group -> keys now served
        for slot in slots:
            rec = self._slots[slot]
            rec.pending = False
            del self._pending[rec.group][rec.key]
            for owner in rec.owners:
                self.nodes[owner].pending -= 1
            if ok and rec.owners:
                self.maps[rec.group][rec.key] = slot
                visible.setdefault(rec.group, []).append(rec.key)
        if not ok:
            for slot in slots:
                failed = self._slots.get(slot)
                if failed is None:
                    continue
                for owner in list(failed.owners):
                    if owner in self.nodes:
                        self._drop_subtree(owner)
        for slot in slots:
            self._maybe_free(slot)
        if self.on_event is not None:
            for group, keys in visible.items():
                self.on_event("stored", group, tuple(keys))

    def pin(self, slots: Sequence[int]) -> None:
        """A load reads these slots: keep them until `unpin`, and mark their nodes used."""
        for slot in slots:
            rec = self._slots[slot]
            rec.pins += 1
            for owner in rec.owners:
                self._touch_node(owner, self.nodes[owner])

    def unpin(self, slots: Sequence[int]) -> None:
        for slot in slots:
            rec = self._slots[slot]
            rec.pins -= 1
            self._maybe_free(slot)

    def drop_keys(self, group: int, keys: Sequence[bytes]) -> None:
        """Forget blocks found unusable (a failed load): their nodes go, with descendants."""
        for key in keys:
            slot = self.maps[group].get(key)
            if slot is None:
                continue
            for owner in list(self._slots[slot].owners):
                if owner in self.nodes:
                    self._drop_subtree(owner)

    def clear(self) -> None:
        """Forget every checkpoint (a shared store may have lost them all). Slots a load
        reads or a store writes stay until their job ends, then become free."""
        for node_id in sorted(self.nodes, key=lambda n: self.nodes[n].r, reverse=True):
            self._remove_node(node_id)  # children (higher r) first

    # -- internals -----------------------------------------------------------------------
    def _fresh(self) -> int:
        slot = self._next_fresh
        self._next_fresh += 1
        return slot

    def _own(self, node_id: bytes, node: _Node, slot: int) -> None:
        rec = self._slots[slot]
        if node_id in rec.owners:
            return
        rec.owners.add(node_id)
        node.slots.append(slot)
        if rec.pending:
            node.pending += 1

    def _touch_node(self, node_id: bytes, node: _Node) -> None:
        self._clock += 1
        node.last_used = self._clock
        if node.children == 0:
            heapq.heappush(self._leaves, (node.last_used, node_id))

    def _evict_one(self, protect: bytes) -> bool:
        """Evict the least recently used evictable leaf; False when there is none."""
        aside: list[tuple[int, bytes]] = []
        found = False
        while self._leaves:
            used, node_id = heapq.heappop(self._leaves)
            node = self.nodes.get(node_id)
            if node is None or node.children or node.last_used != used:
                continue  # stale entry
            if node_id == protect or node.pending:
                aside.append((used, node_id))
                continue
            self._remove_node(node_id)
            self.evicted_nodes += 1
            found = True
            break
        for entry in aside:
            heapq.heappush(self._leaves, entry)
        return found

    def _drop_subtree(self, node_id: bytes) -> None:
        children = [c for c, n in self.nodes.items() if n.parent == node_id]
        for child in children:
            self._drop_subtree(child)
        self._remove_node(node_id)

    def _remove_node(self, node_id: bytes) -> None:
        node = self.nodes.pop(node_id)
        if node.parent is not None and node.parent in self.nodes:
            parent = self.nodes[node.parent]
            parent.children -= 1
            if parent.children == 0:
                heapq.heappush(self._leaves, (parent.last_used, node.parent))
        removed: dict[int, list[bytes]] = {}
        for slot in node.slots:
            rec = self._slots[slot]
            rec.owners.discard(node_id)
            if rec.pending:
                node.pending -= 1
            if not rec.owners and not rec.pending and self.maps[rec.group].get(rec.key) == slot:
                del self.maps[rec.group][rec.key]
                removed.setdefault(rec.group, []).append(rec.key)
            self._maybe_free(slot)
        if self.on_event is not None:
            for group, keys in removed.items():
                self.on_event("removed", group, tuple(keys))

    def _maybe_free(self, slot: int) -> None:
        rec = self._slots.get(slot)
        if rec is None or rec.owners or rec.pending or rec.pins:
            return
        if self.maps[rec.group].get(rec.key) == slot:
            del self.maps[rec.group][rec.key]
            if self.on_event is not None:
                self.on_event("removed", rec.group, (rec.key,))
        del self._slots[slot]
        self._free.append(slot)
        self.evicted_blocks += 1

    # -- the invariant checker ------------------------------------------------------------
    def check(
        self, plan: TierPlan, keys_of: Callable[[bytes], list[list[bytes]]] | None = None
    ) -> list[str]:
        """Violations of the index's invariants (empty: consistent). With `keys_of(node_id)`
        (per group, the sequence's block keys), also that every node's chain holds every
        group's `needed(r)`: each checkpoint is a complete resume point."""
        problems: list[str] = []
        used = set(self._slots)
        if used & set(self._free):
            problems.append("a slot is both used and free")
        if len(used) + self.num_free != self.capacity:
            problems.append(f"used {len(used)} + free {self.num_free} != capacity {self.capacity}")
        for g, gmap in enumerate(self.maps):
            for key, slot in gmap.items():
                rec = self._slots.get(slot)
                if rec is None or rec.key != key or rec.group != g or rec.pending:
                    problems.append(f"group {g} maps a key to slot {slot} not holding it")
                elif not rec.owners:
                    problems.append(f"slot {slot} is visible without an owner")
        children: dict[bytes, int] = {}
        for node_id, node in self.nodes.items():
            if node.parent is not None:
                if node.parent not in self.nodes:
                    problems.append(f"node at {node.r} has no parent in the tier")
                else:
                    children[node.parent] = children.get(node.parent, 0) + 1
                    if self.nodes[node.parent].r >= node.r:
                        problems.append(f"node at {node.r} has a parent at or above it")
            pending = 0
            for slot in node.slots:
                rec = self._slots.get(slot)
                if rec is None or node_id not in rec.owners:
                    problems.append(f"node at {node.r} names slot {slot} it does not own")
                elif rec.pending:
                    pending += 1
            if pending != node.pending:
                problems.append(f"node at {node.r}: pending {node.pending}, counted {pending}")
        for node_id, node in self.nodes.items():
            if node.children != children.get(node_id, 0):
                problems.append(f"node at {node.r}: children {node.children} miscounted")
        for slot, rec in self._slots.items():
            for owner in rec.owners:
                if owner not in self.nodes or slot not in self.nodes[owner].slots:
                    problems.append(f"slot {slot} owned by a node that does not name it")
        if keys_of is not None:
            for node_id in self.nodes:
                problems.extend(self._check_chain(plan, node_id, keys_of(node_id)))
        return problems

    def _check_chain(self, plan: TierPlan, node_id: bytes, keys: list[list[bytes]]) -> list[str]:
        held: list[set[bytes]] = [set() for _ in self.maps]
        current: bytes | None = node_id
        while current is not None:
            node = self.nodes[current]
            for slot in node.slots:
                rec = self._slots[slot]
                held[rec.group].add(rec.key)
            current = node.parent
        r = self.nodes[node_id].r
        problems = []
        for g, need in enumerate(plan.covered(r)):
            lacking = [i for i in need if i >= len(keys[g]) or keys[g][i] not in held[g]]
            if lacking:
                problems.append(f"checkpoint at {r}: group {g} lacks blocks {lacking[:4]}")
        return problems
