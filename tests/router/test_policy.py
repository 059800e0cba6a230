"""Routing policies: prefix affinity, load balance, the hot-prefix spread (docs/routing.md)."""

from __future__ import annotations

import random

import pytest

from relaykv.router.policy import (
    CacheAwarePolicy,
    CacheAwareWeights,
    Candidate,
    LeastLoadedPolicy,
    RoundRobinPolicy,
    make_policy,
)


def test_cache_aware_follows_the_usable_hit() -> None:
    policy = CacheAwarePolicy()
    c = [Candidate(0, 2000, in_flight=0), Candidate(1900, 2000, in_flight=1), Candidate(0, 2000)]
    assert policy.choose(c) == 1
    # Without a hit anywhere it is least-loaded, then KV usage, then round robin.
    assert policy.choose([Candidate(0, 10, 2), Candidate(0, 10, 1)]) == 1
    assert policy.choose([Candidate(0, 10, kv_usage=0.9), Candidate(0, 10, kv_usage=0.1)]) == 1
    picks = {policy.choose([Candidate(0, 10), Candidate(0, 10)]) for _ in range(4)}
    assert picks == {0, 1}


def test_a_hit_is_worth_a_bounded_amount_of_load() -> None:
    policy = CacheAwarePolicy(CacheAwareWeights(load_weight=0.25, kv_weight=0.0))
    # A full hit outweighs 3 extra requests in flight, not 5.
    assert policy.choose([Candidate(1000, 1000, 3), Candidate(0, 1000, 0)]) == 0
    assert policy.choose([Candidate(1000, 1000, 5), Candidate(0, 1000, 0)]) == 1


@pytest.mark.parametrize("engines", [3, 4, 8])
def test_hot_prefix_spreads_no_engine_above_twice_the_mean(engines: int) -> None:
    """One hot prefix at high concurrency: requests arrive and finish at random; the engine
    that holds the prefix attracts them, but never above 2x the mean load."""
    rng = random.Random(engines)
    policy = CacheAwarePolicy()
    holds = [False] * engines
    holds[0] = True
    load = [0] * engines
    worst = 0.0
    for _ in range(2000):
        if sum(load) >= 32 or (sum(load) and rng.random() < 0.4):
            busy = [i for i in range(engines) if load[i]]
            load[rng.choice(busy)] -= 1
            continue
        c = [Candidate(1900 if holds[i] else 0, 2048, in_flight=load[i]) for i in range(engines)]
        i = policy.choose(c)
        load[i] += 1
        holds[i] = True  # the engine computed (or holds) the prefix now
        mean = sum(load) / engines
        if sum(load) >= 2 * engines:
            worst = max(worst, max(load) / mean)
    assert worst <= 2.0


def test_least_loaded_and_round_robin() -> None:
    ll = LeastLoadedPolicy()
    assert ll.choose([Candidate(5000, 5000, 2), Candidate(0, 5000, 1)]) == 1
    rr = RoundRobinPolicy()
    assert [rr.choose([Candidate()] * 3) for _ in range(6)] == [0, 1, 2, 0, 1, 2]


def test_weights_are_checked_and_modes_named() -> None:
    with pytest.raises(ValueError, match="load_weight"):
        CacheAwareWeights(load_weight=-1)
    with pytest.raises(ValueError, match="max_load_ratio"):
        CacheAwareWeights(max_load_ratio=0.5)
    with pytest.raises(ValueError, match="unknown routing mode"):
        make_policy("random")
    assert make_policy("least-loaded").name == "least-loaded"


def test_conditional_rule_goes_local_for_a_short_suffix_on_a_held_prefix() -> None:
    from relaykv.router.policy import ConditionalRule

    rule = ConditionalRule(max_suffix=512, max_queued_prefill=1024)
    local = rule.decide(1600, 1536, queued_prefill=0)
    assert (local.local, local.suffix, local.path) == (True, 64, "local")
    assert "64 <= max suffix 512" in local.why
    # A 1,200-token new suffix on a 1,536-token prefix: P computes it.
    long = rule.decide(2736, 1536, queued_prefill=0)
    assert (long.local, long.suffix) == (False, 1200) and "1200 > max suffix 512" in long.why
    assert rule.decide(2048, 1536, 0).local and not rule.decide(2049, 1536, 0).local
    # The engine's queue: this suffix must fit under the cap with what is queued there.
    assert rule.decide(1600, 1536, queued_prefill=960).local
    queued = rule.decide(1600, 1536, queued_prefill=961)
    assert not queued.local and "queued local prefill 961 + 64 > 1024" in queued.why
    # By default the queue's cap is the max suffix: the wait behind what is queued plus the
    # suffix's own prefill stays within one P trip.
    default = ConditionalRule(max_suffix=300)
    assert default.queue_cap == 300 and ConditionalRule().queue_cap == 512
    assert default.decide(1600, 1536, queued_prefill=236).local
    full = default.decide(1600, 1536, queued_prefill=237)
    assert full.why == "queued local prefill 237 + 64 > 300"
    # Streams of this router decoding on D: a local prefill would stall each of them, so by
    # default (max running 0) one is enough to send the sibling through P.
    busy = rule.decide(1600, 1536, queued_prefill=0, streams=1)
    assert not busy.local and busy.why == "1 streams decoding there > max running 0"
    assert ConditionalRule(max_running=1).decide(1600, 1536, 0, streams=1).local
    assert not ConditionalRule(max_running=1).decide(1600, 1536, 0, streams=2).local
    # Nothing held there (a new prefix), or nothing known: P -> D.
    assert not rule.decide(100, 0, 0).local
    assert not rule.decide(100, None, 0).local


def test_a_bound_of_the_hit_settles_only_what_every_exact_hit_below_it_would() -> None:
    from relaykv.router.policy import ConditionalRule

    rule = ConditionalRule(max_suffix=512, max_queued_prefill=1024)
    settled = rule.settled_by_bound(2736, 1536)
    assert settled is not None and (settled.local, settled.suffix) == (False, -1)
    assert settled.why == "suffix >= 1200 > max suffix 512"
    nothing = rule.settled_by_bound(100, 0)
    assert nothing == rule.decide(100, 0, queued_prefill=0)
    # A bound that leaves a short enough suffix decides nothing: the exact hit may be lower.
    assert rule.settled_by_bound(2048, 1536) is None
    for bound in range(0, 2737, 7):
        path = rule.settled_by_bound(2736, bound)
        for hit in range(0, bound + 1, 5):  # every exact hit the bound allows
            exact = rule.decide(2736, hit, queued_prefill=0)
            assert path is None or path.local == exact.local, (bound, hit)
    # `always` and `never` ignore the hit: nothing for a bound to settle.
    assert ConditionalRule("always").settled_by_bound(2736, 0) is None
    assert ConditionalRule("never").settled_by_bound(2736, 0) is None


def test_always_and_never_ignore_the_hit() -> None:
    from relaykv.router.policy import ConditionalRule

    assert not ConditionalRule("always").decide(1600, 1599, 0).local
    never = ConditionalRule("never").decide(5000, 0, 10**9)
    assert never.local and never.suffix == 5000 and never.why == "--disaggregation never"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": "sometimes"}, "disaggregation must be one of conditional, always, never"),
        ({"max_suffix": -1}, "conditional_max_suffix must be >= 0"),
        ({"max_queued_prefill": -5}, "conditional_max_queued_prefill must be >= 0"),
        ({"max_running": -1}, "conditional_max_running must be >= 0"),
    ],
)
def test_conditional_rule_refuses_bad_settings(kwargs: dict, message: str) -> None:
    from relaykv.router.policy import ConditionalRule

    with pytest.raises(ValueError, match=message):
        ConditionalRule(**kwargs)


def test_the_routers_flags_build_the_rule_and_name_a_bad_value(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import argparse

    from relaykv.router.cli import add_disaggregation_arguments, conditional_rule

    parser = argparse.ArgumentParser()
    add_disaggregation_arguments(parser)
    rule = conditional_rule(parser.parse_args(["--conditional-max-running", "3"]), parser)
    assert (rule.mode, rule.max_suffix, rule.max_running) == ("conditional", 512, 3)
    assert rule.queue_cap == 512  # no --conditional-max-queued-prefill: the max suffix
    argv = ["--conditional-max-suffix", "64", "--conditional-max-queued-prefill", "1000"]
    assert conditional_rule(parser.parse_args(argv), parser).queue_cap == 1000
    assert conditional_rule(parser.parse_args([]), parser).max_running == 0
    with pytest.raises(SystemExit):
        conditional_rule(parser.parse_args(["--conditional-max-running", "-1"]), parser)
    assert "argument --conditional-max-running: must be >= 0, got -1" in capsys.readouterr().err
