"""Stale-if-error (RFC 5861 §4) for stale-tolerant namespaces: on an upstream failure, answer the last good
answer to the same request even when its TTL has passed, and say so.

ONLY namespaces named in ``namespaces`` (configuration: a list of stale-tolerant namespaces) get this: serving an
old answer is a product decision per namespace, never a default.

Two parts:

- :class:`StaleStore` — pure, bounded, in-process: exact key → the last complete upstream answer
  (:class:`~tiers.entry.CachedResponse`), kept regardless of the tiers' TTLs for at most ``max_stale_s``. Bounded
  by ``max_entries`` and ``max_bytes`` (least recently written/served leaves first). The tiers cannot serve this
  role: their stores drop an entry once its TTL passes, which is exactly when stale-if-error is needed. Written by
  hand (an ``OrderedDict`` LRU) because it needs byte accounting and an injectable clock, in ~40 lines.
- :class:`StaleIfError` — the stage. On the way back it feeds the store from complete 2xx answers that came from
  upstream (``X-Cache-Status`` MISS/REFRESH), through the reply's finish callback, so an aborted stream is never
  kept. When the rest of the pipeline raises a 5xx :class:`~proxy.core.errors.ProxyError` (unreachable, reset, timeout,
  circuit open) or answers a status in ``on_status`` (default 500, 502, 503, 504), and the store holds an answer
  for the request's exact key (keys are tenant-scoped, and user-scoped in private namespaces, so this never
  crosses tenants nor, there, users) no older than ``max_stale_s``, it answers that instead: ``X-Cache-Status:
  STALE``, ``X-Cache-Tier: stale``, ``X-Cache-Stale: true``, ``Warning: 110 - "Response is Stale"`` and ``Age``.
  The replaced reply's finish callbacks still run (``ok=False``), so the forward stage releases its replica and
  nothing is stored or settled as complete. A request that asked for no cached answer (``no-cache``,
  ``no-store``, ``max-age``) is never served stale; neither is a stream that already started (its bytes are on
  the wire).

Wiring (``proxy/assembly/pipelines.py``, ``_caching``): right after ``Canonicalize`` and before ``StoreResponse``::

    ApplyCacheControl → Canonicalize → StaleIfError → StoreResponse → L1 → L3 → Coalesce → forward

with one ``StaleStore`` per process (on the Runtime) shared by the chat and completions stages.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Collection
from dataclasses import dataclass

from proxy.answers.replies import complete_body, hit_reply
from proxy.answers.settings import StaleSettings
from proxy.core.context import FinishCallback, Reply, RequestContext
from proxy.core.endpoints import Endpoint
from proxy.core.errors import ProxyError
from proxy.core.outcome import MISS_STATUSES, CacheStatus, Matched, Outcome
from proxy.core.pipeline import Next
from tiers.budgets import MemoryAccount
from tiers.entry import CachedResponse

_STALE = StaleSettings()  # the defaults, defined once there

log = logging.getLogger("ragproxy.stale")

STALE_TIER = "stale"
STALE_WARNING = '110 - "Response is Stale"'
DEFAULT_ERROR_STATUSES = frozenset({500, 502, 503, 504})
_ENTRY_OVERHEAD = 128  # bytes charged per entry on top of its body (key, header, bookkeeping)


@dataclass(frozen=True, slots=True)
class _Kept:
    stored: bytes
    """The entry's stored form: its size is what it holds (a decoded entry's meta, documents' evidence and all, is
    several times larger), decoded only when it is served."""
    kept_at: float
    size: int


class StaleStore:
    """Bounded LRU of the last good answer per exact key, kept past the tiers' TTLs (pure; no I/O)."""

    def __init__(self, *, max_entries: int = _STALE.max_entries, max_bytes: int = _STALE.max_bytes,
                 max_stale_s: float = _STALE.max_stale_s, clock: Callable[[], float] = time.monotonic) -> None:
        if max_entries < 1 or max_bytes < 1 or max_stale_s <= 0:
            raise ValueError("max_entries, max_bytes and max_stale_s must be positive")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.max_stale_s = max_stale_s
        self._clock = clock
        self._entries: OrderedDict[str, _Kept] = OrderedDict()
        self.bytes = 0
        self.served = 0
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._entries)

    def keep(self, key: str, entry: CachedResponse) -> bool:
        """Remember ``entry`` as the last good answer for ``key``; ``False`` when it alone exceeds the budget."""
        stored = entry.encode()
        size = len(stored) + len(key) + _ENTRY_OVERHEAD
        if size > self.max_bytes:
            return False
        self._drop(key)
        self._entries[key] = _Kept(stored, self._clock(), size)
        self.bytes += size
        while len(self._entries) > self.max_entries or self.bytes > self.max_bytes:
            oldest = next(iter(self._entries))
            self._drop(oldest)
            self.evicted += 1
        return True

    def get(self, key: str) -> CachedResponse | None:
        """The kept answer for ``key`` if it is at most ``max_stale_s`` old (it becomes the most recent)."""
        kept = self._entries.get(key)
        if kept is None:
            return None
        if self._clock() - kept.kept_at > self.max_stale_s:
            self._drop(key)
            return None
        self._entries.move_to_end(key)
        return CachedResponse.decode(kept.stored)

    def memory(self) -> list[MemoryAccount]:
        return [MemoryAccount("stale", self.bytes, self.max_bytes, len(self._entries), "cache.stale.max_bytes")]

    def _drop(self, key: str) -> None:
        kept = self._entries.pop(key, None)
        if kept is not None:
            self.bytes -= kept.size


class StaleIfError:
    """Serve the last good answer when the upstream fails, for stale-tolerant namespaces only."""

    name = "stale_if_error"
    needs = frozenset({"cache_key", "cache_policy"})
    gives = frozenset({"outcome", "entry"})
    reads = frozenset({"outcome"})

    def __init__(self, store: StaleStore, *, endpoint: Endpoint, namespaces: Collection[str],
                 on_status: Collection[int] = DEFAULT_ERROR_STATUSES) -> None:
        self.store = store
        self.endpoint = endpoint
        self.namespaces = frozenset(namespaces)
        self.on_status = frozenset(on_status)

    def _applies(self, ctx: RequestContext) -> str | None:
        """The exact key when this request may be fed/served stale, else ``None``."""
        key, policy = ctx.cache_key, ctx.cache_policy
        if key is None or policy is None or ctx.namespace not in self.namespaces:
            return None
        if not policy.may_read or not policy.may_store or policy.max_age is not None:
            return None
        return key

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        key = self._applies(ctx)
        if key is None:
            return await call_next(ctx)
        try:
            reply = await call_next(ctx)
        except ProxyError as exc:
            if exc.status < 500:
                raise
            stale = self._stale(ctx, key, f"{exc.status} {exc.code or exc.message}")
            if stale is None:
                raise
            return stale
        if reply.status in self.on_status:
            stale = self._stale(ctx, key, f"upstream status {reply.status}")
            if stale is not None:
                await _discard(reply)
                return stale
            return reply
        outcome = ctx.outcome
        if 200 <= reply.status < 300 and outcome is not None and outcome.status in MISS_STATUSES \
                and outcome.tier is None:
            reply.on_finish(self._keep(ctx, key))
        return reply

    def _stale(self, ctx: RequestContext, key: str, reason: str) -> Reply | None:
        entry = self.store.get(key)
        if entry is None:
            return None
        self.store.served += 1
        log.info("serving a stale answer for request %s (%s)", ctx.request_id, reason)
        return hit_reply(ctx, entry, Outcome(CacheStatus.STALE, STALE_TIER, Matched.EXACT),
                         extra={"X-Cache-Stale": "true", "Warning": STALE_WARNING})

    def _keep(self, ctx: RequestContext, key: str) -> FinishCallback:
        async def keep(reply: Reply, ok: bool, body: bytes) -> None:
            if not ok:
                return
            stored = complete_body(reply, body, self.endpoint)
            if stored is None:
                return
            model = (ctx.body or {}).get("model")
            self.store.keep(key, CachedResponse(body=stored.body, kind=self.endpoint.kind, meta=stored.meta,
                                                model=model if isinstance(model, str) else None))

        return keep


async def _discard(reply: Reply) -> None:
    """Drop a reply that will not be sent: close its stream, run its finish callbacks as failed."""
    if reply.chunks is not None:
        aclose = getattr(reply.chunks, "aclose", None)
        if aclose is not None:
            await aclose()
    await reply.finish(False, reply.body or b"")

