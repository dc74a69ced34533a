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
from aiohttp.test_utils import make_mocked_request

from loadtest.bench.kv import Servers, make_workload
from proxy.context import Reply, RequestContext
from proxy.kv.admission_queue import AdmissionQueue
from proxy.kv.hints import BackendKind, SlotTable
from proxy.kv.order import OrderPolicy
from proxy.kv.prefill import PrefillModel
from proxy.kv.router import Router
from proxy.kv.stages import Replica, Route, Shape
from proxy.kv.tree import KnowledgeTree
from proxy.pipeline import Pipeline

CACHE = Path.home() / ".cache" / "ragproxy"
pytestmark = pytest.mark.llama


@pytest.fixture(scope="module")
def server_url() -> Any:
    binary, model = CACHE / "llama-server", CACHE / "tiny-llama.gguf"
    if not binary.exists() or not model.exists():
        pytest.skip("run scripts/build_llama_server.sh and scripts/make_tiny_gguf.py first")
    servers = Servers(binary, model, count=1, slots=2, ctx_per_slot=4096, threads=1)
    try:
        servers.wait_ready()
        yield servers.urls[0]
    finally:
        servers.stop()


async def test_reordered_documents_hit_the_server_cache(server_url: str) -> None:
    work = make_workload(docs=4, requests=1, doc_words=120, seed=3)
    model = PrefillModel()
    replica = Replica(
        0, BackendKind.LLAMACPP, KnowledgeTree(16_000, prefill=model), model, AdmissionQueue(2), SlotTable(2)
    )
    router = Router([model], ttft_slo_s=None)
    sent: list[dict[str, Any]] = []
    async with httpx.AsyncClient(timeout=120) as client:

        async def send(ctx: RequestContext) -> Reply:
            sent.append(orjson.loads(ctx.outgoing_body()))
            response = await client.post(
                server_url + "/v1/chat/completions",
                content=ctx.outgoing_body(),
                headers={"Content-Type": "application/json"},
            )
            return Reply(response.status_code, body=response.content)

        pipeline = Pipeline(
            [Shape([replica], default_policy=OrderPolicy.REUSE), Route([replica], router)], send
        )

        async def ask(order: list[int], n: int) -> dict[str, Any]:
            body = {
                "model": "tiny",
                "max_tokens": 1,
                "messages": [
                    {"role": "system", "content": work.system},
                    {"role": "user", "content": f"q{n}"},
                ],
                "ragproxy": {
                    "documents": [{"id": work.documents[i].id, "text": work.documents[i].text} for i in order]
                },
            }
            ctx = RequestContext(
                request=make_mocked_request("POST", "/v1/chat/completions"),
                route="chat",
                request_id=f"t{n}",
                raw_body=orjson.dumps(body),
                body=body,
            )
            reply = await pipeline(ctx)
            assert reply.status == 200
            return dict(orjson.loads(reply.body or b"{}"))

        first = await ask([0, 1, 2], 1)
        second = await ask([2, 0, 1], 2)  # top-ranked 2 goes last; 0, 1 follow the cached path
    assert sent[1]["cache_prompt"] is True and "id_slot" not in sent[1]  # the server's prompt cache picks
    total_first = first["timings"]["prompt_n"] + first["timings"]["cache_n"]
    assert second["timings"]["cache_n"] > total_first * 0.6
