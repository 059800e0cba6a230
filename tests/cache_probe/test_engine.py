"""`cache-probe --engine vllm` from relaykv's own venv: it runs the vLLM probe in the vLLM
venv (relaykv/cache_probe/engine.py) and prints the same output as `--engine relaykv`."""

from __future__ import annotations

import argparse
import json

import pytest

from relaykv.cache_probe import cli as probe_cli
from relaykv.cache_probe.engine import forwarded_args, vllm_python
from relaykv.cli import main


def _parse(args: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    probe_cli.add_arguments(parser)
    return parser.parse_args(args)


@pytest.mark.parametrize(
    "args",
    [
        ["--preset", "dsv4-like", "--prompt-len", "3000", "--json"],
        [
            "--groups",
            "full:4,sliding:8:20",
            "--draft",
            "1",
            "--eagle-reuse",
            "successor",
            "--retention",
            "interval:16",
            "--pd-policy",
            "exact",
            "--extension-len",
            "7",
            "--sibling-diverge",
            "5",
            "--seed",
            "3",
        ],
    ],
)
def test_the_vllm_probe_gets_the_same_arguments(args: list[str]) -> None:
    ns = _parse(args)
    again = _parse(forwarded_args(ns))
    assert vars(again) == vars(ns)


def test_without_the_vllm_venv_the_error_names_the_flag_and_the_install(
    monkeypatch, capsys
) -> None:
    monkeypatch.setenv("RELAYKV_VLLM_PYTHON", "/nonexistent/python")
    with pytest.raises(SystemExit) as exit_info:
        main(["cache-probe", "--engine", "vllm", "--prompt-len", "100"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--engine" in err and "tools/vllm_venv.sh" in err


@pytest.mark.skipif(
    vllm_python() is None,
    reason="vLLM 0.33.0 is not installed: tools/vllm_venv.sh (makes .venv-vllm)",
)
def test_the_vllm_engine_prints_what_relaykv_prints(capsys) -> None:
    args = ["cache-probe", "--preset", "gpt-oss-like", "--pd-policy", "per-group", "--json"]
    assert main([*args, "--engine", "vllm"]) == 0
    through_vllm = json.loads(capsys.readouterr().out)
    assert main(args) == 0
    assert through_vllm == json.loads(capsys.readouterr().out)
    assert through_vllm["decode"]["sibling"]["local_tokens"] == 960
