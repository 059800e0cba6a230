"""One-shot documented commands whose output the docs show: run as written, the output
compared with the doc's (the cache probe is exact; a line `...` in a doc skips lines)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.docs.markdown_blocks import Block, claim
from tests.docs.running import same_output
from tests.docs.sandbox import Sandbox

PROBE_HEADING = "What to expect: `relaykv cache-probe`"
KVCACHE_EXAMPLE = claim("docs/kvcache.md", PROBE_HEADING, "relaykv cache-probe --gr", by=__name__)
KVCACHE_PRESET = claim("docs/kvcache.md", PROBE_HEADING, "relaykv cache-probe --pr", by=__name__)
POLICIES = claim("docs/policies.md", "What the cache predicts", "relaykv cache-probe", by=__name__)
TIER_PROBE = claim(
    "docs/tier.md",
    "What a tier of a given size would hit: `relaykv cache-probe --tier-blocks`",
    "relaykv cache-probe --preset gpt-oss-like --pd-policy per-group --tier-blocks",
    by=__name__,
)
BAD_FLAGS = claim("docs/serving.md", "Flags", "relaykv serve --kv-cache-memory 12XB", by=__name__)
TOKENIZER = claim(
    "docs/benchmarking.md",
    "Third-party clients: `vllm bench serve`, SGLang's `bench_serving.py`",
    "relaykv tokenizer export",
    by=__name__,
)


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    with Sandbox(tmp_path_factory.mktemp("commands")) as box:
        yield box


@pytest.mark.parametrize(
    "block",
    [KVCACHE_EXAMPLE, KVCACHE_PRESET, POLICIES, TIER_PROBE],
    ids=lambda b: f"{b.doc}:{b.line}",
)
def test_cache_probe_prints_what_the_docs_show(sandbox: Sandbox, block: Block) -> None:
    (command,) = block.commands()
    same_output(command.output, sandbox.run(command.text).stdout, excerpt=True)


def test_a_bad_flag_is_one_line_naming_it(sandbox: Sandbox) -> None:
    for command in BAD_FLAGS.commands():
        done = sandbox.run(command.text, check=False)
        assert done.returncode == 2, done
        said = [line for line in done.stderr.splitlines() if line.startswith("relaykv serve:")]
        same_output(command.output, "\n".join(said))


def test_tokenizer_export(sandbox: Sandbox) -> None:
    (command,) = TOKENIZER.commands()
    sandbox.run(command.text)
    listed = sandbox.run("ls tiny-hybrid-tokenizer").stdout.split()
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(listed)
