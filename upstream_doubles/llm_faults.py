"""Faults a test arms on :class:`upstream_doubles.llm_server.FakeLLM` for its next requests (pure, thread-safe).

Each armed fault applies to the next ``times`` model requests (``/v1/*`` except ``GET /v1/models``), in the
order armed; a request consumes at most one fault. Kinds:

- ``error``: answer ``status`` with an OpenAI-shaped error body (and optional headers such as
  ``Retry-After``);
- ``reset``: send ``after_chunks`` SSE events (non-streaming: the response headers only), then reset the TCP
  connection (RST, via SO_LINGER 0);
- ``hang``: never answer (until the client gives up or the server stops).

Note that the ``openai`` SDK retries 408/409/429/5xx and connection errors twice by default: tests that arm a
single fault should build their client with ``max_retries=0``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Fault:
    kind: str  # "error" | "reset" | "hang"
    status: int = 500
    message: str = "injected failure"
    error_type: str | None = None
    code: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    after_chunks: int = 0


@dataclass
class _Armed:
    fault: Fault
    left: int


class FaultPlan:
    """A queue of armed faults, each with a remaining count."""

    def __init__(self) -> None:
        self._armed: list[_Armed] = []
        self._lock = threading.Lock()

    def arm(self, fault: Fault, times: int = 1) -> None:
        with self._lock:
            self._armed.append(_Armed(fault, times))

    def fail_next(
        self,
        status: int,
        times: int = 1,
        *,
        message: str = "injected failure",
        error_type: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        """The next ``times`` requests answer ``status`` with an OpenAI error body."""
        self.arm(Fault("error", status, message, error_type, code, dict(headers or {})), times)

    def reset_after(self, chunks: int, times: int = 1) -> None:
        """The next ``times`` requests are reset after ``chunks`` SSE events."""
        self.arm(Fault("reset", after_chunks=chunks), times)

    def hang_next(self, times: int = 1) -> None:
        """The next ``times`` requests never answer."""
        self.arm(Fault("hang"), times)

    def take(self) -> Fault | None:
        """The fault for the request arriving now, if any (consumes one use)."""
        with self._lock:
            if not self._armed:
                return None
            entry = self._armed[0]
            entry.left -= 1
            if entry.left <= 0:
                self._armed.pop(0)
            return entry.fault

    def clear(self) -> None:
        with self._lock:
            self._armed.clear()

    @property
    def pending(self) -> int:
        """How many request uses are still armed."""
        with self._lock:
            return sum(entry.left for entry in self._armed)
