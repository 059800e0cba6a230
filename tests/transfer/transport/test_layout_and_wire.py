"""Page layout, descriptor and wire format: shapes, round trips, clear errors."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest
import torch

from relaykv.kvcache.geometry import Geometry, GroupSpec
from relaykv.transfer.transport import KVSourceDescriptor, PageCopy, PageLayout, page_copies
from relaykv.transfer.transport.layout import as_page_array, check_destination_pages
from relaykv.transfer.transport.wire import control
from relaykv.transfer.transport.wire.auth import MessageAuth

LAYOUT = PageLayout(8, 256, (256, 100))


def test_layout_from_geometry_matches_the_storage_contract() -> None:
    geometry = Geometry(
        (
            GroupSpec("full", 16, num_layers=2, bytes_per_token=64),
            GroupSpec("sliding", 8, window=32, num_layers=2, bytes_per_token=48),
        )
    )
    layout = PageLayout.from_geometry(geometry, 10)
    assert layout.block_bytes == geometry.block_bytes == 1024
    assert layout.page_bytes == (1024, 384)
    assert PageLayout.from_wire(layout.to_wire()) == layout


@pytest.mark.parametrize(
    "args, match",
    [
        ((1, 256, (256,)), ">= 2 blocks"),
        ((8, 256, ()), "at least one group"),
        ((8, 256, (300,)), "page bytes 300"),
        ((8, 256, (0,)), "page bytes 0"),
    ],
)
def test_bad_layouts(args: tuple, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PageLayout(*args)


def test_torch_buffer_is_viewed_without_copy() -> None:
    tensor = torch.zeros((8, 256), dtype=torch.uint8)
    view = as_page_array(tensor, LAYOUT)
    view[3, 7] = 42
    assert tensor[3, 7].item() == 42
    with pytest.raises(ValueError, match="uint8"):
        as_page_array(torch.zeros((8, 256), dtype=torch.float16), LAYOUT)
    with pytest.raises(ValueError, match="shape"):
        as_page_array(np.zeros((8, 128), dtype=np.uint8), LAYOUT)
    with pytest.raises(ValueError, match="contiguous"):
        as_page_array(np.zeros((256, 8), dtype=np.uint8).T, LAYOUT)


@pytest.mark.parametrize(
    "pages, match",
    [
        ([], "at least one page"),
        ([PageCopy(2, 1, 1, 256)], "group 2"),
        ([PageCopy(1, 1, 1, 256)], "nbytes 256"),
        ([PageCopy(0, 1, 0, 256)], "destination block 0"),
        ([PageCopy(0, 1, 8, 256)], "destination block 8"),
        ([PageCopy(0, 0, 1, 256)], "null block"),
        ([PageCopy(0, 1, 3, 256), PageCopy(1, 2, 3, 100)], "appears twice"),
    ],
)
def test_destination_checks(pages: list[PageCopy], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        check_destination_pages(LAYOUT, pages)


def test_page_copies_uses_group_page_sizes() -> None:
    pages = page_copies(LAYOUT, {1: [(2, 3)], 0: [(4, 5)]})
    assert pages == [PageCopy(0, 4, 5, 256), PageCopy(1, 2, 3, 100)]


def test_descriptor_json_round_trip_and_validation() -> None:
    desc = KVSourceDescriptor("P0", "shm", "127.0.0.1", 5555, LAYOUT.to_wire(), {"k": "v"})
    again = KVSourceDescriptor.from_json(desc.to_json())
    assert again == desc and again.page_layout == LAYOUT
    assert KVSourceDescriptor.from_dict(desc.to_dict()) == desc
    assert desc.endpoint == "tcp://127.0.0.1:5555"
    assert KVSourceDescriptor("P", "tcp", "::1", 1, LAYOUT.to_wire()).endpoint == "tcp://[::1]:1"
    with pytest.raises(ValueError, match="protocol"):
        KVSourceDescriptor.from_dict({**desc.to_dict(), "protocol": 99})
    with pytest.raises(ValueError, match="port"):
        KVSourceDescriptor.from_dict({**desc.to_dict(), "port": 0})
    with pytest.raises(msgspec.ValidationError):
        KVSourceDescriptor.from_dict({"engine_id": "P"})


def test_wire_messages_round_trip_as_msgpack() -> None:
    codec = control.Codec(MessageAuth(b"k" * 32))
    read = control.Read("t", "r", [(0, 1, 2, 256)], b"sink", 4, 1.5, "D", 12.5)
    tag, data = codec.to_server(read)
    assert not data.startswith(b"\x80")  # msgpack, not a pickle stream
    assert codec.decode_to_server(tag, data) == read
    chunk = control.Chunk("t", 0, 0, [2**64 - 1], 3)
    assert codec.decode_to_client(*codec.to_client(chunk)) == chunk
    with pytest.raises(control.Unauthenticated):
        codec.decode_to_client(tag, data)  # signed for the other direction: not reflectable
    with pytest.raises(msgspec.ValidationError):
        codec.decode_to_client(*codec.to_client(read))  # a Read is not for the client


def test_a_message_signed_with_another_secret_is_not_read() -> None:
    ours, theirs = control.Codec(MessageAuth(b"a" * 32)), control.Codec(MessageAuth(b"b" * 32))
    tag, data = theirs.to_server(control.Release("r"))
    with pytest.raises(control.Unauthenticated):
        ours.decode_to_server(tag, data)
    flipped = bytearray(data)
    flipped[-1] ^= 1
    with pytest.raises(control.Unauthenticated):
        ours.decode_to_server(ours.to_server(control.Release("r"))[0], bytes(flipped))
