"""Compare two JUnit XML reports of vLLM's own tests, without and with the plugin
(tools/vllm_own_tests.sh): which ran, which passed in both, which pass only without it."""

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


def main(work: str, count: str) -> int:
    """Reads `WORK/stock-I.xml` and `WORK/plugin-I.xml` for I < count."""
    stock: dict[str, tuple[str, str]] = {}
    plugin: dict[str, tuple[str, str]] = {}
    for i in range(int(count)):
        for into, mode in ((stock, "stock"), (plugin, "plugin")):
            try:
                into.update(outcomes(f"{work}/{mode}-{i}.xml"))
            except (OSError, ET.ParseError):
                print(f"no report: {work}/{mode}-{i}.xml")
    both: Counter[tuple[str, str]] = Counter()
    lost = []
    for name, (state, _) in stock.items():
        theirs = plugin.get(name, ("missing", ""))
        both[(state, theirs[0])] += 1
        if state == "passed" and theirs[0] != "passed":
            lost.append((name, theirs[1]))
    print(f"tests: {len(stock)}")
    for (a, b), n in sorted(both.items()):
        print(f"  without plugin {a:8} -> with plugin {b:8}: {n}")
    print(f"pass without the plugin, not with it: {len(lost)}")
    for name, message in lost:
        print(f"  {name}: {message}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
