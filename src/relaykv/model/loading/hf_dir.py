"""Hugging Face model directories: config.json + *.safetensors (sharded or not) + tokenizer.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from relaykv.model.config import ModelConfig, from_hf_dict
from relaykv.model.loading.tokenizer import HFTokenizer


def weight_files(root: Path) -> list[Path]:
    """The safetensors files of a directory: from the shard index if there is one."""
    index = root / "model.safetensors.index.json"
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        files = [root / name for name in sorted(set(weight_map.values()))]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise ValueError(f"{root}: shards listed in the index are missing: {missing[:4]}")
        return files
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{root}: no *.safetensors weights (only safetensors are supported)")
    return files


def read_hf_dir(path: str | Path) -> tuple[ModelConfig, dict[str, torch.Tensor], dict[str, Any]]:
    """(config, tensors as stored, raw config dict) of a HF model directory."""
    root = Path(path)
    config_file = root / "config.json"
    if not config_file.is_file():
        raise ValueError(f"{root}: no config.json (not a Hugging Face model directory)")
    raw = json.loads(config_file.read_text())
    config = from_hf_dict(raw)
    tensors: dict[str, torch.Tensor] = {}
    for file in weight_files(root):
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open has no __iter__
                tensors[name] = handle.get_tensor(name)
    return config, tensors, raw


def read_hf_tokenizer(path: str | Path, config: ModelConfig) -> HFTokenizer | None:
    """The directory's tokenizer.json, or None if it has none."""
    file = Path(path) / "tokenizer.json"
    if not file.is_file():
        return None
    return HFTokenizer.from_file(str(file), config.eos_token_ids, config.bos_token_id)
