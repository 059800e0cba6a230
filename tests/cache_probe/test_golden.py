"""`relaykv cache-probe` output is byte-identical to the golden file recorded before the
kvcache contract redesign (docs/design.md): the presets and 40 seeded random geometries, table and
JSON, every policy. Regenerate only for an intended behaviour change:

    PYTHONPATH=src python tests/cache_probe/test_golden.py --write
"""

from __future__ import annotations

import contextlib
import io
import json
import random
import sys
from pathlib import Path

from relaykv.cli import main

GOLDEN = Path(__file__).parent / "golden" / "cache_probe.json"


def _random_groups(rng: random.Random) -> tuple[str, list[str]]:
    """A `--groups` value and extra flags drawn like `strategies.geometries`."""
    groups = []
    n = rng.randint(1, 3)
    for _ in range(n):
        block = rng.choice([2, 4, 8])
        if rng.random() < 0.5:
            groups.append(f"full:{block}")
        else:
            groups.append(f"sliding:{block}:{rng.randint(1, 24)}")
    draft = rng.choice(["none", *[str(i) for i in range(n)]])
    extra = ["--draft", draft, "--eagle-reuse", rng.choice(["drop", "successor"])]
    extra += ["--retention", rng.choice(["boundaries", "dense", "boundaries"])]
    return ",".join(groups), extra


def cases() -> list[list[str]]:
    out: list[list[str]] = []
    for name in ("gpt-oss-like", "gemma3-like", "dsv4-like"):
        for n in (1000, 3000):
            out.append(["--preset", name, "--prompt-len", str(n)])
            out.append(["--preset", name, "--prompt-len", str(n), "--json"])
    out.append(["--groups", "full:16,sliding:16:128", "--draft", "1", "--prompt-len", "1000"])
    out.append(["--preset", "gpt-oss-like", "--retention", "interval:64", "--json"])
    rng = random.Random(9)
    for _ in range(40):
        groups, extra = _random_groups(rng)
        n = rng.randint(2, 160)
        diverge = rng.randint(1, n - 1)
        out.append(
            [
                "--groups",
                groups,
                *extra,
                "--prompt-len",
                str(n),
                "--sibling-diverge",
                str(diverge),
                "--extension-len",
                str(rng.randint(1, 40)),
                "--json",
            ]
        )
    return out


def outputs() -> dict[str, str]:
    result = {}
    for args in cases():
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            assert main(["cache-probe", *args]) == 0
        result[" ".join(args)] = buf.getvalue()
    return result


def test_cache_probe_output_matches_the_golden_file() -> None:
    golden = json.loads(GOLDEN.read_text())
    now = outputs()
    assert list(now) == list(golden)
    for key, text in now.items():
        assert text == golden[key], key


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    GOLDEN.write_text(json.dumps(outputs(), indent=1) + "\n")
