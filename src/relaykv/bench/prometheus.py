"""A reader for the Prometheus text exposition format, enough to sum counters.

Counters from `prometheus_client` are exposed as `name_total` (plus `name_created`); other
exporters write plain `name`. `counter_total` accepts both: it sums every label set of
`name_total` when that exists, else of `name` (never both, which would double count), and
never `_created`. Label values may hold escaped quotes, commas, braces and spaces.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


class ExpositionError(ValueError):
    """A line of /metrics text that is not a sample."""


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


def _parse_labels(text: str, start: int) -> tuple[tuple[tuple[str, str], ...], int]:
    """Parse `{a="x",b="y"}` starting at `text[start] == "{"`; return labels, next index."""
    labels: list[tuple[str, str]] = []
    i = start + 1
    while True:
        while i < len(text) and text[i] in " ,":
            i += 1
        if i >= len(text):
            raise ExpositionError(f"unterminated labels: {text!r}")
        if text[i] == "}":
            return tuple(labels), i + 1
        eq = text.find("=", i)
        if eq < 0 or eq + 1 >= len(text) or text[eq + 1] != '"':
            raise ExpositionError(f"bad label in {text!r}")
        key = text[i:eq].strip()
        i = eq + 2
        value: list[str] = []
        while True:
            if i >= len(text):
                raise ExpositionError(f"unterminated label value: {text!r}")
            ch = text[i]
            if ch == "\\" and i + 1 < len(text):
                nxt = text[i + 1]
                value.append({"n": "\n", "\\": "\\", '"': '"'}.get(nxt, "\\" + nxt))
                i += 2
            elif ch == '"':
                i += 1
                break
            else:
                value.append(ch)
                i += 1
        labels.append((key, "".join(value)))


def _parse_value(token: str) -> float:
    lowered = token.lower()
    if lowered in ("+inf", "inf"):
        return math.inf
    if lowered == "-inf":
        return -math.inf
    if lowered == "nan":
        return math.nan
    try:
        return float(token)
    except ValueError:
        raise ExpositionError(f"bad sample value {token!r}") from None


def parse_samples(text: str) -> list[Sample]:
    samples: list[Sample] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        brace = line.find("{")
        space = line.find(" ")
        if brace >= 0 and (space < 0 or brace < space):
            name = line[:brace]
            labels, rest_at = _parse_labels(line, brace)
            rest = line[rest_at:].split()
        else:
            name, *rest = line.split()
            labels = ()
        if not rest:
            raise ExpositionError(f"sample without a value: {line!r}")
        samples.append(Sample(name=name, labels=labels, value=_parse_value(rest[0])))
    return samples


def counter_total(samples: list[Sample], name: str) -> float | None:
    """Sum of `name_total` (or else `name`) over label sets; None when absent."""
    for candidate in (f"{name}_total", name):
        values = [s.value for s in samples if s.name == candidate]
        if values:
            return float(sum(values))
    return None
