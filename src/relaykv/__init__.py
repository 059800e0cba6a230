"""relaykv: a serving engine for hybrid-attention models whose prefix cache survives P/D."""

from __future__ import annotations

__version__ = "0.1.0"
