"""House rules checked on the source tree: no file in `src/` over 400 lines, and no import
circle between its modules (`tools/check_layers.py`, which CI also runs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_no_source_file_over_400_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in (ROOT / "src").rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 400
    }
    assert long == {}


def test_layers_and_no_import_circle() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "check_layers.py"), str(ROOT)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
