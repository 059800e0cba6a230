"""OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}` with a status.

Every failure the server answers goes through `APIError` (or one of the handlers below), so
clients always get the same shape: malformed JSON, wrong types (pydantic) and unsupported
or out-of-range values are 400 (never FastAPI's 422), an unknown model 404 (as OpenAI:
`model_not_found`), a missing or wrong API key 401, a draining server 503, an engine
failure 500. A decode engine whose pool cannot take a local request now answers 429 with the
code `LOCAL_ADMISSION_REFUSED`, which the router reads as "send it through a prefill engine"
(conditional disaggregation, docs/routing.md).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

LOCAL_ADMISSION_REFUSED = "local_admission_refused"

_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
}


class APIError(Exception):
    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


def error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param)


def validation_error(exc: ValidationError | RequestValidationError) -> APIError:
    """The first pydantic error, as a 400 naming its field."""
    errors = exc.errors()
    if not errors:
        return bad_request("invalid request body")
    first = errors[0]
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    if first.get("type") == "json_invalid":
        return bad_request(f"malformed JSON body: {first.get('msg')}")
    where = ".".join(loc)
    more = f" (and {len(errors) - 1} more errors)" if len(errors) > 1 else ""
    return bad_request(
        f"{where}: {first.get('msg')}{more}" if where else first["msg"], loc[0] if loc else None
    )


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_error(exc).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}"
        return APIError(exc.status_code, message).response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        return APIError(500, f"internal error: {type(exc).__name__}: {exc}").response()
