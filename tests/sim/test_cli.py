"""`relaykv sim`: the JSON interface scripts parse, and flag errors that name the flag."""

from __future__ import annotations

import json

import pytest

from relaykv.cli import main
from relaykv.sim.results import KEYS

FLAGS = [
    "sim",
    "--model",
    "gpt-oss-20b",
    "--hardware",
    "h20",
    "--prefill-tp",
    "2",
    "--decode-tp",
    "2",
    "--speculative-tokens",
    "3",
    "--dataset-name",
    "prefix_repetition",
    "--prefix-repetition-prefix-len",
    "1000",
    "--prefix-repetition-suffix-len",
    "16",
    "--prefix-repetition-num-prefixes",
    "1",
    "--prefix-repetition-output-len",
    "8",
    "--num-prompts",
    "6",
    "--max-concurrency",
    "2",
    "--num-warmups",
    "1",
]


def test_json_last_line_one_object_per_policy(capsys, tmp_path) -> None:
    assert main([*FLAGS, "--json", "--result-dir", str(tmp_path)]) == 0
    results = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [r["pd_policy"] for r in results] == ["legacy", "replay-slack", "exact", "per-group"]
    for r in results:
        assert set(KEYS) <= set(r)
        assert r["completed"] == 6 and r["failed"] == 0
    assert results[0]["d_local_hit_tokens"] == 0 and results[3]["d_local_hit_tokens"] > 0
    assert len(list(tmp_path.glob("*.png"))) == 1 and len(list(tmp_path.glob("*.json"))) == 1


def test_text_output_has_blocks_and_a_table(capsys) -> None:
    assert main([*FLAGS, "--pd-policy", "per-group"]) == 0
    out = capsys.readouterr().out
    assert "Simulated result: --pd-policy per-group" in out and "Mean TTFT (ms):" in out


def test_bad_flags_name_the_flag(capsys) -> None:
    cases = [
        (["--hardware", "nope"], "unknown hardware"),
        (["--link", "fast"], "unknown link"),
        (["--acceptance-rate", "2"], "--acceptance-rate"),
        (["--prefix-repetition-num-prefixes", "0"], "--prefix-repetition-num-prefixes"),
        (["--pd-policy", "magic"], "--pd-policy"),
    ]
    for extra, message in cases:
        with pytest.raises(SystemExit) as exit_info:
            main([*FLAGS, *extra])
        assert exit_info.value.code == 2, extra
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, (extra, err)
