"""Building the KV layer from the settings: one knowledge tree, prefill model, queue (and slot table) per replica,
the router over them, and the ``Shape``/``Route`` stages."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from proxy.kv.admission_queue import AdmissionQueue
from proxy.kv.hints import SlotTable
from proxy.kv.kinds import KINDS
from proxy.kv.order import OrderPolicy, Popularity
from proxy.kv.prefill import PrefillModel
from proxy.kv.router import Router
from proxy.kv.settings import RoutingSettings
from proxy.kv.stages import Replica, Route, Shape, SharedPrefixes
from proxy.kv.tree import KnowledgeTree
from proxy.upstream.backends import BackendPool
from proxy.upstream.client import UpstreamClient
from proxy.upstream.settings import Upstreams


@dataclass
class KVLayer:
    """Everything routing needs, for the stages and the admin API."""

    replicas: list[Replica]
    router: Router
    shape: Shape
    route: Route

    def share(self, shared: SharedPrefixes) -> None:
        """Route with the prefix summaries of every proxy replica, not only this one's (shared mode)."""
        self.shape.shared = self.route.shared = shared

    def summary(self) -> list[dict[str, object]]:
        """Per replica: knowledge-tree size and the queue (with this proxy's share of the slots), for
        /admin/backends."""
        return [{"replica": r.index, "kind": r.kind.name, "tree_tokens": r.tree.size_tokens,
                 "tree_capacity_tokens": r.tree.capacity_tokens, "queued": r.queue.waiting,
                 "in_flight": r.queue.active, "in_flight_limit": r.queue.limit} for r in self.replicas]


class KVConfig(Protocol):
    """The settings the KV layer is built from (:class:`proxy.assembly.config.Settings` is one)."""

    @property
    def routing(self) -> RoutingSettings: ...

    @property
    def upstreams(self) -> Upstreams: ...


def build_kv(settings: KVConfig, pool: BackendPool, client: UpstreamClient | None = None) -> KVLayer | None:
    routing = settings.routing
    if not routing.enabled:
        return None
    backends = settings.upstreams.llm
    models = [PrefillModel() for _ in backends]
    # parallelism 1 (the default): llama.cpp computes its slots' prompts one after the other (proxy.kv.router)
    router = Router(models, ttft_slo_s=routing.ttft_slo_s, affinity_headroom=routing.affinity_headroom)
    replicas: list[Replica] = []
    for index, backend in enumerate(backends):
        kind = KINDS[backend.kind]
        replicas.append(Replica(
            index=index, kind=kind, prefill=models[index],
            tree=KnowledgeTree(backend.kv_capacity_tokens, prefill=models[index]),
            queue=AdmissionQueue(backend.max_concurrency, starvation_window_s=routing.starvation_window_s,
                                 max_wait_s=routing.queue_max_wait_s, backlog=router.loads[index].running_s),
            slots=SlotTable(backend.slots, prompt_cache=routing.llama_prompt_cache,
                            cache_tokens=backend.kv_capacity_tokens)
            if kind.tracks_slots else None,
        ))
    shape = Shape(replicas, policies={ns: OrderPolicy(order) for ns, order in routing.namespace_orders.items()},
                  default_policy=OrderPolicy(routing.order), popularity=Popularity())
    salt = routing.salt_secret.get_secret_value() if routing.salt_secret else ""
    route = Route(replicas, router, salt_secret=salt, backend_objects=pool.backends,
                  expose_headers=routing.expose_headers, shift_min_tokens=routing.shift_min_tokens, client=client)
    return KVLayer(replicas=replicas, router=router, shape=shape, route=route)
