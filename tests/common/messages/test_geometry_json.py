"""The `/v1/kv_cache_info` geometry JSON: what an engine writes, a router reads back."""

from __future__ import annotations

import json

import pytest

from relaykv.common.messages.geometry_json import geometry_json, parse_geometry_json
from relaykv.kvcache import Geometry, GroupSpec
from tests.kvcache.conftest import geometry


@pytest.mark.parametrize(
    "geo",
    [
        geometry("full:16"),
        geometry("full:16", "sliding:16:128", draft=1),
        Geometry(
            (GroupSpec("full", 32, draft=True), GroupSpec("chunked", 16, chunk=64)),
            eagle_reuse="successor",
        ),
    ],
)
def test_round_trip_through_json_text(geo: Geometry) -> None:
    served = json.loads(json.dumps(geometry_json(geo)))  # as it crosses HTTP
    assert parse_geometry_json(served, GroupSpec, Geometry) == geo


def test_the_json_names_every_field() -> None:
    geo = geometry("full:16", "sliding:16:128", draft=1)
    assert geometry_json(geo) == {
        "groups": [
            {"kind": "full", "block_size": 16, "window": None, "chunk": None, "draft": False},
            {"kind": "sliding", "block_size": 16, "window": 128, "chunk": None, "draft": True},
        ],
        "eagle": True,
        "eagle_reuse": "drop",
    }


@pytest.mark.parametrize(
    "raw",
    [
        {},
        {"groups": [{"kind": "full"}]},  # no block size
        {"groups": [{"block_size": 16}]},  # no kind
        {"groups": None},
        {"groups": [{"kind": "full", "block_size": "x"}]},
        {"groups": [{"kind": "banded", "block_size": 16}]},  # kvcache refuses the kind
        {"groups": [{"kind": "sliding", "block_size": 16}]},  # a window is missing
        {"groups": []},
    ],
)
def test_malformed_geometry_is_a_value_error(raw: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        parse_geometry_json(raw, GroupSpec, Geometry)


def test_missing_keys_name_the_key() -> None:
    with pytest.raises(ValueError, match="malformed geometry: 'block_size'"):
        parse_geometry_json({"groups": [{"kind": "full"}]}, GroupSpec, Geometry)
