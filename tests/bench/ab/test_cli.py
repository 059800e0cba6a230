"""`relaykv bench ab` end to end with a stub `up` command (a subprocess on loopback)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from relaykv.cli import main

STUB_UP = shlex.join([sys.executable, str(Path(__file__).parent.parent / "stub_cluster.py")])
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def ab(out: Path, *extra: str) -> int:
    return main(
        [
            "bench",
            "ab",
            "--configs",
            "legacy=--pd-policy legacy",
            "per-group=--pd-policy per-group",
            "--up-cmd",
            STUB_UP,
            "--groups",
            "c1/output1:3",
            "c2/output4:4",
            "--prefix-len",
            "64",
            "--suffix-len",
            "16",
            "--output-dir",
            str(out),
            "--disable-tqdm",
            *extra,
        ]
    )


def test_aba_writes_tables_plots_and_results(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert ab(tmp_path, "--probe", "--probe-prefix-len", "64", "--settle", "0") == 0
    out = capsys.readouterr().out
    assert "[1/3] A1 (legacy): starting" in out and "[3/3] A2: cluster stopped" in out
    assert "| Group | Metric | A1 legacy | B1 per-group | A2 legacy |" in out
    for name in ("ttft_distribution.png", "hit_tokens.png", "kv_bytes.png"):
        assert (tmp_path / name).read_bytes()[:8] == PNG_MAGIC, name
    assert (tmp_path / "ab_table.md").read_text().startswith("| Group | Metric |")
    runs = json.loads((tmp_path / "ab_runs.json").read_text())["runs"]
    assert [(r["label"], r["config"]) for r in runs] == [
        ("A1", "legacy"),
        ("B1", "per-group"),
        ("A2", "legacy"),
    ]
    assert runs[1]["command"].endswith("--json --pd-policy per-group")
    assert sorted(p.name for p in (tmp_path / "results").iterdir())[0] == "A1-c1_output1.json"
    # per-request arrays and the engines' steps only with --save-detailed
    plain = json.loads((tmp_path / "results" / "A1-c1_output1.json").read_text())
    assert "itls" not in plain and "engine_steps" not in plain

    table = json.loads((tmp_path / "ab_table.json").read_text())
    rows = {(r["group"], r["metric"]): r for r in table["rows"]}
    assert table["baseline"] == "legacy"
    # the stub publishes received KV only under per-group: D local hits appear in B only.
    # c1/output1: warmup = request 0 caches 5 blocks, then 3 requests x 64 local tokens
    local = rows[("c1/output1", "decode_local_hit_tokens")]
    assert local["values"] == {"A1": 0.0, "B1": 192.0, "A2": 0.0}
    assert local["spread_pct"] == 0.0
    external = rows[("c1/output1", "decode_external_hit_tokens")]
    assert external["values"]["A1"] == external["values"]["A2"] == 192.0
    assert external["change_pct"]["per-group"] == -100.0
    serial = rows[("probe/serial", "local_hit_tokens")]
    assert serial["values"] == {"A1": 0.0, "B1": 128.0, "A2": 0.0}
    completed = rows[("c2/output4", "completed")]
    assert completed["values"] == {"A1": 4.0, "B1": 4.0, "A2": 4.0}
    ttft = rows[("c1/output1", "mean_ttft_ms")]
    a1, a2 = ttft["values"]["A1"], ttft["values"]["A2"]
    assert ttft["spread_pct"] == pytest.approx(abs(a1 - a2) / ((a1 + a2) / 2) * 100)


def test_interleaved_runs_share_the_same_minutes_and_give_the_same_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert ab(
        tmp_path, "--interleave", "--probe", "--probe-prefix-len", "64", "--settle", "0",
        "--save-detailed",
    ) == 0
    out = capsys.readouterr().out
    # every cluster is up before the first group, and stopped after the last
    assert out.index("[3/3] A2: cluster ready") < out.index("A1 c1/output1: 3/3 ok")
    assert out.index("A2 c2/output4: 4/4 ok") < out.index("A1: cluster stopped")
    runs = json.loads((tmp_path / "ab_runs.json").read_text())["runs"]
    assert [(r["label"], r["config"], r["interleaved"]) for r in runs] == [
        ("A1", "legacy", True), ("B1", "per-group", True), ("A2", "legacy", True)
    ]
    rows = {(r["group"], r["metric"]): r for r in json.loads(
        (tmp_path / "ab_table.json").read_text())["rows"]}
    # each run's own counters, as in the sequential A/B/A (same warmup, same requests)
    local = rows[("c1/output1", "decode_local_hit_tokens")]
    assert local["values"] == {"A1": 0.0, "B1": 192.0, "A2": 0.0}
    assert rows[("probe/serial", "local_hit_tokens")]["values"]["B1"] == 128.0
    assert rows[("c2/output4", "completed")]["values"] == {"A1": 4.0, "B1": 4.0, "A2": 4.0}
    assert rows[("c2/output4", "differing_outputs")]["values"] == {"A1": 0, "B1": 0, "A2": 0}
    result = json.loads((tmp_path / "results" / "B1-c2_output4.json").read_text())
    assert result["completed"] == 4 and result["total_output_tokens"] == 16
    # --save-detailed: each run's requests, in request order, with their own token gaps;
    # the c2 group went in two waves of two, and every run's first wave started before
    # any run's second one (the runs shared the same minutes)
    detailed = [
        json.loads((tmp_path / "results" / f"{label}-c2_output4.json").read_text())
        for label in ("A1", "B1", "A2")
    ]
    assert all(len(d["itls"]) == len(d["start_times"]) == 4 for d in detailed)
    assert all(len(gaps) == 3 for d in detailed for gaps in d["itls"])
    first_waves = [t for d in detailed for t in d["start_times"][:2]]
    second_waves = [t for d in detailed for t in d["start_times"][2:]]
    assert max(first_waves) < min(second_waves)
    # ... and each engine's steps since the run's first measured request (the stub logs a
    # step per token: 4 requests x 4 tokens, the warmup's left out), on the same clock
    for d in detailed:
        ((_url, steps),) = d["engine_steps"]["decode"].items()
        assert [w["kind"] for s in steps for w in s["work"]].count("prefill") == 4
        assert len(steps) == 16 and min(s["start"] for s in steps) >= min(d["start_times"])
    # one front end per run is not supported interleaved: refused before anything starts
    assert ab(tmp_path / "front", "--interleave", "--front-cmd", "x --port {port}") == 2
    assert "--interleave does not take --front-cmd" in capsys.readouterr().err


def test_a_failing_up_command_stops_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(
        [
            "bench",
            "ab",
            "--configs",
            "a=--fail-start",
            "b=",
            "--up-cmd",
            STUB_UP,
            "--groups",
            "c1/output1:1",
            "--output-dir",
            str(tmp_path),
            "--disable-tqdm",
        ]
    )
    assert rc == 1
    out = capsys.readouterr().out
    assert "run A1 (a) failed" in out and "status 3" in out
    assert "B1" not in out.split("failed")[-1]


def test_bad_flags_exit_2_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(
            [
                "bench",
                "ab",
                "--configs",
                "a=",
                "b=",
                "--groups",
                "c1/output1",
                "--output-dir",
                str(tmp_path / "x"),
            ]
        )
        == 2
    )
    assert "--groups" in capsys.readouterr().err
    assert (
        main(
            [
                "bench",
                "ab",
                "--configs",
                "a=",
                "b=",
                "--num-prefixes",
                "5",
                "--groups",
                "c1/output1:2",
                "--output-dir",
                str(tmp_path / "x"),
            ]
        )
        == 2
    )
    assert "--num-prefixes" in capsys.readouterr().err
    assert (
        main(
            [
                "bench",
                "ab",
                "--configs",
                "a=",
                "b=",
                "--up-cmd",
                "relaykv 'up",
                "--output-dir",
                str(tmp_path / "x"),
            ]
        )
        == 2
    )
    assert "--up-cmd" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


STUB_FRONT = shlex.join([sys.executable, str(Path(__file__).parent.parent / "stub_front.py")])


def test_a_front_end_router_carries_the_workload_and_counters_stay_the_same(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Behind another router (no /cluster) the engines' counters are those without it."""
    front = f"{STUB_FRONT} --prefill {{prefill}} --decode {{decode}} --port {{port}}"
    common = ("--probe", "--probe-prefix-len", "64", "--settle", "0", "--order", "A/B")
    assert ab(tmp_path / "direct", *common) == 0
    assert ab(tmp_path / "front", *common, "--front-cmd", front) == 0
    out = capsys.readouterr().out
    assert "A1: front end ready at http://127.0.0.1:" in out
    tables = [
        json.loads((tmp_path / d / "ab_table.json").read_text())["rows"]
        for d in ("direct", "front")
    ]
    counters = [
        {(r["group"], r["metric"]): r["values"] for r in rows if "hit" in r["metric"]}
        for rows in tables
    ]
    assert counters[0] == counters[1] and counters[0][("probe/serial", "local_hit_tokens")]
    front_log = (tmp_path / "front" / "A1-front.log").read_text()
    assert "POST /v1/completions" in front_log
    run = json.loads((tmp_path / "front" / "ab_runs.json").read_text())["runs"][0]
    assert run["front"].endswith("--port " + run["front"].split()[-1])
    assert "--decode http://127.0.0.1:" in run["front"]


@pytest.mark.parametrize(
    ("template", "message"),
    [("vllm-router --decode {decode}", "{port}"), ("x {decode} --port {port}", "follow a flag")],
)
def test_bad_front_templates_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], template: str, message: str
) -> None:
    assert ab(tmp_path, "--front-cmd", template) == 2
    assert message in capsys.readouterr().err
