"""Name -> "module:attribute" tables imported on use: one lookup for the registries of
interchangeable implementations (KV transports, KV tier backends), so a missing optional
library (nixl, mooncake) breaks only the entry that needs it."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any


def resolve(entries: Mapping[str, str], name: str, what: str) -> Any:
    """Import and return what `entries[name]` names; an unknown `name` is a ValueError that
    says `what` it is and lists the choices (the CLI's message)."""
    try:
        target = entries[name]
    except KeyError:
        raise ValueError(f"unknown {what} {name!r}; choose from {', '.join(entries)}") from None
    module_name, attribute = target.split(":")
    return getattr(importlib.import_module(module_name), attribute)
