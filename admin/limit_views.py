"""Keys and limits as the admin API reads and shows them: a body's limits merged into stored ones, and the views of
keys and limits (budgets in credits)."""

from __future__ import annotations

import time
from dataclasses import asdict
from decimal import Decimal
from typing import Any

from admin.models import LimitsBody
from proxy.auth.keys import ApiKey
from proxy.core.handoffs import Limits
from proxy.credits.pricing import format_credits, to_micro

LIMIT_FIELDS = ("rpm_limit", "tpm_limit", "max_budget", "budget_duration")


def edited(current: Limits, body: LimitsBody, *, whole: bool, credits: bool) -> Limits:
    """``current`` changed by ``body`` (``whole``: a ``PUT`` or a creation, every field set; else a ``PATCH``: the
    fields it names); :class:`ValueError` for limits that cannot be kept (a budget without credits, a period without a
    budget)."""
    given = set(LIMIT_FIELDS) if whole else body.model_fields_set & set(LIMIT_FIELDS)
    budget: Decimal | None = body.max_budget
    values: dict[str, Any] = {name: getattr(current, name) for name in LIMIT_FIELDS}
    values.update({name: getattr(body, name) for name in given})
    if "max_budget" in given:
        values["max_budget"] = None if budget is None else to_micro(budget)
    limits = Limits(**values)
    if limits.max_budget is not None and not credits:
        raise ValueError("max_budget counts credits, and credits are not enabled on this proxy (credits.enabled)")
    if limits.budget_duration is not None and limits.max_budget is None:
        raise ValueError("budget_duration is the period of a max_budget: set one with it")
    return limits


def limits_view(limits: Limits) -> dict[str, Any]:
    """Limits as the admin API shows them (a budget in credits)."""
    budget = limits.max_budget
    return {"rpm_limit": limits.rpm_limit, "tpm_limit": limits.tpm_limit,
            "max_budget": None if budget is None else format_credits(budget),
            "budget_duration": limits.budget_duration}


def key_view(record: ApiKey) -> dict[str, Any]:
    """A key as the admin API shows it: ``active`` (not revoked) and ``expired`` (past ``expires_at``)."""
    return {**asdict(record), "limits": limits_view(record.limits), "active": record.active,
            "expired": record.expires_at is not None and record.expires_at <= time.time()}
