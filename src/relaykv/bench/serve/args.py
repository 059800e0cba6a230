"""Flags of `relaykv bench serve`: vLLM `bench serve` names and defaults (docs/benchmarking.md)."""

from __future__ import annotations

import argparse

from relaykv.common.workloads.flags import add_arrival_arguments, add_dataset_arguments

BACKENDS: tuple[str, ...] = ("vllm", "openai", "openai-chat", "sglang")
PROMPT_FORMATS: tuple[str, ...] = ("auto", "ids", "text")


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("server")
    group.add_argument(
        "--backend",
        default="openai",
        choices=BACKENDS,
        help="payload family; openai-chat defaults --endpoint to "
        "/v1/chat/completions (default: openai)",
    )
    group.add_argument("--base-url", default=None, help="server base URL (else --host/--port)")
    group.add_argument("--host", default="127.0.0.1")
    group.add_argument("--port", type=int, default=8000)
    group.add_argument(
        "--endpoint",
        default=None,
        help="API path (default /v1/completions; /v1/chat/completions for "
        "openai-chat); a path ending in chat/completions sends messages",
    )
    group.add_argument("--model", default=None, help="model id (default: first of /v1/models)")
    group.add_argument(
        "--served-model-name", default=None, help="model name put in requests (default: --model)"
    )
    group.add_argument("--api-key", default=None, help="bearer token (default: $OPENAI_API_KEY)")
    group.add_argument(
        "--request-timeout",
        type=float,
        default=6 * 60 * 60,
        help="seconds one request may take before it counts as failed",
    )


def add_prompt_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("prompts")
    group.add_argument(
        "--tokenizer",
        default=None,
        help="local tokenizer.json (file or directory): vocabulary for random "
        "ids and id->text decoding for text prompts",
    )
    group.add_argument(
        "--prompt-format",
        default="auto",
        choices=PROMPT_FORMATS,
        help="send prompts as token ids or text; auto = text for chat endpoints "
        "or when --tokenizer is given and the server is not relaykv, else ids",
    )
    group.add_argument(
        "--tokenize-prompt",
        action="store_true",
        help="SGLang's flag: send token ids (same as --prompt-format ids)",
    )
    group.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        help="random ids are drawn from [0, V) (default: the tokenizer's, else "
        "/v1/models vocab_size, else 32000)",
    )


def add_load_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("load and sampling")
    add_arrival_arguments(group)
    group.add_argument("--ignore-eos", action="store_true")
    group.add_argument("--temperature", type=float, default=None)
    group.add_argument("--top-p", type=float, default=None)
    group.add_argument("--top-k", type=int, default=None)
    group.add_argument("--disable-tqdm", action="store_true")


def add_result_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("results")
    group.add_argument(
        "--percentile-metrics",
        default=None,
        help='comma list of ttft,tpot,itl,e2el (default "ttft,tpot,itl")',
    )
    group.add_argument(
        "--metric-percentiles", default="99", help='comma list of percentiles (default "99")'
    )
    group.add_argument(
        "--goodput",
        nargs="+",
        default=None,
        metavar="KEY:MS",
        help="SLOs for goodput, e.g. ttft:500 tpot:50 e2el:2000",
    )
    group.add_argument("--save-result", action="store_true", help="write the result JSON")
    group.add_argument(
        "--save-detailed", action="store_true", help="include per-request arrays in the result JSON"
    )
    group.add_argument("--result-dir", default=None)
    group.add_argument("--result-filename", default=None)
    group.add_argument("--label", default=None, help="result label (default: --backend)")
    group.add_argument(
        "--metadata",
        nargs="*",
        default=None,
        metavar="KEY=VALUE",
        help="extra key=value pairs stored in the result JSON",
    )
    group.add_argument(
        "--cache-report",
        action="store_true",
        help="accepted for SGLang compatibility; the cache report is always on",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_connection_arguments(parser)
    add_prompt_arguments(parser)
    add_dataset_arguments(parser)
    add_load_arguments(parser)
    add_result_arguments(parser)
