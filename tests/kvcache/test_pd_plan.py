"""The P/D plan and its policies (docs/design.md §7), end to end through the cache probe."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from relaykv.cache_probe.probe import run_probe
from relaykv.kvcache import PD_POLICIES, Geometry, GroupSpec, pd_plan, pd_slack_tokens, rules_for

from .conftest import geometry
from .strategies import ALL_MODES, geometries


def test_worked_example(worked_example) -> None:
    """N=1000, full b=16 + sliding b=16 W=128, draft in the sliding group (§7)."""
    results = {p: run_probe(worked_example, p, 1000) for p in PD_POLICIES}
    assert results["legacy"]["colocated"]["resend"] == 976
    assert results["legacy"]["decode"]["resend"]["local_tokens"] == 0
    assert results["exact"]["decode"]["resend"]["local_tokens"] == 976
    # What D holds under legacy: sliding blocks 54..62; the boundary 976 needs 53..61.
    assert pd_plan(worked_example, "legacy", 1000).held[1] == range(54, 63)
    assert pd_plan(worked_example, "exact", 1000).held[1] == range(53, 63)
    # Only the tail crosses the wire once D hits locally.
    assert results["exact"]["decode"]["resend"]["received_blocks"] == [2, 2]
    assert results["legacy"]["decode"]["resend"]["received_blocks"] == [63, 9]


@settings(max_examples=60, deadline=None)
@given(geometries(max_groups=3), st.integers(2, 160))
def test_exact_decode_hits_equal_colocated_for_every_n(geo: Geometry, n: int) -> None:
    result = run_probe(geo, "exact", n, extension_len=20, sibling_diverge=max(1, n // 3))
    for case in ("resend", "extension"):
        assert result["decode"][case]["local_tokens"] == result["colocated"][case], case


@settings(max_examples=60, deadline=None)
@given(geometries(max_groups=3, modes=ALL_MODES), st.integers(2, 160))
def test_per_group_reuses_the_shared_prefix_in_full_groups(geo: Geometry, n: int) -> None:
    diverge = max(1, n // 4)
    result = run_probe(geo, "per-group", n, extension_len=16, sibling_diverge=diverge)
    sibling = result["decode"]["sibling"]
    shared = n - diverge
    full = [r for r in rules_for(geo) if r.spec.kind == "full"]
    assume(full)
    # Every full block wholly inside x is reused (one less in a draft group, whose last
    # block's draft KV depends on the diverging token: no peek proof, no successor key).
    expect = min(
        (shared // r.block_size - (1 if (r.reuse_peek or r.successor_keys) else 0)) * r.block_size
        for r in full
    )
    assert sibling["local_tokens"] >= min(max(0, expect), n - 1)
    for r in full:
        held = pd_plan(geo, "per-group", n).held[r.index]
        reused = shared // r.block_size - (1 if (r.reuse_peek or r.successor_keys) else 0)
        assert sibling["received_blocks"][r.index] <= len(held) - max(0, reused)


@pytest.mark.parametrize("policy", PD_POLICIES)
@pytest.mark.parametrize(
    "geo",
    [
        geometry("full:16", "sliding:16:128", draft=1),
        geometry("full:16", "sliding:16:128", draft=0),
        geometry("full:16", "sliding:16:128"),
        geometry("full:32", "sliding:8:40", "sliding:16:64", draft=1),
    ],
)
def test_plan_is_consistent_for_every_n(geo: Geometry, policy: str) -> None:
    slack = pd_slack_tokens(geo, policy)
    for n in range(1, 400):
        plan = pd_plan(geo, policy, n)
        for rule in rules_for(geo):
            held = plan.held[rule.index]
            assert held.stop == -(-n // rule.block_size)
            if rule.spec.kind == "full":
                assert held.start == 0
                continue
            # D recomputes N-1: its window must be held whatever the policy.
            assert held.start <= rule.first_read_block(n - 1)
            # The sizing slack covers the plan (§8).
            assert rule.first_kept_block(n - 1, None) >= held.start
            assert max(0, n - rule.window - slack[rule.index]) // rule.block_size <= held.start
            if policy == "exact":
                for r in plan.boundaries:
                    assert rule.needed(r).start >= held.start


def test_replay_slack_only_widens_draft_sliding_groups() -> None:
    both = Geometry(
        (GroupSpec("sliding", 16, window=128, draft=True), GroupSpec("sliding", 16, window=128))
    )
    plan = pd_plan(both, "replay-slack", 1000)
    assert plan.held[0].start == 53 and plan.held[1].start == 54
    assert pd_slack_tokens(both, "replay-slack") == (15, 0)


def test_replay_slack_leaves_the_collapse_when_the_draft_is_in_the_full_group() -> None:
    # gpt-oss-like: the replay boundary is global, so the sliding group needs a window the
    # published fix never keeps (docs/design.md §7).
    geo = geometry("full:16", "sliding:16:128", draft=0)
    result = run_probe(geo, "replay-slack", 1000)
    assert result["colocated"]["resend"] == 976
    assert result["decode"]["resend"]["local_tokens"] == 0
    assert run_probe(geo, "exact", 1000)["decode"]["resend"]["local_tokens"] == 976


def test_unknown_policy_and_empty_prompt() -> None:
    with pytest.raises(ValueError, match="unknown P/D policy"):
        pd_plan(geometry("full:16"), "magic", 10)
    with pytest.raises(ValueError):
        pd_plan(geometry("full:16"), "exact", 0)


def _received_then_sibling(reach: int, sibling_suffix: int) -> int:
    """D receives prefix + 64 tokens from P under `per-group` with sibling reach `reach`, then
    computes a sibling (same 1,536-token prefix, a new suffix) itself: its local hit."""
    from relaykv.kvcache import CacheRole, KVCacheManager

    from .conftest import tokens

    geo = geometry("full:16", "sliding:16:64")
    p = KVCacheManager(geo, 2048, pd_policy="per-group", pd_role=True, retention="dense",
                       sibling_reach=reach)
    d = KVCacheManager(geo, 2048, pd_policy="per-group", pd_role=True, sibling_reach=reach)
    prefix = tokens(1536)
    parent = [*prefix, *range(3, 67)]
    p_req = p.add_request("p", parent, role=CacheRole.PREFILL)
    assert p.admit(p_req, budget=4096) is not None
    p.commit(p_req, len(parent))
    held = p.hold_for_transfer(p_req)
    d_req = d.add_request("d", parent, role=CacheRole.DECODE)
    load = d.receive(d_req)
    assert load is not None and [len(x) for x in held] == [len(r) for r in load.plan.held]
    d.load_finished(load, ok=True)
    d.release(d_req)
    sibling = d.add_request("s", [*prefix, *range(100, 100 + sibling_suffix)])
    admission = d.admit(sibling, budget=4096)
    assert admission is not None
    return admission.start


def test_sibling_reach_keeps_the_windows_a_sibling_resumes_at() -> None:
    # Without reach D holds only the window of N-1: a sibling diverging at 1,536 hits nothing.
    assert _received_then_sibling(0, 64) == 0
    # With reach >= the parent's suffix, D holds the window at 1,536: the sibling hits it.
    assert _received_then_sibling(128, 64) == 1536
    assert _received_then_sibling(128, 1200) == 1536
    # The plan only widens the non-prefix-closed groups, by the reach.
    geo = geometry("full:16", "sliding:16:64")
    plain, wide = pd_plan(geo, "per-group", 1600), pd_plan(geo, "per-group", 1600, 128)
    assert plain.held[0] == wide.held[0] == range(0, 100)
    # Position 1599 reads from 1536 (block 96); 1599 - 128 = 1471 reads from 1408 (block 88).
    assert (plain.held[1], wide.held[1]) == (range(96, 100), range(88, 100))
    assert pd_slack_tokens(geo, "per-group", 128)[1] > pd_slack_tokens(geo, "per-group")[1]
    with pytest.raises(ValueError, match="sibling reach"):
        pd_plan(geo, "per-group", 1600, -1)


def test_a_prefill_engine_attaches_the_reach_blocks_it_still_caches() -> None:
    """With a sibling reach P must hold more window blocks; when its cache still has them
    (dense retention keys every window) it attaches them instead of recomputing from lower."""
    from relaykv.kvcache import CacheRole, KVCacheManager
    from relaykv.kvcache.pd_plan import prefill_hit_cap

    from .conftest import tokens

    geo = geometry("full:16", "sliding:16:64")
    prefix = tokens(1536)
    p = KVCacheManager(geo, 2048, pd_policy="per-group", pd_role=True, retention="dense",
                       sibling_reach=128)
    for i, tail in enumerate((range(3, 67), range(100, 164))):
        req = p.add_request(f"p{i}", [*prefix, *tail], role=CacheRole.PREFILL)
        admission = p.admit(req, budget=4096)
        assert admission is not None
        p.commit(req, req.num_prompt_tokens)
        held = p.hold_for_transfer(req)  # raises if a planned block were missing
        assert [len(h) for h in held] == [100, 12]  # full 0..99, sliding 88..99
        p.release(req)
    # The sibling resumed at the shared prefix, above the cap the reach alone would allow.
    capped = prefill_hit_cap(geo, p.rules, p.pd_policy, req, 128)
    assert admission.start == 1536 > capped
    assert p.check() == []
