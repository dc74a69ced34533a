"""Shape + Route against a real llama-server (``-m llama``).

Needs ``scripts/build_llama_server.sh`` and ``scripts/make_tiny_gguf.py`` to have run (skipped otherwise).

The server's own ``timings.cache_n`` must show the reuse that the knowledge tree predicted.
"""

from __future__ import annotations

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
from proxy.kv.hints import SlotTable
from proxy.kv.kinds import LLAMACPP
from proxy.kv.order import OrderPolicy
from proxy.kv.prefill import PrefillModel
from proxy.kv.router import Router
from proxy.kv.stages import Replica, Route, Shape
from proxy.kv.tree import KnowledgeTree
from proxy.server.request import Request

CACHE = Path.home() / ".cache" / "ragproxy"
pytestmark = pytest.mark.llama


@pytest.fixture
def server_url() -> Any:
    """A fresh server per test (it starts in about a second): what one test left in the server's slots and prompt
    cache changes what the next one finds cached (the shift test failed after the reorder test, passed alone)."""
    binary, model = CACHE / "llama-server", CACHE / "tiny-llama.gguf"
    if not binary.exists() or not model.exists():
        pytest.skip("run scripts/build_llama_server.sh and scripts/make_tiny_gguf.py first")
    servers = Servers(binary, model, count=1, slots=2, ctx_per_slot=4096, threads=1)
    try:
        servers.wait_ready()
        yield servers.urls[0]
    finally:
        servers.stop()


class Asker:
    """Shape + Route with one llama.cpp replica, in front of the real server; records the bodies sent."""

    def __init__(self, url: str, client: httpx.AsyncClient, policy: OrderPolicy, system: str) -> None:
        model = PrefillModel()
        replica = Replica(
            0, LLAMACPP, KnowledgeTree(16_000, prefill=model), model, AdmissionQueue(2), SlotTable(2)
        )
        self.url, self.client, self.system = url, client, system
        self.sent: list[dict[str, Any]] = []
        self.pipeline = Pipeline(
            [ReadPrompt(None), Shape([replica], default_policy=policy),
             Route([replica], Router([model], ttft_slo_s=None))],
            self.send
        )

    async def send(self, ctx: RequestContext) -> Reply:
        self.sent.append(orjson.loads(ctx.outgoing_body()))
        response = await self.client.post(
            self.url + "/v1/chat/completions", content=ctx.outgoing_body(), headers={"Content-Type": "application/json"}
        )
        return Reply(response.status_code, body=response.content)

    async def ask(self, documents: list[tuple[str, str]], n: int) -> dict[str, Any]:
        body = {
            "model": "tiny",
            "max_tokens": 1,
            "messages": [{"role": "system", "content": self.system}, {"role": "user", "content": f"q{n}"}],
        }
        ctx = RequestContext(  # the route handler lifts ``ragproxy`` out of the body into proxy_fields
            request=Request("POST", "/v1/chat/completions"),
            route="chat",
            request_id=f"t{n}",
            raw_body=orjson.dumps(body),
            body=body,
            proxy_fields={"ragproxy": {"documents": [{"id": i, "text": text} for i, text in documents]}},
        )
        reply = await self.pipeline(ctx)
        assert reply.status == 200
        return dict(orjson.loads(reply.body or b"{}"))


async def test_reordered_documents_hit_the_server_cache(server_url: str) -> None:
    work = make_workload(docs=4, requests=1, doc_words=120, seed=3)
    docs = [(d.id, d.text) for d in work.documents]
    async with httpx.AsyncClient(timeout=120) as client:
        asker = Asker(server_url, client, OrderPolicy.REUSE, work.system)
        first = await asker.ask([docs[0], docs[1], docs[2]], 1)
        second = await asker.ask([docs[2], docs[0], docs[1]], 2)  # top-ranked 2 goes last; 0, 1 follow the path
    assert asker.sent[1]["cache_prompt"] is True and "id_slot" in asker.sent[1]  # pinned to the slot holding 0, 1
    total_first = first["timings"]["prompt_n"] + first["timings"]["cache_n"]
    assert second["timings"]["cache_n"] > total_first * 0.6


async def test_shift_reuses_documents_outside_the_common_prefix(server_url: str) -> None:
    """Documents cached after one the new prompt lacks: ``reuse`` recomputes them, ``shift`` moves their KV."""
    work = make_workload(docs=4, requests=1, doc_words=120, seed=4)
    docs = [(d.id, d.text) for d in work.documents]
    cached: dict[OrderPolicy, int] = {}
    async with httpx.AsyncClient(timeout=120) as client:
        for n, policy in enumerate((OrderPolicy.REUSE, OrderPolicy.SHIFT)):
            asker = Asker(server_url, client, policy, f"{work.system} ({policy.value})")  # own prefix per policy
            first = await asker.ask([docs[0], docs[1], docs[2]], 10 * n)
            second = await asker.ask([docs[3], docs[1], docs[2]], 10 * n + 1)  # 0 is gone: 1, 2 are not a prefix
            cached[policy] = second["timings"]["cache_n"]
            assert ("n_cache_reuse" in asker.sent[1]) is (policy is OrderPolicy.SHIFT)
    # reuse shares only the system prompt; a document is about a third of the rest of the first prompt
    total_first = first["timings"]["prompt_n"] + first["timings"]["cache_n"]
    document = (total_first - cached[OrderPolicy.REUSE]) / 3
    assert cached[OrderPolicy.SHIFT] - cached[OrderPolicy.REUSE] > 1.5 * document  # documents 1 and 2 moved
