"""SGLang's bootstrap P/D mode is refused with a 400, never half-served.

SGLang's gateways (`sglang-router`, `smg`, `--pd-disaggregation`) send the *same* body to
the prefill and the decode engine at once, adding `bootstrap_host`, `bootstrap_port` and
`bootstrap_room`; SGLang's engines then pair up through a bootstrap server. relaykv engines
pair up through `kv_transfer_params` instead (vLLM's protocol, docs/pd.md), so served as
plain requests both engines would compute the whole request and no KV would move: twice the
work, silently. A request carrying any of those fields is therefore refused before anything
runs, on every engine whatever its role, naming the mode and what to use instead.

`refuse_sglang_bootstrap` is a FastAPI dependency of the generation routes (see
`relaykv.serve.app`): it reads the body (Starlette caches it for the handler) and only
parses it when the field names occur in it.
"""

from __future__ import annotations

import json

from fastapi import Request

from relaykv.api_errors import APIError

BOOTSTRAP_FIELDS = ("bootstrap_room", "bootstrap_host", "bootstrap_port")

MESSAGE = (
    "SGLang's bootstrap P/D mode ({fields} in the request, as sglang-router and smg send "
    "with --pd-disaggregation) is not supported: relaykv engines move KV through "
    "kv_transfer_params, so both engines would compute the whole request. Put vllm-router "
    "--vllm-pd-disaggregation or `relaykv router` in front of them instead (docs/pd.md)."
)


def bootstrap_fields(body: bytes) -> list[str]:
    """The SGLang bootstrap fields set (not null) at the top level of a JSON body."""
    if b"bootstrap_" not in body:
        return []
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return []  # the handler answers malformed JSON with its own 400
    if not isinstance(data, dict):
        return []
    return [name for name in BOOTSTRAP_FIELDS if data.get(name) is not None]


async def refuse_sglang_bootstrap(request: Request) -> None:
    found = bootstrap_fields(await request.body())
    if found:
        raise APIError(400, MESSAGE.format(fields="/".join(found)), found[0], "unsupported_pd_mode")
