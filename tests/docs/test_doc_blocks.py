"""Every shell block of the README and docs/ is run by a test, or says why not where a
reader sees it (tests/docs/__init__.py states the rule). Also: the claims the doc tests make
still name blocks that exist, and no claimed block calls itself not run."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from tests.docs import markdown_blocks
from tests.docs.markdown_blocks import CLAIMS, Block, blocks, documented_files

HERE = Path(__file__).parent
DOC_TESTS = sorted(p.stem for p in HERE.glob("test_*.py") if p.stem != Path(__file__).stem)


@pytest.fixture(scope="module")
def claims() -> dict[tuple[str, int], set[str]]:
    for name in DOC_TESTS:  # a module's claim() calls run at import
        importlib.import_module(f"tests.docs.{name}")
    return CLAIMS


def _all_blocks() -> list[Block]:
    return [b for doc in documented_files() for b in blocks(doc)]


def test_every_block_says_what_it_is() -> None:
    bare = [b.where for b in _all_blocks() if not b.lang]
    assert not bare, (
        "tag these code blocks: sh or console (commands, run by a test or marked "
        "`# not run by tests: <reason>`), text, json, python, ...:\n" + "\n".join(bare)
    )


def test_every_shell_block_is_run_or_says_why_not(claims) -> None:
    unrun = [
        b.where
        for b in _all_blocks()
        if b.is_shell and (b.doc, b.line) not in claims and b.not_run_reason is None
    ]
    assert not unrun, (
        "shell blocks that no test in tests/docs runs and that give no reason (a first line "
        "`# not run by tests: <reason>`):\n" + "\n".join(unrun)
    )


def test_claimed_blocks_are_not_marked_unrun(claims) -> None:
    by_place = {(b.doc, b.line): b for b in _all_blocks()}
    contradictions = [
        by_place[key].where for key in claims if by_place[key].not_run_reason is not None
    ]
    assert not contradictions, contradictions


def test_reasons_are_reasons() -> None:
    short = [b.where for b in _all_blocks() if (r := b.not_run_reason) is not None and len(r) < 12]
    assert not short, short


def test_the_parser_reads_commands_and_transcripts() -> None:
    sh = Block("x.md", 1, "h", "sh", ("# host A: P", "relaykv serve \\", "  --port 1", "", "ls"))
    first, second = sh.commands()
    assert first.text == "relaykv serve \\\n  --port 1" and first.context == "# host A: P"
    assert first.line == 3 and second.text == "ls"
    console = Block("x.md", 1, "h", "console", ("$ a \\", "  b", "out 1", "out 2", "$ c"))
    a, c = console.commands()
    assert a.text == "a \\\n  b" and a.output == ("out 1", "out 2") and c.output == ()
    marked = Block("x.md", 1, "h", "sh", ("", "# not run by tests: needs a GPU", "x"))
    assert marked.not_run_reason == "needs a GPU"
    assert markdown_blocks.NOT_RUN.match("# not run by tests:") is None
