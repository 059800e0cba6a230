"""Our logits equal transformers' on tiny random checkpoints of every supported family.

Each checkpoint is built with transformers itself, re-randomized so every layer matters
(unit-scale projections, norms away from their defaults), saved to a temp dir and loaded
back by our loader. Prompts are longer than the sliding windows, and our side computes
them in uneven chunks and single decode steps over paged KV, so windows, chunked
prefill, RoPE variants and paging are all exercised against an independent model.
"""

from __future__ import annotations

import pytest
import torch

from relaykv.model import ModelRunner, SequenceWork, StepBatch, load_model

from .conftest import TableMaker, random_tokens

transformers = pytest.importorskip("transformers")

VOCAB = 97
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    head_dim=16,
    max_position_embeddings=512,
)
CHUNKS = [(0, 13), (13, 14), (14, 40), (40, 41), (41, 42), (42, 43), (43, 70)]


def _llama():
    cfg = transformers.LlamaConfig(
        **COMMON,
        num_hidden_layers=3,
        num_key_value_heads=2,
        attention_bias=True,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 10000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    )
    return transformers.LlamaForCausalLM(cfg)


def _qwen3():
    cfg = transformers.Qwen3Config(
        **COMMON,
        num_hidden_layers=3,
        num_key_value_heads=2,
        use_sliding_window=True,
        sliding_window=24,
        max_window_layers=0,
        tie_word_embeddings=True,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
    )
    return transformers.Qwen3ForCausalLM(cfg)


def _mistral():
    cfg = transformers.MistralConfig(
        **COMMON, num_hidden_layers=2, num_key_value_heads=1, sliding_window=20
    )
    return transformers.MistralForCausalLM(cfg)


def _gemma3():
    cfg = transformers.Gemma3TextConfig(
        **COMMON,
        num_hidden_layers=4,
        num_key_value_heads=1,
        sliding_window=16,
        layer_types=[
            "sliding_attention",
            "sliding_attention",
            "full_attention",
            "sliding_attention",
        ],
        query_pre_attn_scalar=24,
        final_logit_softcapping=30.0,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1_000_000.0},
        },
    )
    return transformers.Gemma3ForCausalLM(cfg)


def randomize(model, gemma: bool, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=gen)
            if "norm" in name:
                p.copy_((0.0 if gemma else 1.0) + 0.2 * noise)
            elif "embed" in name:
                p.copy_(noise)
            elif name.endswith("bias"):
                p.copy_(0.1 * noise)
            else:
                p.copy_(noise * p.shape[-1] ** -0.5)
    return model.eval()


BUILDERS = {"llama": _llama, "qwen3": _qwen3, "mistral": _mistral, "gemma3": _gemma3}


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def checkpoint(request, tmp_path_factory):
    name = request.param
    torch.manual_seed(0)
    model = randomize(BUILDERS[name](), gemma=name == "gemma3")
    path = tmp_path_factory.mktemp(name)
    # mistral is saved in shards to cover the sharded index path
    shard = "40KB" if name == "mistral" else "100MB"
    model.save_pretrained(path, max_shard_size=shard)
    return name, model, path


def _ours(path, prompt: list[int], block_size: int = 8) -> torch.Tensor:
    loaded = load_model(str(path))
    runner = ModelRunner(loaded.model, num_blocks=400, block_size=block_size)
    tables = TableMaker(runner).fresh(len(prompt))
    rows = []
    for a, b in CHUNKS:
        work = SequenceWork("r", prompt[a:b], a, tables)
        rows.append(runner.score(StepBatch([work]))[0])
    runner.kv.check_invariants()
    return torch.cat(rows)


def test_logits_match_transformers(checkpoint):
    _name, model, path = checkpoint
    prompt = random_tokens(70, VOCAB, seed=1)
    with torch.no_grad():
        ref = model(torch.tensor([prompt])).logits[0].float()
    ours = _ours(path, prompt)
    assert ours.shape == ref.shape
    # fp32 tolerance: the two sides sum in different orders (fused QKV, SDPA vs eager).
    torch.testing.assert_close(ours, ref, atol=2e-4, rtol=1e-4)
    assert ref.std() > 0.5  # logits are spread out: a wrong window would show


def test_block_size_does_not_change_logits(checkpoint):
    _, _, path = checkpoint
    prompt = random_tokens(70, VOCAB, seed=2)
    torch.testing.assert_close(_ours(path, prompt, 1), _ours(path, prompt, 16), atol=1e-4, rtol=0)


def test_windows_and_layer_types_are_read(checkpoint):
    name, _model, path = checkpoint
    loaded = load_model(str(path))
    expected = {
        "llama": (None, ("full_attention",) * 3),
        "qwen3": (24, ("sliding_attention", "full_attention", "sliding_attention")),
        "mistral": (20, ("sliding_attention",) * 2),
        "gemma3": (
            16,
            ("sliding_attention", "sliding_attention", "full_attention", "sliding_attention"),
        ),
    }[name]
    assert (loaded.config.sliding_window, loaded.config.layer_types) == expected


def test_greedy_generation_matches_transformers_generate(checkpoint):
    _name, model, path = checkpoint
    from tests.model.offline import OfflineGenerator

    prompt = random_tokens(30, VOCAB, seed=3)
    with torch.no_grad():
        ref = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=12,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=None,
        )[0, len(prompt) :].tolist()
    runner = ModelRunner(load_model(str(path)).model, num_blocks=64, block_size=8)
    out = OfflineGenerator(runner, chunk_tokens=7).generate([prompt], 12)
    assert out[0].output_ids == ref
