"""A GGUF tokenizer built once per vocabulary and kept on disk.

Building Gemma-3's tokenizer from GGUF metadata derives its merges from the 262k-token
vocabulary in Python (`gguf_tokenizer._spm_merges`): about 9 s of CPU per engine start, which
every `relaykv serve` paid again (two per `relaykv up`, six clusters in `make demo`). The built
`tokenizers` JSON (the tokenizer.json format, which round-trips exactly) is stored under the
relaykv cache directory and read back in about a second.

The key is a sha256 of the tokenizer metadata, the architecture, the builder's own source
and the `tokenizers` version, so a changed vocabulary, builder or library never reuses a
stale file. Writes are atomic (temporary file + rename): engines starting together never read
half a file. An entry that cannot be read is rebuilt; a cache that cannot be written costs
only the build.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import Tokenizer

from relaykv.model.loading import gguf_tokenizer
from relaykv.model.loading.packaged import cache_dir
from relaykv.model.loading.tokenizer import HFTokenizer

SUBDIR = "gguf-tokenizers"


def default_root() -> Path | None:
    """The relaykv cache directory (`$RELAYKV_CACHE_DIR`), or None where it cannot be made."""
    try:
        return cache_dir()
    except OSError:
        return None


def cache_key(meta: dict[str, Any], architecture: str) -> str | None:
    """sha256 naming the tokenizer `meta` builds (None: metadata that JSON cannot spell)."""
    digest = hashlib.sha256()
    try:
        digest.update(json.dumps(meta, sort_keys=True).encode())
    except (TypeError, ValueError):
        return None
    digest.update(architecture.encode())
    digest.update(Path(gguf_tokenizer.__file__).read_bytes())
    digest.update(tokenizers.__version__.encode())
    return digest.hexdigest()


def cached_gguf_tokenizer(
    meta: dict[str, Any], architecture: str, root: Path | None
) -> HFTokenizer:
    """`build_gguf_tokenizer(meta, architecture)`, reading and filling the cache under `root`
    (None: no cache). The result encodes and decodes exactly as a fresh build."""
    key = cache_key(meta, architecture) if root is not None else None
    if root is None or key is None:
        return gguf_tokenizer.build_gguf_tokenizer(meta, architecture)
    entry = root / SUBDIR / f"{key}.json"
    try:
        model = Tokenizer.from_str(entry.read_text(encoding="utf-8"))
    except Exception:  # a missing or unreadable entry (tokenizers raises plain Exception)
        model = gguf_tokenizer.build_gguf_model(meta, architecture)
        _store(entry, model.to_str())
    return gguf_tokenizer.wrap_gguf_tokenizer(model, meta)


def _store(entry: Path, text: str) -> None:
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=entry.parent, prefix=entry.name, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, entry)
    except OSError:
        pass  # a read-only or full cache only costs the next start a build
