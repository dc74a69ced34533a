"""``GET /`` on the data port without a Qdrant upstream: what this server is, and where its APIs, admin and docs are.

With a Qdrant upstream ``/`` is Qdrant's own (forwarded: qdrant-client reads the server version there when it
connects), so this answer only ever replaces a 502. It names no ``version`` field, so a Qdrant client pointed here
by mistake reports that it found no Qdrant version rather than an incompatible one.
"""

from __future__ import annotations

import orjson

from proxy.assembly.config import Settings
from proxy.assembly.routes.handler import Handler
from proxy.assembly.startup_report import http_url, version
from proxy.server.request import Request
from proxy.server.responder import Responder

_JSON = (("Content-Type", "application/json"),)


def about(settings: Settings) -> dict[str, object]:
    """The description ``GET /`` answers."""
    admin = settings.admin
    admin_url = http_url(admin.host, admin.port) if admin.enabled else None
    return {
        "service": "ragproxy",
        "release": version(),
        "what": "A transparent caching proxy for RAG applications: OpenAI-compatible LLM APIs and Qdrant REST, "
                "with exact, semantic and cold cache tiers, a vector-search cache, KV-aware routing and credits.",
        "openai_base_url": "/v1",
        "qdrant": "not configured: start with --qdrant-upstream URL to serve Qdrant REST here",
        "health": {"live": "/healthz", "ready": "/readyz"},
        "admin": None if admin_url is None else {"dashboard": f"{admin_url}/admin/ui",
                                                 "openapi": f"{admin_url}/admin/openapi.json"},
        "docs": "README.md and docs/ in the ragproxy source; `ragproxy demo` shows the tiers at work",
    }


def about_handler(settings: Settings) -> Handler:
    body = orjson.dumps(about(settings))

    async def handle(_: Request, out: Responder) -> None:
        out.send(200, _JSON, body)

    return handle
