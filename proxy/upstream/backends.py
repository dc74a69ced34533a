"""The LLM replicas and what the proxy knows of their health.

Health is learnt two ways: passively (a connection refused marks a replica down at once) and actively (a background
probe of each replica's health path, its kind's (:mod:`proxy.kv.kinds`: ``/v1/models``), every ``interval`` seconds,
every ``down_interval`` seconds while the replica is down). The first probe that succeeds brings a down replica back
and half-opens its breaker, so the next request tries it at once instead of waiting out the breaker's open time:
recovery takes as long as the replica's restart. A probe that fails for want of a local resource (``EMFILE``) says
nothing about the replica and changes nothing. ``first_healthy`` is the default choice until the KV-aware router
picks replicas.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from proxy.upstream.client import UpstreamClient
from proxy.upstream.http1 import LocalResourceError
from proxy.upstream.settings import LLMBackend, Upstreams
from tiers.background import stop_task
from tiers.breaker import CircuitBreaker

_UPSTREAMS = Upstreams()  # the defaults, defined once there

HEALTH_PATH = "/v1/models"
"""What the health probe reads: the OpenAI route every kind of backend serves, so a gateway in front passes it too."""

log = logging.getLogger("ragproxy.backends")


@dataclass
class Backend:
    """One replica and its live state."""

    index: int
    config: LLMBackend
    healthy: bool = True
    in_flight: int = 0
    last_error: str | None = None
    checked_at: float = field(default=0.0)
    breaker: CircuitBreaker = field(default_factory=CircuitBreaker)
    url: str = field(init=False)
    label: str = field(init=False)
    """The name, or the URL without credentials (safe for logs and metrics)."""
    described: str = field(init=False, repr=False)
    """How error messages name it."""
    _auth: dict[str, str] = field(init=False, repr=False)

    def __post_init__(self) -> None:  # read once: the config of a replica does not change under it
        self.url = self.config.url
        self.label = self.config.label
        self.described = f"LLM backend {self.label}"
        key = self.config.api_key
        self._auth = {"Authorization": f"Bearer {key.get_secret_value()}"} if key is not None else {}

    def auth_headers(self) -> dict[str, str]:
        return self._auth


class BackendPool:
    """All configured replicas."""

    def __init__(self, configs: list[LLMBackend], *, breaker_failures: int = _UPSTREAMS.breaker_failures,
                 breaker_open_s: float = _UPSTREAMS.breaker_open_s) -> None:
        self.backends = [
            Backend(index=i, config=c,
                    breaker=CircuitBreaker(failures_to_open=breaker_failures, open_seconds=breaker_open_s))
            for i, c in enumerate(configs)
        ]
        self._probe_task: asyncio.Task[None] | None = None

    def first_healthy(self) -> Backend | None:
        """The first replica that is up and whose breaker lets a call through (``None``: all are failing)."""
        healthy = next((b for b in self.backends if b.healthy and b.breaker.allow()), None)
        return healthy or next((b for b in self.backends if b.breaker.allow()), None)

    def healthy_after(self, tried: set[int]) -> Backend | None:
        """The next healthy replica not tried yet (for the one safe retry: connection refused)."""
        return next((b for b in self.backends if b.healthy and b.index not in tried and b.breaker.allow()), None)

    def mark_down(self, backend: Backend, reason: str, *, warn: bool = True) -> None:
        if backend.healthy and warn:
            log.warning("backend %s marked down: %s", backend.label, reason)
        backend.healthy = False
        backend.last_error = reason

    async def _probe_one(self, client: UpstreamClient, backend: Backend, wait_s: float) -> None:
        try:
            answer = await client.fetch("GET", backend.url + HEALTH_PATH,
                                        headers=backend.auth_headers(),
                                        timeout_s=wait_s)
            ok, reason = answer.status < 500, f"status {answer.status}"
        except LocalResourceError as exc:
            log.warning("backend %s not probed: %s", backend.label, exc.strerror)
            return
        except (OSError, ValueError) as exc:
            ok, reason = False, exc.__class__.__name__
        first, backend.checked_at = backend.checked_at == 0.0, time.monotonic()
        if ok and not backend.healthy:
            log.info("backend %s is back", backend.label)
            backend.breaker.half_open()
        if ok:
            backend.healthy, backend.last_error = True, None
        else:  # a replica down from the start is reported by the start-up summary, not by a warning before it
            self.mark_down(backend, reason, warn=not first)

    def start(self, client: UpstreamClient, interval: float, down_interval: float) -> None:
        """Probe a replica every ``interval`` seconds, one that is down every ``down_interval`` seconds."""
        async def loop() -> None:
            while True:
                now = time.monotonic()
                due = [b for b in self.backends
                       if now - b.checked_at >= (interval if b.healthy else down_interval)]
                await asyncio.gather(*(self._probe_one(client, b, 2.0) for b in due))
                await asyncio.sleep(min(interval, down_interval))

        self._probe_task = asyncio.create_task(loop(), name="backend-probe")

    async def stop(self) -> None:
        if self._probe_task is not None:
            await stop_task(self._probe_task)
            self._probe_task = None
