"""LenientFakeLLM: the :class:`~upstream_doubles.llm_server.FakeLLM` reading requests the way common server stacks do,
so that a proxy relaying what it did not check shows it (``bench abuse``, the front-door tests).

Before routing, each request is read again, as gateways and frameworks in front of a real inference server read
it:

- the path is percent-decoded twice (a framework decoding again what its gateway decoded: ``%252e`` is ``.``),
  overlong UTF-8 is decoded as the character it spells (``%c0%ae`` is ``.``, as old Java and IIS decoders did),
  ``;`` path parameters are dropped from each segment (Tomcat, Spring: ``..;`` is ``..``) and dot segments are
  resolved;
- ``X-Original-URL`` or ``X-Rewrite-URL`` replaces the path (IIS URL Rewrite, Symfony, Laravel) and
  ``X-HTTP-Method-Override``, ``X-HTTP-Method`` or ``X-Method-Override`` the method (Google's APIs, Rails,
  Express's method-override);
- a JSON body is read whatever its ``Content-Type``, with ``NaN``/``Infinity``, lone surrogates, and the *first*
  value of a repeated key (what the proxy's parser reads as the last).

``log`` records each request as read (what the routes acted on); ``reread`` lists those read otherwise than sent,
as ``(method sent, target sent, method read, path read)``.
"""

from __future__ import annotations

import json
import posixpath
import re
from typing import Any
from urllib.parse import unquote_to_bytes

from aiohttp import web
from yarl import URL

from upstream_doubles.llm_server import FakeLLM
from upstream_doubles.served_app import Handler

OVERRIDE_PATH = ("X-Original-URL", "X-Rewrite-URL")
OVERRIDE_METHOD = ("X-HTTP-Method-Override", "X-HTTP-Method", "X-Method-Override")
_OVERLONG = re.compile(rb"[\xc0\xc1][\x80-\xbf]")


def _decode_leniently(text: str) -> str:
    """``text`` percent-decoded once, overlong two-byte sequences read as the ASCII character they spell."""
    raw = _OVERLONG.sub(lambda m: bytes([((m[0][0] & 0x1F) << 6) | (m[0][1] & 0x3F)]), unquote_to_bytes(text))
    return raw.decode("utf-8", "replace")


def lenient_path(target: str) -> str:
    """The path a lenient stack reads in a request target (see the module docstring)."""
    path = _decode_leniently(_decode_leniently(target.partition("?")[0]))
    path = "/".join(segment.split(";", 1)[0] for segment in path.split("/"))
    resolved = posixpath.normpath(path) if path else "/"
    return "/" + resolved.lstrip("/")


def lenient_json(raw: bytes) -> Any:
    """A JSON body read leniently: ``NaN``, lone surrogates and invalid UTF-8 accepted, a repeated key's first value
    kept."""

    def first_wins(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        kept: dict[str, Any] = {}
        for key, value in pairs:
            kept.setdefault(key, value)
        return kept

    return json.loads(raw.decode("utf-8", "surrogateescape"), object_pairs_hook=first_wins)


class LenientFakeLLM(FakeLLM):
    """A :class:`FakeLLM` that reads every request as lenient stacks do (see the module docstring)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.reread: list[tuple[str, str, str, str]] = []

    def build_app(self) -> web.Application:
        app = web.Application(middlewares=[self._read_leniently], client_max_size=256 * 1024 * 1024)
        self.add_routes(app)
        return app

    @web.middleware
    async def _read_leniently(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        override = next((request.headers[name] for name in OVERRIDE_PATH if name in request.headers), None)
        method = next((request.headers[name].upper() for name in OVERRIDE_METHOD if name in request.headers),
                      request.method)
        target = override or request.raw_path
        path = lenient_path(target)
        if (method, path) != (request.method, request.path):
            self.reread.append((request.method, request.raw_path, method, path))
            query = target.partition("?")[2] if override else request.query_string
            request = request.clone(method=method, rel_url=URL.build(path=path, query_string=query))
            match = await request.app.router.resolve(request)
            match.add_app(request.app)
            match.freeze()
            request._match_info = match  # what aiohttp's own dispatch does with a resolved route
            handler = match.handler
        return await self._log_middleware(request, handler)

    async def _json_body(self, request: web.Request) -> dict[str, Any] | web.Response:
        try:
            body = lenient_json(await request.read())
        except ValueError:
            return web.json_response({"error": {"message": "We could not parse the JSON body of your request.",
                                                "type": "invalid_request_error", "param": None, "code": None}},
                                     status=400)
        if not isinstance(body, dict):
            return web.json_response({"error": {"message": "The request body must be a JSON object.",
                                                "type": "invalid_request_error", "param": None, "code": None}},
                                     status=400)
        return body
