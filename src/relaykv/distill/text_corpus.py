"""Offline text for teacher-forced distillation: documentation already on this machine.

No download: the sources are what every relaykv install has (docs/model.md, "Distilling
a draft"):

* `pydoc`: Python's reference documentation topics (`pydoc_data.topics`, shipped with
  the interpreter: prose with code examples);
* `metadata`: the long descriptions (README text, Markdown) of the installed Python
  distributions (`importlib.metadata`);
* `stdlib`: a fixed sample of the standard library's own modules (code and docstrings).

Each document is tokenized, split into windows of `length - 1` tokens and given the
tokenizer's BOS, as a prompt would be; `text_windows` draws a seeded sample of windows
across the sources. Which windows exist depends on the interpreter and the installed
packages, so a corpus is reproducible on one install, not across installs.
"""

from __future__ import annotations

import importlib.metadata
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import torch

from relaykv.model.loading.tokenizer import Tokenizer

STDLIB_EVERY = 7  # one module in 7, sorted by path: a spread-out, fixed sample
MAX_DOC_CHARS = 60_000  # long documents contribute their beginning only


def _pydoc_topics() -> Iterator[str]:
    try:
        from pydoc_data.topics import topics
    except ImportError:  # some distributions strip it
        return
    for name in sorted(topics):
        yield topics[name]


def _package_descriptions() -> Iterator[str]:
    seen: set[str] = set()
    dists = sorted(
        importlib.metadata.distributions(), key=lambda d: (d.metadata["Name"] or "").lower()
    )
    for dist in dists:
        name = (dist.metadata["Name"] or "").lower()
        body = dist.metadata.get_payload() or dist.metadata["Description"] or ""  # type: ignore[attr-defined]
        if name in seen or len(body) < 200:
            continue
        seen.add(name)
        yield body


def _stdlib_modules() -> Iterator[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py") if not p.name.startswith("_"))
    for path in files[::STDLIB_EVERY]:
        try:
            yield path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue


SOURCES = {"pydoc": _pydoc_topics, "metadata": _package_descriptions, "stdlib": _stdlib_modules}


def text_windows(tokenizer: Tokenizer, count: int, length: int, seed: int) -> list[list[int]]:
    """`count` token windows of exactly `length` ids (BOS first), a seeded sample of every
    full window of every source; fewer if the sources hold fewer."""
    bos = tokenizer.encode("")[:1]  # [] when the tokenizer adds no BOS
    body = length - len(bos)
    windows: list[list[int]] = []
    for source in SOURCES.values():
        for doc in source():
            ids = tokenizer.encode(doc[:MAX_DOC_CHARS])[len(bos) :]
            windows.extend(bos + ids[i : i + body] for i in range(0, len(ids) - body + 1, body))
    order = torch.randperm(len(windows), generator=torch.Generator().manual_seed(seed))
    return [windows[i] for i in order[:count].tolist()]
