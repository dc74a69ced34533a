"""What a llama.cpp server really has, read from its ``GET /slots``: how many slots, and the context of each.

:func:`apply_slots` (pure) makes a replica follow the answer: its :class:`~proxy.kv.hints.SlotTable` takes the
real number of slots, its admission queue lets at most that many requests in flight (its share of them with
several proxies in shared mode: :func:`~proxy.kv.admission_queue.slot_share`) (a request beyond the slots
would wait in the server's own first-come queue, out of reach of the cache-aware order and of the deadline that
drops what can no longer meet the TTFT objective; never more than the configured ``max_concurrency``), and its
knowledge tree's capacity becomes at least ``slots * n_ctx`` — the KV cache the server allocated. The slots do not
add prefill parallelism: the server computes their prompts one after the other (:mod:`proxy.kv.router`). The
configured ``kv_capacity_tokens`` stays the floor because llama.cpp also keeps earlier prompts in host memory
(``--cache-ram``, 8 GiB by default), which ``/slots`` does not report; the tree's correction from
``timings.cache_n`` adjusts from there.

:func:`read_slots` is the thin HTTP adapter (bounded wait; ``None`` when the server has no ``/slots`` — it may
run with ``--no-slots`` — or does not answer: the configured values stay).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from proxy.kv.admission_queue import AdmissionQueue
from proxy.kv.hints import SlotTable, capacity_from_slots
from proxy.kv.tree import KnowledgeTree
from proxy.upstream.client import UpstreamClient

log = logging.getLogger("ragproxy.kv")


async def read_slots(
    client: UpstreamClient, base_url: str, headers: Mapping[str, str], timeout_s: float = 2.0
) -> list[dict[str, Any]] | None:
    """The server's ``/slots`` answer, or ``None`` when it has none or does not answer in time."""
    try:
        answer = await client.fetch("GET", base_url.rstrip("/") + "/slots", headers=headers, timeout_s=timeout_s)
        body = answer.json() if answer.status == 200 else None
    except (OSError, ValueError):
        return None
    if not isinstance(body, list) or not body or not all(isinstance(s, dict) for s in body):
        return None
    return body


def apply_slots(
    slots_answer: Sequence[Mapping[str, Any]],
    *,
    tree: KnowledgeTree,
    queue: AdmissionQueue | None = None,
    slot_table: SlotTable | None = None,
) -> tuple[int, int] | None:
    """Make a replica follow its ``/slots`` answer; returns ``(slots, KV capacity in tokens)`` or ``None`` when
    the answer says nothing usable."""
    try:
        count, capacity = capacity_from_slots(slots_answer)
    except (TypeError, ValueError):
        return None
    if count < 1:
        return None
    if slot_table is not None:
        slot_table.resize(count)
    if queue is not None:
        queue.share(slots=min(queue.slots, count))
    if capacity > tree.capacity_tokens:
        tree.capacity_tokens = capacity
        tree.max_capacity_tokens = max(tree.max_capacity_tokens, capacity * 4)
    log.info("llama.cpp server: %d slots, %d tokens of KV", count, capacity)
    return count, capacity
