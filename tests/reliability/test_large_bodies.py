"""Large bodies both ways through a ``ragproxy serve`` process, with the LLM double and the Qdrant shim as processes.

Every non-streamed upstream answer above 256 KiB (the forwarding client's flow-control mark) used to wait for the read
timeout and end in a 504: a 3,000-item embeddings answer (~660 KB), a Qdrant scroll of 80 points (~650 KB). Such a
wait is a 504 whatever the read timeout, so the tests look at the status, not at the clock: the read timeout here is
one a loaded machine never meets while the double reads and answers 64 MB (a regression then fails after it);
sizes go up to 64 MB each way.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator

import httpx
import pytest

from loadtest.harness import child
from tests.support.processes import free_port
from tests.support.proxy_server import ProxyProcess

READ_TIMEOUT_S = 60.0
MB = 1024 * 1024


@pytest.fixture(scope="module")
def proxy() -> Iterator[ProxyProcess]:
    llm_port, qdrant_port = free_port(), free_port()
    with child(["-m", "upstream_doubles.llm_server", "--port", str(llm_port)], llm_port), \
            child(["-m", "upstream_doubles.qdrant_shim", "--port", str(qdrant_port)], qdrant_port):
        env = {"RAGPROXY_UPSTREAMS__LLM": json.dumps([{"url": f"http://127.0.0.1:{llm_port}"}]),
               "RAGPROXY_UPSTREAMS__QDRANT__URL": f"http://127.0.0.1:{qdrant_port}",
               "RAGPROXY_UPSTREAMS__READ_TIMEOUT_S": str(READ_TIMEOUT_S),
               "RAGPROXY_SERVER__MAX_BODY_BYTES": str(80 * MB),
               "RAGPROXY_LIMITS__EMBEDDING_INPUTS": "5000",  # the answer's size is the subject, not the input limit
               "RAGPROXY_CACHE__ENABLED": "false", "RAGPROXY_ADMIN__ENABLED": "false"}
        with ProxyProcess(env) as server:
            yield server


def _embeddings(proxy: ProxyProcess, body: dict[str, object]) -> httpx.Response:
    return httpx.post(proxy.url + "/v1/embeddings", json=body, timeout=READ_TIMEOUT_S + 30)


def test_a_3000_item_embeddings_answer_arrives_whole(proxy: ProxyProcess) -> None:
    response = _embeddings(proxy, {"model": "m", "input": [f"item {i}" for i in range(3000)], "dimensions": 8})
    assert response.status_code == 200, response.text[:300]
    assert 600_000 < len(response.content) < 1 * MB
    assert [item["index"] for item in response.json()["data"]] == list(range(3000))


@pytest.mark.parametrize("megabytes", [10, 64])
def test_answers_of_many_megabytes_arrive_whole(proxy: ProxyProcess, megabytes: int) -> None:
    dims = 32768  # 128 KiB of float32 per item, base64 in the answer
    items = megabytes * MB * 3 // 4 // (dims * 4)
    response = _embeddings(proxy, {"model": "m", "input": [f"item {i}" for i in range(items)],
                                   "dimensions": dims, "encoding_format": "base64"})
    assert response.status_code == 200, response.text[:300]
    assert len(response.content) > megabytes * MB * 0.95
    data = response.json()["data"]
    assert len(data) == items and len(base64.b64decode(data[-1]["embedding"])) == dims * 4


def test_a_64_mb_request_body_reaches_the_upstream_whole(proxy: ProxyProcess) -> None:
    texts = [f"{i:02d} " + "word " * (MB // 5) for i in range(64)]
    response = _embeddings(proxy, {"model": "m", "input": texts, "dimensions": 8})
    assert response.status_code == 200, response.text[:300]
    usage = response.json()["usage"]
    assert usage["prompt_tokens"] == 64 * (MB // 5 + 1)  # every word of every text arrived


def test_a_qdrant_scroll_of_650_kb_arrives_whole(proxy: ProxyProcess) -> None:
    collection = proxy.url + "/collections/big"
    assert httpx.put(collection, json={"vectors": {"size": 4, "distance": "Cosine"}}).status_code == 200
    points = [{"id": i, "vector": [1.0, 0.0, 0.0, float(i)], "payload": {"text": "x" * 8000}} for i in range(80)]
    assert httpx.put(collection + "/points?wait=true", json={"points": points}, timeout=30).status_code == 200
    response = httpx.post(collection + "/points/scroll", json={"limit": 80, "with_payload": True},
                          timeout=READ_TIMEOUT_S + 30)
    assert response.status_code == 200, response.text[:300]
    assert len(response.content) > 640_000 and len(response.json()["result"]["points"]) == 80
