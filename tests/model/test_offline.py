"""The offline driver: stop tokens, max_tokens with speculation, logprobs, no block leaks."""

from __future__ import annotations

from relaykv.model import ModelRunner, SamplingParams
from tests.model.offline import OfflineGenerator

from .conftest import random_tokens


def test_stop_tokens_max_tokens_and_blocks_come_back(tiny, tiny_draft):
    prompts = [random_tokens(n, 259, seed=n) for n in (3, 50, 17)]
    plain = OfflineGenerator(ModelRunner(tiny.model, num_blocks=100)).generate(prompts, 30)
    stop = plain[1].output_ids[7]  # a token the second request emits at index 7
    runner = ModelRunner(tiny.model, num_blocks=200, draft=tiny_draft, num_speculative_tokens=4)
    gen = OfflineGenerator(runner, chunk_tokens=13, step_tokens=40)
    params = SamplingParams(temperature=0.0, logprobs=2)
    results = gen.generate(prompts, 30, params, stop_token_ids=[stop])
    for res, ref in zip(results, plain, strict=True):
        cut = ref.output_ids.index(stop) + 1 if stop in ref.output_ids else 30
        assert res.output_ids == ref.output_ids[:cut]
        assert res.finish_reason == ("stop" if cut < 30 or ref.output_ids[29] == stop else "length")
        assert len(res.logprobs) == len(res.output_ids)
    gen.blocks.check_invariants(runner.kv.num_blocks)
    assert gen.blocks.num_free == runner.kv.num_blocks - 1
    runner.kv.check_invariants()
