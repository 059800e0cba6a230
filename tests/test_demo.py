"""`relaykv demo`: the README's first command runs the cache probe, then an A/B/A of legacy
against per-group with the probe on each cluster (every request through P), then one of
`--disaggregation always` against `conditional` (the runs themselves are tested in
tests/bench with a stub cluster and in tests/serve with real ones)."""

from __future__ import annotations

import argparse

import relaykv.demo as demo


def test_demo_runs_cache_probe_then_legacy_vs_per_group(monkeypatch, tmp_path) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(demo, "relaykv", lambda argv: calls.append(argv) or 0)
    args = argparse.Namespace(quick=True, link=False, output_dir=str(tmp_path))
    assert demo.run(args) == 0
    probe, ab, conditional = calls
    assert probe[0] == "cache-probe" and "full:16,sliding:16:64" in probe
    assert ab[:2] == ["bench", "ab"] and "--probe" in ab
    assert "legacy=--pd-policy legacy --disaggregation always" in ab
    assert "per-group=--pd-policy per-group --disaggregation always" in ab
    groups = ab[ab.index("--groups") + 1 : ab.index("--prefix-len")]
    assert [g.split(":")[0] for g in groups] == ["c1/output1", "c8/output1", "c8/output32"]
    assert "tiny-hybrid" in ab[ab.index("--up-cmd") + 1]
    _is_the_conditional_ab(conditional, ab)


def _is_the_conditional_ab(conditional: list[str], ab: list[str]) -> None:
    assert conditional[:2] == ["bench", "ab"] and "--probe" not in conditional
    assert "always=--pd-policy per-group --disaggregation always" in conditional
    assert "conditional=--pd-policy per-group --disaggregation conditional" in conditional
    groups = conditional[conditional.index("--groups") + 1 : conditional.index("--prefix-len")]
    assert [g.rsplit(":", 1)[0] for g in groups] == ["c1/output1", "gsp:c4/output32"]
    assert conditional[conditional.index("--output-dir") + 1].endswith("conditional")
    assert conditional[conditional.index("--up-cmd") + 1] == ab[ab.index("--up-cmd") + 1]


def test_gemma_demo_runs_with_its_draft_and_the_link_shaped_ab_on_request(
    monkeypatch, tmp_path
) -> None:
    import relaykv.model

    calls: list[list[str]] = []
    monkeypatch.setattr(demo, "relaykv", lambda argv: calls.append(argv) or 0)
    monkeypatch.setattr(relaykv.model, "is_installed", lambda name: name == "gemma3-270m")
    # By default (the README's `make demo`): the probe, the policy A/B/A, the conditional one.
    assert demo.run(argparse.Namespace(quick=False, link=False, output_dir=str(tmp_path))) == 0
    probe, ab, conditional = calls
    groups = ab[ab.index("--groups") + 1 : ab.index("--prefix-len")]
    assert [g.split(":")[0] for g in groups] == ["c1/output1", "c8/output32"]
    _is_the_conditional_ab(conditional, ab)
    calls.clear()
    assert demo.run(argparse.Namespace(quick=False, link=True, output_dir=str(tmp_path))) == 0
    probe, ab, link, conditional = calls
    _is_the_conditional_ab(conditional, ab)
    assert probe[probe.index("--draft") + 1] == "0"  # the draft layer's group
    up = ab[ab.index("--up-cmd") + 1]
    assert "gemma3-270m" in up and "--speculative-tokens 1" in up
    assert "--probe" in ab and "--probe" not in link
    flags = "--disaggregation always --kv-transport tcp --kv-link-gbps 10"
    assert f"legacy=--pd-policy legacy {flags}" in link
    assert f"per-group=--pd-policy per-group {flags}" in link
    assert link[link.index("--groups") + 1].startswith("c1/output1:")
    assert link[link.index("--output-dir") + 1].endswith("link-10gbps")
    # The link part's longer shared prefix fits its engines' --max-model-len.
    link_prefix = int(link[link.index("--prefix-len") + 1])
    link_up = link[link.index("--up-cmd") + 1]
    max_len = int(link_up.split("--max-model-len ")[1].split()[0])
    assert link_prefix > int(ab[ab.index("--prefix-len") + 1]) and link_prefix + 64 + 1 <= max_len


def test_demo_falls_back_to_tiny_hybrid_without_gemma(monkeypatch) -> None:
    import relaykv.model

    monkeypatch.setattr(relaykv.model, "is_installed", lambda name: False)
    said: list[str] = []
    assert demo.choose_scale(False, said.append) is demo.QUICK
    assert "not installed" in said[0]
    monkeypatch.setattr(relaykv.model, "is_installed", lambda name: name == "gemma3-270m")
    assert demo.choose_scale(False, said.append) is demo.REAL
    assert demo.choose_scale(True, said.append) is demo.QUICK


def test_demo_reports_a_failed_run(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(demo, "relaykv", lambda argv: 3 if argv[0] == "bench" else 0)
    assert demo.run(argparse.Namespace(quick=True, link=False, output_dir=str(tmp_path))) == 3
