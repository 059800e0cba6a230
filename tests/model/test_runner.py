"""ModelRunner step semantics: mixed batches, logprobs, validation with clear errors."""

from __future__ import annotations

import pytest
import torch

from relaykv.model import ModelRunner, SamplingParams, SequenceWork, StepBatch

from .conftest import TableMaker, random_tokens


def test_mixed_prefill_and_decode_batch_equals_separate_steps(tiny):
    prompts = [random_tokens(n, 259, seed=n) for n in (90, 3, 41)]
    together = ModelRunner(tiny.model, num_blocks=100)
    maker = TableMaker(together)
    tables = [maker.fresh(120) for _ in prompts]
    # request 0 prefilled earlier and now decodes, 1 prefills fully, 2 prefills a middle chunk
    together.execute(StepBatch([SequenceWork("a", prompts[0], 0, tables[0], sample=True)]))
    together.execute(StepBatch([SequenceWork("c", prompts[2][:20], 0, tables[2])]))
    works = [
        SequenceWork("a", [7], 90, tables[0], sample=True),
        SequenceWork("b", prompts[1], 0, tables[1], sample=True),
        SequenceWork("c", prompts[2][20:35], 20, tables[2]),
    ]
    mixed = together.score(StepBatch(works))
    for work, got in zip(works, mixed, strict=True):
        alone = ModelRunner(tiny.model, num_blocks=100)
        t = TableMaker(alone).fresh(120)
        prefix = {"a": prompts[0], "b": [], "c": prompts[2][:20]}[work.request_id]
        if prefix:
            alone.score(StepBatch([SequenceWork("x", prefix, 0, t)]))
        ref = alone.score(
            StepBatch([SequenceWork("x", list(work.token_ids), work.start_position, t)])
        )[0]
        torch.testing.assert_close(got, ref, atol=2e-5, rtol=0)


def test_outputs_follow_batch_order_and_only_samplers_sample(tiny):
    runner = ModelRunner(tiny.model, num_blocks=40)
    maker = TableMaker(runner)
    out = runner.execute(
        StepBatch(
            [
                SequenceWork("x", [5, 6, 7], 0, maker.fresh(8)),
                SequenceWork("y", [8, 9], 0, maker.fresh(8), sample=True),
            ]
        )
    )
    assert [s.request_id for s in out.sequences] == ["x", "y"]
    assert out.sequences[0].token_ids == [] and len(out.sequences[1].token_ids) == 1


def test_logprobs_are_raw_log_softmax_of_the_last_position(tiny):
    runner = ModelRunner(tiny.model, num_blocks=40)
    maker = TableMaker(runner)
    prompt = random_tokens(30, 259, seed=4)
    logits = runner.score(StepBatch([SequenceWork("s", prompt, 0, maker.fresh(30))]))[0][-1]
    expected = torch.log_softmax(logits, -1)
    out = runner.execute(
        StepBatch(
            [
                SequenceWork(
                    "r",
                    prompt,
                    0,
                    maker.fresh(30),
                    sample=True,
                    sampling=SamplingParams(temperature=0.5, seed=1, logprobs=3),
                )
            ]
        )
    ).sequences[0]
    (lp,) = out.logprobs
    assert lp.token_id == out.token_ids[0]
    assert lp.logprob == pytest.approx(float(expected[lp.token_id]), abs=1e-5)
    top = torch.topk(expected, 3)
    assert [t for t, _ in lp.top] == top.indices.tolist()
    assert [v for _, v in lp.top] == pytest.approx(top.values.tolist(), abs=1e-5)


@pytest.mark.parametrize(
    "work,match",
    [
        (SequenceWork("r", [], 0, [[1], [2]]), "no tokens"),
        (SequenceWork("r", [300], 0, [[1], [2]]), "outside vocabulary"),
        (SequenceWork("r", [5], 0, [[1]]), "1 block tables for 2 KV groups"),
        (SequenceWork("r", [5], 0, [[1], [2]], draft_token_ids=[4]), "need sample=True"),
        (SequenceWork("r", [5], 0, [[0], [2]]), "null block"),
        (SequenceWork("r", [5] * 20, 0, [[1], [2]]), "block table has 1 entries"),
        (SequenceWork("r", [5], -1, [[1], [2]]), "negative start"),
    ],
)
def test_bad_work_is_rejected_before_anything_is_written(tiny, work, match):
    runner = ModelRunner(tiny.model, num_blocks=8)
    before = runner.kv.buffer.clone()
    with pytest.raises(ValueError, match=match):
        runner.execute(StepBatch([SequenceWork("ok", [3, 4], 0, [[3], [4]]), work]))
    assert torch.equal(runner.kv.buffer, before)


def test_duplicate_request_in_one_step(tiny):
    runner = ModelRunner(tiny.model, num_blocks=8)
    with pytest.raises(ValueError, match="twice"):
        runner.execute(
            StepBatch(
                [SequenceWork("r", [3], 0, [[1], [2]]), SequenceWork("r", [4], 1, [[1], [2]])]
            )
        )


def test_runner_needs_a_draft_for_speculation(tiny):
    with pytest.raises(ValueError, match="draft"):
        ModelRunner(tiny.model, num_blocks=8, num_speculative_tokens=2)
