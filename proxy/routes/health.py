"""``/healthz`` (the process is alive) and ``/readyz`` (it can serve: not draining, an LLM replica and Qdrant up)."""

from __future__ import annotations

import aiohttp
import orjson

from proxy.routes.handler import Handler
from proxy.runtime import Runtime
from proxy.server.request import Request
from proxy.server.responder import Responder

_JSON = (("Content-Type", "application/json"),)


def health_handlers(rt: Runtime) -> tuple[Handler, Handler]:
    """``(healthz, readyz)``."""

    async def healthz(_: Request, out: Responder) -> None:
        out.send(200, _JSON, b'{"status":"ok"}')

    async def readyz(_: Request, out: Responder) -> None:
        checks: dict[str, str] = {}
        if rt.draining:
            checks["server"] = "draining"
        healthy = [b.label for b in rt.backends.backends if b.healthy]
        checks["llm"] = "ok" if healthy else "no healthy replica"
        qdrant_url = rt.settings.upstreams.qdrant.url
        if qdrant_url is not None:
            try:
                async with rt.client.session.get(
                    qdrant_url + "/readyz", timeout=aiohttp.ClientTimeout(total=1.0)
                ) as response:
                    checks["qdrant"] = "ok" if response.status < 500 else f"status {response.status}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                checks["qdrant"] = f"unreachable ({exc.__class__.__name__})"
        ready = all(value == "ok" for value in checks.values())
        out.send(200 if ready else 503, _JSON,
                 orjson.dumps({"status": "ready" if ready else "not ready", "checks": checks}))

    return healthz, readyz
