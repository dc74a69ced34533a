"""Values the core names: the request's trace (``ctx.trace``), and the limits vocabulary that keys, rate limits
and the admin API share (:class:`Limits`, :class:`Scope`, :class:`Quota`: what identify hands to rate_limits).

What a feature hands to later stages is typed in the feature, beside its :class:`~proxy.core.context.Handoff` key.
"""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry.context import Context
from opentelemetry.trace import Span


@dataclass(frozen=True, slots=True)
class RequestTrace:
    """The request's span (``ctx.trace``) and the context its stage spans (and the forwarded ``traceparent``)
    descend from."""

    span: Span
    context: Context


@dataclass(frozen=True, slots=True)
class Limits:
    """What one key, user or tenant may use (set through the admin API; :mod:`proxy.rate_limits.decisions`);
    ``None``: no limit of that kind."""

    rpm_limit: int | None = None
    """Requests per minute."""
    tpm_limit: int | None = None
    """Tokens per minute (prompt and completion tokens the upstream processed)."""
    max_budget: int | None = None
    """Micro-credits that may be charged per ``budget_duration`` (in all, without one)."""
    budget_duration: str | None = None
    """The budget's period: ``<n>s``, ``<n>m``, ``<n>h``, ``<n>d`` or ``<n>mo`` (fixed windows, UTC)."""

    @property
    def limited(self) -> bool:
        return self.rpm_limit is not None or self.tpm_limit is not None or self.max_budget is not None


NO_LIMITS = Limits()
"""Limits that limit nothing."""


@dataclass(frozen=True, slots=True)
class Scope:
    """A key, user or tenant and its limits: ``kind`` is ``key``, ``user`` or ``tenant``."""

    kind: str
    name: str
    limits: Limits

    @property
    def id(self) -> str:
        """``<kind>:<name>``: what its counters are kept under."""
        return f"{self.kind}:{self.name}"


@dataclass(frozen=True, slots=True)
class Quota:
    """The limited scopes a request runs under (:data:`proxy.auth.identify.QUOTA`, given by identify): its key's,
    its user's, its tenant's, those with a limit only."""

    scopes: tuple[Scope, ...]
