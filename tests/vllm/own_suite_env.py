"""The environment shim for vLLM 0.33.0's own unit tests on a CPU machine without the Hub
(tools/vllm_own_tests.sh), loaded in both runs, with and without the plugin.

* vLLM's CUDA wheel finds no platform here: its `current_platform` is told the device is
  `cpu` (what `DeviceConfig` asks; the scheduler-side tests never touch a device);
* vLLM's tests name `facebook/opt-125m`: the Hub cache under `$HF_HOME` gets an offline
  entry with that model's public `config.json` (no weights, no tokenizer). The Hub client
  reads `HF_HOME` and `HF_HUB_OFFLINE=1` when imported: the caller sets both
  (tools/vllm_own_tests.sh).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

OPT_125M = {
    "architectures": ["OPTForCausalLM"],
    "model_type": "opt",
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "ffn_dim": 3072,
    "vocab_size": 50272,
    "max_position_embeddings": 2048,
    "word_embed_proj_dim": 768,
    "do_layer_norm_before": True,
    "activation_function": "relu",
    "torch_dtype": "float16",
    "pad_token_id": 1,
    "bos_token_id": 2,
    "eos_token_id": 2,
    "enable_bias": True,
}


def offline_hub(home: Path) -> None:
    repo = home / "hub" / "models--facebook--opt-125m"
    (repo / "snapshots" / "main").mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text("main")
    (repo / "snapshots" / "main" / "config.json").write_text(json.dumps(OPT_125M))


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("HF_HUB_OFFLINE") != "1" or not os.environ.get("HF_HOME"):
        raise pytest.UsageError("own_suite_env needs HF_HOME and HF_HUB_OFFLINE=1 set")
    offline_hub(Path(os.environ["HF_HOME"]))
    from vllm.platforms import current_platform

    if not current_platform.device_type:
        current_platform.device_type = "cpu"
