#!/usr/bin/env python3
# Vendored copy of shared/tools/check_layers.py so CI (a clean clone) can run it.
"""Check relaykv's import layering (see design/ARCHITECTURE.md).

Usage: check_layers.py [PROJECT_ROOT]   (default: current directory)
Prints one line per import that goes against the layering and exits 1 if there is any.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

# package -> packages of relaykv it may import (itself always allowed)
ALLOWED = {
    "kvcache": set(),
    "model": {"kvcache"},
    "engine": {"kvcache"},
    "distill": {"kvcache", "model", "engine"},
    "transfer": {"kvcache", "engine", "model"},
    "router": {"kvcache"},
    "serve": {"kvcache", "engine", "model", "transfer"},
    "launch": {"serve", "router"},
    "bench": set(),
    "sim": {"kvcache", "engine", "transfer", "router"},
}
FORBIDDEN_THIRD_PARTY = {"kvcache": {"torch"}}


def imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


def main() -> int:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    pkg = next((p for p in (root / "src" / "relaykv", root / "relaykv") if p.is_dir()), None)
    if pkg is None:
        print("check_layers: no relaykv package found", file=sys.stderr)
        return 0
    problems = []
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(pkg)
        layer = rel.parts[0] if len(rel.parts) > 1 else None
        if layer not in ALLOWED:
            continue
        for lineno, module in imported_modules(ast.parse(path.read_text(), str(path))):
            top, _, rest = module.partition(".")
            if top == "relaykv":
                target = rest.split(".")[0]
                if target and target != layer and target in ALLOWED and target not in ALLOWED[layer]:
                    problems.append(f"{path}:{lineno}: {layer} imports relaykv.{target}")
            elif top in FORBIDDEN_THIRD_PARTY.get(layer, ()):
                problems.append(f"{path}:{lineno}: {layer} imports {top}")
    for line in problems:
        print(line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
