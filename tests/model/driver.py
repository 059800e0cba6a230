"""A one-request driver over `ModelRunner.execute` for tests (prefix reuse, speculation)."""

from __future__ import annotations

from collections.abc import Sequence

from relaykv.model import GREEDY, ModelRunner, SamplingParams, SequenceWork, StepBatch

from .conftest import TableMaker


def drive(
    runner: ModelRunner,
    tables: list[list[int]],
    prompt: list[int],
    resume: int,
    max_tokens: int,
    maker: TableMaker,
    chunk: int = 10_000,
    params: SamplingParams = GREEDY,
    rid: str = "r",
    copies: Sequence[tuple[int, int, int]] = (),
) -> list[int]:
    """Compute `prompt[resume:]` in chunks, then decode `max_tokens` (with the runner's k);
    `copies`: the first step's `kv_copies`."""
    k = runner.num_speculative_tokens
    pos = resume
    out: list[int] = []
    drafts: list[int] = []
    while pos < len(prompt):
        n = min(chunk, len(prompt) - pos)
        last = pos + n == len(prompt)
        maker.extend(tables, pos + n + k)
        work = SequenceWork(
            rid,
            prompt[pos : pos + n],
            pos,
            tables,
            sample=last,
            sampling=params,
            next_token_id=None if last else prompt[pos + n],
            kv_copies=copies if pos == resume else (),
        )
        res = runner.execute(StepBatch([work])).sequences[0]
        pos += n
        out, drafts = res.token_ids, res.draft_token_ids
    while len(out) < max_tokens:
        seq = prompt + out
        start = len(seq) - 1
        use = drafts[: max_tokens - len(out) - 1]
        maker.extend(tables, start + 1 + len(use) + k)
        work = SequenceWork(
            rid, [seq[-1]], start, tables, sample=True, sampling=params, draft_token_ids=use
        )
        res = runner.execute(StepBatch([work])).sequences[0]
        assert res.num_draft_tokens == len(use)
        assert res.token_ids[: res.num_accepted_tokens] == use[: res.num_accepted_tokens]
        out += res.token_ids
        drafts = res.draft_token_ids
    return out[:max_tokens]
