"""The P/D configuration as types: `PDPolicy` and `Role` (docs/design.md §7).

Every layer takes these enums; a user's string is turned into one exactly once, where it
enters (`PDPolicy.parse` / `Role.parse`, whose message lists the choices). Both are `StrEnum`s:
they print, compare and serialize as their flag values (`"per-group"`, `"decode"`), so the
transfer parameters and result JSON keep their strings.
"""

from __future__ import annotations

from enum import StrEnum


class PDPolicy(StrEnum):
    """Which KV blocks a decode engine holds and how it reuses them (§7)."""

    LEGACY = "legacy"  # vLLM 0.33's decode side: the window of N-1, the common hit
    REPLAY_SLACK = "replay-slack"  # the published fix: +A below the window, draft groups
    EXACT = "exact"  # down to the lowest block any replay boundary needs
    PER_GROUP = "per-group"  # the window of N-1, every block reused by hash (the default)

    @classmethod
    def parse(cls, value: str) -> PDPolicy:
        try:
            return cls(value)
        except ValueError:
            raise ValueError(
                f"unknown P/D policy {value!r}; choose from {', '.join(PD_POLICIES)}"
            ) from None

    @property
    def common_resume(self) -> bool:
        """D resumes all groups at one point found by the hybrid lookup (§5)."""
        return self is not PDPolicy.PER_GROUP

    @property
    def coalesces_loads(self) -> bool:
        """Concurrent loads of the same blocks share one transfer (relaykv's policies only:
        `legacy` and `replay-slack` reproduce systems that pull separately)."""
        return self in (PDPolicy.EXACT, PDPolicy.PER_GROUP)


def eagle_reuse_conflict(policy: PDPolicy, eagle_reuse: str) -> str | None:
    """Why a decode engine under `policy` cannot run `eagle_reuse`, or None. A delivered load
    computes only N-1 (§7), so it cannot compute a common hit's last position again: under
    `eagle_reuse=recompute` only `per-group` reuse (which keeps the per-block peek,
    `GroupRules.reuse_peek`) is sound (docs/design.md §4)."""
    if eagle_reuse == "recompute" and policy.common_resume:
        return (
            f"--pd-policy {policy.value} resumes a load at a common hit; with "
            "eagle_reuse=recompute a decode engine needs --pd-policy per-group"
        )
    return None


class Role(StrEnum):
    """What an engine does for a request: everything, or one side of a P/D transfer."""

    COLOCATED = "colocated"
    PREFILL = "prefill"  # computed here, KV sent to a decode engine afterwards
    DECODE = "decode"  # KV received from a prefill engine, decoded here

    @classmethod
    def parse(cls, value: str) -> Role:
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"unknown role {value!r}; choose from {', '.join(ROLES)}") from None

    @property
    def in_pd_pair(self) -> bool:
        return self is not Role.COLOCATED


PD_POLICIES: tuple[str, ...] = tuple(p.value for p in PDPolicy)
ROLES: tuple[str, ...] = tuple(r.value for r in Role)
DEFAULT_PD_POLICY = PDPolicy.PER_GROUP
