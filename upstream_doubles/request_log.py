"""What a test double received: every request's method, path, headers and body, and counts per path.

Tests assert on it ("exactly one upstream call", "header X was not forwarded"). Appends happen on the server's
event loop; reads may come from another thread (a sync test with the server in a background thread), so the
list is guarded by a lock."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import orjson
from multidict import CIMultiDict, CIMultiDictProxy


@dataclass(frozen=True)
class LoggedRequest:
    """One request as the double saw it (headers case-insensitive, as received)."""

    method: str
    path: str
    query: dict[str, str]
    headers: CIMultiDictProxy[str]
    body: bytes
    received_at: float = field(compare=False)

    def json(self) -> Any:
        """The body parsed as JSON, or ``None`` when it is empty or not JSON."""
        if not self.body:
            return None
        try:
            return orjson.loads(self.body)
        except orjson.JSONDecodeError:
            return None


class RequestLog:
    """Thread-safe, append-only record of requests, with per-path counts."""

    def __init__(self) -> None:
        self._entries: list[LoggedRequest] = []
        self._statuses: dict[int, int] = {}
        self._lock = threading.Lock()

    def append(self, entry: LoggedRequest) -> None:
        with self._lock:
            self._entries.append(entry)

    def answered(self, entry: LoggedRequest, status: int) -> None:
        """Record the status the double answered ``entry`` with (once its handler returned)."""
        with self._lock:
            self._statuses[id(entry)] = status

    def status(self, entry: LoggedRequest) -> int | None:
        """The status ``entry`` was answered with; ``None`` while (or if never) answered."""
        with self._lock:
            return self._statuses.get(id(entry))

    @property
    def entries(self) -> list[LoggedRequest]:
        """A snapshot of every request so far, oldest first."""
        with self._lock:
            return list(self._entries)

    def with_request_id(self, request_id: str) -> list[LoggedRequest]:
        """Requests carrying ``X-Request-ID: request_id``: a test's own, whatever else reached the double (the
        proxy's health probes, other tests' requests). There is no "last request": it may be anyone's."""
        return [e for e in self.entries if e.headers.get("X-Request-ID") == request_id]

    def for_path(self, path: str, method: str | None = None) -> list[LoggedRequest]:
        """Requests to exactly ``path`` (and ``method``, when given)."""
        return [e for e in self.entries if e.path == path and (method is None or e.method == method)]

    def count(self, path: str | None = None, method: str | None = None) -> int:
        """How many requests reached ``path`` (all paths when ``None``)."""
        if path is None:
            return len(self.entries)
        return len(self.for_path(path, method))

    def counts(self) -> dict[str, int]:
        """Requests per path."""
        result: dict[str, int] = {}
        for entry in self.entries:
            result[entry.path] = result.get(entry.path, 0) + 1
        return result

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._statuses.clear()


def frozen_headers(headers: CIMultiDictProxy[str]) -> CIMultiDictProxy[str]:
    """A copy of ``headers`` that outlives the request."""
    return CIMultiDictProxy(CIMultiDict(headers))
