"""The official qdrant-client in REST mode against the TEST-ONLY QdrantShim answers as local mode does."""

from __future__ import annotations

import importlib.metadata
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from qdrant_client import AsyncQdrantClient, QdrantClient, models
from qdrant_client.common.version_check import get_server_version
from qdrant_client.http.exceptions import UnexpectedResponse

from tests.support.processes import free_port, wait_for_port
from upstream_doubles.qdrant_shim import QdrantShim

ROOT = Path(__file__).resolve().parents[2]
DIM = 4


def rest_client(shim: QdrantShim) -> QdrantClient:
    """REST mode; the version check (a thread that may outlive a short test) is tested on its own."""
    return QdrantClient(url=shim.url, prefer_grpc=False, check_compatibility=False)


def vector(i: int) -> list[float]:
    return [float(i % 5), 1.0, 0.5 * i, -float(i % 3)]


def points(ids: range) -> list[models.PointStruct]:
    return [
        models.PointStruct(id=i, vector=vector(i), payload={"parity": i % 2, "title": f"doc {i}", "rank": i})
        for i in ids
    ]


ODD = models.Filter(must=[models.FieldCondition(key="parity", match=models.MatchValue(value=1))])


def exercise(client: QdrantClient) -> list[Any]:
    """The same operations against any client; returns everything they answered, in order."""
    seen: list[Any] = [client.collection_exists("docs")]
    seen.append(
        client.create_collection(
            "docs", vectors_config=models.VectorParams(size=DIM, distance=models.Distance.COSINE)
        )
    )
    seen.append(client.collection_exists("docs"))
    seen.append(client.create_payload_index("docs", "parity", models.PayloadSchemaType.INTEGER))
    seen.append(client.upsert("docs", points=points(range(1, 21))))
    seen.append(
        client.upsert(
            "docs",
            points=models.Batch(
                ids=[21, 22], vectors=[vector(21), vector(22)], payloads=[{"parity": 1}, {"parity": 0}]
            ),
        )
    )
    seen.append(client.get_collections())
    seen.append(client.get_collection("docs").points_count)
    seen.append(client.query_points("docs", query=[1.0, 1.0, 1.0, 0.0], limit=5))
    seen.append(
        client.query_points("docs", query=[1.0, 0.0, 1.0, 0.0], query_filter=ODD, limit=3, with_vectors=True)
    )
    seen.append(client.query_points("docs", query=3, limit=4, score_threshold=0.5))  # by point id
    seen.append(
        client.query_points(
            "docs",
            query=models.RecommendQuery(recommend=models.RecommendInput(positive=[1, 2], negative=[7])),
            limit=3,
        )
    )
    seen.append(
        client.query_batch_points(
            "docs",
            requests=[
                models.QueryRequest(query=[0.0, 1.0, 0.0, 0.0], limit=2, with_payload=True),
                models.QueryRequest(query=[1.0, 0.0, 0.0, 0.0], filter=ODD, limit=2),
            ],
        )
    )
    page, offset = client.scroll("docs", limit=7)
    seen += [page, offset, client.scroll("docs", limit=7, offset=offset)]
    seen.append(client.scroll("docs", scroll_filter=ODD, limit=50, with_vectors=True))
    seen.append(client.count("docs"))
    seen.append(client.count("docs", count_filter=ODD))
    seen.append(client.retrieve("docs", ids=[1, 2, 99], with_vectors=True))
    seen.append(client.set_payload("docs", payload={"tag": "x"}, points=[1, 2]))
    seen.append(client.set_payload("docs", payload={"odd": True}, points=ODD))
    seen.append(client.overwrite_payload("docs", payload={"only": 1}, points=[3]))
    seen.append(client.delete_payload("docs", keys=["title"], points=[4, 5]))
    seen.append(client.clear_payload("docs", points_selector=[6]))
    seen.append(client.retrieve("docs", ids=[1, 2, 3, 4, 5, 6, 7]))
    seen.append(client.delete("docs", points_selector=models.PointIdsList(points=[1, 2])))
    seen.append(client.delete("docs", points_selector=models.FilterSelector(filter=ODD)))
    seen.append(client.count("docs"))
    seen.append(client.scroll("docs", limit=100))
    seen.append(client.delete_collection("docs"))
    seen.append(client.collection_exists("docs"))
    return seen


@pytest.mark.filterwarnings("ignore:Payload indexes have no effect")
def test_rest_client_against_shim_matches_local_mode(qdrant_shim: QdrantShim) -> None:
    remote = rest_client(qdrant_shim)
    direct = QdrantClient(":memory:")
    assert exercise(remote) == exercise(direct)
    counts = qdrant_shim.log.counts()
    assert counts["/collections/docs/points/query"] == 4
    assert counts["/collections/docs/points/query/batch"] == 1
    assert counts["/collections/docs/points/scroll"] == 4


def test_named_vectors_and_payload_filters(qdrant_shim: QdrantShim) -> None:
    def run(client: QdrantClient) -> list[Any]:
        config = {
            "text": models.VectorParams(size=DIM, distance=models.Distance.DOT),
            "image": models.VectorParams(size=2, distance=models.Distance.EUCLID),
        }
        client.create_collection("multi", vectors_config=config)
        client.upsert(
            "multi",
            points=[
                models.PointStruct(
                    id=i, vector={"text": vector(i), "image": [float(i), -float(i)]}, payload={"n": i}
                )
                for i in range(10)
            ],
        )
        in_range = models.Filter(must=[models.FieldCondition(key="n", range=models.Range(gte=3, lt=8))])
        return [
            client.query_points("multi", query=[1.0, 2.0], using="image", limit=3),
            client.query_points(
                "multi", query=vector(2), using="text", query_filter=in_range, with_vectors=["image"]
            ),
            client.get_collection("multi").config.params,
        ]

    assert run(rest_client(qdrant_shim)) == run(QdrantClient(":memory:"))


def test_legacy_search_and_recommend_routes(qdrant_shim: QdrantShim) -> None:
    """``/points/search`` (+batch) and ``/points/recommend`` answer as the equivalent ``query_points``."""
    direct = QdrantClient(":memory:")
    for client in (rest_client(qdrant_shim), direct):
        client.create_collection(
            "docs", vectors_config=models.VectorParams(size=DIM, distance=models.Distance.COSINE)
        )
        client.upsert("docs", points=points(range(1, 21)))

    def expected(query: Any, **kwargs: Any) -> list[Any]:
        found = direct.query_points("docs", query=query, **kwargs).points
        return [p.model_dump(mode="json") for p in found]

    base = f"{qdrant_shim.url}/collections/docs/points"
    odd = ODD.model_dump(mode="json", exclude_none=True)
    search = httpx.post(f"{base}/search", json={"vector": [1, 1, 1, 0], "limit": 4, "with_payload": True})
    assert search.status_code == 200 and search.json()["status"] == "ok"
    assert search.json()["result"] == expected([1.0, 1.0, 1.0, 0.0], limit=4, with_payload=True)
    batch = httpx.post(
        f"{base}/search/batch",
        json={
            "searches": [
                {"vector": [1, 0, 0, 0], "limit": 2},
                {"vector": [0, 1, 0, 0], "filter": odd, "limit": 3},
            ]
        },
    )
    assert batch.json()["result"] == [
        expected([1.0, 0.0, 0.0, 0.0], limit=2, with_payload=False),
        expected([0.0, 1.0, 0.0, 0.0], query_filter=ODD, limit=3, with_payload=False),
    ]
    recommend = httpx.post(f"{base}/recommend", json={"positive": [1, 2], "negative": [7], "limit": 3})
    query = models.RecommendQuery(recommend=models.RecommendInput(positive=[1, 2], negative=[7]))
    assert recommend.json()["result"] == expected(query, limit=3, with_payload=False)


async def test_async_rest_client(qdrant_shim: QdrantShim) -> None:
    client = AsyncQdrantClient(url=qdrant_shim.url, check_compatibility=False)
    await client.create_collection(
        "a", vectors_config=models.VectorParams(size=DIM, distance=models.Distance.DOT)
    )
    await client.upsert("a", points=points(range(5)))
    found = await client.query_points("a", query=vector(4), limit=1)
    assert [p.id for p in found.points] == [4]
    assert (await client.count("a")).count == 5
    await client.close()


def test_errors_in_qdrant_shape(qdrant_shim: QdrantShim) -> None:
    client = rest_client(qdrant_shim)
    with pytest.raises(UnexpectedResponse) as missing:
        client.get_collection("nope")
    assert missing.value.status_code == 404
    body = httpx.post(f"{qdrant_shim.url}/collections/nope/points/search", json={"vector": [1, 2]}).json()
    assert body["status"]["error"] == "Not found: Collection `nope` doesn't exist!" and "time" in body
    client.create_collection("c", vectors_config=models.VectorParams(size=2, distance=models.Distance.COSINE))
    with pytest.raises(UnexpectedResponse) as exists:
        client.create_collection(
            "c", vectors_config=models.VectorParams(size=2, distance=models.Distance.COSINE)
        )
    assert exists.value.status_code == 400
    bad = httpx.put(f"{qdrant_shim.url}/collections/c/points", json={"points": [{"id": 1, "vector": "x"}]})
    assert bad.status_code == 400 and "error" in bad.json()["status"]
    malformed = httpx.post(f"{qdrant_shim.url}/collections/c/points/count", content=b"{oops")
    assert malformed.status_code == 400


def test_service_routes(qdrant_shim: QdrantShim) -> None:
    client = rest_client(qdrant_shim)
    assert get_server_version(qdrant_shim.url, {}, None, 5) == importlib.metadata.version("qdrant-client")
    assert client.info().version
    assert client.cluster_status() is not None
    for path in ("/healthz", "/readyz", "/telemetry", "/cluster"):
        assert httpx.get(qdrant_shim.url + path).status_code == 200
    assert (
        httpx.get(qdrant_shim.url + "/telemetry").json()["result"]["collections"]["number_of_collections"]
        == 0
    )


def test_values_json_cannot_hold_go_out_as_text() -> None:
    """A payload value orjson has no encoding for (a set, an object) is sent as its text, not an encoder error."""
    from uuid import UUID

    from upstream_doubles.qdrant_shim import _ok

    class Tag:
        def __str__(self) -> str:
            return "tag-1"

    body = _ok({"id": UUID(int=1), "tag": Tag()}, 0.0).body
    assert isinstance(body, bytes) and b'"tag":"tag-1"' in body


async def test_serves_on_a_socket_bound_beforehand() -> None:
    """The address is known before the server starts (``ragproxy demo`` builds the proxy's settings first)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    port = sock.getsockname()[1]
    async with QdrantShim(sock=sock) as shim, httpx.AsyncClient() as client:
        assert shim.url == f"http://127.0.0.1:{port}"
        assert (await client.get(f"{shim.url}/collections")).json()["status"] == "ok"


def test_runs_as_a_process() -> None:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "upstream_doubles.qdrant_shim", "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port, timeout=30)
        client = QdrantClient(url=f"http://127.0.0.1:{port}", check_compatibility=False)
        client.create_collection(
            "p", vectors_config=models.VectorParams(size=2, distance=models.Distance.COSINE)
        )
        assert client.collection_exists("p")
    finally:
        process.terminate()
        process.wait(10)
