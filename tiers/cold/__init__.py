"""L3 cold storage: a compressed, persistent, crash-safe byte store on local disk (see
:mod:`tiers.cold.store`)."""

from tiers.cold.database import ColdCounters, ColdEntry
from tiers.cold.store import DEFAULT_MAX_BYTES, ColdStore

__all__ = ["DEFAULT_MAX_BYTES", "ColdCounters", "ColdEntry", "ColdStore"]
