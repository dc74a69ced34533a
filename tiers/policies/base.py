"""The interface every admission/eviction policy implements.

A policy is a pure object: it never touches a store, a socket or the wall clock (time, where a policy needs
it, comes from an injected ``clock``). A store tells the policy what happened (an insert, a hit, a removal it
made for its own reasons such as TTL or invalidation) and the policy answers with decisions: whether a
newcomer is admitted and which resident keys must go to make room. The store carries the decisions out.

Capacity is in bytes (``size`` of an entry = bytes it occupies); ``cost`` is what a miss on the entry would
cost.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer to an insert: admitted or bypassed, and the keys evicted to make room."""

    admitted: bool
    evicted: tuple[str, ...] = field(default_factory=tuple)


class EvictionPolicy(Protocol):
    """Admission and eviction decisions for one bounded cache."""

    name: str
    capacity: int

    @property
    def used(self) -> int:
        """Bytes of the resident entries."""

    def __len__(self) -> int:
        """Number of resident entries."""

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is resident."""

    def insert(self, key: str, size: int, cost: float) -> Decision:
        """A new entry (or a new version of a resident one) wants in.

        A resident ``key`` is first forgotten (its old version goes whether or not the new one is admitted);
        ``Decision.evicted`` lists other keys that were resident and are no longer, never ``key`` itself.
        """

    def hit(self, key: str) -> None:
        """A resident entry was read."""

    def remove(self, key: str) -> None:
        """The store removed ``key`` on its own (TTL, invalidation); forget it. Unknown keys are ignored."""
