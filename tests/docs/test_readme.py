"""The README's commands. `make demo` runs with the substitution the README states next to
it, `ARGS=--quick` (tiny-hybrid instead of Gemma-3-270M, minutes instead of nine), which
runs `relaykv demo --quick`: docs/quickstart.md's "Measure" line too. `make test`, the
block's other line, is the run these tests are part of.

The demo must show what the README says it shows: on the probe's serial phase the decode
engine reuses nothing under `legacy` and the shared prefix under `per-group`, with far fewer
KV bytes received.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest

from tests.docs.markdown_blocks import REPO, claim
from tests.docs.sandbox import Sandbox

pytestmark = pytest.mark.slow

README = claim("README.md", "relaykv", "make demo", by=__name__)
MEASURE = claim("docs/quickstart.md", "Measure", "relaykv bench serve", by=__name__)


def _row(printed: str, group: str, metric: str) -> list[str]:
    """The cells of the A/B/A table row `| group | metric | A1 | B1 | A2 | ...`."""
    match = re.search(rf"^\| {re.escape(group)} \| {re.escape(metric)} \|(.*)$", printed, re.M)
    assert match, f"no row {group} / {metric} in:\n{printed}"
    return [cell.strip() for cell in match[1].split("|")]


def test_make_demo_quick(tmp_path) -> None:
    if sys.executable != str(REPO / ".venv" / "bin" / "python"):
        pytest.skip("`make demo` runs the checkout's .venv; these tests run in another")
    if subprocess.run(["make", "-q", ".venv/.installed"], cwd=REPO).returncode != 0:
        pytest.skip("the venv is older than pyproject.toml: `make demo` would rebuild it")
    demo = README.command("make demo").text.split("#")[0].strip()
    assert demo == "make demo"
    assert "relaykv demo --quick" in MEASURE.command("relaykv demo").text
    before = set((REPO / "results" / "demo").glob("*"))
    try:
        with Sandbox(tmp_path) as sandbox:
            printed = sandbox.run(f"cd {REPO} && {demo} ARGS=--quick", timeout=600).stdout
    finally:
        for made in set((REPO / "results" / "demo").glob("*")) - before:
            shutil.rmtree(made, ignore_errors=True)
    a1, b1, a2, *_ = _row(printed, "probe/serial", "D local hit tokens")
    assert a1 == a2 == "0" and int(b1.replace(",", "")) > 0
    a1, b1, a2, *_ = _row(printed, "probe/serial", "D KV bytes received")
    assert int(b1.replace(",", "")) * 10 < int(a1.replace(",", ""))
    assert "relaykv demo: done" in printed
