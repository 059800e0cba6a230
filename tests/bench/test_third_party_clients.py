"""vLLM 0.33's `vllm bench serve` and SGLang's `bench_serving` against real relaykv servers.

They run from a separate virtual environment named by RELAYKV_CLIENT_VENV (built by
`tools/client_venv.sh`, which never touches torch); without it the tests skip with that
command as the reason. Each run uses the tokenizer `relaykv tokenizer export` writes and
checks what a user of these clients relies on: every request completes, prompts and outputs
have the asked lengths, and a chat stream gives one inter-token gap per token after the
first (the client's ITL count is output tokens - 1). Commands and results:
docs/benchmarking.md "Third-party clients".
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from relaykv.cli import main
from tests.serve.harness import free_socket
from tests.waiting import wait_server_healthy

VENV = os.environ.get("RELAYKV_CLIENT_VENV", "")
TOOLS = Path(__file__).resolve().parents[2] / "tools"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (VENV and (Path(VENV) / "bin" / "vllm").is_file()),
        reason="needs vLLM/SGLang clients: tools/client_venv.sh /tmp/clientvenv && "
        "RELAYKV_CLIENT_VENV=/tmp/clientvenv pytest tests/bench/test_third_party_clients.py",
    ),
]
N, IN, OUT = 8, 128, 16


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("tokenizer")
    assert main(["tokenizer", "export", "--model", "tiny-hybrid", "--out", str(out)]) == 0
    return str(out)


@pytest.fixture(scope="module")
def serve_url() -> Iterator[str]:
    sock = free_socket()
    port = sock.getsockname()[1]
    sock.close()
    proc = subprocess.Popen(
        [sys.executable, "-m", "relaykv", "serve", "--model", "tiny-hybrid", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_server_healthy(url, proc, timeout=120)
        yield url
    finally:
        _stop(proc)


@pytest.fixture(scope="module")
def up_url(tmp_path_factory) -> Iterator[str]:
    logs = tmp_path_factory.mktemp("up")
    proc = subprocess.Popen(
        [sys.executable, "-m", "relaykv", "up", "--json", "--num-blocks", "600",
         "--kv-transport", "tcp", "--log-dir", str(logs)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        yield json.loads(proc.stdout.readline())["router"]
    finally:
        _stop(proc)


def _vllm(url: str, tok: str, out: Path, *args: str) -> dict:
    cmd = [f"{VENV}/bin/vllm", "bench", "serve", "--base-url", url, "--model", "tiny-hybrid",
           "--tokenizer", tok, "--num-prompts", str(N), "--max-concurrency", "4",
           "--ignore-eos", "--temperature", "0", "--disable-tqdm", "--save-result",
           "--save-detailed", "--result-dir", str(out), "--result-filename", "r.json", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads((out / "r.json").read_text())


RANDOM = ("--dataset-name", "random", "--random-input-len", str(IN),
          "--random-output-len", str(OUT))
CHAT = ("--backend", "openai-chat", "--endpoint", "/v1/chat/completions")


def _complete_with_gaps(result: dict) -> None:
    assert (result["completed"], result["failed"]) == (N, 0)
    assert result["output_lens"] == [OUT] * N
    # One ITL per token after the first: no token step was merged or read as metadata.
    assert [len(gaps) for gaps in result["itls"]] == [OUT - 1] * N


def test_vllm_random_completions_have_exact_lengths(serve_url, tokenizer_dir, tmp_path) -> None:
    result = _vllm(serve_url, tokenizer_dir, tmp_path, "--backend", "vllm", *RANDOM)
    _complete_with_gaps(result)
    # vLLM asks for IN - 1 ids of text (it leaves room for BOS); the server counts IN.
    assert result["input_lens"] == [IN] * N


def test_vllm_chat_random_streams_lose_no_gap(serve_url, tokenizer_dir, tmp_path) -> None:
    result = _vllm(serve_url, tokenizer_dir, tmp_path, *CHAT, *RANDOM)
    _complete_with_gaps(result)
    # The chat template adds the same text to every prompt: equal prompt lengths.
    assert len(set(result["input_lens"])) == 1 and result["input_lens"][0] > IN


def test_vllm_prefix_repetition(serve_url, tokenizer_dir, tmp_path) -> None:
    result = _vllm(
        serve_url, tokenizer_dir, tmp_path, "--backend", "vllm",
        "--dataset-name", "prefix_repetition", "--prefix-repetition-prefix-len", "96",
        "--prefix-repetition-suffix-len", "32", "--prefix-repetition-num-prefixes", "2",
        "--prefix-repetition-output-len", str(OUT),
    )
    _complete_with_gaps(result)
    # vLLM draws these ids from the whole vocabulary (special ids and lone bytes >= 0x80
    # included, which are not text in a byte vocabulary) and warns that lengths drift.
    assert all(n >= 96 + 32 for n in result["input_lens"])


def test_vllm_chat_through_a_relaykv_up_cluster(up_url, tokenizer_dir, tmp_path) -> None:
    _complete_with_gaps(_vllm(up_url, tokenizer_dir, tmp_path, *CHAT, *RANDOM))


def test_sglang_generated_shared_prefix(serve_url, tokenizer_dir, tmp_path) -> None:
    out = tmp_path / "sgl.jsonl"
    cmd = [f"{VENV}/bin/python", str(TOOLS / "sglang_bench_serving.py"), "--backend", "vllm",
           "--base-url", serve_url, "--model", "tiny-hybrid", "--tokenizer", tokenizer_dir,
           "--dataset-name", "generated-shared-prefix", "--gsp-num-groups", "2",
           "--gsp-prompts-per-group", "4", "--gsp-system-prompt-len", "96",
           "--gsp-question-len", "32", "--gsp-output-len", str(OUT),
           "--max-concurrency", "4", "--output-details", "--disable-tqdm",
           "--output-file", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(out.read_text().splitlines()[-1])
    assert result["completed"] == N and not any(result["errors"])
    assert result["output_lens"] == [OUT] * N  # SGLang reads usage.completion_tokens
    # SGLang samples text prompts from get_vocab() (special ids and lone high bytes
    # included) and decodes them, so a byte vocabulary gives longer prompts; its
    # `--tokenize-prompt` (exact ids) works only with `--backend sglang`.
    assert all(n >= 96 + 32 for n in result["input_lens"])
    # SGLang skips chunks with empty text (a byte step that does not finish a UTF-8
    # character), so it records at most one gap per token after the first.
    assert all(len(gaps) <= OUT - 1 for gaps in result["itls"])
