"""Compare JUnit XML reports of vLLM's own tests without the plugin and with it, under its
default policy and under `legacy` (tools/vllm_own_tests.sh): which ran, which passed in
both, which pass only without it."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import Counter


def outcomes(path: str) -> dict[str, tuple[str, str]]:
    """test id -> (passed | failed | skipped, first line of the message)."""
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        state, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                state = "skipped" if child.tag == "skipped" else "failed"
                message = (
                    (child.get("message") or "").splitlines()[0][:160]
                    if child.get("message")
                    else ""
                )
        out[name] = (state, message)
    return out


def main(work: str, count: str, *modes: str) -> int:
    """Reads `WORK/MODE-I.xml` for I < count, MODE `stock` and each of `modes` (default
    `plugin`), and compares each mode with stock."""
    runs: dict[str, dict[str, tuple[str, str]]] = {}
    for mode in ("stock", *(modes or ("plugin",))):
        runs[mode] = {}
        for i in range(int(count)):
            try:
                runs[mode].update(outcomes(f"{work}/{mode}-{i}.xml"))
            except (OSError, ET.ParseError):
                print(f"no report: {work}/{mode}-{i}.xml")
    stock = runs.pop("stock")
    print(f"tests: {len(stock)}")
    for mode, theirs in runs.items():
        both: Counter[tuple[str, str]] = Counter()
        lost, changed = [], []
        for name, (state, _) in stock.items():
            other = theirs.get(name, ("missing", ""))
            both[(state, other[0])] += 1
            if state == "passed" and other[0] != "passed":
                lost.append((name, other[1]))
            elif state != other[0]:
                changed.append((name, f"{state} -> {other[0]}"))
        print(f"{mode}:")
        for (a, b), n in sorted(both.items()):
            print(f"  without plugin {a:8} -> {mode} {b:8}: {n}")
        print(f"  pass without the plugin, not under {mode}: {len(lost)}")
        for name, message in lost:
            print(f"    {name}: {message}")
        for name, message in changed:
            print(f"  other change: {name}: {message}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
