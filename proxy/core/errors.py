"""Errors the proxy itself raises, rendered in the shape of the upstream the client thinks it is talking to.

OpenAI routes answer ``{"error": {"message", "type", "param", "code"}}``; Qdrant routes answer
``{"status": {"error": "..."}, "time": 0.0}``. A stage raises :class:`ProxyError`; the route renders it.
"""

from __future__ import annotations

from enum import Enum

import orjson

from proxy.server.responder import Responder


class Dialect(Enum):
    """Which upstream's error shape a route speaks."""

    OPENAI = "openai"
    QDRANT = "qdrant"


_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "insufficient_quota",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}


class ProxyError(Exception):
    """A request the proxy answers itself with an error status."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
        error_type: str | None = None,
    ) -> None:
        """``error_type``: the OpenAI ``type`` when the status's usual one is not what the upstream would say."""
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.headers = headers or {}
        self.error_type = error_type

    def body(self, dialect: Dialect) -> bytes:
        """The JSON body in ``dialect``'s shape."""
        if dialect is Dialect.QDRANT:
            return orjson.dumps({"status": {"error": self.message}, "time": 0.0})
        error = {
            "message": self.message,
            "type": self.error_type or _OPENAI_TYPES.get(self.status,
                                                         "invalid_request_error" if self.status < 500 else "api_error"),
            "param": self.param,
            "code": self.code,
        }
        return orjson.dumps({"error": error})

    def send(self, out: Responder, dialect: Dialect, request_id: str | None = None) -> None:
        """Answer with this error (nothing is sent when the response already started)."""
        if out.started:
            return
        headers = {**self.headers, "Content-Type": "application/json"}
        if request_id:
            headers["X-Request-ID"] = request_id
        out.send(self.status, headers.items(), self.body(dialect))
