"""`relaykv bench serve` against a real relaykv server on loopback (the app, the engine and
the paging-sensitive reference executor): every request completes, usage and cached tokens
come back, and the result JSON has vLLM's keys."""

from __future__ import annotations

import json

from relaykv.cli import main
from tests.serve.harness import ServerThread, reference_served


def test_bench_serve_against_relaykv(tmp_path, capsys) -> None:
    server = ServerThread(reference_served(), api_key=None)
    try:
        code = main([
            "bench", "serve", "--base-url", server.url, "--dataset-name", "prefix_repetition",
            "--prefix-repetition-prefix-len", "64", "--prefix-repetition-suffix-len", "8",
            "--prefix-repetition-num-prefixes", "2", "--prefix-repetition-output-len", "4",
            "--num-prompts", "12", "--max-concurrency", "4", "--num-warmups", "1",
            "--ignore-eos", "--cache-report", "--disable-tqdm", "--save-result",
            "--result-dir", str(tmp_path), "--result-filename", "run.json",
        ])
        assert code == 0
        printed = capsys.readouterr().out
        assert "============ Serving Benchmark Result ============" in printed
        result = json.loads((tmp_path / "run.json").read_text())
        assert result["completed"] == 12 and result["failed"] == 0
        assert result["total_output_tokens"] == 48
        for key in ("request_throughput", "output_throughput", "mean_ttft_ms", "p99_itl_ms",
                    "max_concurrent_requests"):
            assert key in result
        report = result["cache_report"]
        assert report["total_cached_tokens"] > 0  # the shared prefixes hit the engine's cache
        assert server.idle()
    finally:
        server.stop()
