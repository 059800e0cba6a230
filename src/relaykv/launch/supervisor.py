"""Supervision of a running cluster: a dead member is restarted, the rest keep serving.

`relaykv up` calls `Supervisor.poll()` twice a second. A member that exited is restarted on
its own port after a backoff (`backoff_s`, doubling per restart inside the window, at most
`max_backoff_s`); the router's health checks put it back into rotation once it answers
`/health`. Meanwhile the router fails requests over to the other engines of that role. A
member that dies more than `max_restarts` times within `window_s` seconds is crash-looping:
`poll()` then returns why, and `up` stops the cluster and exits 1 (docs/pd.md, "Failures").

After any death, shared-memory files whose creator is gone are removed (`on_death`, e.g.
relaykv.serve.assembly.pd_wiring.clean_stale_shared_memory): a decode engine killed with SIGKILL
leaves its whole KV pool file in /dev/shm otherwise.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from relaykv.launch.cluster import Cluster, Member


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    max_restarts: int = 5
    window_s: float = 60.0

    def __post_init__(self) -> None:
        if self.backoff_s < 0 or self.max_backoff_s < self.backoff_s:
            raise ValueError("need 0 <= backoff_s <= max_backoff_s")
        if self.max_restarts < 0 or self.window_s <= 0:
            raise ValueError("need max_restarts >= 0 and window_s > 0")


@dataclass
class Supervisor:
    cluster: Cluster
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    say: Callable[[str], None] = print
    on_death: Callable[[], object] | None = None
    clock: Callable[[], float] = time.monotonic
    deaths: dict[str, list[float]] = field(default_factory=dict)
    restart_at: dict[str, float] = field(default_factory=dict)

    def poll(self) -> str | None:
        """Restart what is due; None, or why the cluster must stop (a crash loop)."""
        now = self.clock()
        for member in self.cluster.members:
            if member.process is None or member.process.poll() is None:
                continue
            if member.name in self.restart_at:
                if now >= self.restart_at[member.name]:
                    del self.restart_at[member.name]
                    member.restarts += 1
                    self.cluster.launch(member)
                    self.say(f"{member.name} restarted (restart {member.restarts})")
                continue
            reason = self._died(member, now)
            if reason is not None:
                return reason
        return None

    def _died(self, member: Member, now: float) -> str | None:
        assert member.process is not None
        recent = [t for t in self.deaths.get(member.name, []) if t > now - self.policy.window_s]
        recent.append(now)
        self.deaths[member.name] = recent
        status = member.process.returncode
        if self.on_death is not None:
            self.on_death()
        if len(recent) > self.policy.max_restarts:
            return (
                f"{member.name} died {len(recent)} times within {self.policy.window_s:g}s "
                f"(status {status}); it is crash-looping\n{member.log_tail()}"
            )
        delay = min(self.policy.max_backoff_s, self.policy.backoff_s * 2 ** (len(recent) - 1))
        self.restart_at[member.name] = now + delay
        self.say(f"{member.name} exited (status {status}); restarting in {delay:g}s; the "
                 f"other members keep serving\n{member.log_tail(5)}")
        return None

    def check(self) -> list[str]:
        """Invariant violations (tests run this)."""
        problems = []
        names = {m.name for m in self.cluster.members}
        problems += [f"restart of unknown {n}" for n in self.restart_at if n not in names]
        for name, times in self.deaths.items():
            if times != sorted(times):
                problems.append(f"{name}: death times out of order")
        return problems
