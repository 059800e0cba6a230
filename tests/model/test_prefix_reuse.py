"""Resuming at r over cached blocks gives exactly the tokens and logits of a cold run.

Request A computes prompt x + a and keeps its blocks. Request B = x + b resumes at r
(a multiple of the block size, r <= |x|): its full-group table reuses A's first r/b
blocks, its sliding-group table reuses only the blocks covering the window of r and is
null below (docs/design.md §4), and B computes from r on, in one chunk or many.
"""

from __future__ import annotations

import pytest
import torch

from relaykv.model import ModelRunner, SequenceWork, StepBatch

from .conftest import TableMaker, random_tokens
from .driver import drive


def _reused_tables(runner: ModelRunner, donor: list[list[int]], r: int) -> list[list[int]]:
    b = runner.layout.block_size
    tables = []
    for g, spec in enumerate(runner.geometry.groups):
        if spec.window is None:
            tables.append(donor[g][: r // b])
        else:
            low = max(0, r - spec.window + 1) // b
            tables.append([0] * low + donor[g][low : r // b])
    return tables


@pytest.mark.parametrize("r,chunk", [(128, 10_000), (96, 7), (64, 33), (16, 5)])
def test_resume_matches_cold_run(tiny, r, chunk):
    runner = ModelRunner(tiny.model, num_blocks=200)
    maker = TableMaker(runner)
    x = random_tokens(131, 259, seed=10)
    a, b = random_tokens(20, 259, seed=11), random_tokens(25, 259, seed=12)
    tables_a = maker.fresh(len(x + a))
    drive(runner, tables_a, x + a, 0, 12, maker)
    shared = [list(t[: r // 16]) for t in tables_a]
    before = [runner.kv.read_pages(g, [i for i in t if i]) for g, t in enumerate(shared)]

    warm = drive(runner, _reused_tables(runner, tables_a, r), x + b, r, 24, maker, chunk=chunk)
    cold = drive(runner, maker.fresh(len(x + b)), x + b, 0, 24, maker)
    assert warm == cold
    after = [runner.kv.read_pages(g, [i for i in t if i]) for g, t in enumerate(shared)]
    for old, new in zip(before, after, strict=True):
        assert torch.equal(old, new)  # B never wrote into the blocks it reused
    runner.kv.check_invariants()


def test_resume_logits_match_cold_logits(tiny):
    runner = ModelRunner(tiny.model, num_blocks=200)
    maker = TableMaker(runner)
    prompt = random_tokens(150, 259, seed=13)
    donor = maker.fresh(len(prompt))
    runner.score(StepBatch([SequenceWork("a", prompt, 0, donor)]))
    r = 112
    tables = _reused_tables(runner, donor, r)
    maker.extend(tables, len(prompt))
    warm = runner.score(StepBatch([SequenceWork("b", prompt[r:], r, tables)]))[0]
    cold = runner.score(StepBatch([SequenceWork("c", prompt, 0, maker.fresh(150))]))[0]
    torch.testing.assert_close(warm, cold[r:], atol=2e-5, rtol=0)


def test_resume_with_eagle_draft_matches_cold_run(tiny, tiny_draft):
    runner = ModelRunner(tiny.model, num_blocks=300, draft=tiny_draft, num_speculative_tokens=3)
    maker = TableMaker(runner)
    x = random_tokens(100, 259, seed=14)
    tables_a = maker.fresh(120)
    drive(runner, tables_a, [*x, 5, 6, 7], 0, 8, maker)
    r = 96  # A's draft KV at 95 was computed with token 96 = x[96]: the peek holds
    warm = drive(runner, _reused_tables(runner, tables_a, r), [*x, 9, 9], r, 20, maker)
    cold = drive(runner, maker.fresh(120), [*x, 9, 9], 0, 20, maker)
    assert warm == cold


def test_recompute_of_the_last_shared_position_matches_cold_and_plain_runs(tiny, tiny_draft):
    """docs/design.md §4 `eagle_reuse=recompute`: B resumes at r = 96 over A's blocks with
    the block holding position 95 copied (`kv_copies`) and computed again from 95 (A's draft
    KV there was computed with A's token 96, not B's). Tokens equal a cold run and plain
    decoding without a draft, the draft's acceptance equals the cold run's, and A's blocks
    are not written."""
    runner = ModelRunner(tiny.model, num_blocks=300, draft=tiny_draft, num_speculative_tokens=3)
    maker = TableMaker(runner)
    x = random_tokens(96, 259, seed=14)
    tables_a = maker.fresh(120)
    drive(runner, tables_a, [*x, 5, 6, 7], 0, 8, maker)
    r, b = 96, runner.layout.block_size
    tables = _reused_tables(runner, tables_a, r)
    copies = []
    for g, table in enumerate(tables):
        private = maker.fresh(1)[0][0]
        copies.append((g, table[r // b - 1], private))
        table[r // b - 1] = private
    shared = [list(t[: r // b]) for t in tables_a]
    before = [runner.kv.read_pages(g, [i for i in t if i]) for g, t in enumerate(shared)]

    def run(tables, resume, copies=()):
        stats = (runner.stats.num_draft_tokens, runner.stats.num_accepted_tokens)
        out = drive(runner, tables, [*x, 9, 9], resume, 20, maker, copies=copies)
        return out, (
            runner.stats.num_draft_tokens - stats[0],
            runner.stats.num_accepted_tokens - stats[1],
        )

    warm, warm_spec = run(tables, r - 1, copies)
    cold, cold_spec = run(maker.fresh(120), 0)
    assert warm == cold and warm_spec == cold_spec
    plain = ModelRunner(tiny.model, num_blocks=40)
    plain_tables = TableMaker(plain).fresh(120)
    assert drive(plain, plain_tables, [*x, 9, 9], 0, 20, TableMaker(plain, 20)) == cold
    after = [runner.kv.read_pages(g, [i for i in t if i]) for g, t in enumerate(shared)]
    for old, new in zip(before, after, strict=True):
        assert torch.equal(old, new)
