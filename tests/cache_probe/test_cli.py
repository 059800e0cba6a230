"""`relaykv cache-probe`: JSON shape, table, and one-line errors naming the flag."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from relaykv.cli import main


def run(capsys, *args: str) -> str:
    assert main(["cache-probe", *args]) == 0
    return capsys.readouterr().out


def test_json_has_exactly_the_documented_keys(capsys) -> None:
    out = json.loads(
        run(
            capsys,
            "--groups",
            "full:16,sliding:16:128",
            "--draft",
            "1",
            "--pd-policy",
            "exact",
            "--json",
        )
    )
    assert set(out) == {"prompt_len", "alignment", "pd_policy", "colocated", "decode"}
    assert out["prompt_len"] == 1000 and out["alignment"] == 16 and out["pd_policy"] == "exact"
    assert out["colocated"] == {"resend": 976, "extension": 976, "sibling": 0}
    assert set(out["decode"]) == {"first_load", "resend", "extension", "sibling"}
    for case in out["decode"].values():
        assert set(case) == {"local_tokens", "received_blocks"}
        assert len(case["received_blocks"]) == 2
    assert out["decode"]["resend"]["local_tokens"] == 976


def test_all_policies_give_a_list_and_a_table(capsys) -> None:
    rows = json.loads(run(capsys, "--preset", "gemma3-like", "--prompt-len", "2000", "--json"))
    assert [r["pd_policy"] for r in rows] == ["legacy", "replay-slack", "exact", "per-group"]
    table = run(capsys, "--preset", "dsv4-like", "--prompt-len", "3000")
    assert "per-group" in table and "colocated engine hits" in table


def test_tier_blocks_probe_a_flushed_engine_with_a_tier(capsys) -> None:
    """The device pool let everything go: the tier alone serves the follow-ups; a tier too
    small for the whole prompt keeps a shorter prefix, never an unusable mix."""
    base = ["--groups", "full:16,sliding:16:128", "--draft", "0", "--pd-policy", "exact"]
    out = json.loads(run(capsys, *base, "--tier-blocks", "1000", "--json"))
    tier = out["tier"]
    assert tier["tier_blocks"] == 1000
    assert tier["resend"] == {"hit": 976, "from_tier": 976}  # what the device pool would hit
    assert tier["sibling"]["hit"] == 960  # the tier's checkpoints: the device's miss
    small = json.loads(run(capsys, *base, "--tier-blocks", "40", "--json"))["tier"]
    assert (
        0 < small["resend"]["hit"] < 976 and small["resend"]["from_tier"] == small["resend"]["hit"]
    )
    none = json.loads(run(capsys, *base, "--tier-blocks", "0", "--json"))["tier"]
    assert none["resend"] == {"hit": 0, "from_tier": 0}
    assert "with a KV tier of 1000 blocks" in run(capsys, *base, "--tier-blocks", "1000")


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--prompt-len", "1"], "--prompt-len"),
        (["--prompt-len", "x"], "--prompt-len"),
        (["--groups", "full:16,sliding:16"], "--groups"),
        (["--draft", "7"], "--draft"),
        (["--retention", "interval:5"], "--retention"),
        (["--pd-policy", "magic"], "--pd-policy"),
        (["--sibling-diverge", "0"], "--sibling-diverge"),
        (["--groups", "full:16", "--preset", "gemma3-like"], "--preset"),
        (["--tier-blocks", "-1"], "--tier-blocks"),
    ],
)
def test_bad_flags_fail_with_one_line_naming_the_flag(args: list[str], flag: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "relaykv", "cache-probe", *args], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0], proc.stderr


def test_kvcache_does_not_import_torch() -> None:
    code = "import sys, relaykv.kvcache, relaykv.cli; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
