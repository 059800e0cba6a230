"""docs/tier.md's "Mooncake Store" section, run as written in a sandbox: `relaykv up
--kv-offloading-backend mooncake --port 8100` starts the master first and every engine with
the store, the curl through its router answers, the prefill engine put blocks into the store
and the decode engine's tier is the store; the bad-flag transcript prints what it shows.
Skipped with the reason when Mooncake's store is not importable.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest

from relaykv.transfer.tier.mooncake import mooncake_unavailable
from tests.docs.markdown_blocks import claim
from tests.docs.running import same_output
from tests.docs.sandbox import Sandbox

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(mooncake_unavailable() is not None, reason=str(mooncake_unavailable())),
]

HEADING = "Mooncake Store: a tier the engines share"
UP = claim("docs/tier.md", HEADING, "relaykv up --kv-offloading-backend mooncake", by=__name__)
CURL = claim("docs/tier.md", HEADING, "curl -s http://127.0.0.1:8100", by=__name__)
BAD = claim("docs/tier.md", HEADING, "relaykv serve --kv-offloading-backend", by=__name__)


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    with Sandbox(tmp_path_factory.mktemp("tier-store")) as box:
        yield box


def _metric(sandbox: Sandbox, url: str, name: str) -> float:
    text = sandbox.run(f"curl -s {url}/metrics").stdout
    found = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    return float(found[1]) if found else 0.0


def test_up_with_the_store_then_curl(sandbox: Sandbox) -> None:
    (command,) = UP.commands()
    up = sandbox.start(command.text, "store-up")
    printed = sandbox.wait_log(up, "(Ctrl-C stops the cluster)")
    assert printed.index("kvstore ready") < printed.index("prefill0 ready"), printed
    prefill = re.search(r"^prefill\s+(http://\S+)$", printed, re.M)[1]  # type: ignore[index]
    answer = json.loads(sandbox.run(CURL.commands()[0].text).stdout)
    assert answer["usage"]["completion_tokens"] == 5
    stored = 'relaykv:kv_offload_blocks_total{direction="stored"}'
    assert _metric(sandbox, prefill, stored) > 0  # P put what it computed into the store
    assert sandbox.stop(up) == 0
    assert "every member exited 0" in up.log_text()


def test_a_missing_master_is_one_line_naming_it(sandbox: Sandbox) -> None:
    (command,) = BAD.commands()
    done = sandbox.run(command.text, check=False)
    assert done.returncode == 2, done
    said = [line for line in done.stderr.splitlines() if line.startswith("relaykv serve:")]
    same_output(command.output, "\n".join(said))
