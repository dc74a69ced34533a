"""Admission/eviction policies behind ``tiers.policies.base.EvictionPolicy``; ``make_policy`` builds them.

Names: ``lru``, ``fifo``, ``s3fifo``, ``gdsf``, ``landlord``, ``bpcache`` (the default). Options go to the
policy's constructor: ``small_ratio`` (s3fifo, bpcache), ``promote_hits`` (s3fifo), ``unread_credit`` and
``ghost_ratio`` (bpcache).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tiers.policies.base import Decision, EvictionPolicy
from tiers.policies.bpcache import BPCachePolicy
from tiers.policies.fifo import FIFOPolicy
from tiers.policies.greedydual import GDSFPolicy, GreedyDualPolicy, LandlordPolicy
from tiers.policies.lru import LRUPolicy
from tiers.policies.s3fifo import S3FIFOPolicy

_FACTORIES: dict[str, Callable[..., EvictionPolicy]] = {
    "lru": LRUPolicy,
    "fifo": FIFOPolicy,
    "s3fifo": S3FIFOPolicy,
    "gdsf": GDSFPolicy,
    "landlord": LandlordPolicy,
    "bpcache": BPCachePolicy,
}

POLICY_NAMES: tuple[str, ...] = tuple(_FACTORIES)
DEFAULT_POLICY = "bpcache"


def make_policy(name: str, capacity: int, **options: Any) -> EvictionPolicy:
    """Build the policy called ``name`` for ``capacity`` bytes; ValueError names the allowed values."""
    factory = _FACTORIES.get(name)
    if factory is None:
        raise ValueError(f"unknown eviction policy {name!r}; allowed: {', '.join(POLICY_NAMES)}")
    try:
        return factory(capacity, **options)
    except TypeError as error:
        raise ValueError(f"invalid options for eviction policy {name!r}: {error}") from None


__all__ = [
    "DEFAULT_POLICY",
    "POLICY_NAMES",
    "BPCachePolicy",
    "Decision",
    "EvictionPolicy",
    "FIFOPolicy",
    "GDSFPolicy",
    "GreedyDualPolicy",
    "LRUPolicy",
    "LandlordPolicy",
    "S3FIFOPolicy",
    "make_policy",
]
