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
        (["--conditional-max-running", "-1"], "--conditional-max-running: must be >= 0"),
    ]
    for extra, message in cases:
        with pytest.raises(SystemExit) as exit_info:
            main([*FLAGS, *extra])
        assert exit_info.value.code == 2, extra
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, (extra, err)


def _calibration(path, **conditions) -> str:
    """A calibration file (hand-made fitted figures) measured under `conditions`."""
    base = {"model": "tiny-hybrid", "speculative_tokens": 2, "draft": "shipped",
            "torch_threads": 1, "kv_transport": "shm"}
    content = {"name": "calibrated:tiny-hybrid", "peak_flops": 5e9, "hbm_bandwidth": 1e10,
               "memory_bytes": 1e9, "combine": "sum", "kv_cache_memory": float(1 << 26),
               "max_num_batched_tokens": 2048, "acceptance_rate": 0.6,
               "link": {"name": "shm", "bandwidth": 5e9, "latency_s": 1e-3}}
    if conditions.get("none"):
        path.write_text(json.dumps(content))
    else:
        path.write_text(json.dumps({**content, "conditions": {**base, **conditions}}))
    return str(path)


TINY = ["sim", "--model", "tiny-hybrid", "--pd-policy", "per-group", "--num-prompts", "4",
        "--random-input-len", "64", "--random-output-len", "4", "--json"]


def test_a_calibration_simulates_only_what_it_measured(capsys, tmp_path, monkeypatch) -> None:
    """k, draft and torch threads must be the calibration's (docs/simulator.md,
    "Validation conditions"); any other is refused: exit 2, one line naming the flag."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # relaykv up's default here: 1 thread
    cases = [
        ({"speculative_tokens": 0, "draft": None}, ["--speculative-tokens", "2"],
         "--speculative-tokens", "timed k=0, asked to simulate k=2"),
        ({}, ["--speculative-tokens", "0"], "--speculative-tokens", "timed k=2"),
        ({"draft": "random"}, ["--speculative-tokens", "2"], "--draft-model", "random"),
        ({}, ["--speculative-tokens", "2", "--draft-model", "random"], "--draft-model", "shipped"),
        ({}, ["--speculative-tokens", "2", "--torch-threads", "2"], "--torch-threads",
         "timed 1 torch thread(s) per engine, asked to simulate 2"),
        ({"torch_threads": 4}, ["--speculative-tokens", "2"], "--torch-threads", "simulate 1"),
        ({"model": "gemma3-270m"}, ["--speculative-tokens", "2"], "--model", "gemma3-270m"),
        ({"none": True}, ["--speculative-tokens", "2"], "--hardware", "records no conditions"),
    ]
    for conditions, flags, flag, words in cases:
        hardware = _calibration(tmp_path / "cal.json", **conditions)
        with pytest.raises(SystemExit) as exit_info:
            main([*TINY, "--hardware", hardware, *flags])
        assert exit_info.value.code == 2, (conditions, flags)
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1, lines
        assert lines[0].startswith(f"relaykv sim: error: argument {flag}: "), lines
        assert words in lines[0], lines
    # The same conditions simulate.
    for conditions, flags in (
        ({}, ["--speculative-tokens", "2"]),
        ({}, ["--speculative-tokens", "2", "--torch-threads", "1"]),
        ({"speculative_tokens": 0, "draft": None}, ["--draft-model", "random"]),  # no draft
        ({"draft": "random", "torch_threads": 3},
         ["--speculative-tokens", "2", "--draft-model", "random", "--torch-threads", "3"]),
    ):
        hardware = _calibration(tmp_path / "cal.json", **conditions)
        assert main([*TINY, "--hardware", hardware, *flags]) == 0, (conditions, flags)
        assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])[0]["completed"] == 4
