"""Admin errors: every failure answers ``{"error": {"code": ..., "message": ...}}`` with a fitting status (and the
router's own headers, such as the ``Allow`` of a 405).

Admin operations fail loudly: an unexpected exception is a 500 with its class name (never a traceback in the body,
but logged with one). A credit or key store that cannot be reached is a 503 with ``Retry-After``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import orjson
from aiohttp import web
from pydantic import ValidationError

from proxy.stores.unavailable import StoreUnavailable

log = logging.getLogger("ragproxy.admin")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_BODY_HEADERS = frozenset({"content-type", "content-length"})
"""Headers of a router error that describe its own body (replaced); the rest (``Allow`` of a 405) are kept."""


class AdminError(Exception):
    """An admin request answered with an error status."""

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}

    def response(self) -> web.Response:
        return error_response(self.status, self.code, self.message, self.headers)


def error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> web.Response:
    body = orjson.dumps({"error": {"code": code, "message": message}})
    return web.Response(status=status, body=body, content_type="application/json", headers=headers)


def validation_message(exc: ValidationError) -> str:
    """The first problem of a pydantic validation error, as one line naming the field."""
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"]) or "body"
    return f"{where}: {error['msg']}"


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Router errors, validation errors and anything unexpected become JSON errors."""
    try:
        return await handler(request)
    except AdminError as exc:
        return exc.response()
    except ValidationError as exc:
        return error_response(400, "invalid_request", validation_message(exc))
    except StoreUnavailable as exc:
        log.warning("admin request failed, store unavailable: %s %s: %s", request.method, request.path, exc)
        return error_response(503, "store_unavailable", str(exc), {"Retry-After": "5"})
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        kept = {name: value for name, value in exc.headers.items() if name.lower() not in _BODY_HEADERS}
        return error_response(exc.status, exc.reason.lower().replace(" ", "_"), exc.reason, kept)
    except Exception as exc:
        log.exception("admin request failed: %s %s", request.method, request.path)
        return error_response(500, "internal_error", f"admin operation failed ({exc.__class__.__name__})")
