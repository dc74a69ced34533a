"""Pipeline stages of the KV layer: ``Shape`` (documents, per-replica order) and ``Route`` (replica, hints).

Order in the pipeline: ``Shape`` then ``Route``, just before forward, in the chat and the Responses pipelines. The
document order that reuses the most KV depends on the replica, and the best replica depends on the order, so the
work is split this way:

* :class:`Shape` builds the request's :class:`~normalizer.prompt_plan.PromptPlan` from the documents
  :class:`~proxy.core.prompt.ReadPrompt` read (``ctx.prompt``: structured documents to render, or registered
  documents recognised in the prompt) and, for every replica, the document order of the namespace's policy and
  the tokens that replica probably has cached for it: :data:`~proxy.kv.handoffs.SHAPED` (:class:`ShapedRequest`).
  It also counts document popularity (the canonical order of ``reuse``).
* :class:`Route` asks the :class:`~proxy.kv.router.Router` for a replica (429 with ``Retry-After`` and code
  :data:`SLO_AT_ARRIVAL` when no replica can meet the TTFT SLO), patches the body with that replica's order and
  hints (``ctx.patch``), gives :data:`~proxy.upstream.forward.DESTINATION` (:class:`RoutedRequest`: the replica's
  index, which the forward stage sends to, and the hint headers for the upstream request), records the path in
  the replica's knowledge tree, waits for a concurrency slot (cache-aware order; 429 when the wait exceeds the
  queue's bound, or — with a TTFT SLO, code :data:`SLO_AFTER_WAIT` — once the request can no longer start in
  time); as the request starts
  (:meth:`Route.start`), a llama.cpp replica's slot is chosen (pinned with ``id_slot`` where the table says so),
  its slot table follows the server's slot and prompt-cache moves, and the tree forgets what the server truncated
  without saving it (:meth:`~proxy.kv.hints.SlotTable.assign`); it calls the rest of the
  pipeline, and when the reply is finished reads what the backend reported as cached (converted from the
  backend's tokens into the tree's estimates with the prompt's reported length) to correct the tree and refit
  the prefill model (with the prefill time only when that prefill ran alone on its replica: one slowed by
  another's says little about its own cost; replicas not fitted yet take the others' fit), tells the router when
  the first token came (a reply not streamed arrives whole: the backend's reported decode time is taken off),
  and frees the slot. A request refused after routing is taken back out of the tree.

For llama.cpp replicas whose ``backend_objects`` entry has a ``url``, :class:`Route` reads ``GET /slots`` in the
background from the first request on (:mod:`proxy.kv.discovery`): the real number of slots (the most requests
in flight) and KV capacity.

Response headers for the client, only when ``expose_headers`` is set (``routing.expose_headers``):
``X-RagProxy-Replica``, ``X-RagProxy-Cached-Tokens-Estimate``. They are off by default because the knowledge
tree is shared by every tenant of a replica: the estimate would tell a client whether anyone recently sent the
same system prompt and documents.

Isolation hints follow the cache scope: ``cache_salt`` is per tenant, and per user of a private namespace
(``ctx.user_scope``, set by :class:`~proxy.answers.cache_policy.Canonicalize`).

A plain prompt (no documents) keeps the client's body bytes unless a hint must go into the body: re-rendering
and re-serializing an unchanged body would only cost time on the hot path.

Both stages serve chat as they are; another endpoint's pipeline runs them through :meth:`Shape.serving` and
:meth:`Route.serving` (one state, shared by every endpoint), and the endpoint (:mod:`proxy.core.endpoints`) plans its
requests. Responses requests are planned from their chat view (:func:`~proxy.core.endpoints.plan_stateless_response`)
and forwarded as the client wrote them (:attr:`~proxy.core.endpoints.Endpoint.forwarded_as_sent`), plus body hints: the
documents keep the order sent (the ``preserve`` policy whatever the namespace's), so the path in the tree is the
order the backend saw. The backend's report is read from the response object's ``usage``, or from the
``response.completed`` event's.
A request building on state kept on one replica (:func:`normalizer.responses.one_replica_reason`) is not routed:
one continuing a stored response is pinned to the replica that made it (:data:`~proxy.upstream.forward.PINNED`,
:mod:`proxy.stored.stages`), the others go to the first healthy replica. New stored responses are routed
like any request: the proxy records which replica made each.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from normalizer.prompt_plan import Segment
from proxy.core.context import Reply, RequestContext
from proxy.core.endpoints import CHAT, Endpoint
from proxy.core.errors import ProxyError
from proxy.core.pipeline import Named, Next
from proxy.kv.admission_queue import AdmissionQueue, DeadlineExceeded
from proxy.kv.discovery import apply_slots, read_slots
from proxy.kv.handoffs import SHAPED, ReplicaOrder, RoutedRequest, ShapedRequest
from proxy.kv.hints import SlotTable, prefix_hashes, reply_objects, reports_cache
from proxy.kv.kinds import BackendKind, build_hints
from proxy.kv.order import OrderPolicy, Popularity, order_documents, shift_reusable_tokens
from proxy.kv.prefill import PrefillModel, share_fits
from proxy.kv.router import Candidate, Reject, Router
from proxy.kv.settings import RoutingSettings
from proxy.kv.tree import KnowledgeTree, Match
from proxy.upstream.client import UpstreamClient
from proxy.upstream.forward import DESTINATION

_ROUTING = RoutingSettings()  # the defaults, defined once there

SLO_AT_ARRIVAL = "ttft_slo"
"""The error ``code`` of a 429 at arrival: no replica is expected to start the request within the TTFT SLO."""
SLO_AFTER_WAIT = "ttft_slo_queued"
"""The error ``code`` of a 429 after waiting: the request waited in a replica's queue until it could no longer
start within the TTFT SLO."""


class EndpointStage(partial[Coroutine[Any, Any, Reply]]):
    """A KV stage as one endpoint's pipeline runs it: the stage's ``run`` with the endpoint bound (a partial, so
    a request costs no wrapper frame), the stage's state shared by every endpoint."""

    name: str
    needs: frozenset[Named]
    gives: frozenset[Named]
    endpoint: Endpoint

    def __new__(cls, stage: Shape | Route, endpoint: Endpoint) -> EndpointStage:
        bound = super().__new__(cls, stage.run, endpoint)  # positional: no keyword merging per request
        bound.name, bound.needs, bound.gives, bound.endpoint = stage.name, stage.needs, stage.gives, endpoint
        return bound


class PrefixBoard(Protocol):
    """Prefix summaries shared between proxy replicas (``proxy.kv.prefix_board.PrefixSummaryBoard``)."""

    def record(self, backend: str, prefixes: Iterable[tuple[str, int]]) -> None: ...

    def cached_tokens(self, backend: str, hashes: Sequence[str]) -> int: ...


def _alone() -> int:
    return 1


@dataclass(frozen=True, slots=True)
class SharedPrefixes:
    """The board, the backend label of each replica (by index), and how many proxies send to the replicas (the
    live members of the shared-mode bus, this one included): each admits its share of a replica's slots."""

    board: PrefixBoard
    labels: Sequence[str]
    proxies: Callable[[], int] = _alone

    @staticmethod
    def hashes(path: Sequence[Segment]) -> list[str]:
        """Cumulative hashes of a tree path, one per prefix (the board's keys)."""
        return prefix_hashes([segment.key for segment in path])


@dataclass(slots=True)
class Replica:
    """One backend replica as the KV layer sees it."""

    index: int
    kind: BackendKind
    tree: KnowledgeTree
    prefill: PrefillModel
    queue: AdmissionQueue
    slots: SlotTable | None = None
    """llama.cpp only: what each server slot last held (for ``id_slot``)."""


class Shape:
    """Documents of the prompt and, per replica, their order and probably-cached tokens.

    ``default_policy``: the order of a namespace without one in ``policies`` (``routing.order``, whose default the
    settings hold); ``policies``: per namespace (``routing.namespace_orders``)."""

    name = "shape"
    needs = frozenset({"prompt"})
    gives = frozenset({SHAPED})

    def __init__(
        self,
        replicas: Sequence[Replica],
        *,
        default_policy: OrderPolicy,
        policies: Mapping[str, OrderPolicy] | None = None,
        chars_per_token: float = 4.0,
        popularity: Popularity | None = None,
    ) -> None:
        self.replicas = list(replicas)
        self.policies = dict(policies or {})
        self.default_policy = default_policy
        self.chars_per_token = chars_per_token
        self.popularity = popularity if popularity is not None else Popularity()
        self.shared: SharedPrefixes | None = None

    def serving(self, endpoint: Endpoint) -> EndpointStage:
        """This stage in ``endpoint``'s pipeline."""
        return EndpointStage(self, endpoint)

    def shape(self, ctx: RequestContext, endpoint: Endpoint = CHAT) -> None:
        """The pure part: :data:`SHAPED`, the plan and the per-replica orders."""
        if ctx.body is None or ctx.prompt is None:
            return
        plan = endpoint.plan(ctx.body, ctx.prompt, chars_per_token=self.chars_per_token)
        if plan is None:
            return
        # a body forwarded as sent keeps its documents in the order sent (preserve)
        policy = OrderPolicy.PRESERVE if endpoint.forwarded_as_sent else \
            self.policies.get(ctx.namespace, self.default_policy)
        orders = []
        for replica in self.replicas:
            order = order_documents(
                policy, plan.prefix, plan.documents, replica.tree, popularity=self.popularity
            ) if plan.documents else []
            path = plan.path(order)
            if not path:  # a one-message prompt: nothing before the question to find cached
                orders.append(ReplicaOrder(replica.index, (), 0))
                continue
            if _shifts(replica, policy):
                cached = shift_reusable_tokens(replica.tree, path)
            else:
                cached = replica.tree.match(path).tokens
            if replica.slots is not None and not replica.slots.prompt_cache:
                cached = min(cached, replica.slots.best(path)[1])  # one slot's prompt is all a request reuses
            if self.shared is not None:  # what other proxy replicas sent to this backend counts too
                cached = max(cached, self.shared.board.cached_tokens(self.shared.labels[replica.index],
                                                                     SharedPrefixes.hashes(path)))
            orders.append(ReplicaOrder(replica.index, tuple(order), cached))
        if plan.documents:
            self.popularity.observe([d.key for d in plan.documents])
        ctx.handoffs[SHAPED] = ShapedRequest(plan, policy, orders)

    def __call__(self, ctx: RequestContext, call_next: Next) -> Coroutine[Any, Any, Reply]:
        return self.run(CHAT, ctx, call_next)

    async def run(self, endpoint: Endpoint, ctx: RequestContext, call_next: Next) -> Reply:
        """The stage for ``endpoint``'s requests."""
        self.shape(ctx, endpoint)
        return await call_next(ctx)


class Route:
    """Replica choice by estimated TTFT, hints, concurrency slot, and tree correction from the reply."""

    name = "route"
    needs = frozenset({SHAPED})
    gives: frozenset[Named] = frozenset({DESTINATION, "reported_cached_tokens"})

    def __init__(
        self,
        replicas: Sequence[Replica],
        router: Router,
        *,
        salt_secret: str = "",
        backend_objects: Sequence[Any] | None = None,
        expose_headers: bool = False,
        shift_min_tokens: int = _ROUTING.shift_min_tokens,
        client: UpstreamClient | None = None,
    ) -> None:
        self.expose_headers = expose_headers
        self.shift_min_tokens = shift_min_tokens
        if len(replicas) != len(router.loads):
            raise ValueError("the router must know every replica")
        if backend_objects is not None and len(backend_objects) != len(replicas):
            raise ValueError("one backend object per replica")
        self.backend_objects = list(backend_objects) if backend_objects is not None else None
        self._undiscovered = {r.index for r in replicas if r.kind.tracks_slots and r.slots is not None}
        self._next_discovery = 0.0
        self.client = client  # reads /slots (discovery is off without one)
        self._discovery: asyncio.Task[None] | None = None
        self.shared: SharedPrefixes | None = None
        self._proxies = 1
        self.replicas = list(replicas)
        self.router = router
        self._tickets = itertools.count()
        self._unfitted = len(self.replicas) > 1
        """Whether some replica's prefill model may still lack its own fit (:func:`~proxy.kv.prefill.share_fits`)."""
        self.salt_secret = salt_secret
        only = self.replicas[0]
        self._fixed = (len(self.replicas) == 1 and not router.tracks_load and only.slots is None
                       and not build_hints(only.kind, (), tenant="").body and not expose_headers)
        """Whether a prompt without a prefix has a known route (:meth:`_fixed_route`)."""

    def serving(self, endpoint: Endpoint) -> EndpointStage:
        """This stage in ``endpoint``'s pipeline."""
        return EndpointStage(self, endpoint)

    def follow_proxies(self, proxies: int) -> None:
        """With ``proxies`` proxies (at least one) sending to the same replicas, admit this one's share of each
        replica's slots (:func:`~proxy.kv.admission_queue.slot_share`; docs/scale-out.md)."""
        proxies = max(1, proxies)
        if proxies != self._proxies:
            self._proxies = proxies
            for replica in self.replicas:
                replica.queue.share(proxies=proxies)

    def route(self, ctx: RequestContext, endpoint: Endpoint = CHAT) -> RoutedRequest | None:
        """The pure part: choose the replica, patch the body sent upstream, attach hints. ``None`` without a plan."""
        shaped = ctx.handoffs.get(SHAPED)
        if shaped is None or not shaped.orders:
            return None
        plan, orders = shaped.plan, shaped.orders
        if self._fixed and not plan.prefix.tokens and not plan.documents and self.shared is None:
            return self._fixed_route(ctx, plan.total_tokens(()))
        totals = [plan.total_tokens(o.order) for o in orders]  # an order's rank hint counts in its length
        decision = self.router.choose(
            [Candidate(o.replica, o.cached_tokens, total) for o, total in zip(orders, totals, strict=True)])
        if isinstance(decision, Reject):
            raise ProxyError(
                429,
                f"no backend can meet the time-to-first-token objective (best estimate "
                f"{decision.best_estimate_s:.1f}s)",
                code=SLO_AT_ARRIVAL,
                headers={"Retry-After": str(decision.retry_after_s)},
            )
        replica = self.replicas[decision.replica]
        order = orders[decision.replica].order  # Shape lists every replica, in index order
        path = tuple(plan.path(order))
        shifted = _shifts(replica, shaped.policy)
        hints = build_hints(
            replica.kind,
            path,
            document_keys=[s.key for s in order],
            tenant=f"{ctx.tenant}~{ctx.user_scope}" if ctx.user_scope is not None else ctx.tenant,
            salt_secret=self.salt_secret,
            shift_min_tokens=self.shift_min_tokens if shifted else 0,
            responses=endpoint.forwarded_as_sent,
        )
        if plan.rewrites:
            messages = plan.render_messages(order)
            ctx.patch("route.order", lambda sent: {**sent, "messages": messages, **hints.body})
        elif hints.body:  # a plain prompt or a Responses body is forwarded as the client sent it, plus body hints
            ctx.patch("route.hints", lambda sent: {**sent, **hints.body})
        if self.expose_headers:
            ctx.response_headers["X-RagProxy-Replica"] = str(decision.replica)
            ctx.response_headers["X-RagProxy-Cached-Tokens-Estimate"] = str(decision.cached_tokens)
        predicted = replica.tree.insert(path, in_flight=True)
        if self.shared is not None:
            tokens, prefixes = 0, []
            for segment, digest in zip(path, SharedPrefixes.hashes(path), strict=True):
                tokens += segment.tokens
                prefixes.append((digest, tokens))
            self.shared.board.record(self.shared.labels[decision.replica], prefixes)
        routed = RoutedRequest(
            decision.replica, path, predicted, None, decision.estimated_ttft_s, decision.start_deadline,
            totals[decision.replica],
            None, shifted, hints.headers or None, ticket=str(next(self._tickets)),
        )
        ctx.handoffs[DESTINATION] = routed
        self.router.admitted(routed.ticket, decision)
        return routed

    def start(self, ctx: RequestContext, routed: RoutedRequest, slots: SlotTable) -> None:
        """Choose the llama.cpp slot as the request leaves the queue, which is when the server chooses too: the
        queue lets no more requests in flight than the server has slots, so the table's idle slots are the
        server's (chosen at routing time, under load, the slot was a guess among busy ones). What the server is
        expected to reuse is judged now as well: what the table says the server reuses in that slot (its prefix, or
        the prompt it restores from its cache), within the tree's match after the requests that started meanwhile
        (the tree also knows what reports corrected). Pins the slot when the table says so, and makes the tree
        forget what this start truncates without saving (:meth:`SlotTable.assign`)."""
        replica = self.replicas[routed.replica]
        cached = replica.tree.match(routed.path)
        choice = slots.choose(routed.path, routed.total_tokens, value=replica.tree.reuse_value,
                              cached_tokens=cached.tokens)
        routed.slot = choice.slot
        routed.expected = _prefix_match(routed.path, min(cached.tokens, choice.reused))
        if choice.pin:
            pin = replica.kind.slot_hint(choice.slot)
            ctx.patch("route.slot", lambda sent: {**sent, **pin})
        lost = slots.assign(choice.slot, routed.path, routed.total_tokens)
        if lost is not None:  # truncated in the slot the server reuses, and saved nowhere
            replica.tree.forget(lost.path, lost.kept_tokens)

    def _fixed_route(self, ctx: RequestContext, total: int) -> RoutedRequest:
        """The route when nothing is left to decide: one replica that is neither compared, refused nor given hints
        for a prompt without a prefix (a single message), and nothing for its tree. Same result as the full path
        (which the tests check), without the router's and the hints' work on the hot path."""
        routed = RoutedRequest(0, (), Match(0, 0), None, self.replicas[0].prefill.seconds(total), None, total,
                               ticket=str(next(self._tickets)))
        ctx.handoffs[DESTINATION] = routed
        return routed

    def settle(self, ctx: RequestContext, routed: RoutedRequest, body: bytes | None, whole: bool = False) -> None:
        """Correct the replica's tree and prefill model from what the backend reported, and let the router measure
        its slowdown. ``whole``: the reply was not streamed, so the time to it includes the backend's generating
        after the first token (its reported decode time is taken off; unknown, nothing is measured)."""
        if not body or not reports_cache(body):
            return
        replica = self.replicas[routed.replica]
        report = replica.kind.report(reply_objects(body))  # parsed once for the kind's readers
        decode_s = report.decode_s if whole else 0.0
        # the tree and the prefill model count estimated tokens; the backend reports its own
        backend_total = report.prompt_tokens
        scale = routed.total_tokens / backend_total if backend_total and routed.total_tokens else 1.0
        cached = report.cached_tokens
        if cached is not None:
            expected = routed.expected if routed.expected is not None else routed.predicted
            prefix_cached = round(cached * scale)
            if routed.shifted:  # shifted chunks are not prefix: no evidence of a larger cache
                prefix_cached = min(prefix_cached, expected.tokens)
            replica.tree.correct(routed.path, prefix_cached, expected)
            ctx.reported_cached_tokens = cached
        first = routed.first_token
        if report.prefill is not None and (first is None or first.alone):
            prompt_n, cache_n, prompt_ms = report.prefill
            replica.prefill.observe(round(prompt_n * scale), round(cache_n * scale), prompt_ms / 1000)
            if self._unfitted and replica.prefill.fitted:
                self._unfitted = share_fits([r.prefill for r in self.replicas])
        if first is not None and cached is not None and backend_total and decode_s is not None:
            self.router.measured(first, round((backend_total - cached) * scale), round(cached * scale), decode_s)

    async def discover(self, timeout_s: float = 2.0) -> None:
        """Read ``GET /slots`` of the llama.cpp replicas not read yet (:mod:`proxy.kv.discovery`)."""
        if self.backend_objects is None or self.client is None or not self._undiscovered:
            return
        for index in sorted(self._undiscovered):
            backend = self.backend_objects[index]
            url = getattr(backend, "url", None)
            if not isinstance(url, str):
                self._undiscovered.discard(index)
                continue
            auth = getattr(backend, "auth_headers", None)
            headers = auth() if callable(auth) else {}
            answer = await read_slots(self.client, url, headers, timeout_s)
            replica = self.replicas[index]
            if answer is not None and apply_slots(answer, tree=replica.tree, queue=replica.queue,
                                                  slot_table=replica.slots):
                self._undiscovered.discard(index)

    def _maybe_discover(self) -> None:
        """Start :meth:`discover` in the background: at the first request, then at most once a minute while some
        llama.cpp replica has not answered (the configured slots and capacity hold meanwhile)."""
        if not self._undiscovered or self.backend_objects is None:
            return
        now = time.monotonic()
        if now < self._next_discovery or (self._discovery is not None and not self._discovery.done()):
            return
        self._next_discovery = now + 60.0
        self._discovery = asyncio.get_running_loop().create_task(self.discover())

    def __call__(self, ctx: RequestContext, call_next: Next) -> Coroutine[Any, Any, Reply]:
        return self.run(CHAT, ctx, call_next)

    async def run(self, endpoint: Endpoint, ctx: RequestContext, call_next: Next) -> Reply:
        """The stage for ``endpoint``'s requests."""
        if self._undiscovered:
            self._maybe_discover()
        if self.shared is not None:
            self.follow_proxies(self.shared.proxies())
        routed = self.route(ctx, endpoint)
        if routed is None:
            return await call_next(ctx)
        replica = self.replicas[routed.replica]
        decision_cached = routed.predicted.tokens
        compute = max(1, sum(s.tokens for s in routed.path) - decision_cached) if routed.path else 1
        try:
            if not replica.queue.try_acquire():
                await replica.queue.acquire(decision_cached, compute, routed.start_deadline)
        except DeadlineExceeded as error:
            self.router.finished(routed.ticket, routed.replica)
            replica.tree.retract(routed.path, routed.predicted)
            raise ProxyError(
                429,
                "the backend could not start this request within the time-to-first-token objective",
                code=SLO_AFTER_WAIT,
                headers={"Retry-After": "1"},
            ) from error
        except TimeoutError as error:
            self.router.finished(routed.ticket, routed.replica)
            replica.tree.retract(routed.path, routed.predicted)
            raise ProxyError(
                429, "the backend queue is full", code="queue_timeout", headers={"Retry-After": "1"}
            ) from error
        except BaseException:
            self.router.finished(routed.ticket, routed.replica)
            replica.tree.retract(routed.path, routed.predicted)
            raise
        self.router.started(routed.ticket, routed.replica)
        if replica.slots is not None:
            self.start(ctx, routed, replica.slots)

        def release() -> None:
            replica.tree.settled(routed.path, routed.predicted)
            self.router.finished(routed.ticket, routed.replica)
            replica.queue.release()
            if replica.slots is not None and routed.slot is not None:
                replica.slots.release(routed.slot)

        try:
            reply = await call_next(ctx)
        except BaseException:
            release()
            raise
        routed.first_token = self.router.first_token(routed.ticket, routed.replica)
        if not reply.streamed:
            self.settle(ctx, routed, reply.body, whole=True)
            release()
            return reply

        async def on_finish(_reply: Reply, ok: bool, body: bytes) -> None:
            try:
                if ok:
                    self.settle(ctx, routed, body)
            finally:
                release()

        reply.on_finish(on_finish)
        return reply


def _shifts(replica: Replica, policy: OrderPolicy | None) -> bool:
    """Whether the replica is asked to reuse cached chunks outside the prefix (only a server whose slots the proxy
    follows can: llama.cpp)."""
    return policy is OrderPolicy.SHIFT and replica.kind.tracks_slots


def _prefix_match(path: Sequence[Segment], tokens: int) -> Match:
    """The leading segments of ``path`` that ``tokens`` cover."""
    segments = covered = 0
    for segment in path:
        if covered + segment.tokens > tokens:
            break
        covered += segment.tokens
        segments += 1
    return Match(segments, covered)
