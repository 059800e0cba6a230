"""Page digests: the sender hashes what it reads, the receiver re-hashes what landed.

xxh3-64 per page (xxhash is a core dependency, as for the cache keys). The receiver hashes
the *destination* pages after they landed, so a wrong offset, a stale slot, a torn write
or a short write all show up as a mismatch, whatever the transport did on the way.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import xxhash

from relaykv.transfer.transport.errors import IntegrityError
from relaykv.transfer.transport.layout import PageCopy


def page_digest(data: np.ndarray | memoryview | bytes) -> int:
    """xxh3-64 of one page's bytes (contiguous)."""
    return xxhash.xxh3_64_intdigest(data)  # type: ignore[arg-type]  # numpy lacks Buffer stubs


def source_digests(buffer: np.ndarray, pages: Sequence[PageCopy]) -> list[int]:
    """Digests of the source pages as the sender reads them."""
    return [page_digest(buffer[p.src, : p.nbytes]) for p in pages]


def verify_destination(
    buffer: np.ndarray, pages: Sequence[PageCopy], digests: Sequence[int], first_index: int
) -> None:
    """Raise IntegrityError naming the first destination page whose bytes do not match."""
    if len(pages) != len(digests):
        raise IntegrityError(f"{len(digests)} digests for {len(pages)} pages")
    for offset, (page, expected) in enumerate(zip(pages, digests, strict=True)):
        got = page_digest(buffer[page.dst, : page.nbytes])
        if got != expected:
            raise IntegrityError(
                f"page {first_index + offset} (group {page.group}, src block {page.src} -> "
                f"dst block {page.dst}, {page.nbytes} bytes) does not match the sender's "
                f"digest: destination is garbage"
            )
