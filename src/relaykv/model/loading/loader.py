"""`load_model(spec)`: one entry point for every way of naming a model.

`spec` is `tiny-hybrid` (the embedded default), a packaged preset (`gemma3-270m`,
`smollm2-135m`), a Hugging Face directory, or a `.gguf` file. Weights are converted to
the runtime dtype; the tokenizer is built on first use (a GGUF vocabulary takes seconds the
first time, then comes from the cache: `tokenizer_cache`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from relaykv.model.config import ModelConfig
from relaykv.model.loading.gguf_file import read_gguf
from relaykv.model.loading.hf_dir import read_hf_dir, read_hf_tokenizer
from relaykv.model.loading.packaged import gemma3_270m_path, smollm2_135m_path
from relaykv.model.loading.tokenizer import ByteTokenizer, Tokenizer
from relaykv.model.loading.tokenizer_cache import cached_gguf_tokenizer, default_root
from relaykv.model.loading.weight_map import load_hf_weights
from relaykv.model.presets import PRESET_NAMES, tiny_hybrid
from relaykv.model.transformer import CausalLM, empty_model

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedModel:
    """A target model ready for a runner, with its tokenizer (None: ids only)."""

    name: str
    model: CausalLM
    source: str  # what was loaded: preset name, directory or file path
    _tokenizer_factory: Callable[[], Tokenizer | None] = field(repr=False, default=lambda: None)
    _tokenizer: Tokenizer | None = field(default=None, repr=False)
    _tokenizer_built: bool = field(default=False, repr=False)

    @property
    def config(self) -> ModelConfig:
        return self.model.config

    @property
    def tokenizer(self) -> Tokenizer | None:
        if not self._tokenizer_built:
            self._tokenizer = self._tokenizer_factory()
            self._tokenizer_built = True
        return self._tokenizer

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self.config.eos_token_ids


def build_from_tensors(
    config: ModelConfig,
    tensors: dict[str, torch.Tensor],
    dtype: torch.dtype,
    device: torch.device | str,
) -> CausalLM:
    model = empty_model(config, dtype, device)
    load_hf_weights(model, tensors)
    return model.eval()


def load_gguf(
    path: str | Path,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    name: str | None = None,
) -> LoadedModel:
    config, tensors, meta = read_gguf(path)
    model = build_from_tensors(config, tensors, dtype, device)
    del tensors
    arch = str(meta.get("general.architecture"))
    token_meta = {k: v for k, v in meta.items() if k.startswith("tokenizer.")}
    return LoadedModel(
        name or Path(path).stem,
        model,
        str(path),
        lambda: cached_gguf_tokenizer(token_meta, arch, default_root()),
    )


def load_hf(
    path: str | Path, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
) -> LoadedModel:
    config, tensors, _ = read_hf_dir(path)
    model = build_from_tensors(config, tensors, dtype, device)
    return LoadedModel(Path(path).name, model, str(path), lambda: read_hf_tokenizer(path, config))


def load_model(
    spec: str = "tiny-hybrid",
    dtype: torch.dtype | str = torch.float32,
    device: torch.device | str = "cpu",
) -> LoadedModel:
    """Load a model by preset name, HF directory or GGUF file (see module docstring)."""
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; choose from {', '.join(DTYPES)}")
        dtype = DTYPES[dtype]
    if spec == "tiny-hybrid":
        return LoadedModel(
            "tiny-hybrid", tiny_hybrid(dtype, device).eval(), "tiny-hybrid", ByteTokenizer
        )
    if spec == "gemma3-270m":
        return load_gguf(gemma3_270m_path(), dtype, device, name=spec)
    if spec == "smollm2-135m":
        return load_gguf(smollm2_135m_path(), dtype, device, name=spec)
    path = Path(spec)
    if path.is_dir():
        return load_hf(path, dtype, device)
    if path.is_file() and path.suffix == ".gguf":
        return load_gguf(path, dtype, device)
    raise ValueError(
        f"unknown model {spec!r}: expected one of {', '.join(PRESET_NAMES)}, "
        "a Hugging Face model directory or a .gguf file"
    )
