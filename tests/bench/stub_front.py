"""A stub production router for `bench ab --front-cmd` tests: forwards to the first decode URL.

`stub_front.py --port P --decode URL [--decode URL2 ...] [--prefill URL ...]` proxies
`GET /v1/models` and `POST /v1/completions` (streamed back unchanged) to the first decode
engine, and answers `/cluster` with 404 as vllm-router does. Each request is logged on stdout.
"""

from __future__ import annotations

import argparse
import sys

from aiohttp import ClientSession, web


def make_app(target: str) -> web.Application:
    async def forward(request: web.Request) -> web.StreamResponse:
        print(f"stub front: {request.method} {request.path} -> {target}", flush=True)
        async with (
            ClientSession() as session,
            session.request(
                request.method,
                f"{target}{request.path}",
                data=await request.read(),
                headers={"content-type": "application/json"},
            ) as upstream,
        ):
            response = web.StreamResponse(status=upstream.status)
            response.content_type = upstream.content_type
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    app = web.Application()
    app.router.add_get("/v1/models", forward)
    app.router.add_post("/v1/completions", forward)
    return app


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--prefill", action="append", default=[])
    parser.add_argument("--decode", action="append", required=True)
    args = parser.parse_args()
    print(f"stub front: prefill {args.prefill}, decode {args.decode}", flush=True)
    web.run_app(make_app(args.decode[0]), host="127.0.0.1", port=args.port, print=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
