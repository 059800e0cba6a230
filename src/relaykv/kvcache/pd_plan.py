"""The P/D plan: which blocks a decode engine holds after receiving an N-token prompt (§7).

ONE function, `pd_plan(geometry, policy, N)`, answers it. Everything else derives from its
result, never from a formula of its own (docs/design.md §7: two separate computations disagree at
some `N mod b`):

* P's retention: P keeps exactly `held[g]` of each group until D has read it;
* D's allocation: D's table for group g covers `held[g]` (nulls below it);
* the transfer lists on both sides: `held[g]` minus what D reuses locally, paired by index;
* the caching mask after a load: `cache_mask(g)` within `held[g]`;
* sizing and admission: `slack_tokens` is the largest retention beyond the window over all N.

After a full-prompt load D recomputes position N-1 (the full-prompt rule: logits come from the
last prompt token), so its sliding groups need the window of N-1: positions `>= N-W`.

| policy         | sliding blocks D holds                                                      |
|----------------|-----------------------------------------------------------------------------|
| `legacy`       | the window of N-1 only (vLLM 0.33's window, see below)                      |
| `replay-slack` | draft sliding groups: A more tokens below the window counted from N         |
| `exact`        | every sliding group: down to the lowest block any replay boundary needs     |
| `per-group`    | the window of N-1; each block reused locally by hash or received (no common |
|                | resume point, since D does not prefill)                                     |

Full groups always hold `[0, cdiv(N, b))`.

**Sibling reach** (`reach`, tokens; 0 by default, the table above): the non-prefix-closed
groups also hold the blocks every position down to `N-1-reach` reads, on top of the policy's
range. A decode engine that serves siblings itself (conditional disaggregation,
docs/routing.md) then holds the windows a sibling diverging within `reach` tokens of the end
resumes at, so its local lookup hits the shared prefix. Both engines of a pair plan with the
same reach (the transfer parameters carry it; D refuses a mismatch).

`legacy` reproduces vLLM 0.33.0's decode side (the hit collapse of §7), with one deliberate
difference: 0.33.0 materializes positions `>= N-W+1`, which drops the block holding token N-W
when `N-W+1` is a multiple of b although recomputing N-1 reads it (a wrong-output bug, see the
docs/design.md §7). relaykv's legacy keeps that block, so every policy produces correct tokens
and the comparison measures cache behaviour only.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

from relaykv.kvcache.geometry import Geometry, cdiv
from relaykv.kvcache.groups import GroupRules, rules_for
from relaykv.kvcache.pd_config import PDPolicy
from relaykv.kvcache.retention import Retention, hash_mask, replay_boundaries


@dataclass(frozen=True, slots=True)
class PDPlan:
    """What D holds per group after receiving an N-token prompt, and how it reuses it."""

    policy: PDPolicy
    num_tokens: int
    held: tuple[range, ...]
    boundaries: tuple[int, ...]
    reach: int = 0

    @property
    def common_resume(self) -> bool:
        """D resumes all groups at one point found by the hybrid lookup (§5)."""
        return self.policy.common_resume

    @property
    def coalesces_loads(self) -> bool:
        """Concurrent loads of the same blocks share one transfer (see `PDPolicy`)."""
        return self.policy.coalesces_loads

    def held_blocks(self) -> int:
        return sum(len(r) for r in self.held)

    def cache_mask(
        self, rule: GroupRules, retention: Retention, junction: int = 0
    ) -> set[int] | None:
        """Block indices of group `rule` to hash after the load (None: every full one).

        Under the common-resume policies the sliding groups keep the windows their retention
        policy names, exactly as a colocated engine would; under `per-group` D's later
        lookups are per block, so every received full block is worth a hash; with a sibling
        reach, so is every block it holds for the siblings.
        """
        if not self.common_resume or self.reach:
            return None
        return hash_mask(rule, retention, self.boundaries, junction, self.num_tokens)


def pd_plan(geometry: Geometry, policy: PDPolicy, num_tokens: int, reach: int = 0) -> PDPlan:
    """The plan for a decode engine receiving a `num_tokens`-token prompt under `policy`,
    with sibling reach `reach` tokens (module docstring)."""
    if num_tokens < 1:
        raise ValueError("a P/D transfer needs a prompt of at least one token")
    if reach < 0:
        raise ValueError(f"the sibling reach must be >= 0 tokens, got {reach}")
    return _plan(geometry, PDPolicy.parse(policy), num_tokens, reach)


@lru_cache(maxsize=4096)
def _plan(geometry: Geometry, policy: PDPolicy, n: int, reach: int = 0) -> PDPlan:
    rules = rules_for(geometry)
    boundaries = replay_boundaries(geometry, n, rules)
    held = tuple(
        range(
            _first_held_block(rule, geometry, policy, n, boundaries, reach),
            cdiv(n, rule.block_size),
        )
        for rule in rules
    )
    return PDPlan(policy, n, held, boundaries, reach)


def _first_held_block(
    rule: GroupRules,
    geometry: Geometry,
    policy: PDPolicy,
    n: int,
    boundaries: tuple[int, ...],
    reach: int = 0,
) -> int:
    final_window = rule.first_read_block(n - 1)  # D recomputes N-1 (full-prompt rule)
    if reach and not rule.prefix_closed:
        # Sibling reach: every position down to N-1-reach keeps what it reads.
        final_window = min(final_window, rule.first_read_block(max(0, n - 1 - reach)))
    if policy is PDPolicy.REPLAY_SLACK and rule.draft:
        # The published fix: one alignment unit below the window counted from N (§7).
        return min(final_window, rule.first_kept_block(n - geometry.alignment))
    if policy is PDPolicy.EXACT:
        lowest = [rule.needed(r).start for r in boundaries]
        return min([final_window, *lowest])
    return final_window


@lru_cache(maxsize=256)
def pd_slack_tokens(geometry: Geometry, policy: PDPolicy, reach: int = 0) -> tuple[int, ...]:
    """Per group, the most tokens a plan retains below the standard window, over all N (§8).

    A request that processed p tokens keeps blocks from `first_kept_block(p - slack)`; after a
    load D has processed N-1 tokens, so the slack that keeps `held[g]` is
    `slack_tokens(N-1, held[g].start)`. The plan repeats with period A once N exceeds the
    longest reach by a few alignment units, so a finite scan finds the maximum.
    """
    policy = PDPolicy(policy)
    rules = rules_for(geometry)
    a = geometry.alignment
    top = max((r.reach or 0 for r in rules), default=0) + reach + 4 * a
    slack = [0] * len(rules)
    for n in range(1, top + a + 1):
        plan = _plan(geometry, policy, n, reach)
        for rule in rules:
            need = rule.slack_tokens(n - 1, plan.held[rule.index].start)
            slack[rule.index] = max(slack[rule.index], need)
    return tuple(slack)


class _Prompted(Protocol):
    @property
    def num_prompt_tokens(self) -> int: ...

    @property
    def num_tokens(self) -> int: ...


def prefill_hit_cap(
    geometry: Geometry,
    rules: tuple[GroupRules, ...],
    policy: PDPolicy,
    req: _Prompted,
    reach: int = 0,
) -> int:
    """The largest local hit a prefill engine may take (also what a router scores it by):
    it must end up holding every block its plan names, and blocks below a hit's needed
    range are nulls, so no group's hit may start above the plan's first held block."""
    plan = pd_plan(geometry, policy, req.num_prompt_tokens, reach)
    cap = req.num_tokens
    for rule in rules:
        rule_cap = rule.hit_cap_for_floor(plan.held[rule.index].start)
        if rule_cap is not None:
            cap = min(cap, rule_cap)
    return cap


def reach_blocks(plan: PDPlan, rule: GroupRules, hit_tokens: int) -> range:
    """The blocks of group `rule` a prefill engine resuming at `hit_tokens` must take from
    its cache to hold `plan` (the sibling reach's windows below the hit's own; empty without
    a reach). When one is not cached, the hit is capped by `prefill_hit_cap` instead."""
    if hit_tokens <= 0 or rule.prefix_closed:
        return range(0)
    return range(plan.held[rule.index].start, rule.needed(hit_tokens).start)
