"""Pure work that grows with a request's items, written so that its caller may pause between items.

A :data:`Steps` is a generator that does one item per step (each ``yield`` is a point where the caller may pause)
and returns its result. :func:`at_once` runs it in one go; the proxy runs it in slices between which its event loop
serves other requests (:func:`proxy.core.pacing.finish`).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TypeVar

T = TypeVar("T")

Steps = Generator[None, None, T]
"""Work done one item per step; its result is the generator's return value."""


def at_once(steps: Steps[T]) -> T:
    """The result of ``steps``, run without pausing."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
