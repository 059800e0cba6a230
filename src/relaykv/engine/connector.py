"""The scheduler's hooks for P/D transfers; `relaykv.transfer` implements them.

The engine never moves KV itself. On a prefill engine the connector takes over a finished
request's blocks (holding the ones the P/D plan names until the decode engine has read them);
on a decode engine it fills the blocks of a `KVLoad` from the prefill engine.

Safety rules: every method runs on the engine's step thread (transport threads hand their
completions over through queues and `poll`); a load is reported exactly once, as verified OK or
failed; blocks handed to `prefill_finished` are released through the cache manager by the
connector itself, after the read or on lease expiry, never by the scheduler.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from relaykv.engine.request import Request
from relaykv.kvcache import KVLoad


class KVConnector(Protocol):
    def validate(
        self, params: dict[str, Any], prompt_ids: Sequence[int], cache_salt: str | None = None
    ) -> None:
        """Raise ValueError for `kv_transfer_params` this engine cannot act on, including
        parameters not issued for exactly this prompt (and salt)."""
        ...

    def prefill_finished(self, request: Request) -> dict[str, Any] | None:
        """P side: hold the request's planned blocks; return the params for the response
        (None: nothing to send, the scheduler frees the blocks)."""
        ...

    def start_load(self, request: Request, load: KVLoad) -> None:
        """D side: start filling `load.receive` from the engine in `request.kv_transfer_params`."""
        ...

    def release_remote(self, request: Request) -> None:
        """D side: tell the prefill engine this request will not read its blocks."""
        ...

    def keep_alive(self, waiting: list[Request]) -> None:
        """D side: these remote-prefill requests still wait for admission; keep P's blocks."""
        ...

    def poll(self) -> list[tuple[KVLoad, bool]]:
        """Loads whose own transfer ended since the last call, with success; also applies
        releases of held prefill blocks that became due."""
        ...

    def shutdown(self) -> None: ...
