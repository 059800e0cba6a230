"""`relaykv serve` flags: a bad value is one line naming the flag, exit status 2."""

from __future__ import annotations

import pytest

from relaykv.cli import main


def fails(capsys: pytest.CaptureFixture[str], *argv: str, loads: bool = False) -> str:
    """The error line; before the model loads it is all of stderr, after it the last line
    (the load's progress bar comes first)."""
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", *argv])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert loads or len(lines) == 1, lines
    assert lines[-1].startswith("relaykv serve: error: argument --"), lines[-1]
    return lines[-1]


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--kv-cache-memory", "12XB"], "--kv-cache-memory"),
        (["--kv-cache-memory", "0"], "--kv-cache-memory"),
        (["--kv-cache-memory", "1GiB", "--num-blocks", "10"], "--num-blocks"),
        (["--port", "70000"], "--port"),
        (["--block-size", "0"], "--block-size"),
        (["--max-num-seqs", "0"], "--max-num-seqs"),
        (["--max-model-len", "1"], "--max-model-len"),
        (["--num-blocks", "1"], "--num-blocks"),
        (["--speculative-tokens", "-1"], "--speculative-tokens"),
        (["--draft-model", "random"], "--draft-model"),
        (["--eagle-reuse", "successor"], "--eagle-reuse"),
        (["--role", "decode", "--pd-policy", "exact", "--eagle-reuse", "recompute"],
         "--eagle-reuse"),
        (["--model", "x.gguf", "--speculative-tokens", "2"], "--speculative-tokens"),
        (["--drain-timeout", "-1"], "--drain-timeout"),
        (["--dtype", "int4"], "--dtype"),
        (["--served-model-name", " "], "--served-model-name"),
        (["--role", "router"], "--role"),
        (["--kv-load-failure", "retry"], "--kv-load-failure"),
        (["--kv-lease-seconds", "0"], "--kv-lease-seconds"),
        (["--torch-threads", "0"], "--torch-threads"),
        (["--torch-threads", "two"], "--torch-threads"),
        (["--role", "decode", "--kv-transfer-timeout", "0"], "--kv-transfer-timeout"),
        (["--role", "prefill", "--kv-transfer-port", "70000"], "--kv-transfer-port"),
    ],
)
def test_flags_checked_before_loading(capsys, argv: list[str], flag: str) -> None:
    assert flag in fails(capsys, *argv)


def test_flags_checked_against_the_model(capsys) -> None:
    """These need the model (tiny-hybrid loads in about a second)."""
    assert "--model" in fails(capsys, "--model", "no-such-model", loads=True)
    err = fails(capsys, "--num-blocks", "3", loads=True)
    assert "--num-blocks" in err and "cannot hold one request" in err
    err = fails(capsys, "--kv-cache-memory", "1MiB", loads=True)
    assert "--kv-cache-memory" in err and "raise the pool" in err
    assert "--max-model-len" in fails(capsys, "--max-model-len", "100000", loads=True)
    assert "--retention" in fails(capsys, "--retention", "interval:10", loads=True)
    assert "--draft-model" in fails(
        capsys, "--speculative-tokens", "2", "--draft-model", "/no/such/draft", loads=True
    )


def test_kv_events_off_the_host_need_the_cluster_secret(capsys, monkeypatch, tmp_path) -> None:
    """An event endpoint another host can reach is CURVE with keys derived from the cluster
    secret (docs/kv-events.md): without a usable secret the engine refuses to start."""
    monkeypatch.delenv("RELAYKV_KV_SECRET_FILE", raising=False)
    config = '{"enable_kv_cache_events": true, "endpoint": "tcp://0.0.0.0:5557"}'
    err = fails(capsys, "--kv-events-config", config)
    assert "--kv-events-config" in err and "--kv-secret-file" in err
    err = fails(capsys, "--kv-events-config", config, "--kv-secret-file", str(tmp_path / "none"))
    assert err.startswith("relaykv serve: error: argument --kv-secret-file")
