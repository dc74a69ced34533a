"""The base of every settings section: unknown keys refused, assignments validated.

Apart from :mod:`proxy.assembly.config` so that a feature can define its own section beside its code (its defaults once,
where it uses them) and :mod:`proxy.assembly.config` composes the sections without the feature importing it back.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """A settings section (``credits``, ``idempotency``, ...)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
