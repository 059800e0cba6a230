"""The array forms of the decode-side reuse rule (a router's, docs/routing.md "Cost") equal
the dict forms the engine uses, on random probes, geometries and prompt lengths."""

from __future__ import annotations

import random

import numpy as np

from relaykv.kvcache import cdiv, rules_for
from relaykv.kvcache.decode_loads import (
    reused_blocks,
    reused_indices,
    tokens_local_everywhere,
    tokens_local_in,
)

from .conftest import geometry


def test_reused_indices_equal_reused_blocks() -> None:
    rng = random.Random(21)
    for _ in range(400):
        start, count, peek = rng.randrange(0, 9), rng.randrange(0, 40), rng.choice([0, 1])
        extra = peek and rng.random() < 0.7  # the prompt has the block past `stop`
        found = [rng.choice([0, 0, 1, 3, 9]) for _ in range(count + extra)]
        stop = start + count
        expected = list(reused_blocks(found, start, stop, peek))
        got = reused_indices(np.array(found, dtype=np.uint64), start, stop, peek)
        assert got.tolist() == expected, (found, start, stop, peek)


def test_tokens_local_in_equals_tokens_local_everywhere() -> None:
    rng = random.Random(22)
    geometries = [
        geometry("full:16"),
        geometry("full:16", draft=0),
        geometry("full:16", "sliding:16:64"),
        geometry("full:32", "full:16", "sliding:16:64"),
        geometry("sliding:16:64"),
        geometry("full:64", "sliding:16:128", draft=0),
    ]
    for _ in range(300):
        geo = rng.choice(geometries)
        rules = rules_for(geo)
        n = rng.randrange(1, 700)  # a P/D plan needs a token (pd_plan)
        local = []
        for rule in rules:
            blocks = cdiv(n, rule.block_size)
            dense = rng.random() < 0.5
            held = [k for k in range(blocks) if rng.random() < (0.9 if dense else 0.3)]
            local.append(dict.fromkeys(held, 7))
        arrays = [np.fromiter(d, dtype=np.int64, count=len(d)) for d in local]
        expected = tokens_local_everywhere(rules, geo.hash_unit, local, n)
        assert tokens_local_in(rules, geo.hash_unit, arrays, n) == expected, (geo, n, local)
