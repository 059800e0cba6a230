"""The fixed-engine probe against a stub router + decode engine (hand-computed counters).

Stub engine (see stub_cluster): 16-token blocks, a prompt of 64 + 16 = 80 tokens has 64
reusable tokens; `publish=True` caches the prompt's blocks, `publish=False` never does.
"""

from __future__ import annotations

import json

import pytest

from relaykv.bench.probe.run import probe_prompts
from relaykv.cli import main
from tests.bench.stub_cluster import BYTES_PER_TOKEN, EngineState, ServerThread


def probe(url: str, *extra: str) -> int:
    return main(
        [
            "probe",
            "--url",
            url,
            "--prefix-len",
            "64",
            "--suffix-len",
            "16",
            "--seed",
            "5",
            "--settle",
            "0",
            *extra,
        ]
    )


def phase(name: str, local: int, external: int, ok: int) -> dict:
    return {
        "name": name,
        "local_hit_tokens": local,
        "external_hit_tokens": external,
        "kv_bytes_received": external * BYTES_PER_TOKEN,
        "requests_ok": ok,
    }


def test_json_output_when_received_kv_is_published(capsys: pytest.CaptureFixture[str]) -> None:
    with ServerThread(EngineState(publish=True)) as srv:
        assert probe(srv.url, "--json") == 0
        sent = [b["prompt"] for b in srv.state.received]
    assert json.loads(capsys.readouterr().out) == {
        "phases": [
            phase("first_load", 0, 64, 1),  # x+a: nothing local, 64 tokens loaded
            phase("serial", 128, 0, 2),  # x+a and x+b both reuse x locally
            phase("overlap", 128, 0, 2),
        ]
    }
    xa, xb = probe_prompts(64, 16, 1000, 5)  # vocab from /v1/models
    assert sent[:3] == [xa, xa, xb]  # first load, then serial
    assert sorted(sent[3:]) == sorted([xa, xb])  # overlap: both, in either arrival order
    assert xa[:64] == xb[:64] and xa[64:] != xb[64:]


def test_json_output_when_it_is_not(capsys: pytest.CaptureFixture[str]) -> None:
    with ServerThread(EngineState(publish=False)) as srv:
        assert probe(srv.url, "--json") == 0
    assert json.loads(capsys.readouterr().out)["phases"] == [
        phase("first_load", 0, 64, 1),
        phase("serial", 0, 128, 2),
        phase("overlap", 0, 128, 2),
    ]


def test_table_output_and_counters_summed_over_decode_engines(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The router sends every request to engine 1; engine 2 has its own (idle) counters."""
    with ServerThread(EngineState()) as idle, ServerThread(EngineState()) as busy:
        idle.state.admit(list(range(33)))  # non-zero totals that must not leak into deltas
        busy._cluster = lambda: {
            "router": busy.url,
            "prefill": [],  # type: ignore[method-assign]
            "decode": [busy.url, idle.url],
        }
        assert probe(busy.url) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[1].split() == [
        "phase",
        "requests_ok",
        "local_hit_tokens",
        "external_hit_tokens",
        "kv_bytes_received",
    ]
    assert lines[2].split() == ["first_load", "1/1", "0", "64", str(64 * BYTES_PER_TOKEN)]
    assert lines[3].split() == ["serial", "2/2", "128", "0", "0"]


def test_failed_requests_are_reported_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    with ServerThread(EngineState(behaviour=lambda n, b: "http_error" if n == 1 else "ok")) as srv:
        assert probe(srv.url, "--json") == 1
    captured = capsys.readouterr()
    phases = json.loads(captured.out)["phases"]
    assert [p["requests_ok"] for p in phases] == [1, 1, 2]
    assert "request failed: serial: HTTP 500" in captured.err


def test_missing_counters_read_as_zero_with_a_warning(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with ServerThread(EngineState()) as srv:
        srv._cluster = lambda: {"router": srv.url, "prefill": [], "decode": []}  # type: ignore[method-assign]
        assert probe(srv.url, "--json") == 0
    captured = capsys.readouterr()
    assert all(p["local_hit_tokens"] == 0 for p in json.loads(captured.out)["phases"])
    assert "no decode engine" in captured.err


def test_bad_flags_and_unreachable_router(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["probe", "--url", "http://127.0.0.1:9", "--suffix-len", "0"]) == 2
    assert "--suffix-len" in capsys.readouterr().err
    assert main(["probe", "--url", "http://127.0.0.1:9", "--seed", "1"]) == 1
    assert "/v1/models" in capsys.readouterr().err


def _no_cluster() -> dict:
    raise RuntimeError("this front end has no /cluster")  # the stub answers 500


def test_engines_named_on_the_command_line_need_no_cluster(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Behind a production router (no /cluster) the decode engines are given with --decode."""
    with ServerThread(EngineState(publish=True), cluster=_no_cluster) as srv:
        assert probe(srv.url, "--json") == 1
        assert "--prefill URL --decode URL" in capsys.readouterr().err
        assert probe(srv.url, "--json", "--prefill", "http://p:1", "--decode", srv.url) == 0
    assert json.loads(capsys.readouterr().out)["phases"] == [
        phase("first_load", 0, 64, 1),
        phase("serial", 128, 0, 2),
        phase("overlap", 128, 0, 2),
    ]


@pytest.mark.parametrize(
    "flags", [["--prefill", "http://p:1"], ["--decode", "d:1"], ["--decode", "ftp://d"]]
)
def test_bad_engine_urls_are_refused(flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert probe("http://127.0.0.1:9", *flags) == 2
    err = capsys.readouterr().err
    assert "--decode" in err
