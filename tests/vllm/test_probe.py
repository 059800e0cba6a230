"""`cache-probe --engine vllm`: vLLM 0.33's real scheduler with the plugin (issue 24).

* `legacy` is stock vLLM: relaykv.vllm.Scheduler + RelayKVConnector under `legacy` give what
  vLLM's own Scheduler + NixlConnector give, and the decode engine reuses nothing locally
  after an external load (the failure vLLM PR #56449 reported).
* Under `replay-slack`, `exact` and `per-group` the probe through vLLM equals relaykv's own
  probe phase by phase (local tokens, blocks received per group; colocated hits too) for
  every geometry of tests/cache_probe/golden and for prompt lengths around block and window
  boundaries.
"""

from __future__ import annotations

import argparse
import random

import pytest

from tests.cache_probe.test_golden import cases as golden_cases
from tests.vllm.conftest import SKIP_REASON

pytest.importorskip("vllm", reason=SKIP_REASON)

from relaykv.cache_probe import cli as probe_cli
from relaykv.cache_probe.probe import run_probe as relaykv_probe
from relaykv.kvcache.geometry import Geometry, parse_groups, preset
from relaykv.vllm.probe import run_probe as vllm_probe

PLUGIN_POLICIES = ("replay-slack", "exact", "per-group")


def _parse(args: list[str]) -> tuple[Geometry, argparse.Namespace]:
    parser = argparse.ArgumentParser()
    probe_cli.add_arguments(parser)
    ns = parser.parse_args(args)
    return probe_cli.build_geometry(parser, ns), ns


def _golden() -> list[list[str]]:
    seen, out = set(), []
    for args in golden_cases():
        key = tuple(a for a in args if a != "--json")
        if key not in seen:
            seen.add(key)
            out.append(list(key))
    return out


@pytest.mark.parametrize("args", _golden(), ids=" ".join)
def test_plugin_equals_relaykv_on_every_golden_geometry(args: list[str], model_dirs) -> None:
    geometry, ns = _parse(args)
    for policy in PLUGIN_POLICIES:
        ours = relaykv_probe(geometry, policy, ns.prompt_len, **probe_cli.probe_options(ns))
        through_vllm = vllm_probe(
            geometry, policy, ns.prompt_len, dirs=model_dirs, **probe_cli.probe_options(ns)
        )
        assert through_vllm == ours, policy


def _boundary_lengths(geometry: Geometry) -> list[int]:
    a = geometry.alignment
    points = {3 * a, 8 * a}
    for g in geometry.groups:
        if g.parameter is not None:
            points.add(g.parameter)
            points.add(g.parameter + 2 * a)
    out = set()
    for p in points:
        out.update(n for n in (p - 1, p, p + 1) if n >= 2)
    return sorted(out)


_SHAPES = [
    ("gpt-oss-like", None),
    ("gemma3-like", None),
    ("dsv4-like", None),
    ("full:16,sliding:16:128", 1),
    ("full:8,chunked:8:64", None),
    ("full:4,sliding:8:20", 0),
    ("sliding:4:13,full:2", 0),
]


@pytest.mark.parametrize(("shape", "draft"), _SHAPES)
def test_plugin_equals_relaykv_around_block_and_window_boundaries(shape, draft, model_dirs) -> None:
    geometry = preset(shape) if ":" not in shape else Geometry(parse_groups(shape))
    if draft is not None:
        geometry = geometry.with_draft(draft)
    rng = random.Random(shape)
    for n in _boundary_lengths(geometry):
        diverge = rng.randint(1, n - 1)
        for policy in PLUGIN_POLICIES:
            kw = dict(sibling_diverge=diverge, extension_len=rng.randint(1, 40))
            ours = relaykv_probe(geometry, policy, n, **kw)
            assert vllm_probe(geometry, policy, n, dirs=model_dirs, **kw) == ours, (n, policy)


@pytest.mark.parametrize("name", ["gpt-oss-like", "gemma3-like", "dsv4-like"])
@pytest.mark.parametrize("n", [1000, 1024, 3000])
def test_legacy_is_stock_vllm(name: str, n: int, model_dirs) -> None:
    geometry = preset(name)
    plugin = vllm_probe(geometry, "legacy", n, dirs=model_dirs)
    stock = vllm_probe(geometry, "legacy", n, dirs=model_dirs, stock=True)
    assert plugin == stock


def test_stock_vllm_reuses_nothing_on_the_decode_engine_after_a_load(model_dirs) -> None:
    """PR #56449's report, reproduced on vLLM 0.33's scheduler: a colocated engine hits the
    resend and the extension, the decode engine hits nothing after the first load; relaykv's
    per-group reuses the whole shared prefix."""
    geometry = preset("gpt-oss-like")
    legacy = vllm_probe(geometry, "legacy", 1000, dirs=model_dirs)
    assert legacy["colocated"]["resend"] == 976 and legacy["colocated"]["extension"] == 976
    assert [case["local_tokens"] for case in legacy["decode"].values()] == [0, 0, 0, 0]
    per_group = vllm_probe(geometry, "per-group", 1000, dirs=model_dirs)
    assert [case["local_tokens"] for case in per_group["decode"].values()] == [0, 976, 976, 960]
