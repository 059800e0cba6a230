"""Which decode engine a grant is for (docs/security.md, "Signed grants").

The router chooses D before it calls P and names D's transfer identity in the request to P
(`kv_transfer_params: {"do_remote_decode": true, "destination_engine_id": ...}`). P signs the
grant for that engine and lets only that engine read the blocks; any other D refuses the
grant (400 naming `kv_transfer_params`) and P's transfer server refuses its read.

D's identity is the `engine_id` of its `/v1/kv_cache_info`, fetched once and kept on the
`Backend` until the engine fails a request or a health check (a restarted engine has a new
id). An engine that does not report one gets an unbound grant (bound to its first reader).
If D refuses a grant as meant for another engine (it restarted between two health checks),
the router fetches the id again and retries once with a fresh grant (`relay.py`).
"""

from __future__ import annotations

import json

import httpx
from fastapi.responses import Response

from relaykv.router.backends import Backend

INFO_TIMEOUT_S = 2.0


async def destination_id(
    client: httpx.AsyncClient, backend: Backend, headers: dict[str, str]
) -> str | None:
    """D's engine id (cached on `backend`); None when D does not say. Raises
    `httpx.HTTPError` when D cannot be reached (the caller takes it out of rotation)."""
    if backend.engine_id is not None:
        return backend.engine_id
    auth = {k: v for k, v in headers.items() if k.lower() == "authorization"}
    resp = await client.get(
        f"{backend.url}/v1/kv_cache_info", headers=auth, timeout=INFO_TIMEOUT_S
    )
    try:
        info = resp.json() if resp.status_code == 200 else None
    except ValueError:
        info = None
    engine_id = info.get("engine_id") if isinstance(info, dict) else None
    backend.engine_id = engine_id if isinstance(engine_id, str) and engine_id else None
    return backend.engine_id


def refused_grant(response: Response) -> bool:
    """D answered 400 about the transfer parameters the router itself passed on (never the
    client's: the router sets them), e.g. a grant for an engine id D no longer has."""
    if response.status_code != 400:
        return False
    try:
        error = json.loads(bytes(response.body)).get("error")
    except (ValueError, AttributeError):
        return False
    return isinstance(error, dict) and error.get("param") == "kv_transfer_params"
