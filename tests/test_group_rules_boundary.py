"""The rule of which blocks matter lives in `kvcache/groups/` only (docs/design.md §4).

Outside `kvcache/groups/` (the kinds) and `model/attention/` (the model's attention read
window) no source file may switch on a group kind or do window arithmetic: it asks the
group's `GroupRules`. This test greps `src/` for both.
"""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "relaykv"
ALLOWED_DIRS = ("kvcache/groups/", "model/attention/")
# Lines that turn a MODEL's layer types into group kinds, build its dense attention mask, or
# price its attention reads (the simulator's cost model): the model's side of the contract,
# not a cache rule.
ALLOWED_LINES = {
    ("model/kv_layout.py", "if draft.window else"),
    ("model/kv_layout.py", "if window else"),
    ("kvcache/geometry.py", 'k[0] == "full"'),  # group_layers: full groups first, as vLLM
    ("sim/cost_model.py", "return window * new"),
    ("sim/cost_model.py", "below = (lo + window) * (window - lo + 1) // 2"),
    ("sim/cost_model.py", "return below + window * (hi - window)"),
}
KINDS = r"(full|sliding|chunked)"
PATTERNS = [
    re.compile(r"isinstance\([^)]*\b(FullAttention|SlidingWindow|ChunkedLocal)Group\b"),
    re.compile(rf"[=!]=\s*[\"']{KINDS}[\"']"),
    re.compile(rf"[\"']{KINDS}[\"']\s*[=!]="),
    re.compile(rf"[\"']{KINDS}[\"']\s+if\b"),
    # ruff format spaces binary operators, so arithmetic reads " window - 1", " - w.window".
    re.compile(r"\bwindow\s+[-+*/%]\s|\s[-+*/%]\s+[\w.]*\bwindow\b"),
    # a chunked group's C (`spec.chunk`); a bare `chunk` is usually a prefill or byte chunk
    re.compile(r"\.chunk\s+[-+*/%]\s|\s[-+*/%]\s+[\w.]*\.chunk\b"),
]


def _code_lines(path: Path) -> list[tuple[int, str]]:
    """Lines of code, without comments and docstrings (prose may speak of windows)."""
    out, in_doc = [], False
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        quotes = line.count('"""')
        if in_doc or line.startswith('"""'):
            if (in_doc and quotes) or (not in_doc and quotes == 1):
                in_doc = not in_doc
            continue
        out.append((number, line.split("  #")[0] if not line.startswith("#") else ""))
    return out


def violations() -> list[str]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith(ALLOWED_DIRS):
            continue
        for number, line in _code_lines(path):
            if any(p.search(line) for p in PATTERNS) and not any(
                rel == f and snippet in line for f, snippet in ALLOWED_LINES
            ):
                found.append(f"{rel}:{number}: {line}")
    return found


def test_no_kind_switch_or_window_arithmetic_outside_the_group_rules() -> None:
    assert violations() == []


def test_the_grep_catches_what_it_should(tmp_path: Path) -> None:
    bad = [
        "if isinstance(rule, SlidingWindowGroup):",
        'if g.kind == "full":',
        "cap = (first + 1) * b + rule.window - 2",
        "start = max(0, n - spec.window + 1) // b",
        'kind = "sliding" if w else "full"',
        "start = p // spec.chunk * spec.chunk",
    ]
    for line in bad:
        assert any(p.search(line) for p in PATTERNS), line
