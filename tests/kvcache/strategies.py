"""Hypothesis strategies for geometries and token sequences that share prefixes."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import strategies as st

from relaykv.kvcache import Geometry, GroupSpec
from relaykv.kvcache.geometry import EAGLE_REUSE_MODES


@st.composite
def geometries(
    draw: st.DrawFn, max_groups: int = 3, modes: tuple[str, ...] = ("drop", "successor")
) -> Geometry:
    """Random geometries; `modes`: the `eagle_reuse` modes to draw from (`recompute` only
    where the test's P/D policies allow it: docs/design.md §4)."""
    n = draw(st.integers(1, max_groups))
    groups = []
    for _ in range(n):
        block = draw(st.sampled_from([2, 4, 8]))
        kind = draw(st.sampled_from(["full", "sliding", "full", "sliding", "chunked"]))
        if kind == "full":
            groups.append(GroupSpec("full", block))
        elif kind == "sliding":
            groups.append(GroupSpec("sliding", block, window=draw(st.integers(1, 24))))
        else:
            groups.append(GroupSpec("chunked", block, chunk=draw(st.integers(1, 24))))
    draft = draw(st.one_of(st.none(), st.integers(0, n - 1)))
    reuse = draw(st.sampled_from(modes))
    groups = [replace(g, draft=(i == draft)) for i, g in enumerate(groups)]
    return Geometry(tuple(groups), eagle_reuse=reuse)


ALL_MODES = EAGLE_REUSE_MODES


@st.composite
def related_prompts(draw: st.DrawFn, count: int = 4, max_len: int = 80) -> list[list[int]]:
    """Prompts that share prefixes: each one extends or branches off an earlier one."""
    prompts: list[list[int]] = []
    for _ in range(count):
        tail = draw(st.lists(st.integers(0, 3), min_size=1, max_size=max_len))
        if prompts and draw(st.booleans()):
            base = draw(st.sampled_from(prompts))
            keep = draw(st.integers(0, len(base)))
            prompts.append((base[:keep] + tail)[:max_len] or [0])
        else:
            prompts.append(tail)
    return prompts


def branching_prompts(bases: list[list[int]], max_tail: int = 12) -> st.SearchStrategy[list[int]]:
    """A prefix of one of `bases` plus a short random tail (never empty)."""
    return st.builds(
        lambda b, keep, tail: (b[:keep] + tail) or [1],
        st.sampled_from(bases),
        st.integers(0, max(len(b) for b in bases)),
        st.lists(st.integers(0, 4), max_size=max_tail),
    )
