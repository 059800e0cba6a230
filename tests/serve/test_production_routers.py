"""relaykv engines behind the production routers (docs/pd.md "Behind vllm-router").

One tiny-hybrid P/D cluster (`relaykv up`'s members: prefill, decode, relaykv's router), then:

* vllm-router in P/D mode (`cache_aware`, deep health checks on `/health_generate`, then
  `power_of_two` on `/get_load`): plain, streaming and chat requests succeed with the same
  greedy tokens as through relaykv's router, every endpoint it polls answers 2xx (the
  engines' access logs), and the upstream report's probe through it reads the same decode-engine
  counters as through relaykv's router, including the sibling's prefix reused on D.
* vllm-router with `kv_aware`, fed by the prefill engine's KV events (`--pd-kv-events`,
  static, as its P/D mode requires): the same requests succeed, every poll answers 2xx, and
  D reuses the sibling's prefix (skipped where `relaykv serve --kv-events-config` is absent).
* sglang-router and smg in P/D mode, engines started with `--sglang-bootstrap`: the room
  handshake moves the KV (greedy tokens as through relaykv's router, D reuses a sibling's
  prefix, every prefill produced exactly one token and D computed next to nothing of the
  prompts), and a decode engine asked to fetch from a prefill engine it was not told about
  refuses. Engines without the flag refuse SGLang's requests with a 400 before computing
  anything (two model-free reference servers behind each gateway).

Each router is skipped, with its install command as the reason, when it is not installed.
"""

from __future__ import annotations

import importlib.util
import json
import random
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from relaykv.bench.prometheus import parse_samples
from relaykv.cli import main
from relaykv.launch.cluster import Cluster, free_port
from tests.waiting import wait_server_healthy, wait_until

from .harness import ServerThread, reference_served

pytestmark = pytest.mark.slow

SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")

ENGINE_ARGS = [
    "--model",
    "tiny-hybrid",
    "--num-blocks",
    "600",
    "--max-model-len",
    "1024",
    "--access-log",
]
INSTALL = {
    "vllm-router": "pip install 'relaykv[vllm-router]'  (vllm-router==0.1.17)",
    "sglang-router": "pip install 'relaykv[sglang-router]'  (sglang-router==0.3.2)",
    "smg": "pip install 'relaykv[sglang-router]'  (smg==1.13.0)",
}


def _binary(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if found is None:
        pytest.skip(f"{name} is not installed: {INSTALL[name]}")
    return found


# KV events come with issue 12 (`relaykv serve --kv-events-config`); older trees skip that test.
KV_EVENTS = importlib.util.find_spec("relaykv.engine.kv_events_config") is not None


def _events_args(port: int) -> list[str]:
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{port}"}
    return ["--kv-events-config", json.dumps(config)] if KV_EVENTS else []


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    event_ports = {"prefill": free_port(), "decode": free_port()}
    c = Cluster(
        engine_args=[*ENGINE_ARGS, "--sglang-bootstrap"],
        prefill_args=_events_args(event_ports["prefill"]),
        decode_args=_events_args(event_ports["decode"]),
        log_dir=tmp_path_factory.mktemp("up"),
        # Every request P -> D through relaykv's router too, as through the production
        # fronts: the checks count each prefill engine's work (docs/routing.md).
        router_args=["--disaggregation", "always"],
    )
    c.plan()
    prefill = c.urls("prefill")[0].removeprefix("http://")
    for member in c.members:
        if member.name.startswith("decode"):
            member.argv += ["--sglang-bootstrap-peers", prefill]
    c.start(timeout=300)
    c.event_ports = event_ports  # type: ignore[attr-defined]
    yield c
    c.stop()


class Front:
    """A third-party router process on a free loopback port, its output in a log file."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [*argv, "--port", str(self.port)],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

        def log_tail() -> str:
            return log.read_text(errors="replace")[-2000:]

        try:
            wait_server_healthy(self.url, self.proc, timeout=60, log_tail=log_tail)
        except AssertionError:
            self.stop()
            raise AssertionError(f"{argv[0]} did not start: {log_tail()}") from None

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _pd(cluster: Cluster) -> list[str]:
    return ["--prefill", cluster.urls("prefill")[0], "--decode", cluster.urls("decode")[0]]


def _complete(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}{path}", json={"model": "tiny-hybrid", **body}, timeout=120)


def _stream_text(url: str, path: str, body: dict) -> tuple[str, list[dict]]:
    events = []
    with httpx.stream(
        "POST", f"{url}{path}", json={"model": "tiny-hybrid", **body, "stream": True}, timeout=120
    ) as resp:
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
            if line == "data: [DONE]":
                events.append({"done": True})
    assert events[-1] == {"done": True}
    parts = [
        c.get("text") or c.get("delta", {}).get("content") or ""
        for e in events[:-1]
        for c in e.get("choices", [])
    ]
    return "".join(parts), events


def _probe(url: str, cluster: Cluster, seed: int, capsys: pytest.CaptureFixture[str]) -> dict:
    assert (
        main(
            [
                "probe",
                "--url",
                url,
                *_pd(cluster),
                "--prefix-len",
                "256",
                "--suffix-len",
                "16",
                "--seed",
                str(seed),
                "--json",
                "--settle",
                "0.3",
            ]
        )
        == 0
    )
    return json.loads(capsys.readouterr().out)


def _polls(log: Path, since: int) -> list[tuple[str, str, int]]:
    """(method, path, status) of every HTTP request an engine logged after byte `since`."""
    text = log.read_bytes()[since:].decode(errors="replace")
    return [(m, p, int(s)) for m, p, s in re.findall(r'"(GET|POST) (\S+) HTTP/1\.1" (\d{3})', text)]


GREEDY = {
    "prompt": "The quick brown fox jumps over",
    "max_tokens": 8,
    "temperature": 0,
    "ignore_eos": True,
}
CHAT = {
    "messages": [{"role": "user", "content": "hello"}],
    "max_tokens": 6,
    "temperature": 0,
    "ignore_eos": True,
}


def _requests_match_relaykv_router(cluster: Cluster, front: Front) -> None:
    """Plain, streaming and chat requests through `front` give relaykv's router's tokens."""
    ours = _complete(cluster.router.url, "/v1/completions", GREEDY).json()
    theirs = _complete(front.url, "/v1/completions", GREEDY)
    assert theirs.status_code == 200, theirs.text
    assert theirs.json()["choices"][0]["text"] == ours["choices"][0]["text"]
    text, _ = _stream_text(front.url, "/v1/completions", GREEDY)
    assert text == ours["choices"][0]["text"]
    ours_chat = _complete(cluster.router.url, "/v1/chat/completions", CHAT).json()
    theirs_chat = _complete(front.url, "/v1/chat/completions", CHAT)
    assert theirs_chat.status_code == 200, theirs_chat.text
    expected = ours_chat["choices"][0]["message"]["content"]
    assert theirs_chat.json()["choices"][0]["message"]["content"] == expected
    assert _stream_text(front.url, "/v1/chat/completions", CHAT)[0] == expected


def _polls_all_answered(logs: list[Path], marks: list[int], expected: list[set[str]]) -> None:
    """Every request the engines logged since `marks` got a 2xx; each saw its `expected`."""
    for log, mark, paths in zip(logs, marks, expected, strict=True):
        polls = _polls(log, mark)
        assert [p for p in polls if p[2] >= 300] == [], log
        seen = {path.split("?")[0] for _, path, _ in polls}
        assert paths <= seen, (log, seen)


def test_behind_vllm_router(
    cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    binary = _binary("vllm-router")
    logs = [m.log_path for m in cluster.members if m.name != "router"]
    marks = [p.stat().st_size for p in logs]
    front = Front(
        [
            binary,
            "--vllm-pd-disaggregation",
            *_pd(cluster),
            "--policy",
            "cache_aware",
            "--prometheus-port",
            str(free_port()),
            "--health-check-endpoint",
            "/health_generate",
            "--health-check-interval-secs",
            "1",
        ],
        tmp_path / "vllm-router.log",
    )
    try:
        _requests_match_relaykv_router(cluster, front)
        # the upstream report's probe: same decode-engine counters as through relaykv's router
        through_ours = _probe(cluster.router.url, cluster, 11, capsys)
        through_vllm_router = _probe(front.url, cluster, 12, capsys)
        assert through_vllm_router == through_ours
        serial = through_vllm_router["phases"][1]
        assert serial["requests_ok"] == 2 and serial["local_hit_tokens"] >= 2 * 256
        wait_until(  # at least one deep health check of each engine
            lambda: all(
                any(p.split("?")[0] == "/health_generate" for _, p, _ in _polls(log, mark))
                for log, mark in zip(logs, marks, strict=True)
            ),
            timeout=30,
            interval=0.05,
            what="vllm-router's deep health checks of both engines",
        )
    finally:
        front.stop()
    front = Front(
        [
            binary,
            "--vllm-pd-disaggregation",
            *_pd(cluster),
            "--policy",
            "power_of_two",
            "--prometheus-port",
            str(free_port()),
        ],
        tmp_path / "vllm-router-p2.log",
    )
    try:
        assert _complete(front.url, "/v1/completions", GREEDY).status_code == 200
    finally:
        front.stop()
    polled = {
        "/v1/completions/render",
        "/v1/chat/completions/render",
        "/health_generate",
        "/get_load",
    }
    _polls_all_answered(logs, marks, [polled, polled])


def test_behind_vllm_router_kv_aware_fed_by_relaykv_events(
    cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    binary = _binary("vllm-router")
    if not KV_EVENTS:
        pytest.skip("this tree has no KV events (relaykv serve --kv-events-config, issue 12)")
    prefill = cluster.urls("prefill")[0]
    events = f"tcp://127.0.0.1:{cluster.event_ports['prefill']}"  # type: ignore[attr-defined]
    logs = [m.log_path for m in cluster.members if m.name != "router"]
    marks = [p.stat().st_size for p in logs]
    front = Front(
        [
            binary,
            "--vllm-pd-disaggregation",
            *_pd(cluster),
            "--policy",
            "kv_aware",
            "--pd-kv-events",
            f"{prefill}={events}",
            "--kv-event-model",
            "tiny-hybrid",
            "--prometheus-port",
            str(free_port()),
        ],
        tmp_path / "vllm-router-kv.log",
    )
    try:
        _requests_match_relaykv_router(cluster, front)
        through_ours = _probe(cluster.router.url, cluster, 21, capsys)
        through_vllm_router = _probe(front.url, cluster, 22, capsys)
        assert through_vllm_router == through_ours
        assert through_vllm_router["phases"][1]["local_hit_tokens"] >= 2 * 256
    finally:
        front.stop()
    assert f"kv_index subscriber for {prefill} rank0 on {events}" in re.sub(
        r"\x1b\[[0-9;]*m", "", front.log.read_text(errors="replace")
    )
    # kv_aware renders on the prefill side only (decode placement is load/affinity based)
    _polls_all_answered(logs, marks, [{"/v1/chat/completions/render"}, set()])


def _sglang(name: str, prefill: str, bootstrap_port: int, decode: str, log: Path) -> Front:
    argv = [_binary(name), "launch", "--pd-disaggregation", "--prefill", prefill]
    argv += [str(bootstrap_port), "--decode", decode, "--prometheus-port", str(free_port())]
    return Front(argv, log)


def _counter(url: str, name: str, **labels: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(
        sample.value
        for sample in parse_samples(text)
        if sample.name == f"{name}_total" and set(labels.items()) <= set(sample.labels)
    )


@pytest.mark.parametrize("name", ["sglang-router", "smg"])
def test_sglang_gateways_shake_hands_and_the_kv_moves(
    cluster: Cluster, tmp_path: Path, name: str
) -> None:
    prefill, decode = cluster.urls("prefill")[0], cluster.urls("decode")[0]
    front = _sglang(name, prefill, int(prefill.rsplit(":", 1)[1]), decode, tmp_path / "gw.log")
    p_tokens = _counter(prefill, "vllm:generation_tokens")
    d_sources = {s: _counter(decode, "vllm:prompt_tokens_by_source", source=s) for s in SOURCES}
    try:
        _requests_match_relaykv_router(cluster, front)  # 2 through ours, 4 through the gateway
        rng = random.Random(name)
        x = "".join(rng.choice("abcdefgh ") for _ in range(300))
        hits = _counter(decode, "vllm:prefix_cache_hits")
        for suffix in (" first sibling", " second sibling"):
            body = {"prompt": x + suffix, "max_tokens": 2, "temperature": 0}
            assert _complete(front.url, "/v1/completions", body).status_code == 200
        assert _counter(decode, "vllm:prefix_cache_hits") - hits >= 256  # the sibling's x
    finally:
        front.stop()
    # every prefill (8 requests: 2 through relaykv's router, 6 through the gateway) made
    # exactly one token; D received the prompts and computed next to nothing of them
    assert _counter(prefill, "vllm:generation_tokens") - p_tokens == 8
    got = {
        s: _counter(decode, "vllm:prompt_tokens_by_source", source=s) - d_sources[s]
        for s in SOURCES
    }
    assert got["external_kv_transfer"] > 300, got  # x came from P once, then D reused it
    assert got["local_compute"] <= 0.1 * sum(got.values())


def test_a_decode_engine_fetches_only_from_its_peers(cluster: Cluster) -> None:
    decode = cluster.urls("decode")[0]
    queries = _counter(decode, "vllm:prefix_cache_queries")
    body = {
        "prompt": "hello",
        "bootstrap_host": "10.9.9.9",
        "bootstrap_port": 80,
        "bootstrap_room": 5,
    }
    resp = _complete(decode, "/v1/completions", body)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "bootstrap_host"
    assert "--sglang-bootstrap-peers" in resp.text
    assert _counter(decode, "vllm:prefix_cache_queries") == queries


@pytest.mark.parametrize("name", ["sglang-router", "smg"])
def test_sglang_gateways_are_refused_where_not_enabled(tmp_path: Path, name: str) -> None:
    """Engines without --sglang-bootstrap (model-free reference servers): a 400, no work."""
    _binary(name)
    servers = [ServerThread(reference_served(), api_key=None) for _ in range(2)]
    try:
        front = _sglang(name, servers[0].url, free_port(), servers[1].url, tmp_path / "gw.log")
        try:
            for path, body in (
                ("/v1/completions", {"prompt": "x" * 300, "max_tokens": 4}),
                ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
            ):
                resp = httpx.post(
                    f"{front.url}{path}", json={"model": "reference", **body}, timeout=60
                )
                assert resp.status_code == 400, resp.text
                assert "SGLang's bootstrap P/D mode" in resp.text
                assert "--sglang-bootstrap" in resp.text
        finally:
            front.stop()
        for server in servers:  # no prompt token was even looked up, on either engine
            metrics = server.served.engine.metrics
            assert (metrics.prompt_tokens, metrics.num_steps) == (0, 0)
    finally:
        for server in servers:
            server.stop()
