"""The reply the pipeline's stages hand back to the client.

A :class:`Reply` is either complete (``body``) or streamed (``chunks``). Stages that need the whole body once the
client has it (store in a tier, settle credits) register a callback with :meth:`Reply.on_finish`; the route calls
:meth:`Reply.finish` after the last byte was written, with ``ok=False`` when the stream was aborted (client gone,
upstream reset), so nothing half-received is ever stored or billed as complete.

Work that needs neither the body nor any I/O (giving back a backend's in-flight count, timing the upstream) is
registered with :meth:`Reply.on_end` instead: a plain function, run inline when the transfer ends, before the
finish callbacks. A reply with only such work is sent without collecting its stream and without the task that
protects finish callbacks from a client hanging up (two event-loop turns per request).

The complete answer a finished reply carried (:class:`Complete`: a streamed one assembled from its events) is built
once, by the first finish callback that asks for it (:meth:`Reply.completed`), and shared by every other: the store,
stale-if-error, coalescing and the semantic tier all read the same one.

:func:`finish` runs a sent reply's finish callbacks so that a client hanging up cannot cancel them;
:func:`drain_finishers` waits for those still running at shutdown (the runtime calls it, the routes call
:func:`finish`: both import down to this module).

Apart from :mod:`proxy.core.context` so that the upstream client, which builds replies, needs nothing of the request
context (and the context can name the stages' slot types without an import cycle).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from multidict import CIMultiDict

log = logging.getLogger("ragproxy.respond")

FinishCallback = Callable[["Reply", bool, bytes], Awaitable[None]]
EndCallback = Callable[["Reply", bool], None]


@dataclass(frozen=True, slots=True)
class Complete:
    """An answer as it is stored: the JSON body, and how the upstream shaped it (entry metadata read by
    :func:`proxy.answers.replies.hit_reply`: ``json_type``/``sse_type``, the upstream's ``Content-Type`` when not the
    plain one; ``stream``, a chat stream's :class:`~proxy.core.sse.StreamShape`)."""

    body: bytes
    meta: dict[str, Any] = field(default_factory=dict)


Assemble = Callable[["Reply", bytes, str], "Complete | None"]
"""Builds the complete answer of a finished reply from the body the client received (and the events withheld from
it, :attr:`Reply.withheld`), read as one kind of request (``None``: not a usable answer)."""


@dataclass(slots=True)
class Reply:
    """A response on its way to the client."""

    status: int
    headers: CIMultiDict[str] = field(default_factory=CIMultiDict)
    body: bytes | None = None
    chunks: AsyncIterator[bytes] | None = None
    withheld: list[bytes] = field(default_factory=list)
    """Events of the upstream's stream kept from the client (the usage chunk the proxy asked for,
    :mod:`proxy.core.stream_usage`): part of the answer, not of what the client received."""
    _callbacks: list[FinishCallback] = field(default_factory=list)
    _enders: list[EndCallback] = field(default_factory=list)
    _completed: tuple[bytes, str, Complete | None] | None = None

    @property
    def streamed(self) -> bool:
        return self.chunks is not None

    @property
    def wants_body(self) -> bool:
        """Whether someone needs the full body at the end (so a stream must be collected while it passes)."""
        return bool(self._callbacks)

    def on_finish(self, callback: FinishCallback) -> None:
        """Call ``callback(reply, ok, body)`` once the client has received everything (or the transfer failed)."""
        self._callbacks.append(callback)

    def on_end(self, callback: EndCallback) -> None:
        """Call ``callback(reply, ok)`` inline once the transfer ended (before the finish callbacks)."""
        self._enders.append(callback)

    def completed(self, body: bytes, kind: str, assemble: Assemble) -> Complete | None:
        """The complete answer in ``body`` (what the client received), read as ``kind``'s: built by ``assemble``
        the first time a finish callback asks, the same one handed to every later reader of the same body."""
        memo = self._completed
        if memo is None or memo[0] is not body or memo[1] != kind:
            memo = self._completed = (body, kind, assemble(self, body, kind))
        return memo[2]

    def take_over(self, replaced: Reply) -> Reply:
        """This reply answers instead of ``replaced``: its finish work (releasing a replica, settling) moves here."""
        self._callbacks[:0] = replaced._callbacks
        self._enders[:0] = replaced._enders
        replaced._callbacks = []
        replaced._enders = []
        return self

    def end(self, ok: bool) -> None:
        """Run the end callbacks (once), in the order they were registered."""
        enders, self._enders = self._enders, []
        for callback in enders:
            callback(self, ok)

    async def finish(self, ok: bool, body: bytes) -> None:
        """Run the end callbacks, then the finish callbacks, innermost stage first (the order they were
        registered in)."""
        self.end(ok)
        for callback in self._callbacks:
            await callback(self, ok, body)


_unfinished: set[asyncio.Task[None]] = set()
"""Finish work of replies whose client hung up, still running: :func:`drain_finishers` waits for it at shutdown."""


async def _run_finish(reply: Reply, ok: bool, body: bytes) -> None:
    try:
        await reply.finish(ok, body)
    except Exception:  # a failing store or ledger write must not break the response already sent
        log.exception("finish callback failed")


async def finish(reply: Reply, ok: bool, body: bytes) -> None:
    """Run the finish callbacks to completion even if the client hangs up meanwhile (the handler is then
    cancelled): storing, indexing and settling what was sent must not depend on the client's patience."""
    reply.end(ok)
    if not reply.wants_body:
        return
    task = asyncio.ensure_future(_run_finish(reply, ok, body))
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        _unfinished.add(task)
        task.add_done_callback(_unfinished.discard)
        raise


async def drain_finishers(wait_s: float) -> None:
    """Wait (bounded) for finish work left running by clients that hung up; called at shutdown."""
    if _unfinished:
        await asyncio.wait(list(_unfinished), timeout=wait_s)
