#!/usr/bin/env python3
# relaykv's layering and import-circle check (docs/architecture.md); CI runs it.
"""Check relaykv's import layering (see docs/architecture.md).

Usage: check_layers.py [PROJECT_ROOT]   (default: current directory)
Prints one line per import that goes against the layering (an upward or sideways import,
vllm imported outside the plugin `relaykv/vllm/`, the plugin imported at all), and one line
per import circle between relaykv modules, and exits 1 if there is any. For circles every
module-level import counts, those under `if TYPE_CHECKING:` too (a circle for the type
checker is a circle); imports inside a function body do not (they run late, on purpose:
optional or heavy code).
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

# package -> packages of relaykv it may import (itself always allowed)
ALLOWED = {
    "common": set(),
    "kvcache": set(),
    "cache_probe": {"kvcache"},
    "model": {"kvcache"},
    "engine": {"kvcache"},
    "generate": {"kvcache", "model", "engine"},
    "distill": {"kvcache", "model", "engine"},
    "transfer": {"kvcache", "engine", "model"},
    "router": {"kvcache"},
    "serve": {"kvcache", "engine", "model", "transfer"},
    "launch": {"serve", "router"},
    "bench": set(),
    "sim": {"kvcache", "engine", "transfer", "router"},
}
# The shared floor: every layer may import it, and it imports nothing of relaykv outside itself.
FLOOR = "common"
# Only the vLLM plugin (relaykv/vllm/) imports vllm, and nothing imports the plugin (vLLM loads
# it through its entry point); the cache contract, its probe and the floor never import torch.
PLUGIN = "vllm"
FORBIDDEN_THIRD_PARTY = {layer: {"vllm"} for layer in ALLOWED}
for _layer in ("kvcache", "cache_probe", FLOOR):
    FORBIDDEN_THIRD_PARTY[_layer] = {"torch", "vllm"}


def imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


def module_name(pkg: Path, path: Path) -> str:
    parts = list(path.relative_to(pkg.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(pkg: Path) -> dict[str, set[str]]:
    """Module -> the relaykv modules it imports (`from a.b import c` names a.b.c when c is a
    module, else a.b); a package's own submodules imported by its __init__ count too."""
    files = {module_name(pkg, p): p for p in pkg.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        edges: set[str] = set()
        for node in _module_level(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
            for target in targets:
                if target in files and target != name:
                    edges.add(target)
                    if isinstance(node, ast.ImportFrom):
                        break  # the first existing name: a submodule, else the module
        graph[name] = edges
    return graph


def _module_level(tree: ast.Module) -> list[ast.stmt]:
    """Statements outside function bodies (classes and if/try blocks included)."""
    out: list[ast.stmt] = []
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        out.append(node)
        for name in ("body", "orelse", "finalbody", "handlers"):
            todo.extend(getattr(node, name, []))
    return out


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))
    return circles


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
        if layer == PLUGIN:
            continue
        # Modules at the package root (the CLI dispatcher, the demo) sit outside the layers;
        # they may import any layer, never vllm.
        forbidden = FORBIDDEN_THIRD_PARTY.get(layer, {"vllm"}) if layer else {"vllm"}
        for lineno, module in imported_modules(ast.parse(path.read_text(), str(path))):
            top, _, rest = module.partition(".")
            if top == "relaykv":
                target = rest.split(".")[0]
                if target == PLUGIN:
                    problems.append(f"{path}:{lineno}: {layer or rel} imports relaykv.{PLUGIN}")
                elif layer == FLOOR and target != FLOOR:
                    problems.append(f"{path}:{lineno}: the floor imports relaykv.{target or ''}")
                elif (
                    layer in ALLOWED
                    and target in ALLOWED
                    and target not in (layer, FLOOR, *ALLOWED[layer])
                ):
                    problems.append(f"{path}:{lineno}: {layer} imports relaykv.{target}")
            elif top in forbidden:
                problems.append(f"{path}:{lineno}: {layer or rel} imports {top}")
    for circle in import_circles(import_graph(pkg)):
        problems.append("import circle: " + " <-> ".join(circle))
    for line in problems:
        print(line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
