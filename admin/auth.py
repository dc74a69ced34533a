"""Who may use the admin API: a Bearer token, compared in constant time.

Rules (also enforced at start-up by :meth:`proxy.assembly.config.AdminSettings.bind_problem`):

- a configured ``admin.token`` is always required (``Authorization: Bearer <token>``), whatever the bind;
- with no token, the API is open only when it listens on a loopback address (``127.0.0.0/8``, ``::1``,
  ``localhost``); the proxy refuses to start otherwise, and an app built anyway answers 401 to everything;
- ``/admin/ui`` (a static page holding no data) is served without a token so a browser can load it; the page asks
  for the token and sends it with every data request. ``/`` (a redirect to it) needs no token either.
"""

from __future__ import annotations

import hmac

from aiohttp import web

from admin.errors import Handler, error_response
from proxy.assembly.config import Settings
from proxy.core.loopback import is_loopback

PUBLIC_PATHS = frozenset({"/", "/admin/ui", "/admin/ui/"})


def token_matches(presented: str | None, expected: str) -> bool:
    """Constant-time comparison of the presented Bearer credential with the configured token."""
    return hmac.compare_digest((presented or "").encode(), expected.encode())


def bearer(header: str | None) -> str | None:
    scheme, _, value = (header or "").strip().partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def auth_middleware(settings: Settings) -> web.middleware:  # type: ignore[valid-type]
    """Require the admin token on every path but the dashboard page."""
    token = settings.admin.token.get_secret_value() if settings.admin.token is not None else None
    open_access = token is None and is_loopback(settings.admin.host)

    @web.middleware
    async def require_token(request: web.Request, handler: Handler) -> web.StreamResponse:
        if open_access or request.path in PUBLIC_PATHS:
            return await handler(request)
        if token is None:
            return error_response(401, "unauthorized", "admin API is not bound to loopback and has no token")
        if not token_matches(bearer(request.headers.get("Authorization")), token):
            return error_response(401, "unauthorized", "a valid admin Bearer token is required",
                                  {"WWW-Authenticate": 'Bearer realm="ragproxy-admin"'})
        return await handler(request)

    return require_token
