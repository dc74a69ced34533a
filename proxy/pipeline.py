"""The request pipeline: an ordered list of small stages, each wrapping the rest (an onion).

A stage is any object with a ``name`` and ``async __call__(ctx, call_next) -> Reply``. It may answer on its own
(a cache hit, an error), or call ``call_next(ctx)`` and work on the reply on its way back (store it, settle credits).
Work that needs the complete body of a streamed reply is registered with ``Reply.on_finish``.

The lists of stages for each kind of request are assembled in :mod:`proxy.assembly` — the one place that shows the
order of the whole system.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Protocol

from proxy.context import Reply, RequestContext

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

Next = Callable[[RequestContext], Awaitable[Reply]]


class Stage(Protocol):
    """One step of the pipeline."""

    name: str

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply: ...


class Pipeline:
    """Stages chained once at start-up; running a request is a chain of awaits."""

    def __init__(self, stages: Sequence[Stage], terminal: Next, *, tracer: Tracer | None = None) -> None:
        self.stages = tuple(stages)
        self._entry = terminal
        if tracer is not None:
            from proxy.tracing import traced_stage

            self._entry = traced_stage(tracer, "forward", terminal)
        for stage in reversed(self.stages):
            self._entry = _bind(stage, self._entry)
            if tracer is not None:
                self._entry = traced_stage(tracer, stage.name, self._entry)

    @property
    def names(self) -> list[str]:
        return [stage.name for stage in self.stages]

    def __call__(self, ctx: RequestContext) -> Awaitable[Reply]:
        return self._entry(ctx)


def _bind(stage: Stage, call_next: Next) -> Next:
    """``stage`` with the rest of the chain bound: calling it makes the stage's own coroutine (no wrapper
    coroutine per stage and request)."""
    return partial(stage, call_next=call_next)
