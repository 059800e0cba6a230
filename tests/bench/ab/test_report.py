"""A/B/A tables on synthetic run records (hand-computed change and spread)."""

from __future__ import annotations

import pytest

from relaykv.bench.ab.cli import parse_configs, parse_order, run_labels
from relaykv.bench.ab.report import build_rows, change_pct, markdown_table, spread_pct
from relaykv.bench.ab.workload import parse_group


def record(label: str, config: str, throughput: float, local_hits: float | None) -> dict:
    return {
        "label": label,
        "config": config,
        "probe": {
            "phases": [
                {
                    "name": "serial",
                    "local_hit_tokens": 0 if config == "a" else 64,
                    "external_hit_tokens": 64,
                    "kv_bytes_received": 6400,
                    "requests_ok": 2,
                }
            ]
        },
        "groups": [
            {
                "group": "c1/output1",
                "result": {
                    "request_throughput": throughput,
                    "mean_ttft_ms": 10.0 / throughput,
                    "completed": 8,
                    "failed": 0,
                    "cache_report": {"cache_hit_rate_pct": 50.0},
                },
                "counters": {"decode": {"local_hit_tokens": local_hits}, "prefill": {}},
            }
        ],
    }


RUNS = [record("A1", "a", 1.0, 0.0), record("B1", "b", 2.0, 100.0), record("A2", "a", 1.2, 0.0)]


def row(rows, group: str, metric: str):
    return next(r for r in rows if r.group == group and r.metric == metric)


def test_baseline_mean_change_and_a1_a2_spread() -> None:
    rows = build_rows(RUNS, "a")
    tput = row(rows, "c1/output1", "request_throughput")
    assert tput.values == {"A1": 1.0, "B1": 2.0, "A2": 1.2}
    assert tput.baseline == pytest.approx(1.1)
    assert tput.candidates == {"b": 2.0}
    assert tput.change_pct["b"] == pytest.approx((2.0 - 1.1) / 1.1 * 100)
    assert tput.spread_pct == pytest.approx(0.2 / 1.1 * 100)
    hits = row(rows, "c1/output1", "decode_local_hit_tokens")
    assert (hits.baseline, hits.change_pct["b"], hits.spread_pct) == (0.0, None, 0.0)
    assert row(rows, "probe/serial", "local_hit_tokens").candidates == {"b": 64.0}
    assert row(rows, "c1/output1", "prefill_local_hit_tokens").baseline is None


def test_change_and_spread_edge_cases() -> None:
    assert change_pct(0.0, 0.0) == 0.0
    assert change_pct(None, 1.0) is None
    assert change_pct(-2.0, -1.0) == pytest.approx(50.0)
    assert spread_pct([1.0]) is None
    assert spread_pct([1.0, None, 3.0]) == pytest.approx(100.0)


def test_markdown_table_columns() -> None:
    text = markdown_table(build_rows(RUNS, "a"), RUNS, "a")
    header = text.splitlines()[0]
    assert header == (
        "| Group | Metric | A1 a | B1 b | A2 a | Baseline (a) | b | Change (b) | A1/A2 spread |"
    )
    assert (
        "| c1/output1 | Request throughput (req/s) | 1.000 | 2.000 | 1.200 | 1.100 | 2.000 "
        "| +81.8% | 18.2% |"
    ) in text
    assert "| c1/output1 | D local hit tokens | 0 | 100 | 0 | 0 | 100 | n/a | 0.0% |" in text
    assert "| probe/serial | Probe requests ok | 2 | 2 | 2 | 2 | 2 | +0.0% | 0.0% |" in text


def test_a_change_inside_the_a1_a2_spread_says_within_noise() -> None:
    # throughput: A1 1.0, A2 1.2 (spread 18.2 %); b at 1.15 is +4.5 %: within noise.
    runs = [
        record("A1", "a", 1.0, 0.0),
        record("B1", "b", 1.15, 100.0),
        record("A2", "a", 1.2, 0.0),
    ]
    rows = build_rows(runs, "a")
    tput = row(rows, "c1/output1", "request_throughput")
    assert tput.change_pct["b"] == pytest.approx(0.05 / 1.1 * 100)
    assert tput.within_noise == {"b": True}
    text = markdown_table(rows, runs, "a")
    line = next(x for x in text.splitlines() if "Request throughput" in x)
    assert "| within noise | 18.2% |" in line and "+4.5%" not in line
    # No signed change in the table is smaller than its row's spread.
    for r in rows:
        change, spread = r.change_pct["b"], r.spread_pct
        if change is not None and spread and abs(change) <= spread:
            assert r.within_noise["b"]
    # A change beyond the spread keeps its sign; zero spread with zero change stays +0.0 %.
    assert not row(build_rows(RUNS, "a"), "c1/output1", "request_throughput").within_noise["b"]
    assert not row(rows, "probe/serial", "requests_ok").within_noise["b"]


def test_flag_parsers() -> None:
    configs = parse_configs(["legacy=--pd-policy legacy", 'new=--pd-policy "per group"'])
    assert configs == {"legacy": ["--pd-policy", "legacy"], "new": ["--pd-policy", "per group"]}
    assert parse_order("A/B/A", ["legacy", "new"]) == ["legacy", "new", "legacy"]
    assert parse_order("new,legacy", ["legacy", "new"]) == ["new", "legacy"]
    assert run_labels(["x", "y", "x", "y"], ["x", "y"]) == ["A1", "B1", "A2", "B2"]
    g = parse_group("c8/output128:40")
    assert (g.concurrency, g.output_len, g.num_prompts, g.label) == (8, 128, 40, "c8/output128")
    for bad, flag in ((["x"], "--configs"), (["a=1", "a=2"], "--configs")):
        with pytest.raises(ValueError, match=flag):
            parse_configs(bad)
    with pytest.raises(ValueError, match="--order"):
        parse_order("A/C", ["a", "b"])
    with pytest.raises(ValueError, match="--order"):
        parse_order("A", ["a", "b"])
    for bad in ("c8/output128", "c0/output1:3", "8/128:40"):
        with pytest.raises(ValueError, match="--groups"):
            parse_group(bad)


def test_shared_prefix_groups_and_the_greedy_output_check() -> None:
    from relaykv.bench.ab.report import build_rows
    from relaykv.bench.ab.workload import count_differing_outputs

    g = parse_group("gsp:c4/output32:16")
    assert (g.concurrency, g.output_len, g.num_prompts, g.shared_prefix) == (4, 32, 16, True)
    assert g.label == "gsp c4/output32" and not parse_group("c4/output32:16").shared_prefix
    with pytest.raises(ValueError, match="gsp:"):
        parse_group("sgl:c4/output32:16")

    def run(label: str, config: str, outputs: list) -> dict:
        result = {"completed": 3, "failed": 0, "p99_itl_ms": 10.0}
        group = {"group": "gsp c4/output32", "result": result, "counters": {}, "outputs": outputs}
        return {"label": label, "config": config, "probe": None, "groups": [group]}

    runs = [run("A1", "always", ["x", "y", "z"]), run("B1", "conditional", ["x", "Y", None]),
            run("A2", "always", ["x", "y", "z"])]
    count_differing_outputs(runs)
    assert [r["groups"][0]["differing_outputs"] for r in runs] == [0, 1, 0]  # None: a failure
    rows = {r.metric: r for r in build_rows(runs, "always")}
    assert rows["differing_outputs"].candidates == {"conditional": 1.0}
    assert rows["p99_itl_ms"].baseline == 10.0
