"""Transport names, availability reporting and the shared CLI flags."""

from __future__ import annotations

import argparse

import pytest

from relaykv.transfer.transport import (
    DEFAULT_TRANSPORT,
    TRANSPORT_NAMES,
    add_transport_arguments,
    availability,
    get_transport,
    options_from_args,
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_transport_arguments(p)
    return p


def test_names_and_default() -> None:
    assert TRANSPORT_NAMES == ("shm", "tcp", "nixl", "mooncake")
    assert DEFAULT_TRANSPORT == "shm"
    report = availability()
    assert set(report) == set(TRANSPORT_NAMES)
    assert report["shm"] is None and report["tcp"] is None
    for name, reason in report.items():
        if reason is not None:
            assert "install" in reason, name  # the reason says how to fix it


def test_unknown_transport_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="choose from shm, tcp, nixl, mooncake"):
        get_transport("carrier-pigeon")


def test_flags_round_trip() -> None:
    args = parser().parse_args(
        [
            "--kv-transport",
            "tcp",
            "--kv-transfer-host",
            "10.0.0.5",
            "--kv-transfer-port",
            "7100",
            "--kv-transfer-timeout",
            "3",
        ]
    )
    options = options_from_args(args)
    assert (args.kv_transport, options.host, options.port, options.timeout_s) == (
        "tcp",
        "10.0.0.5",
        7100,
        3.0,
    )
    defaults = options_from_args(parser().parse_args([]))
    assert defaults.host == "127.0.0.1" and defaults.port == 0


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--kv-transfer-port", "70000"], "--kv-transfer-port"),
        (["--kv-transfer-timeout", "0"], "--kv-transfer-timeout"),
    ],
)
def test_bad_flags_name_the_flag(argv: list[str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        options_from_args(parser().parse_args(argv))


def test_unknown_choice_exits_2() -> None:
    with pytest.raises(SystemExit) as info:
        parser().parse_args(["--kv-transport", "udp"])
    assert info.value.code == 2
