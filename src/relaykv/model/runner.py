"""The model runner: one `StepBatch` in, one `StepOutput` out (the engine's executor side).

A step is one target forward over every sequence's tokens (prefill chunks, decode tokens
and verification windows flattened together: projections and MLPs are one matmul each),
logits for the rows that sample only, verification, then, with an EAGLE draft, the
draft passes that write the draft KV and propose the next step's tokens. Which KV
positions are written is specified in `relaykv.common.messages.steps` (the engine's rollback
depends on it). The runner keeps no per-request state: sampling randomness is derived
from (seed, token index), so there is nothing to free when a request ends.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from relaykv.common.messages.steps import (
    SequenceOutput,
    SequenceWork,
    SpeculativeStats,
    StepBatch,
    StepOutput,
)
from relaykv.kvcache.geometry import Geometry
from relaykv.model.attention.backend import AttentionBackend, TorchPagedAttention
from relaykv.model.attention.plan import GroupPlan, QueryRun, build_group_plan
from relaykv.model.eagle import EagleDraft
from relaykv.model.forward_context import PagedContext
from relaykv.model.kv_layout import KVLayout, derive_layout
from relaykv.model.kv_pages import KVPageStore
from relaykv.model.packed_linear import prepack_linears
from relaykv.model.sampling import GeneratorSource, token_logprobs
from relaykv.model.speculative import verify
from relaykv.model.transformer import CausalLM

HiddenObserver = Callable[[Sequence[SequenceWork], Sequence[int], torch.Tensor], None]


class ModelRunner:
    """Runs a target model (and optional EAGLE draft) over paged KV.

    `num_blocks` sizes the page store (block 0 is the null block); `block_size` is used by
    every group; `num_speculative_tokens` (k) needs a draft. `batch_threshold`: query runs
    up to this many tokens are attended as one padded batch; longer runs (prefill chunks)
    attend on their own in sub-blocks of `query_block` queries. `kv_buffer`: memory for the
    KV pages that the caller owns (uint8 `[num_blocks, block_bytes]`, e.g. a shared-memory
    segment a KV transport writes into); by default the runner allocates it.
    `prepack_weights`: keep the projections' CPU weights prepacked as well (`packed_linear`;
    more memory, faster multi-row steps).
    """

    def __init__(
        self,
        model: CausalLM,
        *,
        num_blocks: int,
        block_size: int = 16,
        draft: EagleDraft | None = None,
        num_speculative_tokens: int = 0,
        backend: AttentionBackend | None = None,
        seed: int | None = None,
        batch_threshold: int = 32,
        query_block: int = 512,
        kv_buffer: torch.Tensor | None = None,
        prepack_weights: bool = True,
    ) -> None:
        if num_speculative_tokens < 0:
            raise ValueError("num_speculative_tokens must be >= 0")
        if num_speculative_tokens and draft is None:
            raise ValueError("speculative tokens need a draft model")
        self.model = model.eval()
        self.device = model.device
        self.dtype = model.dtype
        self.draft = draft
        self.num_speculative_tokens = num_speculative_tokens if draft is not None else 0
        shape = draft.attention_shape() if draft is not None else None
        self.layout: KVLayout = derive_layout(model.config, block_size, self.dtype, shape)
        self.kv = KVPageStore(self.layout, num_blocks, self.device, kv_buffer)
        self.slots = self.layout.slots()  # layer key -> page slot; the model stays unbound
        model.build_rotaries()
        if draft is not None:
            draft.check_target(model.config)
            draft.to(device=self.device, dtype=self.dtype).eval()
            draft.build_rotaries()
        if prepack_weights:
            prepack_linears(model)
            if draft is not None:
                prepack_linears(draft)
        self.backend = backend or TorchPagedAttention()
        self.generators = GeneratorSource(self.device, seed)
        self.stats = SpeculativeStats()
        self.batch_threshold = batch_threshold
        self.query_block = query_block
        # Called after each step's target pass with (sequences, first row of each, final-norm
        # hidden states of all rows): how EAGLE distillation records the target's hidden
        # states while the real engine generates its training text (docs/model.md).
        self.hidden_observer: HiddenObserver | None = None

    @property
    def geometry(self) -> Geometry:
        return self.layout.geometry

    @property
    def kv_buffer(self) -> torch.Tensor:
        return self.kv.buffer

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size

    # -- the step -----------------------------------------------------------------------
    @torch.inference_mode()
    def execute(self, batch: StepBatch) -> StepOutput:
        seqs = list(batch.sequences)
        if not seqs:
            return StepOutput([])
        self._validate(seqs)
        self._copy_pages(seqs)
        hidden, starts = self._target_pass(seqs)
        if self.hidden_observer is not None:
            self.hidden_observer(seqs, starts, hidden)
        rows: list[int] = []
        for work, start in zip(seqs, starts, strict=True):
            if work.sample:
                n, d = len(work.token_ids), len(work.draft_token_ids)
                rows.extend(range(start + n - 1, start + n + d))
        logits = self.model.logits(hidden[self._long(rows)]) if rows else None
        outputs, offset = [], 0
        for work in seqs:
            out = SequenceOutput(work.request_id)
            if work.sample:
                assert logits is not None
                n, d = len(work.token_ids), len(work.draft_token_ids)
                rows_logits = logits[offset : offset + d + 1]
                offset += d + 1
                tokens, accepted = verify(
                    rows_logits,
                    work.draft_token_ids,
                    work.sampling,
                    work.start_position + n,
                    self.generators,
                )
                out.token_ids = tokens
                out.num_draft_tokens, out.num_accepted_tokens = d, accepted
                if work.sampling.logprobs:
                    out.logprobs = token_logprobs(rows_logits, tokens, work.sampling.logprobs)
                if d:
                    self.stats.num_drafts += 1
                    self.stats.num_draft_tokens += d
                    self.stats.num_accepted_tokens += accepted
            outputs.append(out)
        if self.num_speculative_tokens:
            self._propose(seqs, starts, hidden, outputs)
        return StepOutput(outputs)

    @torch.inference_mode()
    def score(self, batch: StepBatch) -> list[torch.Tensor]:
        """float32 logits `[n + d, vocab]` of every computed position of each sequence.

        Runs the target pass only (writes the target KV like `execute`, no sampling, no
        draft): for prompt log-probabilities and for tests against reference models.
        """
        seqs = list(batch.sequences)
        if not seqs:
            return []
        self._validate(seqs, need_next_token=False)
        self._copy_pages(seqs)
        hidden, starts = self._target_pass(seqs)
        logits = self.model.logits(hidden)
        ends = [*starts[1:], hidden.shape[0]]
        return [logits[a:b] for a, b in zip(starts, ends, strict=True)]

    def _copy_pages(self, seqs: list[SequenceWork]) -> None:
        """The steps' `kv_copies`, before anything is computed (common.messages.steps)."""
        for work in seqs:
            for group, source, dest in work.kv_copies:
                self.kv.write_pages(group, [dest], self.kv.read_pages(group, [source]))

    def _target_pass(self, seqs: list[SequenceWork]) -> tuple[torch.Tensor, list[int]]:
        """Final hidden states of all rows, and each sequence's first row."""
        starts: list[int] = []
        ids: list[int] = []
        positions: list[int] = []
        for work in seqs:
            tokens = [*work.token_ids, *work.draft_token_ids]
            starts.append(len(ids))
            ids.extend(tokens)
            positions.extend(range(work.start_position, work.start_position + len(tokens)))
        runs = [
            (work, start, len(work.token_ids) + len(work.draft_token_ids), work.start_position)
            for work, start in zip(seqs, starts, strict=True)
        ]
        groups = range(len(self.layout.shapes))
        ctx = PagedContext(
            self.model.rotaries,
            self._long(positions),
            self.dtype,
            self._plans(runs, groups),
            self.kv,
            self.backend,
            self.slots,
        )
        return self.model(self._long(ids), ctx), starts

    # -- EAGLE ----------------------------------------------------------------------------
    def _propose(
        self,
        seqs: list[SequenceWork],
        starts: list[int],
        hidden: torch.Tensor,
        outputs: list[SequenceOutput],
    ) -> None:
        """Write the draft KV of the committed positions, then draft k tokens per sampler."""
        draft = self.draft
        assert draft is not None and self.layout.draft_slot is not None
        group = self.layout.draft_slot.group
        rows: list[int] = []
        tokens: list[int] = []
        positions: list[int] = []
        runs: list[tuple[SequenceWork, int, int, int]] = []
        for work, start, out in zip(seqs, starts, outputs, strict=True):
            if work.sample:
                committed = [*work.token_ids, *work.draft_token_ids[: out.num_accepted_tokens]]
                following = [*committed[1:], out.token_ids[-1]]
            else:
                following = [*work.token_ids[1:], int(work.next_token_id)]  # type: ignore[arg-type]
            count = len(following)
            runs.append((work, len(rows), count, work.start_position))
            rows.extend(range(start, start + count))
            tokens.extend(following)
            positions.extend(range(work.start_position, work.start_position + count))
        ctx = PagedContext(
            draft.rotaries,
            self._long(positions),
            self.dtype,
            self._plans(runs, [group]),
            self.kv,
            self.backend,
            self.slots,
        )
        out_hidden = draft(self.model.embed(self._long(tokens)), hidden[self._long(rows)], ctx)

        samplers = [i for i, work in enumerate(seqs) if work.sample and work.propose]
        if not samplers:
            return
        last_rows = [runs[i][1] + runs[i][2] - 1 for i in samplers]
        h = out_hidden[self._long(last_rows)]
        proposal = self._draft_argmax(h)
        proposals = [proposal]
        for j in range(1, self.num_speculative_tokens):
            step_runs = [
                (seqs[i], row, 1, seqs[i].start_position + runs[i][2] - 1 + j)
                for row, i in enumerate(samplers)
            ]
            ctx = PagedContext(
                draft.rotaries,
                self._long([r[3] for r in step_runs]),
                self.dtype,
                self._plans(step_runs, [group]),
                self.kv,
                self.backend,
                self.slots,
            )
            h = draft(self.model.embed(proposal), h, ctx)
            proposal = self._draft_argmax(h)
            proposals.append(proposal)
        table = torch.stack(proposals, dim=1).tolist()
        for row, i in enumerate(samplers):
            outputs[i].draft_token_ids = table[row]

    def _draft_argmax(self, h: torch.Tensor) -> torch.Tensor:
        assert self.draft is not None
        return torch.argmax(self.model.logits(self.draft.head_input(h)), dim=-1)

    # -- helpers --------------------------------------------------------------------------
    def _long(self, values: Sequence[int] | torch.Tensor) -> torch.Tensor:
        if isinstance(values, torch.Tensor):
            return values.to(device=self.device, dtype=torch.long)
        return torch.tensor(values, dtype=torch.long, device=self.device)

    def _plans(
        self, runs: Sequence[tuple[SequenceWork, int, int, int]], groups: Sequence[int] | range
    ) -> dict[int, GroupPlan]:
        plans = {}
        for g in groups:
            spec = self.layout.geometry.groups[g]
            query_runs = [
                QueryRun(w.request_id, row, count, pos, w.block_tables[g])
                for w, row, count, pos in runs
            ]
            plans[g] = build_group_plan(
                query_runs,
                spec.block_size,
                spec.window,
                self.device,
                self.batch_threshold,
                self.query_block,
            )
        return plans

    def _validate(self, seqs: list[SequenceWork], need_next_token: bool = True) -> None:
        vocab, num_groups = self.vocab_size, len(self.layout.shapes)
        seen: set[str] = set()
        for work in seqs:
            rid = work.request_id
            if rid in seen:
                raise ValueError(f"request {rid} appears twice in one step")
            seen.add(rid)
            if not work.token_ids:
                raise ValueError(f"request {rid}: no tokens to compute")
            if work.start_position < 0:
                raise ValueError(f"request {rid}: negative start position")
            for token in (*work.token_ids, *work.draft_token_ids):
                if not 0 <= token < vocab:
                    raise ValueError(
                        f"request {rid}: token id {token} outside vocabulary 0..{vocab - 1}"
                    )
            if work.draft_token_ids and not work.sample:
                raise ValueError(f"request {rid}: draft tokens to verify need sample=True")
            if len(work.block_tables) != num_groups:
                raise ValueError(
                    f"request {rid}: {len(work.block_tables)} block tables "
                    f"for {num_groups} KV groups"
                )
            if need_next_token and self.num_speculative_tokens and not work.sample:
                nxt = work.next_token_id
                if nxt is None:
                    raise ValueError(
                        f"request {rid}: a non-final prefill chunk needs next_token_id "
                        "(the draft KV of its last position depends on the next token)"
                    )
                if not 0 <= nxt < vocab:
                    raise ValueError(f"request {rid}: next_token_id {nxt} outside vocabulary")
