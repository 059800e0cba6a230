"""What the client asks a server before a run: `GET /v1/models`.

The first entry's `id` is the model to request (vLLM's rule). Optional extensions are read
when present: `vocab_size` (relaykv publishes it so random token ids stay in range),
`max_model_len`, and `owned_by` ("relaykv" means the server is relaykv).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiohttp

RELAYKV_OWNER = "relaykv"


class ServerError(RuntimeError):
    """The server could not be asked (unreachable, bad answer); CLI exit status 1."""


@dataclass(frozen=True, slots=True)
class ServedModel:
    id: str
    vocab_size: int | None = None
    max_model_len: int | None = None
    owned_by: str | None = None

    @property
    def is_relaykv(self) -> bool:
        return self.owned_by == RELAYKV_OWNER


def parse_models(body: Any) -> ServedModel:
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list) or not data or not isinstance(data[0], dict):
        raise ServerError("/v1/models lists no model")
    first = data[0]
    if not isinstance(first.get("id"), str):
        raise ServerError("/v1/models: the first model has no id")

    def int_or_none(value: Any) -> int | None:
        return value if isinstance(value, int) and value > 0 else None

    return ServedModel(
        id=first["id"],
        vocab_size=int_or_none(first.get("vocab_size")),
        max_model_len=int_or_none(first.get("max_model_len")),
        owned_by=first.get("owned_by") if isinstance(first.get("owned_by"), str) else None,
    )


async def fetch_json(url: str, headers: dict[str, str] | None = None, timeout_s: float = 30) -> Any:
    try:
        async with (
            aiohttp.ClientSession(trust_env=False) as session,
            session.get(
                url, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as response,
        ):
            if response.status != 200:
                raise ServerError(f"GET {url}: HTTP {response.status}")
            return await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise ServerError(f"GET {url} failed: {type(exc).__name__}: {exc}") from exc


async def fetch_served_model(base_url: str, headers: dict[str, str] | None = None) -> ServedModel:
    return parse_models(await fetch_json(f"{base_url.rstrip('/')}/v1/models", headers))
