"""The base of every settings section: unknown keys refused, assignments validated.

Apart from :mod:`proxy.assembly.config` so that a feature can define its own section beside its code (its defaults once,
where it uses them) and :mod:`proxy.assembly.config` composes the sections without the feature importing it back.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict

from tiers.policies import POLICY_NAMES


class Section(BaseModel):
    """A settings section (``credits``, ``idempotency``, ...)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def _known_policy(name: str) -> str:
    if name not in POLICY_NAMES:
        raise ValueError(f"unknown eviction policy; allowed: {', '.join(POLICY_NAMES)}")
    return name


PolicyName = Annotated[str, AfterValidator(_known_policy)]
"""An eviction policy's name (:data:`tiers.policies.POLICY_NAMES`), as every tier's section takes it."""
