"""docs/pd.md's two-host commands, run as written in the network namespaces the doc
creates for its hosts (10.0.0.1 and 10.0.0.2 exist only inside the sandbox).

"Two hosts (or more)" (the engines and `relaykv router`) and "Two hosts: router and P on
host A, D on host B" (the same engines behind vllm-router) share one pair of engines, as a
reader moving from one section to the next would; the probe must print the doc's table
through both routers; with Mooncake instead of NIXL ("pass `--kv-transport mooncake` to both
engines") too. "API keys behind vllm-router" starts keyed engines, the SGLang gateway section
engines of its own. The secret and key files are written once in the sandbox's working
directory, which both "hosts" see (the doc's "copied to every host").
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from relaykv.transfer.transport import availability
from tests.docs.markdown_blocks import Block, claim
from tests.docs.running import is_router, run_block, same_output
from tests.docs.sandbox import Sandbox

pytestmark = pytest.mark.slow

PD = "docs/pd.md"
BEHIND = "Two hosts: router and P on host A, D on host B"
TWO_HOSTS = claim(PD, "Two hosts (or more)", "python -c", by=__name__)
VLLM_ROUTER = claim(PD, BEHIND, "python -c", by=__name__)
PROBE = claim(PD, BEHIND, "relaykv probe", by=__name__)
NAMESPACES = claim(PD, BEHIND, "ip netns add", by=__name__)
CLEANUP = claim(PD, BEHIND, "ip netns del", by=__name__)
KEYED = claim(PD, "API keys behind vllm-router", "python -c", by=__name__)
KEYED_PROBE = claim(PD, "API keys behind vllm-router", "OPENAI_API_KEY=", by=__name__)
SGLANG = claim(PD, "SGLang's gateways: a room handshake, or a 400, never half-served",
               "relaykv serve", by=__name__)
RECEIVED = re.compile(r"^relaykv:kv_bytes_received(?:_total)?(?:\{[^}]*\})? (\S+)$", re.M)


def _engine_lines(block: Block) -> list[str]:
    """The secret and the two engines, as written."""
    return [c.text for c in block.commands() if not is_router(c)]


def _probe(sandbox: Sandbox, url: str | None = None) -> str:
    command = PROBE.commands()[0].text
    if url is not None:  # the doc's "relaykv router in place of vllm-router"
        command = command.replace("--url http://10.0.0.1:8000", f"--url {url}")
    return sandbox.run(command, host="rkvA", timeout=300).stdout


def _complete(sandbox: Sandbox, base: str, max_tokens: int = 2) -> tuple[int, str]:
    """POST a small completion to `base` from host A: (HTTP status, body)."""
    body = json.dumps({"model": "tiny-hybrid", "prompt": "hello there", "max_tokens": max_tokens})
    out = sandbox.run(
        f"curl -s -w '\\n%{{http_code}}' {base}/v1/completions "
        f"-H 'content-type: application/json' -d '{body}'",
        host="rkvA",
    ).stdout
    text, _, status = out.rpartition("\n")
    return int(status), text


@contextlib.contextmanager
def _hosts(
    tmp_path: Path, transport: str = "nixl", router: str = "vllm-router"
) -> Iterator[Sandbox]:
    """A sandbox with the doc's two hosts and the cluster's secret file (the first section's
    "once" line: later sections use the reader's kv-secret). `make install` installs the
    transports and routers; a venv without those optional extras skips."""
    why = availability()[transport]
    if why:
        pytest.skip(f"docs/pd.md's two-host commands use {transport}: {why}")
    if not (Path(sys.executable).parent / router).exists():
        pytest.skip(f"pip install 'relaykv[{router}]' (docs/pd.md runs {router})")
    with Sandbox(tmp_path) as sandbox:
        sandbox.run(NAMESPACES.text)
        sandbox.run(TWO_HOSTS.command("python -c").text)
        yield sandbox


def test_two_hosts_relaykv_router_then_vllm_router(tmp_path: Path) -> None:
    # the two sections start the same engines: the second runs on the first's
    assert _engine_lines(TWO_HOSTS) == _engine_lines(VLLM_ROUTER)
    with _hosts(tmp_path) as sandbox:
        run_block(sandbox, TWO_HOSTS, hosts=True, skip=("python -c",))  # P on A, D on B, router
        # `relaykv router` names no --host: 127.0.0.1 of the host it runs on (A)
        same_output(PROBE.commands()[0].output, _probe(sandbox, "http://127.0.0.1:8000"))
        run_block(sandbox, VLLM_ROUTER, hosts=True, skip=("python -c", "relaykv serve"))
        same_output(PROBE.commands()[0].output, _probe(sandbox))
        for server in list(sandbox.servers):
            sandbox.stop(server)
        sandbox.run(CLEANUP.text)
        left = sandbox.run("ip netns list; ip -o link").stdout
        assert "rkv" not in left, left


def test_two_hosts_with_mooncake(tmp_path: Path) -> None:
    """The doc: "pass `--kv-transport mooncake` to both engines"; the same table."""
    engines = [c.text for c in TWO_HOSTS.commands() if not is_router(c)][1:]
    assert all("--kv-transport nixl" in text for text in engines)
    mooncake = dataclasses.replace(
        TWO_HOSTS,
        lines=tuple(x.replace("--kv-transport nixl", "--kv-transport mooncake")
                    for x in TWO_HOSTS.lines),
    )
    with _hosts(tmp_path, "mooncake") as sandbox:
        run_block(sandbox, mooncake, hosts=True, skip=("python -c", "relaykv router"))
        run_block(sandbox, VLLM_ROUTER, hosts=True, skip=("python -c", "relaykv serve"))
        same_output(PROBE.commands()[0].output, _probe(sandbox))


def test_engines_with_an_api_key_behind_vllm_router(tmp_path: Path) -> None:
    with _hosts(tmp_path) as sandbox:
        run_block(sandbox, KEYED, hosts=True)
        probe = sandbox.run(KEYED_PROBE.commands()[0].text, host="rkvA", timeout=300).stdout
        same_output(PROBE.commands()[0].output, probe)
        # the engines refuse a request without the key; the router passed it on
        for engine in ("http://10.0.0.1:8100", "http://10.0.0.2:8200"):
            assert _complete(sandbox, engine)[0] == 401, engine
        # the empty bearer token: the same router without OPENAI_API_KEY gets the 401s
        router = next(s for s in sandbox.servers if "vllm-router" in s.command)
        sandbox.stop(router)
        bare = re.sub(r'^OPENAI_API_KEY="\$\(cat api-key\)" ', "", router.command)
        assert bare != router.command
        again = sandbox.start(bare, "vllm-router-without-key", host="rkvA")
        sandbox.wait_http("http://10.0.0.1:8000/health", again, host="rkvA")
        status, body = _complete(sandbox, "http://10.0.0.1:8000")  # "Bearer " is no key
        assert status == 401 and "invalid_api_key" in body, (status, body)


def test_sglang_gateway_across_hosts(tmp_path: Path) -> None:
    with _hosts(tmp_path, router="sglang-router") as sandbox:
        run_block(sandbox, SGLANG, hosts=True)
        status, body = _complete(sandbox, "http://10.0.0.1:8000", max_tokens=5)
        assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 5, body
        metrics = sandbox.run("curl -s http://10.0.0.2:8200/metrics", host="rkvB").stdout
        received = RECEIVED.search(metrics)
        assert received and float(received[1]) > 0, "D received no KV from P"
