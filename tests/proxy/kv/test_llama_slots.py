"""Slot choice against real llama-servers without a host-memory prompt cache (``-m llama``).

Needs ``scripts/build_llama_server.sh`` and ``scripts/make_tiny_gguf.py`` to have run (skipped otherwise).

Two servers run with ``--cache-ram 0`` (a slot's prompt is all the server keeps) and 2 slots each. The same
sequence — a popular prompt twice, two one-off prompts, the popular prompt again — goes to one through the
proxy's slot table (``prompt_cache=False``: pinned slots, one-offs overwrite the cheapest slot) and to the other
the way llama.cpp picks slots itself (no ``id_slot``). Only the first should still hold the popular prompt at
the end. The proxy also reads the server's real slot count and context from ``GET /slots``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from loadtest.bench._kv_servers import Servers
from loadtest.bench._kv_workload import make_workload
from proxy.core.context import Reply, RequestContext
from proxy.core.pipeline import Pipeline
from proxy.core.prompt import ReadPrompt
from proxy.kv.admission_queue import AdmissionQueue
from proxy.kv.discovery import apply_slots, read_slots
from proxy.kv.hints import SlotTable
from proxy.kv.kinds import LLAMACPP
from proxy.kv.order import OrderPolicy
from proxy.kv.prefill import PrefillModel
from proxy.kv.router import Router
from proxy.kv.stages import Replica, Route, Shape
from proxy.kv.tree import KnowledgeTree
from proxy.server.request import Request
from proxy.upstream.client import UpstreamClient

CACHE = Path.home() / ".cache" / "ragproxy"
pytestmark = pytest.mark.llama


@pytest.fixture(scope="module")
def urls() -> Iterator[list[str]]:
    binary, model = CACHE / "llama-server", CACHE / "tiny-llama.gguf"
    if not binary.exists() or not model.exists():
        pytest.skip("run scripts/build_llama_server.sh and scripts/make_tiny_gguf.py first")
    servers = Servers(binary, model, count=2, slots=2, ctx_per_slot=4096, threads=1, cache_ram_mib=0)
    try:
        servers.wait_ready()
        yield servers.urls
    finally:
        servers.stop()


async def run_sequence(url: str, *, pinned: bool) -> list[dict[str, Any]]:
    work = make_workload(docs=10, requests=1, doc_words=120, seed=5)
    model = PrefillModel()
    slots = SlotTable(1, prompt_cache=not pinned)
    replica = Replica(0, LLAMACPP, KnowledgeTree(100_000, prefill=model), model, AdmissionQueue(1), slots)
    router = Router([model], ttft_slo_s=None)
    client = UpstreamClient(connect_timeout=5, read_timeout=10, pool_size=1)
    try:
        answer = await read_slots(client, url, {})
    finally:
        await client.close()
    assert answer is not None
    assert apply_slots(answer, tree=replica.tree, queue=replica.queue, slot_table=slots) == (2, 8192)
    assert len(slots) == 2
    replies: list[dict[str, Any]] = []
    async with httpx.AsyncClient(timeout=120) as client:

        async def send(ctx: RequestContext) -> Reply:
            response = await client.post(
                url + "/v1/chat/completions", content=ctx.outgoing_body(),
                headers={"Content-Type": "application/json"},
            )
            return Reply(response.status_code, body=response.content)

        pipeline = Pipeline([ReadPrompt(None), Shape([replica], default_policy=OrderPolicy.REUSE),
                             Route([replica], router)], send)
        for n, docs in enumerate([[0, 1, 2], [0, 1, 2], [5, 6, 7], [8, 9, 4], [0, 1, 2]]):
            body = {
                "model": "tiny", "max_tokens": 1,
                "messages": [{"role": "system", "content": work.system}, {"role": "user", "content": f"q{n}"}],
            }
            own = {"documents": [{"id": work.documents[i].id, "text": work.documents[i].text} for i in docs]}
            ctx = RequestContext(request=Request("POST", "/v1/chat/completions"), route="chat",
                                 request_id=f"s{n}", raw_body=orjson.dumps(body), body=body,
                                 proxy_fields={"ragproxy": own})  # as the route handler lifts it out of the body
            reply = await pipeline(ctx)
            assert reply.status == 200
            replies.append(dict(orjson.loads(reply.body or b"{}")))
    return replies


async def test_pinned_slots_keep_a_popular_prompt_that_llamacpps_own_choice_overwrites(urls: list[str]) -> None:
    protected = await run_sequence(urls[0], pinned=True)
    server_choice = await run_sequence(urls[1], pinned=False)
    total = protected[-1]["timings"]["cache_n"] + protected[-1]["timings"]["prompt_n"]
    assert protected[-1]["timings"]["cache_n"] > 0.8 * total
    assert server_choice[-1]["timings"]["cache_n"] < 0.5 * total
