from __future__ import annotations

import os
import subprocess
import sys
from array import array

import numpy as np
import pytest

from relaykv.kvcache import hashing
from relaykv.kvcache.hashing import (
    SEED_HASH,
    PrefixChains,
    TokenHashes,
    _chain_loop,
    chain_hashes,
    salt_prefix,
    token_bytes,
)

from .conftest import tokens


def test_chain_is_a_prefix_fingerprint() -> None:
    a = tokens(64, seed=1)
    b = a[:32] + [x + 1 for x in a[32:]]
    ha, hb = chain_hashes(token_bytes(a), 16), chain_hashes(token_bytes(b), 16)
    assert ha[:2] == hb[:2] and ha[2] != hb[2] and ha[3] != hb[3]
    # A later unit with equal tokens still differs: the parent is part of the hash.
    c = [x + 1 for x in a[:16]] + a[16:]
    assert chain_hashes(token_bytes(c), 16)[3] != ha[3]


def test_only_full_units_are_hashed() -> None:
    assert len(chain_hashes(token_bytes(tokens(47)), 16)) == 2


def test_incremental_equals_batch() -> None:
    t = tokens(200, seed=3)
    inc = TokenHashes(8)
    for start in range(0, 200, 13):
        inc.extend(t[start : start + 13])
    assert inc.hashes == chain_hashes(token_bytes(t), 8)


def test_salt_changes_every_hash_but_only_mixes_into_the_first_unit() -> None:
    t = tokens(48)
    plain, salted, other = (
        TokenHashes(16),
        TokenHashes(16, salt="tenant-a"),
        TokenHashes(16, salt="b"),
    )
    for h in (plain, salted, other):
        h.extend(t)
    assert all(x != y for x, y in zip(plain.hashes, salted.hashes, strict=True))
    assert all(x != y for x, y in zip(salted.hashes, other.hashes, strict=True))
    # Later units chain from the salted first hash without extra keys of their own.
    assert salted.hashes[1:] == chain_hashes(token_bytes(t[16:]), 16, parent=salted.hashes[0])


def test_token_representations_agree() -> None:
    t = tokens(32)
    assert token_bytes(t) == token_bytes(np.array(t)) == token_bytes(array("i", t))


def test_hashes_are_identical_across_processes() -> None:
    code = (
        "from relaykv.kvcache.hashing import TokenHashes;"
        "h=TokenHashes(16, salt='s'); h.extend(range(100)); print(h.hashes[-1].hex())"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2")
    }
    h = TokenHashes(16, salt="s")
    h.extend(range(100))
    assert outs == {h.hashes[-1].hex() + "\n"}
    assert len(SEED_HASH) == 16


def test_published_hash_values_are_pinned() -> None:
    # Engines publish these keys in their KV events (docs/kv-events.md): a faster hashing
    # loop must not change a single value. Computed by the original loop.
    t = [(i * 7919) % 50000 for i in range(5000)]
    salted, plain = TokenHashes(16, salt="tenant"), TokenHashes(16)
    salted.extend(t)
    plain.extend(t)
    assert len(salted.hashes) == 312
    assert salted.hashes[-1].hex() == "ca0eab5a4b1e7dc84c228bcaace06ca7"
    assert plain.hashes[-1].hex() == "3aa60311042d9dacb36fc173d5547da6"


def test_c_driven_chain_equals_the_plain_loop() -> None:
    # chain_hashes runs its chain in C (map over the list extend grows); the plain loop is
    # the reference, for every length around unit boundaries, parent and salt.
    for n in (0, 1, 15, 16, 17, 32, 33, 100, 1000):
        data = token_bytes(tokens(n, seed=n)) if n else b""
        for unit in (4, 16):
            for parent in (None, b"p" * 16):
                for extra in (b"", salt_prefix("tenant")):
                    assert chain_hashes(data, unit, parent, extra) == _chain_loop(
                        data, unit, parent, extra
                    ), (n, unit, parent, extra)


def test_prefix_chains_equal_fresh_hashing() -> None:
    rng = np.random.default_rng(5)
    chains = PrefixChains(segment_units=4, max_segments=40)
    shared = [int(x) for x in rng.integers(0, 50_000, 300)]
    for trial in range(60):
        cut = int(rng.integers(0, 300))
        tail = [int(x) for x in rng.integers(0, 50_000, int(rng.integers(0, 90)))]
        prompt = shared[:cut] + tail
        salt = [None, "a", "b"][trial % 3]
        unit = [8, 16][trial % 2]
        memo = TokenHashes(unit, salt)
        memo.extend(prompt, chains)
        fresh = TokenHashes(unit, salt)
        fresh.extend(prompt)
        assert memo.hashes == fresh.hashes, (trial, cut, len(tail), salt, unit)
        memo.extend(tail)  # later growth chains on as usual
        fresh.extend(tail)
        assert memo.hashes == fresh.hashes
    assert chains.hits > 0 and chains.misses > 40 and len(chains) == 40  # some evicted


def test_prefix_chains_check_the_bytes_behind_a_digest(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every segment's digest collides: an entry is used only for equal token bytes, so each
    # prompt still gets its own hashes, and a repeated prompt still finds its segments.
    monkeypatch.setattr(hashing, "_segment_digest", lambda data: b"same")
    a, b = tokens(256, seed=1), tokens(256, seed=2)
    chains = PrefixChains(segment_units=2)
    # (units of 8 tokens make segments of another length, under the same colliding keys)
    for prompt, unit in ((a, 16), (a, 16), (b, 16), (a, 8), (a, 16), (b[:64] + a[64:], 16)):
        memo = TokenHashes(unit)
        memo.extend(prompt, chains)
        fresh = TokenHashes(unit)
        fresh.extend(prompt)
        assert memo.hashes == fresh.hashes
    assert chains.hits >= 8  # the second `a`: all 8 of its segments


def test_prefix_chains_keep_tenants_apart() -> None:
    # A salt is part of what a segment's hashes are memoised under: another tenant's
    # prompt with the same tokens never gets the first tenant's hashes.
    t = tokens(256, seed=9)
    chains = PrefixChains(segment_units=2)
    a, b = TokenHashes(16, "a"), TokenHashes(16, "b")
    a.extend(t, chains)
    b.extend(t, chains)
    assert not set(a.hashes) & set(b.hashes)
    assert chains.hits == 0
