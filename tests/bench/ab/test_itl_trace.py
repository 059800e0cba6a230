"""benchmarks/itl_trace.py on a hand-made `bench ab --save-detailed` result: the largest gap
is named with the steps that ran meanwhile, and a decode engine's local prefill is checked
against the streams (alone, before any stream started; then one sharing a decode step)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmarks.itl_trace import gaps, local_steps, main, report


def _step(start: float, end: float, *work: tuple[str, str]) -> dict:
    return {
        "start": start,
        "end": end,
        "work": [{"request_id": r, "kind": k, "tokens": 1, "draft_tokens": 0} for r, k in work],
    }


def _result() -> dict:
    # two streams sent at t=10: first tokens at 10.1 and 10.3, then gaps (s)
    return {
        "start_times": [10.0, 10.0],
        "ttfts": [0.1, 0.3],
        "itls": [[0.05, 0.25, 0.05], [0.05, 0.05]],
        "engine_steps": {
            "decode": {
                "http://d": [
                    _step(10.0, 10.09, ("a", "prefill")),  # local, before any stream
                    _step(10.16, 10.39, ("a", "decode"), ("b", "load")),
                ]
            },
            "prefill": {"http://p": [_step(10.0, 10.25, ("b", "prefill"))]},
        },
    }


def test_the_largest_gap_comes_with_the_steps_that_ran_meanwhile() -> None:
    result = _result()
    largest = gaps(result)[0]
    assert (largest.stream, largest.index) == (0, 1)
    assert largest.seconds == pytest.approx(0.25)
    lines = report(result, top=1)
    # numpy's linear P99 of 50, 50, 50, 50, 250 ms: 50 + 0.96 x 200
    assert lines[0] == "  P99 ITL 242.0 ms over 5 gaps"
    assert lines[1].startswith("   250.0 ms  request 0 gap 1 at +150 ms after its send: ")
    assert lines[1].endswith("P[1xprefill 250 ms] D[1xdecode+1xload 230 ms]")
    assert local_steps(result) == (1, 0, 0)
    assert lines[2] == (
        "  decode-engine prefill steps 1: 0 shared a batch, 0 ran while a measured stream "
        "streamed"
    )


def test_a_local_prefill_next_to_a_stream_is_counted() -> None:
    result = _result()
    steps = result["engine_steps"]["decode"]["http://d"]
    steps.append(_step(10.4, 10.45, ("a", "decode"), ("c", "prefill")))
    assert local_steps(result) == (2, 1, 1)


def test_the_command_reads_an_output_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "B1-gsp_c4_output32.json").write_text(json.dumps(_result()))
    (tmp_path / "results" / "A1-gsp_c4_output32.json").write_text(json.dumps({"completed": 2}))
    assert main([str(tmp_path), "--group", "gsp", "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert "A1-gsp_c4_output32.json: no per-request arrays" in out
    assert "B1-gsp_c4_output32\n  P99 ITL 242.0 ms" in out
    assert main([str(tmp_path), "--group", "c8"]) == 2
