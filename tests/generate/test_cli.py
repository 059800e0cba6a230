"""`relaykv generate`: output format, equivalences, and errors that name the flag.

The command runs the serving engine (`LLMEngine` + `ModelRunner`); the model layer's own
offline driver (`OfflineGenerator`) is the independent reference it must agree with.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from relaykv.cli import main
from relaykv.model import ModelRunner
from relaykv.model.loading.export import save_hf_dir
from relaykv.model.loading.tokenizer import ByteTokenizer
from tests.model.offline import OfflineGenerator


def _json(capsys, *args):
    assert main(["generate", *args, "--json"]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_json_output_shape(capsys):
    rows = _json(
        capsys,
        "--prompt",
        "Hi there",
        "--prompt-ids",
        "1,72,101",
        "--max-tokens",
        "5",
        "--logprobs",
        "2",
        "--ignore-eos",
    )
    assert [r["prompt_ids"] for r in rows] == [ByteTokenizer().encode("Hi there"), [1, 72, 101]]
    for row in rows:
        assert len(row["output_ids"]) == 5
        assert isinstance(row["text"], str)
        assert len(row["logprobs"]) == 5
        for position in row["logprobs"]:
            assert len(position) == 2
            (t0, lp0), (_, lp1) = position
            assert isinstance(t0, int) and lp0 >= lp1
        # greedy: the chosen token is the most likely one
        assert [p[0][0] for p in row["logprobs"]] == row["output_ids"]


@pytest.fixture(scope="module")
def tiny():
    from relaykv.model import load_model

    return load_model("tiny-hybrid")


def test_generate_runs_the_engine() -> None:
    # The offline driver it is compared with is a test helper (tests/model/offline.py).
    code = (
        "import sys; from relaykv.cli import main; "
        "assert main(['generate', '--prompt-ids', '1,2,3', '--max-tokens', '2']) == 0; "
        "assert 'relaykv.engine.engine' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def test_cli_greedy_equals_library_and_speculation(capsys, tiny):
    base = _json(capsys, "--prompt-ids", "1,5,9,200,31", "--max-tokens", "12", "--ignore-eos")
    runner = ModelRunner(tiny.model, num_blocks=16)
    lib = OfflineGenerator(runner).generate([[1, 5, 9, 200, 31]], 12)[0].output_ids
    assert base[0]["output_ids"] == lib
    assert base[0]["logprobs"] is None
    spec = _json(
        capsys,
        "--prompt-ids",
        "1,5,9,200,31",
        "--max-tokens",
        "12",
        "--ignore-eos",
        "--speculative-tokens",
        "3",
    )
    rnd = _json(
        capsys,
        "--prompt-ids",
        "1,5,9,200,31",
        "--max-tokens",
        "12",
        "--ignore-eos",
        "--speculative-tokens",
        "2",
        "--draft-model",
        "random",
    )
    assert spec[0]["output_ids"] == rnd[0]["output_ids"] == lib


def test_json_summary_reports_the_acceptance(capsys):
    args = ["--prompt-ids", "1,5,9,200,31", "--max-tokens", "24", "--ignore-eos"]
    assert main(["generate", *args, "--json", "--speculative-tokens", "3"]) == 0
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 1  # stdout: one object per prompt, nothing else
    report = json.loads(err.strip().splitlines()[-1])["summary"]
    drafts, proposed, accepted = (
        report["num_drafts"],
        report["num_draft_tokens"],
        report["num_accepted_tokens"],
    )
    assert report["tokens"] == 24 and report["speculative_tokens"] == 3
    assert proposed == 3 * drafts and 0 < accepted <= proposed  # the shipped tiny draft
    assert report["draft_acceptance"] == round(accepted / proposed, 4)
    assert report["mean_accepted_length"] == round(1 + accepted / drafts, 4)
    # The prefill emits the first token, each verification step its accepted drafts plus
    # one (the last step may run past --max-tokens and be cut).
    assert drafts < 24 and 1 + drafts + accepted >= 24
    assert main(["generate", *args, "--json"]) == 0
    assert "draft_acceptance" not in capsys.readouterr().err


def test_seeded_sampling_is_reproducible(capsys):
    args = (
        "--prompt",
        "abc",
        "--max-tokens",
        "8",
        "--temperature",
        "0.8",
        "--top-k",
        "20",
        "--seed",
        "7",
        "--ignore-eos",
    )
    assert _json(capsys, *args) == _json(capsys, *args)


@pytest.mark.parametrize(
    "args,flag",
    [
        ([], "--prompt"),
        (["--prompt-ids", "1,x"], "--prompt-ids"),
        (["--prompt-ids", "1,999"], "--prompt-ids"),
        (["--prompt", "a", "--temperature", "-1"], "--temperature"),
        (["--prompt", "a", "--top-p", "0"], "--top-p"),
        (["--prompt", "a", "--max-tokens", "0"], "--max-tokens"),
        (["--prompt", "a", "--model", "no-such-model"], "--model"),
        (
            ["--prompt", "a", "--speculative-tokens", "2", "--draft-model", "/nonexistent"],
            "--draft-model",
        ),
    ],
)
def test_errors_name_the_flag(capsys, args, flag):
    assert main(["generate", *args]) == 2
    err = capsys.readouterr().err
    assert flag in err and err.startswith("relaykv generate: error:")


def test_directory_model_without_tokenizer(capsys, tiny, tmp_path):
    path = save_hf_dir(tiny.model, tmp_path / "tiny")
    assert main(["generate", "--model", str(path), "--prompt", "hi"]) == 2
    assert "--prompt-ids" in capsys.readouterr().err
    assert (
        main(["generate", "--model", str(path), "--prompt-ids", "1,2", "--speculative-tokens", "1"])
        == 2
    )
    assert "--draft-model" in capsys.readouterr().err
    rows = _json(
        capsys, "--model", str(path), "--prompt-ids", "1,5,9", "--max-tokens", "3", "--ignore-eos"
    )
    assert rows[0]["text"] is None and len(rows[0]["output_ids"]) == 3


def test_entry_point_and_parser_errors():
    # -X importtime lists every module imported: the parser names the models
    # (relaykv.common.model_names) without the model layer, so a bad flag costs no torch.
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "relaykv", "generate", "--max-tokens", "x"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2 and "--max-tokens" in done.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()}
    assert "relaykv.common.model_names" in imported and "torch" not in imported

