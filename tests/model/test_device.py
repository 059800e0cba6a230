"""The model on the device `RELAYKV_TEST_DEVICE` names: cpu by default, cuda when
`tools/gpu_check.sh` runs it on a GPU machine (docs/model.md, "The GPU path").

References: transformers on CPU in float32 for the logits of Gemma-3 and Qwen3 checkpoints;
a dense forward on the same device for paged attention; plain greedy decoding on the real
engine for EAGLE speculative decoding (the shipped tiny-hybrid draft, K=3).
"""

from __future__ import annotations

import os

import pytest
import torch

from relaykv.engine import EngineConfig, LLMEngine, SamplingParams
from relaykv.model import ModelRunner, SequenceWork, StepBatch, default_draft, load_model
from relaykv.model.forward_context import DenseContext

from .conftest import TableMaker, random_tokens

DEVICE = os.environ.get("RELAYKV_TEST_DEVICE", "cpu")
if DEVICE.startswith("cuda") and not torch.cuda.is_available():
    pytest.skip(
        f"RELAYKV_TEST_DEVICE={DEVICE} but torch sees no CUDA device", allow_module_level=True
    )
# float32 on both sides; CUDA kernels sum in other orders than the CPU reference.
ATOL = 2e-4 if DEVICE == "cpu" else 2e-3
CHUNKS = [(0, 13), (13, 14), (14, 40), (40, 41), (41, 70)]


@pytest.fixture(scope="module", params=["gemma3", "qwen3"])
def checkpoint(request, tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    from . import test_hf_parity as parity

    del transformers
    torch.manual_seed(0)
    builder = {"gemma3": parity._gemma3, "qwen3": parity._qwen3}[request.param]
    model = parity.randomize(builder(), gemma=request.param == "gemma3")
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    return model, path, parity.VOCAB


def _paged_logits(model, prompt: list[int]) -> torch.Tensor:
    runner = ModelRunner(model, num_blocks=200, block_size=8)
    tables = TableMaker(runner).fresh(len(prompt))
    rows = [
        runner.score(StepBatch([SequenceWork("r", prompt[a:b], a, tables)]))[0] for a, b in CHUNKS
    ]
    runner.kv.check_invariants()
    return torch.cat(rows).cpu()


def test_logits_match_transformers_on_device(checkpoint) -> None:
    hf, path, vocab = checkpoint
    prompt = random_tokens(70, vocab, seed=1)
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0].float()
    ours = _paged_logits(load_model(str(path), device=DEVICE).model, prompt)
    torch.testing.assert_close(ours, ref, atol=ATOL, rtol=1e-3)


def test_paged_equals_dense_on_device(checkpoint) -> None:
    _, path, vocab = checkpoint
    model = load_model(str(path), device=DEVICE).model
    prompt = random_tokens(70, vocab, seed=2)
    with torch.no_grad():
        ctx = DenseContext(model.build_rotaries(), 1, len(prompt), torch.float32, DEVICE)
        ids = torch.tensor(prompt, device=DEVICE)
        dense = model.logits(model(ids, ctx)).cpu()
    torch.testing.assert_close(_paged_logits(model, prompt), dense, atol=ATOL, rtol=1e-3)


def _greedy(model, prompts, k: int, draft=None) -> tuple[list[list[int]], float]:
    runner = ModelRunner(model, num_blocks=400, draft=draft, num_speculative_tokens=k)
    engine = LLMEngine(runner, EngineConfig(num_blocks=400), vocab_size=runner.vocab_size)
    reqs = engine.generate(prompts, SamplingParams(max_tokens=40, temperature=0.0))
    m = engine.metrics
    rate = m.spec_num_accepted_tokens / m.spec_num_draft_tokens if m.spec_num_draft_tokens else 0
    return [r.output_ids for r in reqs], rate


def test_eagle_speculation_is_lossless_on_device() -> None:
    loaded = load_model("tiny-hybrid", device=DEVICE)
    draft = default_draft("tiny-hybrid", loaded.config)
    prompts = [random_tokens(n, 259, seed=n) for n in (9, 30, 75)]
    plain, _ = _greedy(loaded.model, prompts, 0)
    spec, acceptance = _greedy(loaded.model, prompts, 3, draft)
    assert spec == plain
    assert acceptance > 0.2  # the shipped draft proposes what the target would say
