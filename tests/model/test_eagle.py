"""EAGLE draft: checkpoint layout against an independent reference, save/load, geometry.

The reference is transformers' own `LlamaDecoderLayer` (input norm removed, as in
EAGLE-1) fed with fc(cat(embed(token p+1), hidden p)) over a dense causal mask; drafting
continues from its own output. Our runner's proposals must follow the same argmax chain.
"""

from __future__ import annotations

import json

import pytest
import torch

from relaykv.model import (
    ModelRunner,
    SequenceWork,
    StepBatch,
    load_eagle_checkpoint,
    random_draft,
    save_eagle_checkpoint,
)
from relaykv.model.forward_context import DenseContext

from .conftest import TableMaker, random_tokens

transformers = pytest.importorskip("transformers")


def _eagle_dir(tmp_path, hidden: int):
    cfg = transformers.LlamaConfig(
        vocab_size=259,
        hidden_size=hidden,
        intermediate_size=384,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        rope_theta=10000.0,
    )
    gen = torch.Generator().manual_seed(0)
    layer = transformers.models.llama.modeling_llama.LlamaDecoderLayer(cfg, 0)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1 + 0.2 * noise if "norm" in name else noise * p.shape[-1] ** -0.5)
    layer.input_layernorm = torch.nn.Identity()
    fc = torch.nn.Linear(2 * hidden, hidden)
    with torch.no_grad():
        fc.weight.copy_(torch.randn(fc.weight.shape, generator=gen) * (2 * hidden) ** -0.5)
        fc.bias.copy_(0.1 * torch.randn(hidden, generator=gen))
    state = {f"layers.0.{k}": v.clone() for k, v in layer.state_dict().items()}
    state.update(
        {
            "fc.weight": fc.weight.detach().clone(),
            "fc.bias": fc.bias.detach().clone(),
            "embed_tokens.weight": torch.zeros(259, hidden),
        }
    )
    path = tmp_path / "eagle"
    path.mkdir()
    torch.save(state, path / "pytorch_model.bin")
    (path / "config.json").write_text(json.dumps(cfg.to_dict()))
    return path, cfg, layer.eval(), fc.eval()


def _reference_chain(target, cfg, layer, fc, prompt, first_token, k):
    """Draft proposals for the position after `prompt`, computed densely with transformers."""
    with torch.no_grad():
        n = len(prompt)
        hidden = target(torch.tensor(prompt), DenseContext(target.rotaries, 1, n, torch.float32))
        following = torch.tensor([*prompt[1:], first_token])
        xs = fc(torch.cat([target.embed(following), hidden], -1))
        rotary = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(cfg)
        proposals = []
        for _ in range(k):
            t = xs.shape[0]
            mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
            pos = torch.arange(t)[None]
            out = layer(
                xs[None],
                attention_mask=mask,
                position_ids=pos,
                position_embeddings=rotary(xs[None], pos),
            )[0]
            token = int(torch.argmax(target.logits(out[-1:])))
            proposals.append(token)
            xs = torch.cat([xs, fc(torch.cat([target.embed(torch.tensor([token])), out[-1:]], -1))])
        return proposals


def test_eagle_checkpoint_matches_transformers_reference(tiny, tmp_path):
    path, cfg, layer, fc = _eagle_dir(tmp_path, tiny.config.hidden_size)
    draft = load_eagle_checkpoint(path, tiny.config)
    assert draft.layer.input_norm is None and draft.norm is None and draft.fc.bias is not None
    k = 4
    runner = ModelRunner(tiny.model, num_blocks=40, draft=draft, num_speculative_tokens=k)
    prompt = random_tokens(75, 259, seed=30)
    tables = TableMaker(runner).fresh(80 + k)
    out = runner.execute(StepBatch([SequenceWork("r", prompt, 0, tables, sample=True)]))
    seq = out.sequences[0]
    assert seq.draft_token_ids == _reference_chain(
        tiny.model, cfg, layer, fc, prompt, seq.token_ids[0], k
    )


def test_save_and_load_round_trip(tiny, tmp_path):
    draft = random_draft(tiny.config, seed=5, window=32)
    loaded = load_eagle_checkpoint(save_eagle_checkpoint(draft, tmp_path / "d"), tiny.config)
    assert loaded.window == 32
    for (name, a), (_, b) in zip(
        draft.state_dict().items(), loaded.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name


def test_bad_checkpoints_are_named(tiny, tmp_path):
    with pytest.raises(ValueError, match=r"no config\.json"):
        load_eagle_checkpoint(tmp_path, tiny.config)
    path = save_eagle_checkpoint(random_draft(tiny.config), tmp_path / "d")
    (path / "model.safetensors").unlink()
    with pytest.raises(ValueError, match=r"no model\.safetensors"):
        load_eagle_checkpoint(path, tiny.config)
    other = random_draft(tiny.config.with_updates(hidden_size=128, intermediate_size=64))
    with pytest.raises(ValueError, match="hidden size"):
        load_eagle_checkpoint(save_eagle_checkpoint(other, tmp_path / "o"), tiny.config)
