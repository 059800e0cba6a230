"""A model-free executor that makes paging errors visible (engine tests).

"KV" is the token itself, stored with its position in a real page buffer laid out as the model
runner's (uint8 `[num_blocks, block_bytes]`, group g's page in the first `b_g * 8` bytes of a
row: int32 token and int32 position + 1 per slot), so transports can move it. The next
token after position p is a hash of what each group reads through its block table: every
position up to p in a full group, the last W in a sliding one. `expected_next` computes the
same function straight from the token sequence, without any paging, so an engine that reads a
wrong, stale, null or unwritten block produces different tokens (or trips an assertion).

Speculation: with `k > 0` it proposes k drafts from the true continuation, deliberately wrong
at every `wrong_every`-th position, and verifies them like the real runner (greedy).
"""

from __future__ import annotations

import numpy as np

from relaykv.common.messages.steps import SequenceOutput, StepBatch, StepOutput
from relaykv.kvcache import Geometry, GroupSpec

VOCAB = 101
SLOT_BYTES = 8  # int32 token + int32 (position + 1); 0 marks an unwritten slot


def with_slot_bytes(geometry: Geometry) -> Geometry:
    """The geometry with each group's bytes per token set to the reference KV's size."""
    groups = tuple(
        GroupSpec(g.kind, g.block_size, g.window, g.draft, g.num_layers, SLOT_BYTES)
        for g in geometry.groups
    )
    return Geometry(groups, eagle=geometry.eagle, eagle_reuse=geometry.eagle_reuse)


def _mix(h: int, x: int) -> int:
    return (h * 1_000_003 + x + 7) % (1 << 61)


def expected_next(geometry: Geometry, tokens: list[int], p: int) -> int:
    """The token following position p of `tokens`, computed without paging."""
    h = 0
    for g in geometry.groups:
        lo = 0 if g.kind == "full" else max(0, p - g.window + 1)
        for q in range(lo, p + 1):
            h = _mix(h, tokens[q] * 131 + q)
        h = _mix(h, 999)
    return h % VOCAB


def reference_generate(geometry: Geometry, prompt: list[int], max_tokens: int) -> list[int]:
    seq = list(prompt)
    out = []
    for _ in range(max_tokens):
        t = expected_next(geometry, seq, len(seq) - 1)
        out.append(t)
        seq.append(t)
    return out


class ReferenceExecutor:
    def __init__(
        self, geometry: Geometry, num_blocks: int, k: int = 0, wrong_every: int = 3
    ) -> None:
        self._geometry = with_slot_bytes(geometry)
        self.k = k
        self.wrong_every = wrong_every
        self.buffer = np.zeros((num_blocks, self._geometry.block_bytes), dtype=np.uint8)
        self._slots = self.buffer.view(np.int32)  # [num_blocks, block_bytes // 4]
        self.steps = 0

    @property
    def geometry(self) -> Geometry:
        return self._geometry

    @property
    def num_speculative_tokens(self) -> int:
        return self.k

    @property
    def kv_buffer(self) -> np.ndarray:
        return self.buffer

    def _write(self, tables, p: int, token: int) -> None:
        for gi, g in enumerate(self._geometry.groups):
            block = tables[gi][p // g.block_size]
            assert block != 0, f"write of position {p} into the null block (group {gi})"
            slot = 2 * (p % g.block_size)
            self._slots[block, slot : slot + 2] = (token, p + 1)

    def _read_next(self, tables, p: int) -> int:
        h = 0
        for gi, g in enumerate(self._geometry.groups):
            lo = 0 if g.kind == "full" else max(0, p - g.window + 1)
            for q in range(lo, p + 1):
                block = tables[gi][q // g.block_size]
                assert block != 0, f"read of position {q} from the null block (group {gi})"
                slot = 2 * (q % g.block_size)
                token, pos = (int(x) for x in self._slots[block, slot : slot + 2])
                assert pos == q + 1, f"group {gi} block {block} holds position {pos - 1}, not {q}"
                h = _mix(h, token * 131 + q)
            h = _mix(h, 999)
        return h % VOCAB

    def execute(self, batch: StepBatch) -> StepOutput:
        self.steps += 1
        outs = []
        for seq in batch.sequences:  # page copies first (common.messages.steps)
            for _, source, dest in seq.kv_copies:
                self.buffer[dest] = self.buffer[source]
        for seq in batch.sequences:
            s = seq.start_position
            tables = seq.block_tables
            tokens = list(seq.token_ids)
            drafts = list(seq.draft_token_ids)
            for i, t in enumerate(tokens + drafts):
                self._write(tables, s + i, t)
            out = SequenceOutput(seq.request_id)
            if seq.sample:
                last = s + len(tokens) - 1
                accepted = 0
                produced = []
                target = self._read_next(tables, last)
                for d in drafts:
                    if d != target:
                        break
                    accepted += 1
                    produced.append(d)
                    target = self._read_next(tables, last + accepted)
                produced.append(target)
                out.token_ids = produced
                out.num_draft_tokens = len(drafts)
                out.num_accepted_tokens = accepted
                if self.k:
                    out.draft_token_ids = self._propose(tables, last + accepted + 1, target)
            outs.append(out)
        return StepOutput(outs)

    def _propose(self, tables, position: int, token: int) -> list[int]:
        """Drafts for positions after `position` (whose token is `token`), written as
        speculative KV exactly where the real runner writes it (lookahead slots)."""
        proposals = []
        p, t = position, token
        for i in range(self.k):
            self._write(tables, p, t)
            nxt = self._read_next(tables, p)
            if (p + i) % self.wrong_every == 0:
                nxt = (nxt + 1) % VOCAB
            proposals.append(nxt)
            p, t = p + 1, nxt
        return proposals
