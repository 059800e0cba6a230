"""The router's lazy choice (cheap bounds, exact lookups only where a bound can win) makes
the same decision as scoring every engine exactly, and the bounds never undercount (nor
does conditional disaggregation's path, which a bound settles when it can)."""

from __future__ import annotations

import random

import pytest

from relaykv.kvcache import accel
from relaykv.router.backends import BackendPool
from relaykv.router.index import EngineIndex
from relaykv.router.policy import CacheAwarePolicy, Candidate, ConditionalRule
from relaykv.router.prompt import Prompt
from relaykv.router.routing import Routing
from tests.kvcache.conftest import geometry, tokens


@pytest.mark.parametrize("accelerated", [True, False], ids=["accel", "pure-python"])
@pytest.mark.parametrize("role", ["prefill", "decode", "colocated"])
def test_lazy_choice_equals_full_evaluation(
    role: str, accelerated: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With the accelerator (C holders table, every slot counted in one pass) and without
    # (dict, numpy slot by slot): the same exact hits, bounds and choices.
    if not accelerated:
        monkeypatch.setattr(accel, "native", None)
    rng = random.Random(role)
    geo = geometry("full:16", "sliding:16:32", draft=0)
    systems = [tokens(rng.randrange(64, 400), seed=s) for s in range(4)]
    for trial in range(40):
        routing = Routing("cache-aware")
        pool = BackendPool(role, [f"http://e{i}" for i in range(5)])
        indexes = []
        for b in pool.backends:
            holders = {"decode": routing.holders, "prefill": routing.prefill_holders}.get(role)
            # some engines with a sibling reach (a prefill engine's second lookup) or blocks
            # in a KV tier (the tiered lookup, which the holders do not cover)
            reach = 32 * rng.randrange(3) if trial % 3 == 1 else 0
            index = EngineIndex(geo, role, holders=holders, sibling_reach=reach)
            # Hold random parts of random prefixes, as evictions leave them.
            for _ in range(rng.randrange(0, 3)):
                req = index.request(systems[rng.randrange(4)] + tokens(40, seed=trial))
                for g, gmap in enumerate(index.maps):
                    keys = req.keys(g)
                    cut = rng.randrange(len(keys) + 1)
                    drop = {rng.randrange(len(keys) + 1) for _ in range(rng.randrange(3))}
                    held = [k for i, k in enumerate(keys[:cut]) if i not in drop]
                    for key in held:
                        gmap[key] = 1
                    if trial % 4 == 2:
                        index.tier.maps[g].update(dict.fromkeys(keys[cut : cut + 3], 1))
                    if index.holders is not None and index.slot is not None:
                        index.holders.add(g, held, index.slot)
            t = routing.engines.tracker(b)
            t.index, t.subscriber = index, object()  # type: ignore[assignment]
            b.in_flight = rng.randrange(3)
            b.streams = rng.randrange(b.in_flight + 1)
            indexes.append(index)
        prompt_tokens = systems[rng.randrange(4)] + tokens(rng.randrange(1, 50), seed=999)
        if trial % 10 == 0:
            prompt_tokens = prompt_tokens[: rng.randrange(1, 40)]  # shorter than a block or two
        prompt = Prompt(prompt_tokens)
        exact = [ix.usable_hit(prompt.request_for(ix)) for ix in indexes]
        for ix, hit in zip(indexes, exact, strict=True):
            req, counts = prompt.request_for(ix), prompt.counts_for(ix)
            assert (counts is None) == (role == "colocated")
            assert ix.hit_bound(req, counts) >= hit
            # An exact hit from the role's shared holders bits is the one from the engine's
            # own map (kvcache's rules on either's probes: a decode engine's reuse, the runs
            # from block 0 of a prefill engine's lookup and of a local request's).
            assert ix.usable_hit(req, counts) == hit
            assert ix.local_hit(req, counts) == ix.local_hit(req)
        full = CacheAwarePolicy().choose(
            [
                Candidate(h, len(prompt_tokens), b.in_flight, cached_blocks=ix.num_blocks)
                for h, b, ix in zip(exact, pool.backends, indexes, strict=True)
            ]
        )
        chosen = routing.pick(pool, set(), Prompt(prompt_tokens))
        assert chosen is not None and chosen.backend is pool.backends[full], (trial, exact)
        if role == "decode":  # the path: the bound settles only what the exact hit would
            local = indexes[full].local_hit(prompt.request_for(indexes[full]))
            assert chosen.hit_bound >= local
            suffix = len(prompt_tokens) - local  # around the exact suffix, and far off
            for max_suffix in sorted({0, max(0, suffix - 1), suffix, suffix + 16, 200}):
                routing.conditional = ConditionalRule(max_suffix=max_suffix)
                path = routing.decide_path(chosen)
                exact_path = routing.conditional.decide(
                    len(prompt_tokens), local, 0, chosen.backend.streams
                )
                assert path.local == exact_path.local, (trial, max_suffix, path, exact_path)
                assert path.suffix in (-1, exact_path.suffix)
