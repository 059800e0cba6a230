"""Weight and tokenizer loading: HF directories, GGUF files, packaged real models."""

from __future__ import annotations

from relaykv.model.loading.loader import LoadedModel, load_model
from relaykv.model.loading.packaged import PackageNotInstalled, is_installed

__all__ = ["LoadedModel", "PackageNotInstalled", "is_installed", "load_model"]
