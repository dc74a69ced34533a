"""The request pipeline: an ordered list of small stages, each wrapping the rest (an onion).

A stage is any object with a ``name`` and ``async __call__(ctx, call_next) -> Reply``. It may answer on its own
(a cache hit, an error), or call ``call_next(ctx)`` and work on the reply on its way back (store it, settle credits).
Work that needs the complete body of a streamed reply is registered with ``Reply.on_finish``.

Stages talk through the typed slots of :class:`~proxy.core.context.RequestContext` and the features' typed keys
(:class:`~proxy.core.context.Handoff`). Each declares ``needs`` (slots, by name, and keys it reads before calling
the rest) and ``gives`` (those it sets); building a :class:`Pipeline` fails when a stage needs a slot or key that no
earlier stage gives, so a consumer placed before its producer is caught at assembly.

The way back is declared the same way. A stage that reads a slot once the rest has answered (the outcome,
:mod:`proxy.core.outcome`: ``outcome``, ``charged``) declares it in ``reads`` when it cannot do its
work without it, and building fails unless a later stage (one that has answered by then) gives it; a read that
is meaningful when nothing set the slot (``None``: the upstream answered, nothing was cached) is declared in
``reads_if_given``, checked only for naming a real slot. Both are optional (most stages read nothing then).

The lists of stages for each kind of request are assembled in :mod:`proxy.assembly.pipelines` — the one place that
shows the
order of the whole system.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from proxy.core.context import SLOTS, Handoff, Reply, RequestContext

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

Next = Callable[[RequestContext], Awaitable[Reply]]
Named = str | Handoff[Any]
"""What ``needs``, ``gives``, ``reads`` and ``reads_if_given`` hold: a slot's name, or a feature's key."""


HANDLER_GIVES = frozenset({"request", "route", "request_id", "raw_body", "body", "proxy_fields", "written_body",
                           "upstream_path", "path_params", "method", "stream"})
"""The slots the route handler sets before the first stage runs."""


class Stage(Protocol):
    """One step of the pipeline (and, optionally, ``reads`` and ``reads_if_given``: what it reads on the way back;
    see the module docstring)."""

    name: str

    @property
    def needs(self) -> frozenset[Named]: ...

    @property
    def gives(self) -> frozenset[Named]: ...

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply: ...


NO_SLOTS: frozenset[Named] = frozenset()


def _names(named: Iterable[Named]) -> list[str]:
    return sorted(item if isinstance(item, str) else item.name for item in named)


def check_slots(stages: Iterable[Stage]) -> None:
    """``ValueError`` when a stage needs a slot or key no earlier stage gives, reads on the way back one no later
    stage gives, or names a slot the context lacks."""
    ordered = tuple(stages)
    given: set[Named] = set(HANDLER_GIVES)
    for index, stage in enumerate(ordered):
        reads: frozenset[Named] = getattr(stage, "reads", NO_SLOTS)
        reads_if_given: frozenset[Named] = getattr(stage, "reads_if_given", NO_SLOTS)
        unknown = {item for item in stage.needs | stage.gives | reads | reads_if_given
                   if isinstance(item, str)} - SLOTS
        if unknown:
            raise ValueError(f"stage {stage.name!r} names unknown context slots {sorted(unknown)}")
        missing = stage.needs - given
        if missing:
            raise ValueError(f"stage {stage.name!r} needs {_names(missing)}, which no earlier stage gives")
        given |= stage.gives
        if reads:
            unanswered = reads.difference(*(later.gives for later in ordered[index + 1:]))
            if unanswered:
                raise ValueError(f"stage {stage.name!r} reads {_names(unanswered)} on the way back, which no later "
                                 "stage gives")


class Pipeline:
    """Stages chained once at start-up; running a request is a chain of awaits."""

    def __init__(self, stages: Sequence[Stage], terminal: Next, *, tracer: Tracer | None = None) -> None:
        self.stages = tuple(stages)
        check_slots(self.stages)
        self._entry = terminal
        if tracer is not None:
            from proxy.core.tracing import traced_stage

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
