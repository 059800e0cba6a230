"""Byte sizes on the command line: `512MiB`, `2GiB`, `1.5G`, `1000000` (bytes)."""

from __future__ import annotations

import re

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "ki": 1 << 10,
    "kib": 1 << 10,
    "mi": 1 << 20,
    "mib": 1 << 20,
    "gi": 1 << 30,
    "gib": 1 << 30,
    "ti": 1 << 40,
    "tib": 1 << 40,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str) -> int:
    """Bytes from a size with an optional unit (`KiB`, `MiB`, `GiB`, `TiB` are powers of
    1024; `K`/`KB`, `M`/`MB`, `G`/`GB`, `T`/`TB` powers of 1000). Raises ValueError."""
    match = _SIZE.match(text)
    if match is None or match.group(2).lower() not in _UNITS:
        raise ValueError(f"expected a size such as 512MiB, 2GiB or 1000000, got {text!r}")
    value = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if value < 1:
        raise ValueError(f"a size must be at least 1 byte, got {text!r}")
    return int(value)


def format_bytes(n: int | float) -> str:
    """`1.50 GiB`-style rendering (powers of 1024)."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{value:.2f} TiB"
