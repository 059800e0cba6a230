"""The optional C accelerator of kvcache hashing (`relaykv.kvcache._accel`) against the
pure-Python path it replaces, and the fallback when it is absent (docs/routing.md "Cost")."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import sysconfig
import tracemalloc
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash

from relaykv.kvcache import CacheRequest, accel, rules_for
from relaykv.kvcache.accel import (
    KeyMasksPy,
    int32_bytes,
    int32_bytes_py,
    key_masks,
    values_u64,
    values_u64_py,
)
from relaykv.kvcache.decode_loads import reused_in_masks, reused_in_masks_py
from relaykv.kvcache.hashing import (
    _H,
    SEED_HASH,
    PrefixChains,
    TokenHashes,
    _chain_loop,
    _chain_py,
    chain_hashes,
    salt_prefix,
)

from .conftest import geometry

ACCEL = accel.native
needs_accel = pytest.mark.skipif(
    ACCEL is None, reason="C accelerator not built: `pip install -e .` builds it"
)
# ... and either side of one CPython digit (2**30), where the C fast path ends
INT32_EDGES = [0, 1, -1, 2**31 - 1, -(2**31), 50_000, 255, 256, 65_535, 65_536,
               2**30 - 1, 2**30, -(2**30) + 1, -(2**30), 2**15 - 1, 2**15]


def _random_tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.choice(INT32_EDGES) if rng.random() < 0.1 else rng.randrange(0, 1 << 17)
            for _ in range(n)]


def test_accelerator_is_built_where_a_compiler_is() -> None:
    # CI installs with `pip install -e .`, which must build it on a machine with a compiler
    # and Python's headers; elsewhere (a bare PYTHONPATH checkout) the fallback is in use.
    if not os.environ.get("CI"):
        pytest.skip("checked in CI, where `make install` builds the package")
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    headers = Path(sysconfig.get_paths()["include"], "Python.h")
    if shutil.which(cc) is None or not headers.exists():
        pytest.skip("no C compiler or Python headers here: the pure-Python path is used")
    assert ACCEL is not None, "relaykv.kvcache._accel was not built by the install"


@needs_accel
def test_int32_bytes_equal_the_pure_path() -> None:
    assert ACCEL is not None
    rng = random.Random(11)
    for n in (0, 1, 2, 7, 64, 1000):
        toks = _random_tokens(rng, n)
        assert ACCEL.int32_bytes(toks) == int32_bytes_py(toks) == np.asarray(
            toks, "<i4"
        ).tobytes()
        assert ACCEL.int32_bytes(tuple(toks)) == int32_bytes_py(tuple(toks))
    # ids read with __index__, as `struct` reads them: bools, numpy integers
    odd = [True, False, np.int64(7), np.int32(-3), np.uint16(9)]
    assert ACCEL.int32_bytes(odd) == int32_bytes_py(odd) == token_le([1, 0, 7, -3, 9])
    # strict (a JSON body's ids): exact ints only
    assert ACCEL.int32_bytes([5, -6], True) == int32_bytes_py([5, -6], True)
    for item in odd:
        for convert in (ACCEL.int32_bytes, int32_bytes_py):
            with pytest.raises(TypeError, match="position 1 is not an integer"):
                convert([4, item], True)


def token_le(values: list[int]) -> bytes:
    return array("i", values).tobytes() if sys.byteorder == "little" else np.asarray(
        values, "<i4"
    ).tobytes()


@needs_accel
def test_chain_equals_the_pure_path() -> None:
    assert ACCEL is not None
    rng = random.Random(12)
    for trial in range(150):
        unit = rng.choice([1, 2, 4, 8, 16, 32])
        n = rng.choice([0, 1, unit - 1, unit, unit + 1, 3 * unit, rng.randrange(0, 400)])
        data = int32_bytes(_random_tokens(rng, max(0, n)))
        parent = rng.choice([None, SEED_HASH, rng.randbytes(16), rng.randbytes(5)])
        extra = rng.choice([b"", salt_prefix("tenant"), salt_prefix("é" * rng.randrange(9))])
        expected = _chain_loop(data, unit, parent, extra)
        assert _chain_py(data, unit, parent, extra) == expected, trial
        assert chain_hashes(data, unit, parent, extra) == expected, trial
        got = ACCEL.chain(data, unit * 4, SEED_HASH if parent is None else parent, extra, _H)
        assert got == expected, trial
        assert all(type(h) is bytes and len(h) == 16 for h in got)


@needs_accel
def test_the_chain_calls_xxhash_directly_only_once_checked() -> None:
    # The C chain calls XXH3_128bits itself (docs/routing.md "Cost") for the digest callable
    # it was checked against; any other callable is called per unit, to the same hashes.
    assert ACCEL is not None
    if not hasattr(ACCEL, "bind_xxh3"):
        pytest.skip("an accelerator built before bind_xxh3: `pip install -e .` rebuilds it")
    assert accel.direct_xxh3
    rng = random.Random(15)
    for trial in range(60):
        unit = rng.choice([1, 4, 16])
        data = rng.randbytes(rng.randrange(0, 40 * unit))
        parent = rng.choice([SEED_HASH, rng.randbytes(16), rng.randbytes(3), rng.randbytes(40)])
        extra = rng.choice([b"", salt_prefix("t" * rng.randrange(30))])
        direct = ACCEL.chain(data, unit * 4, parent, extra, _H)
        assert direct == ACCEL.chain(data, unit * 4, parent, extra, lambda b: _H(b)), trial
        assert direct == _chain_loop(data, unit, parent, extra), trial
    # a callable whose digests differ is never bound: the chain keeps calling it
    assert not ACCEL.bind_xxh3(xxhash._xxhash.__file__, xxhash.xxh3_64_digest)
    assert not ACCEL.bind_xxh3("/nonexistent/xxhash.so", _H)
    assert ACCEL.chain(b"\0" * 8, 4, SEED_HASH, b"", xxhash.xxh3_64_digest) == [
        xxhash.xxh3_64_digest(SEED_HASH + b"\0" * 4),
        xxhash.xxh3_64_digest(xxhash.xxh3_64_digest(SEED_HASH + b"\0" * 4) + b"\0" * 4),
    ]
    assert ACCEL.chain(b"\0" * 8, 4, SEED_HASH, b"", _H) == _chain_loop(b"\0" * 8, 1)


@pytest.mark.parametrize(
    ("bad", "error", "words"),
    [
        ([1, 2, "3"], TypeError, "position 2 is not an integer: str"),
        ([1.5], TypeError, "position 0 is not an integer: float"),
        ([0, None], TypeError, "position 1 is not an integer: NoneType"),
        ([5, 2**31], OverflowError, "2147483648 at position 1 is outside int32"),
        ([-(2**31) - 1], OverflowError, "-2147483649 at position 0 is outside int32"),
        ([7, 7, 2**70], OverflowError, f"{2**70} at position 2 is outside int32"),
    ],
)
def test_bad_token_ids_are_refused_clearly_on_both_paths(
    bad: list[object], error: type[Exception], words: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(error, match=words):
        int32_bytes_py(bad)  # type: ignore[arg-type]
    if ACCEL is not None:
        with pytest.raises(error, match=words):
            ACCEL.int32_bytes(bad)
    rules = rules_for(geometry("full:16"))
    for native in (ACCEL, None):
        monkeypatch.setattr(accel, "native", native)
        with pytest.raises(error, match=words):
            CacheRequest("r", bad, rules, 16)  # type: ignore[arg-type]


@needs_accel
def test_values_u64_equal_the_pure_path() -> None:
    rng = random.Random(14)
    present = {rng.randbytes(16): rng.choice([1, 2**63, 2**64 - 1, 5]) for _ in range(300)}
    keys = [*present, *(rng.randbytes(16) for _ in range(100))]
    rng.shuffle(keys)
    for ks in (keys, tuple(keys[:7]), []):
        got = values_u64(present, ks)
        assert got.dtype == np.uint64 and got.tolist() == values_u64_py(present, ks).tolist()
        assert got.tolist() == [present.get(k, 0) for k in ks]
    assert ACCEL is not None
    with pytest.raises(TypeError):
        ACCEL.values_u64({b"k": "x"}, [b"k"])
    with pytest.raises(OverflowError):
        ACCEL.values_u64({b"k": -1}, [b"k"])


@needs_accel
def test_key_masks_table_equals_the_dict() -> None:
    # The C table of key -> engine bitmasks (the router's holders map) against the dict it
    # replaces, through random sets and clears: keys stay exactly the non-zero masks, through
    # growth and backward-shift deletions; keys that are not 16-byte bytes live beside it.
    assert ACCEL is not None and hasattr(ACCEL, "KeyMasks")
    rng = random.Random(16)
    for trial in range(12):
        ref, table = KeyMasksPy(), key_masks()
        assert type(table) is not KeyMasksPy
        size = rng.choice([3, 40, 2500])
        universe = [rng.randbytes(16) for _ in range(size)] + [b"odd", rng.randbytes(32), b""]
        for step in range(250):
            keys = rng.sample(universe, rng.randrange(0, min(len(universe), 300)))
            bits = rng.choice([1, 2, 4, 3, 0, 1 << 63, 5 << 10, 2**64 - 1])
            if rng.random() < 0.55:
                ref.or_bits(keys, bits)
                table.or_bits(tuple(keys) if step % 2 else iter(keys), bits)
            else:
                ref.clear_bits(keys, bits)
                table.clear_bits(keys, bits)
            assert len(table) == len(ref), (trial, step)
            probe = [*rng.sample(universe, min(len(universe), 64)), rng.randbytes(16)]
            got = table.values(probe)
            assert got.dtype == np.uint64, (trial, step)
            assert got.tolist() == ref.values(probe).tolist(), (trial, step)
        assert sorted(table.items()) == sorted(ref.items())
        table.clear_bits(universe, 2**64 - 1)
        assert len(table) == 0 and table.values(universe).tolist() == [0] * len(universe)
    with pytest.raises(ValueError, match="16 bytes"):
        ACCEL.KeyMasks(b"short")
    with pytest.raises(OverflowError):
        key_masks().or_bits([b"k" * 16], -1)


@needs_accel
def test_slot_counts_equal_numpy_slot_by_slot() -> None:
    # Per engine slot, the prompt keys it holds and its run of held keys from key 0, as the
    # router's holders pass counts them (one C pass), against numpy slot by slot.
    rng = np.random.default_rng(18)
    for trial in range(60):
        n = int(rng.choice([0, 1, 7, 64, 1000]))
        slots = rng.choice(64, size=int(rng.integers(1, 10)), replace=False)
        masks = np.zeros(n, dtype=np.uint64)
        for slot in slots:  # a run from key 0, then random holdings (gaps, reach)
            held = rng.random(n) < rng.random()
            held[: int(rng.integers(0, n + 1))] = True
            masks |= held.astype(np.uint64) << np.uint64(slot)
        if trial % 5 == 0:
            masks[:] = np.uint64(2**64 - 1)
        counted = accel.slot_counts(masks)
        assert counted is not None
        held_from_0 = np.bitwise_and.accumulate(masks)
        for slot in range(64):
            assert counted[0][slot] == accel.slot_held_py(masks, slot), (trial, slot)
            assert counted[1][slot] == accel.slot_run_py(held_from_0, slot), (trial, slot)
    with pytest.raises(ValueError, match="whole uint64"):
        ACCEL.slot_counts(b"\x00" * 9)


@needs_accel
def test_slot_reused_equals_reused_indices_on_the_slots_bits() -> None:
    # A router's exact per-group reuse of a decode engine, read from the holders masks: the
    # C pass against kvcache's rule (`reused_indices` on the slot's bits, and a block-by-block
    # oracle of it), on random masks, slots, ranges and peeks.
    rng = np.random.default_rng(19)
    for trial in range(400):
        n = int(rng.choice([0, 1, 2, 7, 64, 300]))
        masks = rng.integers(0, 2**64, size=n, dtype=np.uint64, endpoint=False)
        if trial % 3 == 0:  # dense runs of one slot
            masks |= (rng.random(n) < 0.9).astype(np.uint64) << np.uint64(5)
        slot = 5 if trial % 3 == 0 else int(rng.integers(0, 64))
        start = int(rng.integers(0, n + 1))
        stop = int(rng.integers(0, n + 1))
        peek = int(rng.integers(0, 2))
        got = reused_in_masks(masks, slot, start, stop, peek)
        assert got.dtype == np.int64
        ref = reused_in_masks_py(masks, slot, start, stop, peek)
        bit = [(int(m) >> slot) & 1 for m in masks]
        oracle = [
            k for k in range(start, stop) if bit[k] and (not peek or (k + 1 < n and bit[k + 1]))
        ]
        assert got.tolist() == ref.tolist() == oracle, (trial, slot, start, stop, peek)
    for args in [(np.zeros(4, np.uint64), 64, 0, 4, 0), (np.zeros(4, np.uint64), 0, -1, 4, 0),
                 (np.zeros(4, np.uint64), 0, 0, 5, 1)]:
        with pytest.raises(ValueError):
            reused_in_masks(*args)
        with pytest.raises(ValueError):
            reused_in_masks_py(*args)
    with pytest.raises(ValueError, match="whole uint64"):
        ACCEL.slot_reused(b"\x00" * 9, 0, 0, 1, 0)


@needs_accel
def test_a_large_key_masks_table_is_exact_and_counted() -> None:
    # Past 2 MiB of slots the table is allocated on huge-page boundaries, outside Python's
    # allocator: it still equals the dict through growth and deletions, and tracemalloc
    # still sees its memory (bench_router's bytes per indexed block).
    rng = random.Random(17)
    keys = [rng.randbytes(16) for _ in range(120_000)]
    gone = rng.sample(keys, 40_000)
    ref = KeyMasksPy()
    for start in range(0, len(keys), 20_000):
        ref.or_bits(keys[start : start + 30_000], 1 << (start // 20_000))
    ref.clear_bits(gone, 2**64 - 1)
    tracemalloc.start()
    try:
        table = key_masks()
        for start in range(0, len(keys), 20_000):
            table.or_bits(keys[start : start + 30_000], 1 << (start // 20_000))
        table.clear_bits(gone, 2**64 - 1)
        counted, _ = tracemalloc.get_traced_memory()
        assert counted > 2**18 * 24  # its 262,144 slots of 24 bytes
    finally:
        tracemalloc.stop()
    assert len(table) == len(ref) == 80_000
    probe = [*rng.sample(keys, 5_000), rng.randbytes(16)]
    assert table.values(probe).tolist() == ref.values(probe).tolist()
    assert sorted(table.items()) == sorted(ref.items())


def test_key_masks_fall_back_to_the_dict(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(accel, "native", None)
    table = key_masks()
    assert type(table) is KeyMasksPy
    table.or_bits([b"a" * 16, b"b"], 6)
    table.clear_bits([b"a" * 16], 2)
    assert table.values([b"a" * 16, b"b", b"c"]).tolist() == [4, 6, 0]


def _hash_everything() -> list[list[bytes]]:
    """Hashes of requests over random prompts, salts, geometries and a memo."""
    rng = random.Random(13)
    chains = PrefixChains(segment_units=2, max_segments=16)
    shared = _random_tokens(rng, 200)
    out = []
    for trial in range(40):
        geo = geometry("full:16", "sliding:16:64") if trial % 2 else geometry("full:8")
        prompt = shared[: rng.randrange(0, 200)] + _random_tokens(rng, rng.randrange(0, 40))
        salt = rng.choice([None, "a", "tenant-b"])
        req = CacheRequest("r", prompt, rules_for(geo), geo.hash_unit, salt,
                           chains=chains if trial % 3 else None)
        req.append_tokens(_random_tokens(rng, rng.randrange(0, 20)))
        out.append([*req.hashes.hashes, *req.keys(0)])
    inc = TokenHashes(4, "s")
    for start in range(0, 90, 7):
        inc.extend(shared[start : start + 7])
    out.append(inc.hashes)
    return out


def test_a_request_given_its_token_bytes_equals_one_given_its_list() -> None:
    # The router's intake converts a body's ids once and hands the bytes on (CacheRequest's
    # `token_bytes`): the request's tokens, hashes and keys are the list's.
    rng = random.Random(19)
    geo = geometry("full:16", "sliding:16:64")
    for n in (0, 1, 15, 16, 17, 300):
        prompt = _random_tokens(rng, n)
        plain = CacheRequest("r", prompt, rules_for(geo), geo.hash_unit, "s")
        given = CacheRequest("r", prompt, rules_for(geo), geo.hash_unit, "s",
                             token_bytes=int32_bytes(prompt))
        assert given.tokens.tolist() == plain.tokens.tolist() == prompt
        assert given.hashes.hashes == plain.hashes.hashes
        assert [given.keys(g) for g in (0, 1)] == [plain.keys(g) for g in (0, 1)]
        # ... and stay so as tokens are appended (the bytes are read in place until then)
        more = _random_tokens(rng, 40)
        for req in (plain, given):
            req.keys(0)
            req.append_tokens(more[:7])
            req.append_tokens(more[7:])
        assert given.tokens.tolist() == plain.tokens.tolist() == prompt + more
        assert given.hashes.hashes == plain.hashes.hashes
        assert [given.keys(g) for g in (0, 1)] == [plain.keys(g) for g in (0, 1)]
    with pytest.raises(ValueError, match="int32"):
        CacheRequest("r", [1, 2], rules_for(geo), geo.hash_unit, token_bytes=b"\x01" * 4)


def test_requests_hash_the_same_without_the_accelerator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with_accel = _hash_everything()
    monkeypatch.setattr(accel, "native", None)
    assert _hash_everything() == with_accel


def test_a_missing_accelerator_falls_back_to_python() -> None:
    # The import itself fails (a machine without a compiler never built it): hashing still
    # works and gives the published values (tests/kvcache/test_hashing.py pins them).
    code = (
        "import sys; sys.modules['relaykv.kvcache._accel'] = None\n"
        "from relaykv.kvcache import accel, hashing\n"
        "assert accel.native is None\n"
        "h = hashing.TokenHashes(16, salt='tenant')\n"
        "h.extend([(i * 7919) % 50000 for i in range(5000)])\n"
        "print(h.hashes[-1].hex())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out == "ca0eab5a4b1e7dc84c228bcaace06ca7\n"


# ---- KeyMasks against hostile keys: Python code run mid-call, odd types, cycles ---------


def _both_tables() -> list[Any]:
    """The C table and the dict reference, for a scenario run on each."""
    assert ACCEL is not None and hasattr(ACCEL, "KeyMasks")
    return [key_masks(), KeyMasksPy()]


def _grower(table: Any, new_keys: list[bytes]) -> type[bytes]:
    """A bytes subclass (an odd key, kept in the side dict) whose first hash inserts
    `new_keys` into `table`: Python code that grows the table in the middle of a pass."""

    class Grower(bytes):
        fired = False

        def __hash__(self) -> int:
            if not Grower.fired:
                Grower.fired = True
                table.or_bits(new_keys, 5)
            return bytes.__hash__(self)

    return Grower


@needs_accel
@pytest.mark.parametrize("before", [0, 20])
def test_key_masks_values_follow_a_key_that_grows_the_table_mid_pass(before: int) -> None:
    # values() asks for a batch's slots before reading them; a key whose hash (Python code)
    # grows the table in between must not leave the batch's later keys probing the old
    # table's places (from an empty table: an unset place, a read out of bounds).
    rng = random.Random(before)
    old = [rng.randbytes(16) for _ in range(before)]
    new = [rng.randbytes(16) for _ in range(200)]
    results = []
    for table in _both_tables():
        table.or_bits([b"odd", *old], 3)
        probe = [_grower(table, new)(b"zz"), *new[:10], *old[:5]]
        results.append(table.values(probe).tolist())
    assert results[0] == results[1] == [0] + [5] * 10 + [3] * min(5, before)


@needs_accel
@pytest.mark.parametrize("kind", ["C table", "dict", "values_u64"])
def test_a_value_is_read_before_its_key_is_let_go(kind: str) -> None:
    # A probing key the list let go of (its hash replaced it) dies when the pass drops it;
    # its __del__ may drop the very value it found: the value is read before that, not from
    # freed memory (KeyMasks.values and values_u64 alike).
    want = (1 << 62) + 12345
    table = key_masks() if kind == "C table" else KeyMasksPy()
    assert (type(table) is KeyMasksPy) == (kind != "C table")
    table.or_bits([b"zz"], want)
    plain = dict(table.items())
    keys: list[bytes] = []
    reuse: list[int] = []

    class Dying(bytes):
        def __hash__(self) -> int:
            keys[0] = b"x"
            return bytes.__hash__(self)

        def __del__(self) -> None:
            table.clear_bits([b"zz"], 2**64 - 1)
            plain.clear()
            reuse.extend(int(str(2**62 + i)) for i in range(100))  # the freed memory

    keys.append(Dying(b"zz"))
    if kind == "values_u64":
        got = accel.values_u64(plain, keys).tolist()
    else:
        got = table.values(keys).tolist()
    assert got == [want]


@needs_accel
@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda t: t.or_bits([b"k" * 16], -1), OverflowError),
        (lambda t: t.or_bits([b"k" * 16], 2**64), OverflowError),
        (lambda t: t.clear_bits([b"k" * 16], 2**64), OverflowError),
        (lambda t: t.or_bits([b"k" * 16], "1"), TypeError),
        (lambda t: t.or_bits([b"k" * 16], 1.0), TypeError),
        (lambda t: t.or_bits([[1]], 1), TypeError),
        (lambda t: t.clear_bits([[1]], 1), TypeError),
        (lambda t: t.values([[1]]), TypeError),
        (lambda t: t.values([b"k" * 16, {}]), TypeError),
        (lambda t: t.or_bits(5, 1), TypeError),
        (lambda t: t.values(None), TypeError),
    ],
)
def test_key_masks_refuse_what_the_dict_refuses(call: Callable[[Any], object], error: type) -> None:
    # Bad bits or keys raise the same error from the C table and the dict, and change
    # nothing after the bad key (an empty table has no odd keys: the key is still hashed).
    for table in _both_tables():
        with pytest.raises(error):
            call(table)
        assert table.values([b"k" * 16]).tolist() == [0]


@needs_accel
def test_key_masks_see_a_plain_bytes_subclass_as_its_bytes() -> None:
    # A dict finds b"k"*16 under an equal bytes subclass key; so does the C table.
    class Key(bytes):
        pass

    results = []
    for table in _both_tables():
        table.or_bits([Key(b"k" * 16)], 1)
        table.or_bits([b"k" * 16], 2)
        got = table.values([b"k" * 16, Key(b"k" * 16)]).tolist()
        results.append((len(table), got))
        table.clear_bits([Key(b"k" * 16)], 3)
        assert len(table) == 0
    assert results[0] == results[1] == (1, [3, 3])


@needs_accel
def test_a_key_masks_table_in_a_reference_cycle_is_collected() -> None:
    # An odd key may refer back to its table; the collector frees the pair.
    import gc

    freed: list[str] = []

    class Key:
        def __init__(self, table: object) -> None:
            self.table = table

        def __del__(self) -> None:
            freed.append("key")

    assert ACCEL is not None
    table = ACCEL.KeyMasks(b"s" * 16)
    table.or_bits([Key(table)], 1)
    del table
    gc.collect()
    assert freed == ["key"]


@needs_accel
def test_bind_xxh3_checks_long_inputs_too() -> None:
    # A chain's unit can be long (a 256-token block: 1,040 bytes with its parent; a long salt
    # in the first). A digest callable that agrees with XXH3_128bits on short inputs only is
    # not bound: the chain keeps calling it.
    assert ACCEL is not None
    if not hasattr(ACCEL, "bind_xxh3"):
        pytest.skip("an accelerator built before bind_xxh3")
    def agreeing_up_to(limit: int) -> Callable[[bytes], bytes]:
        return lambda data: _H(data) if len(data) <= limit else _H(data + b"!")

    for limit in [300, 1000, 4096]:
        assert not ACCEL.bind_xxh3(xxhash._xxhash.__file__, agreeing_up_to(limit)), limit
    only_short = agreeing_up_to(1000)
    data = bytes(range(256)) * 8
    assert ACCEL.chain(data, 1024, SEED_HASH, b"", only_short) == [
        only_short(SEED_HASH + data[:1024]),
        only_short(only_short(SEED_HASH + data[:1024]) + data[1024:]),
    ]
    # the bound callable is still xxhash's own, with its direct chain
    assert accel.direct_xxh3
    assert ACCEL.chain(data, 1024, SEED_HASH, b"", _H) == _chain_loop(data, 256)


@needs_accel
def test_chain_with_no_full_unit_allocates_nothing() -> None:
    # data shorter than one unit: no hashes, whatever the unit's size (no buffer of it).
    assert ACCEL is not None
    assert ACCEL.chain(b"abc", sys.maxsize, SEED_HASH, b"", _H) == []
    assert ACCEL.chain(b"abc", sys.maxsize, SEED_HASH, b"", lambda b: _H(b)) == []


def _clearer(table: Any, keys: list[bytes]) -> type[bytes]:
    """A bytes subclass whose hash clears `keys` of bits 7 in `table`."""

    class Clearer(bytes):
        def __hash__(self) -> int:
            table.clear_bits(keys, 7)
            return bytes.__hash__(self)

    return Clearer


@needs_accel
def test_key_masks_updates_follow_a_key_that_changes_the_table_mid_pass() -> None:
    # or_bits / clear_bits over keys one of which grows the table (then another clears
    # much of it) from its __hash__: the same keys and masks as the dict's.
    rng = random.Random(7)
    first = [rng.randbytes(16) for _ in range(50)]
    grown = [rng.randbytes(16) for _ in range(300)]
    results = []
    for table in _both_tables():
        grower = _grower(table, grown)(b"a")
        clearer = _clearer(table, grown[::2])(b"b")
        table.or_bits(first, 1)
        table.or_bits([*first[:10], grower, *first[10:], *grown[:50]], 2)
        table.clear_bits([*grown[:40], clearer, *grown[40:100], *first], 1)
        results.append(sorted(table.items()))
    assert results[0] == results[1]
    assert len(results[0]) > 100
