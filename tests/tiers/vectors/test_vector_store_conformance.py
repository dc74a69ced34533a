"""What "a vector store works" means: every backend passes this suite (add a backend to ``BACKENDS``)."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.upstream.client import UpstreamClient
from tiers.embedders.base import normalize_rows
from tiers.vectors.base import VectorStore
from tiers.vectors.hnsw import HnswVectorStore
from tiers.vectors.qdrant import QdrantVectorStore
from upstream_doubles.qdrant_shim import QdrantShim

DIM = 16
StoreFactory = Callable[[Path], AbstractAsyncContextManager[VectorStore]]


@asynccontextmanager
async def _hnsw(directory: Path) -> AsyncIterator[VectorStore]:
    """Partitions past 4 vectors are hnswlib graphs."""
    yield HnswVectorStore(DIM, directory, model="test", graph_from=4)


@asynccontextmanager
async def _flat(directory: Path) -> AsyncIterator[VectorStore]:
    """Every partition of these tests is an exact scan."""
    yield HnswVectorStore(DIM, directory, model="test")


@asynccontextmanager
async def _qdrant(directory: Path) -> AsyncIterator[VectorStore]:
    """Over REST, against the Qdrant shim (qdrant-client's local mode behind Qdrant's HTTP API)."""
    client = UpstreamClient(connect_timeout=2, read_timeout=10, pool_size=4)
    try:
        with QdrantShim() as shim:
            yield QdrantVectorStore(client, shim.url, DIM)
    finally:
        await client.close()


BACKENDS: dict[str, StoreFactory] = {"hnsw": _hnsw, "hnsw-flat": _flat, "qdrant": _qdrant}


@pytest.fixture(params=sorted(BACKENDS))
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[VectorStore]:
    async with BACKENDS[request.param](tmp_path) as instance:
        yield instance
        await instance.close()


def unit(rng: np.random.Generator, n: int) -> np.ndarray:
    return normalize_rows(rng.standard_normal((n, DIM)))


async def test_search_finds_the_nearest_in_its_partition_only(store: VectorStore) -> None:
    rng = np.random.default_rng(1)
    vectors = unit(rng, 6)
    await store.add("a", ["a0", "a1", "a2"], vectors[:3], [{"q": "zero"}, {"q": "one"}, {"q": "two"}])
    await store.add("b", ["b0", "b1", "b2"], vectors[3:])
    hits = await store.search("a", vectors[1], k=2)
    assert hits[0].id == "a1"
    assert hits[0].similarity == pytest.approx(1.0, abs=1e-5)
    assert hits[0].payload == {"q": "one"}
    assert len(hits) == 2 and hits[0].similarity >= hits[1].similarity
    assert all(hit.id.startswith("a") for hit in await store.search("a", vectors[4], k=3))
    assert await store.search("nowhere", vectors[0], k=3) == []


async def test_similarity_is_cosine(store: VectorStore) -> None:
    base = np.zeros(DIM, dtype=np.float32)
    base[0] = 1.0
    other = np.zeros(DIM, dtype=np.float32)
    other[0], other[1] = 0.6, 0.8
    await store.add("p", ["x"], other[None, :])
    [hit] = await store.search("p", base, k=5)
    assert hit.similarity == pytest.approx(0.6, abs=1e-5)


async def test_counts_and_deletes(store: VectorStore) -> None:
    rng = np.random.default_rng(2)
    await store.add("a", ["1", "2", "3"], unit(rng, 3))
    await store.add("b", ["4"], unit(rng, 1))
    assert await store.count() == 4
    assert await store.count("a") == 3
    assert await store.delete(["2", "4", "missing"]) == 2
    assert await store.count("a") == 2 and await store.count("b") == 0
    assert "2" not in {hit.id for hit in await store.search("a", unit(rng, 1)[0], k=10)}
    assert await store.delete_partition("a") == 2
    assert await store.count() == 0
    assert await store.search("a", unit(rng, 1)[0]) == []


async def test_re_adding_an_id_replaces_it_even_across_partitions(store: VectorStore) -> None:
    rng = np.random.default_rng(3)
    first, second = unit(rng, 2)
    await store.add("a", ["x"], first[None, :], [{"v": 1}])
    await store.add("a", ["x"], second[None, :], [{"v": 2}])
    assert await store.count() == 1
    [hit] = await store.search("a", second, k=3)
    assert (hit.id, hit.payload) == ("x", {"v": 2})
    assert hit.similarity == pytest.approx(1.0, abs=1e-5)
    await store.add("b", ["x"], first[None, :])
    assert await store.count("a") == 0 and await store.count("b") == 1


async def test_grows_past_its_initial_capacity_and_reuses_deleted_slots(store: VectorStore) -> None:
    rng = np.random.default_rng(4)
    vectors = unit(rng, 40)
    for start in range(0, 40, 5):
        await store.add("p", [str(i) for i in range(start, start + 5)], vectors[start : start + 5])
    assert await store.count("p") == 40
    await store.delete([str(i) for i in range(0, 40, 2)])
    await store.add("p", ["new"], vectors[:1])
    assert await store.count("p") == 21
    for i in (1, 17, 39):
        [hit] = await store.search("p", vectors[i], k=1)
        assert hit.id == str(i)
    assert (await store.search("p", vectors[0], k=1))[0].id == "new"


async def test_rejects_mismatched_batches(store: VectorStore) -> None:
    rng = np.random.default_rng(5)
    with pytest.raises(ValueError):
        await store.add("p", ["1", "2"], unit(rng, 1))
    with pytest.raises(ValueError):
        await store.add("p", ["1"], rng.standard_normal((1, DIM + 1)).astype(np.float32))
    with pytest.raises(ValueError):
        await store.add("p", ["1", "1"], unit(rng, 2))


@pytest.mark.parametrize("graph_from", [2, 1024])
async def test_persist_then_reload_keeps_everything(tmp_path: Path, graph_from: int) -> None:
    rng = np.random.default_rng(6)
    vectors = unit(rng, 10)
    store = HnswVectorStore(DIM, tmp_path, model="m", graph_from=graph_from)
    await store.add("tenant/ns/sig", [f"k{i}" for i in range(10)], vectors, [{"i": i} for i in range(10)])
    await store.delete(["k3"])
    await store.persist()
    reloaded = HnswVectorStore(DIM, tmp_path, model="m")
    assert await reloaded.load() == 9
    [hit] = await reloaded.search("tenant/ns/sig", vectors[5], k=1)
    assert (hit.id, hit.payload) == ("k5", {"i": 5})
    assert "k3" not in {h.id for h in await reloaded.search("tenant/ns/sig", vectors[3], k=9)}
    await reloaded.add("tenant/ns/sig", ["k3"], vectors[3:4])
    assert (await reloaded.search("tenant/ns/sig", vectors[3], k=1))[0].id == "k3"
    assert await reloaded.count() == 10


async def test_reload_ignores_an_index_of_another_model(tmp_path: Path) -> None:
    store = HnswVectorStore(DIM, tmp_path, model="m1")
    await store.add("p", ["x"], unit(np.random.default_rng(7), 1))
    await store.close()
    other = HnswVectorStore(DIM, tmp_path, model="m2")
    assert await other.load() == 0
    assert await other.count() == 0


async def test_persist_drops_the_files_of_dropped_partitions(tmp_path: Path) -> None:
    store = HnswVectorStore(DIM, tmp_path)
    rng = np.random.default_rng(8)
    await store.add("a", ["1"], unit(rng, 1))
    await store.add("b", ["2"], unit(rng, 1))
    await store.persist()
    await store.delete_partition("a")
    await store.persist()
    assert sum(1 for path in os.listdir(tmp_path) if path.endswith(".npy")) == 1
    await store.delete(["2"])  # the last vector of a partition: it goes, files and all
    await store.persist()
    assert sorted(os.listdir(tmp_path)) == ["manifest.json"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    operations=st.lists(
        st.tuples(st.sampled_from(["add", "delete"]), st.integers(0, 11), st.sampled_from(["p", "q"])),
        max_size=40,
    ),
    graph_from=st.sampled_from([1, 3, 1024]),
)
async def test_hnsw_agrees_with_a_dictionary_model(operations: list[tuple[str, int, str]], graph_from: int) -> None:
    rng = np.random.default_rng(9)
    vectors = unit(rng, 12)
    store = HnswVectorStore(DIM, graph_from=graph_from)
    model: dict[str, str] = {}
    for operation, number, partition in operations:
        key = str(number)
        if operation == "add":
            await store.add(partition, [key], vectors[number : number + 1])
            model[key] = partition
        else:
            assert await store.delete([key]) == int(model.pop(key, None) is not None)
    for partition in ("p", "q"):
        expected = {key for key, where in model.items() if where == partition}
        assert await store.count(partition) == len(expected)
        for key in expected:
            assert (await store.search(partition, vectors[int(key)], k=1))[0].id == key
        found = await store.search(partition, vectors[0], k=12)
        assert {hit.id for hit in found} == expected


async def test_a_manifest_of_the_wrong_shape_loads_nothing(tmp_path: Path) -> None:
    store = HnswVectorStore(DIM, tmp_path, model="m")
    await store.add("p", ["x"], unit(np.random.default_rng(10), 1))
    await store.persist()
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    manifest["partitions"] = [[*manifest["partitions"][0], "one too many"], 7]
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    reloaded = HnswVectorStore(DIM, tmp_path, model="m")
    assert await reloaded.load() == 0
