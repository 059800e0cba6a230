"""House rules checked on the source tree (docs/architecture.md): every package states its
role in its `__init__` docstring, no folder holds more than 20 modules directly (a room that
grows past that holds several jobs: split it by role), and no import goes against the
layering or closes a circle (`tools/check_layers.py`, which CI also runs). Files end where
their job ends: there is no line cap."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "relaykv"
MAX_MODULES_PER_FOLDER = 20


def _folders() -> list[Path]:
    return sorted({p.parent for p in PACKAGE.rglob("*.py")})


def test_every_folder_is_a_package_that_states_its_role() -> None:
    missing = []
    for folder in _folders():
        init = folder / "__init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text())) if init.is_file() else None
        # A role is a sentence, not a name: "relaykv.x." alone says nothing.
        if not doc or len(doc.split()) < 5:
            missing.append(str(folder.relative_to(ROOT)))
    assert missing == [], "packages without a role in their __init__ docstring"


def test_no_folder_holds_more_than_20_modules() -> None:
    crowded = {
        str(folder.relative_to(ROOT)): n
        for folder in _folders()
        if (n := sum(1 for p in folder.glob("*.py") if p.name != "__init__.py"))
        > MAX_MODULES_PER_FOLDER
    }
    assert crowded == {}


def test_layers_and_no_import_circle() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "check_layers.py"), str(ROOT)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_only_the_plugin_imports_vllm_and_nothing_imports_the_plugin(tmp_path: Path) -> None:
    pkg = tmp_path / "src" / "relaykv"
    files = {
        "vllm/__init__.py": "import vllm\nfrom relaykv.vllm import connector\n",
        "vllm/connector.py": "from vllm.config import VllmConfig\nimport relaykv.kvcache\n",
        "kvcache/__init__.py": "",
        "serve/__init__.py": "from relaykv.vllm import connector\n",
        "launch/__init__.py": "def later():\n    import vllm\n",
        "cli.py": "import relaykv.vllm.connector\n",
    }
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "check_layers.py"), str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1
    assert sorted(line.split(": ", 1)[1] for line in proc.stdout.splitlines()) == [
        "cli.py imports relaykv.vllm",
        "launch imports vllm",
        "serve imports relaykv.vllm",
    ]
