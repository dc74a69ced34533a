"""The outcome of a request on its way back: how the cache took part (:class:`CacheStatus`).

The outcome is carried by two typed slots of :class:`~proxy.core.context.RequestContext`: ``outcome`` (an
:class:`Outcome`: the :class:`CacheStatus`, the tier that held the answer and how it :class:`Matched`, set whole by
the stage that decided it) and ``charged`` (the micro-credits this request was charged, once settled with the
reply). ``X-Cache-Status`` and ``X-Cache-Tier`` are written from it in one place, :func:`add_headers`.
The stages that set them declare them in ``gives``; a stage that reads them on the way back declares them in
``reads`` (or ``reads_if_given``), checked at assembly (:func:`proxy.core.pipeline.check_slots`).

:class:`CacheStatus` is a ``StrEnum``: each member *is* its wire value, so the ``X-Cache-Status`` header, the
``cache_status`` metric label and the statistics read exactly the bare strings they always did. A header is given
``str(status)``, the plain string: the server formats each header into the response head, and formatting a ``str``
subclass goes through its ``__format__`` (about 1,500 instructions a header on Python 3.11), a plain string not.
On Python 3.11 reading a member through its class (``CacheStatus.HIT``) also costs about a thousand instructions
(``EnumType.__getattr__`` sends every lookup of a class attribute down the slow path): the paths measured by
``loadtest.bench instructions`` (a request no cache stage decides; with ``--hits``, an exact hit) read the members
they need once (a closure variable, a default argument) or test the sets below; elsewhere a status costs that once
where it is decided.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from enum import StrEnum
from typing import NamedTuple


class CacheStatus(StrEnum):
    """How the cache took part in answering a request (the ``X-Cache-Status`` header's values)."""

    HIT = "HIT"
    """Answered from a tier by the request's exact key (or, for items, every item was)."""
    SEMANTIC_HIT = "SEMANTIC_HIT"
    """Answered from a tier by an equivalent question (or, for searches, at least one nearby vector)."""
    MISS = "MISS"
    """Answered by the upstream (a coalesced follower too: it waited on another request's upstream call)."""
    REFRESH = "REFRESH"
    """Answered by the upstream because the request asked for a fresh answer; stored like a miss."""
    BYPASS = "BYPASS"
    """Not cacheable (the request's own cache control, or a bypass rule): forwarded, neither read nor stored."""
    STALE = "STALE"
    """The upstream failed and the last good answer was served past its lifetime (stale-if-error)."""
    ERROR = "ERROR"
    """The request was refused or failed before there was an answer (set by the route handler)."""
    NONE = "NONE"
    """No cache stage decided anything (a pass-through route): what metrics and statistics report for ``None``."""


HIT_STATUSES = frozenset({CacheStatus.HIT, CacheStatus.SEMANTIC_HIT})
"""Answered from a cache tier without the upstream."""
MISS_STATUSES = frozenset({CacheStatus.MISS, CacheStatus.REFRESH})
"""Looked up and answered by the upstream (what is stored, kept stale, learned from)."""
MICRO = 1_000_000
"""Micro-credits per credit: the unit of ``ctx.charged``."""
SEMANTIC_TIER = "l2"
"""The name semantic hits are priced under (``credits.hit_multipliers``), whichever tier held the answer: the
semantic tier decided the hit, the cold tier's question vectors only found it (``X-Cache-Tier`` still says where the
answer came from)."""
COALESCED = "coalesced"
"""The tier of a follower answered by an identical request's upstream call (a ``MISS``)."""


class Matched(StrEnum):
    """How a cached answer matched the request."""

    EXACT = "exact"
    """By the request's exact key (its final question folded, :func:`normalizer.canonical.fold_final_question`)."""
    SEMANTIC = "semantic"
    """By an equivalent question (the semantic tier decided, whichever tier held the answer)."""
    NEARBY = "nearby"
    """A vector search answered from a search with a nearby query vector (within the collection's tolerance)."""


_SEMANTIC, _EXACT, _HIT = Matched.SEMANTIC, Matched.EXACT, CacheStatus.HIT  # read once: see the module docstring


class Outcome(NamedTuple):
    """What the cache did for one request (``ctx.outcome``), set whole by the stage that decided it and read whole
    by pricing, metrics, statistics, logs and traces; :func:`add_headers` turns it into the response's headers."""

    status: CacheStatus
    tier: str | None = None
    """Where the answer was held (an answer tier's name, ``retrieval``, ``stale``, ``coalesced``); ``None``: the
    upstream answered all of it."""
    matched: Matched | None = None
    """How the cached answer (or, for items, the cached part) matched; ``None`` when nothing cached served it."""

    @property
    def priced_as(self) -> str | None:
        """The name the answer is priced under (``credits.hit_multipliers``): :data:`SEMANTIC_TIER` for a
        semantic hit wherever its answer was held, else the tier; ``None``: the upstream's full price."""
        return SEMANTIC_TIER if self.matched is _SEMANTIC else self.tier


def exact_hit(tier: str) -> Outcome:
    """The outcome of an answer found by the request's exact key in ``tier`` (the path of every exact hit: the
    members are read once, at import)."""
    return Outcome(_HIT, tier, _EXACT)


def add_headers(headers: MutableMapping[str, str], outcome: Outcome | None) -> None:
    """Write ``outcome`` into a response's headers: ``X-Cache-Status`` and, when a tier held (part of) the
    answer, ``X-Cache-Tier``. The one place these headers are written (the reply to the client, an idempotent
    call's kept answer)."""
    if outcome is None:
        return
    headers["X-Cache-Status"] = str(outcome.status)  # a plain str: see the module docstring
    if outcome.tier is not None:
        headers["X-Cache-Tier"] = outcome.tier
