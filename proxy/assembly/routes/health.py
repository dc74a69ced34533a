"""``/healthz`` (the process is alive) and ``/readyz`` (it can serve).

``/readyz`` answers 503 when the proxy is draining, when no LLM replica can take a call (each is down or its circuit
breaker is open), when the configured Qdrant does not answer or when the shared Redis lost its credits and keys
while the proxy ran (:mod:`proxy.stores.redis_wipe`). Every open breaker is listed under ``degraded``: a replica's
(unready only when no replica is left) and a cache tier's (never unready: requests go upstream around it).
"""

from __future__ import annotations

import orjson

from proxy.assembly.routes.handler import Handler
from proxy.assembly.runtime import Runtime
from proxy.server.request import Request
from proxy.server.responder import Responder
from tiers.breaker import BreakerState

_JSON = (("Content-Type", "application/json"),)


def health_handlers(rt: Runtime) -> tuple[Handler, Handler]:
    """``(healthz, readyz)``."""

    async def healthz(_: Request, out: Responder) -> None:
        out.send(200, _JSON, b'{"status":"ok"}')

    async def readyz(_: Request, out: Responder) -> None:
        checks: dict[str, str] = {}
        if rt.draining:
            checks["server"] = "draining"
        backends = rt.backends.backends
        if any(b.healthy and b.breaker.state is not BreakerState.OPEN for b in backends):
            checks["llm"] = "ok"
        else:
            checks["llm"] = "no healthy replica" if not any(b.healthy for b in backends) else "breaker open"
        if rt.credits.wipe is not None:
            checks["redis"] = "lost its data (credits in outage mode)" if rt.credits.wipe.wiped else "ok"
        qdrant_url = rt.settings.upstreams.qdrant.url
        if qdrant_url is not None:
            try:
                answer = await rt.client.fetch("GET", qdrant_url + "/readyz", timeout_s=1.0)
                checks["qdrant"] = "ok" if answer.status < 500 else f"status {answer.status}"
            except (OSError, ValueError) as exc:
                checks["qdrant"] = f"unreachable ({exc.__class__.__name__})"
        degraded = {f"llm {b.label}": "breaker open" for b in backends if b.breaker.state is BreakerState.OPEN}
        degraded.update({tier.name: "breaker open" for tier in rt.tiers.answers
                         if tier.breaker.state is BreakerState.OPEN})
        ready = all(value == "ok" for value in checks.values())
        out.send(200 if ready else 503, _JSON,
                 orjson.dumps({"status": "ready" if ready else "not ready", "checks": checks,
                               **({"degraded": degraded} if degraded else {})}))

    return healthz, readyz
