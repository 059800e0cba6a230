"""`relaykv bench serve` end to end against a loopback stub server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from relaykv.cli import main
from tests.bench.stub_cluster import EngineState, ServerThread

PREFIX_REP = [
    "--dataset-name",
    "prefix_repetition",
    "--prefix-repetition-num-prefixes",
    "1",
    "--prefix-repetition-prefix-len",
    "64",
    "--prefix-repetition-suffix-len",
    "16",
    "--prefix-repetition-output-len",
    "4",
    "--num-prompts",
    "8",
    "--disable-tqdm",
]


@pytest.fixture
def server() -> Iterator[ServerThread]:
    with ServerThread(EngineState()) as srv:
        yield srv


def bench(srv: ServerThread, *extra: str) -> int:
    return main(["bench", "serve", "--base-url", srv.url, *extra])


def test_prefix_repetition_run_prints_the_block_and_saves_vllm_keys(
    server: ServerThread, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = bench(
        server,
        *PREFIX_REP,
        "--num-warmups",
        "1",
        "--max-concurrency",
        "2",
        "--temperature",
        "0",
        "--ignore-eos",
        "--goodput",
        "ttft:10000",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,99",
        "--save-result",
        "--result-dir",
        str(tmp_path),
        "--result-filename",
        "r.json",
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "============ Serving Benchmark Result ============" in out
    assert f"{'Successful requests:':<40} {8:<10}" in out
    assert f"{'Failed requests:':<40} {0:<10}" in out
    assert "Model not specified, using the server's first model: stub-model" in out
    # warmup = request 0 (80 tokens, caches 5 blocks); every measured request reuses the
    # 64-token prefix (4 blocks): 8 * 64 cached of 8 * 80 prompt tokens
    assert f"{'Total cached tokens:':<40} {512:<10}" in out
    assert f"{'Cache hit rate (%):':<40} {80.0:<10.2f}" in out
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["completed"] == 8 and result["failed"] == 0
    assert result["total_input_tokens"] == 640 and result["total_output_tokens"] == 32
    assert result["model_id"] == "stub-model" and result["max_concurrency"] == 2
    assert result["request_goodput"] == pytest.approx(result["request_throughput"])
    for key in (
        "mean_ttft_ms",
        "median_tpot_ms",
        "std_itl_ms",
        "p50_e2el_ms",
        "p99_ttft_ms",
        "max_output_tokens_per_s",
        "max_concurrent_requests",
        "total_token_throughput",
    ):
        assert key in result, key
    assert result["cache_report"] == {
        "total_prompt_tokens": 640,
        "total_cached_tokens": 512,
        "cache_hit_rate_pct": 80.0,
        "requests_reporting_cached": 8,
    }
    assert result["peak_concurrent_requests"] <= 2  # --max-concurrency 2, exactly
    assert result["max_concurrent_requests"] >= result["peak_concurrent_requests"]  # vLLM's
    assert result["rtfx"] == 0.0
    body = server.state.received[-1]
    assert isinstance(body["prompt"], list) and len(body["prompt"]) == 80
    assert all(0 <= t < 1000 for t in body["prompt"])  # vocab_size from /v1/models
    assert body["ignore_eos"] is True and body["temperature"] == 0
    assert body["stream_options"] == {"include_usage": True}


def test_errors_and_dropped_streams_are_counted_and_the_run_completes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    modes = {1: "http_error", 3: "drop", 4: "bad_chunk", 6: "error_event"}
    with ServerThread(EngineState(behaviour=lambda n, body: modes.get(n, "ok"))) as srv:
        rc = bench(
            srv,
            *PREFIX_REP,
            "--save-result",
            "--save-detailed",
            "--result-filename",
            str(tmp_path / "r.json"),
        )
    out = capsys.readouterr().out
    assert rc == 0
    assert "Failed requests during benchmark run detected" in out
    result = json.loads((tmp_path / "r.json").read_text())
    assert (result["completed"], result["failed"]) == (4, 4)
    errors = [e for e in result["errors"] if e]
    assert len(errors) == 4
    assert any("HTTP 500" in e for e in errors) and any("not JSON" in e for e in errors)
    assert result["output_lens"].count(0) == 4


def test_generated_shared_prefix_ignores_num_prompts(
    server: ServerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = bench(
        server,
        "--dataset-name",
        "generated-shared-prefix",
        "--gsp-num-groups",
        "2",
        "--gsp-prompts-per-group",
        "3",
        "--gsp-system-prompt-len",
        "32",
        "--gsp-question-len",
        "8",
        "--gsp-output-len",
        "2",
        "--num-prompts",
        "100",
        "--model",
        "stub-model",
        "--disable-tqdm",
    )
    assert rc == 0
    assert f"{'Successful requests:':<40} {6:<10}" in capsys.readouterr().out
    assert {len(b["prompt"]) for b in server.state.received} == {40}


def test_random_dataset_forces_ignore_eos(server: ServerThread) -> None:
    assert (
        bench(
            server,
            "--random-input-len",
            "20",
            "--random-output-len",
            "3",
            "--num-prompts",
            "3",
            "--disable-tqdm",
        )
        == 0
    )
    assert all(b["ignore_eos"] and b["max_tokens"] == 3 for b in server.state.received)
    assert {len(b["prompt"]) for b in server.state.received} == {20}


def test_chat_with_a_tokenizer_sends_text(server: ServerThread, tmp_path: Path) -> None:
    vocab = {"[UNK]": 0, **{f"w{i}": i + 1 for i in range(50)}}
    tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    rc = bench(
        server,
        "--backend",
        "openai-chat",
        "--tokenizer",
        str(tmp_path),
        "--random-input-len",
        "12",
        "--random-output-len",
        "2",
        "--num-prompts",
        "2",
        "--disable-tqdm",
    )
    assert rc == 0
    body = server.state.received[-1]
    words = body["messages"][0]["content"].split()
    assert len(words) == 12 and all(w in vocab for w in words)


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--goodput", "ttfx:5"], "--goodput"),
        (["--percentile-metrics", "ttft,nope"], "--percentile-metrics"),
        (["--max-concurrency", "0"], "--max-concurrency"),
        (["--request-rate", "0"], "--request-rate"),
        (["--backend", "openai-chat"], "--tokenizer"),
        ([*PREFIX_REP, "--prefix-repetition-num-prefixes", "20"], "--num-prompts"),
        (["--random-range-ratio", "1.5", "--num-prompts", "2"], "--random-range-ratio"),
        (["--tokenizer", "/nonexistent"], "--tokenizer"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(
    server: ServerThread, argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bench(server, *argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("relaykv bench serve: error:") and flag in err
    assert server.state.received == []


def test_api_key_flag_and_environment(
    server: ServerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "from-env")
    assert (
        bench(server, *PREFIX_REP, "--num-prompts", "1", "--prefix-repetition-num-prefixes", "1")
        == 0
    )
    assert bench(server, *PREFIX_REP, "--num-prompts", "1", "--api-key", "from-flag") == 0
    assert server.state.auth == ["Bearer from-env", "Bearer from-flag"]


def test_unreachable_server_without_model_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["bench", "serve", "--base-url", "http://127.0.0.1:9", "--num-prompts", "1"])
    assert rc == 1
    assert "/v1/models" in capsys.readouterr().err


def test_all_requests_failing_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    with ServerThread(EngineState(behaviour=lambda n, body: "http_error")) as srv:
        assert bench(srv, *PREFIX_REP) == 1
    assert f"{'Successful requests:':<40} {0:<10}" in capsys.readouterr().out
