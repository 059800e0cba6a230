"""Flag parsing and resolution for `bench serve` (errors name the flag)."""

from __future__ import annotations

import argparse

import pytest

from relaykv.bench.serve.args import add_arguments
from relaykv.bench.serve.options import (
    UsageError,
    base_url,
    choose_prompt_format,
    endpoint,
    is_chat,
    parse_goodput,
    parse_metadata,
    parse_metric_percentiles,
    parse_percentile_metrics,
)
from relaykv.common.workloads.flags import dataset_seed


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_compat_defaults() -> None:
    a = parse()
    assert (a.dataset_name, a.num_prompts, a.request_rate, a.metric_percentiles) == (
        "random",
        1000,
        float("inf"),
        "99",
    )
    assert (a.random_input_len, a.random_output_len, a.random_range_ratio, a.random_prefix_len) == (
        1024,
        128,
        0.0,
        0,
    )
    assert (
        a.prefix_repetition_prefix_len,
        a.prefix_repetition_suffix_len,
        a.prefix_repetition_num_prefixes,
        a.prefix_repetition_output_len,
    ) == (256, 256, 10, 128)
    gsp = (
        a.gsp_num_groups,
        a.gsp_prompts_per_group,
        a.gsp_system_prompt_len,
        a.gsp_question_len,
        a.gsp_output_len,
        a.gsp_range_ratio,
    )
    assert gsp == (64, 16, 2048, 128, 256, 1.0)
    assert dataset_seed(a) == 0
    assert dataset_seed(parse("--dataset-name", "generated-shared-prefix")) == 42
    assert dataset_seed(parse("--dataset-name", "generated-shared-prefix", "--seed", "3")) == 3


def test_percentile_flags() -> None:
    assert parse_percentile_metrics(None) == ["ttft", "tpot", "itl"]
    assert parse_percentile_metrics("e2el,ttft") == ["e2el", "ttft"]
    with pytest.raises(UsageError, match="--percentile-metrics"):
        parse_percentile_metrics("ttft,latency")
    assert parse_metric_percentiles("50,99.9") == [50.0, 99.9]
    for bad in ("x", "101", ""):
        with pytest.raises(UsageError, match="--metric-percentiles"):
            parse_metric_percentiles(bad)


def test_goodput_and_metadata() -> None:
    assert parse_goodput(["ttft:500", "tpot:50", "e2el:2000"]) == {
        "ttft": 500.0,
        "tpot": 50.0,
        "e2el": 2000.0,
    }
    assert parse_goodput(None) == {}
    for bad in (["ttft=5"], ["itl:5"], ["ttft:-1"], ["ttft:abc"]):
        with pytest.raises(UsageError, match="--goodput"):
            parse_goodput(bad)
    assert parse_metadata(["a=1", "b = two"]) == {"a": "1", "b": "two"}
    with pytest.raises(UsageError, match="--metadata"):
        parse_metadata(["novalue"])


def test_urls_and_endpoints() -> None:
    assert base_url(parse("--host", "10.0.0.1", "--port", "9")) == "http://10.0.0.1:9"
    assert base_url(parse("--host", "::1")) == "http://[::1]:8000"
    assert base_url(parse("--base-url", "http://r:1/")) == "http://r:1"
    assert endpoint(parse()) == "/v1/completions"
    assert endpoint(parse("--backend", "openai-chat")) == "/v1/chat/completions"
    assert endpoint(parse("--endpoint", "v1/completions")) == "/v1/completions"
    assert is_chat("/v1/chat/completions") and not is_chat("/v1/completions")


def test_prompt_format_rules() -> None:
    def choose(req: str, chat=False, tok=False, relaykv=False) -> str:
        return choose_prompt_format(req, chat=chat, have_tokenizer=tok, server_is_relaykv=relaykv)

    assert choose("auto") == "ids"
    assert choose("auto", tok=True) == "text"
    assert choose("auto", tok=True, relaykv=True) == "ids"
    assert choose("auto", chat=True, tok=True, relaykv=True) == "text"
    assert choose("ids", tok=True) == "ids"
    with pytest.raises(UsageError, match="--tokenizer"):
        choose("auto", chat=True)
    with pytest.raises(UsageError, match="--tokenizer"):
        choose("text")
    with pytest.raises(UsageError, match="chat"):
        choose("ids", chat=True, tok=True)
