"""LangChain's Qdrant vector store (``langchain-qdrant``, a dev extra) through the proxy, unchanged, one tenant per
key: each tenant's store is its own, with one collection name for both."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.search.tenancy import namespace_of
from tests.support.proxy_server import ProxyServer, proxy_settings
from upstream_doubles.qdrant_shim import QdrantShim

langchain_qdrant = pytest.importorskip("langchain_qdrant")
fake = pytest.importorskip("langchain_core.embeddings.fake")

TEXTS = {"a": ["Tenant A ships rockets.", "Tenant A sells fuel."], "b": ["Tenant B bakes bread."]}


@pytest.fixture
def keyed(qdrant_shim: QdrantShim, tmp_path: Path) -> Iterator[tuple[ProxyServer, dict[str, str]]]:
    settings = proxy_settings(qdrant_url=qdrant_shim.url, **{"auth.mode": "keys", "data_dir": str(tmp_path)})
    with ProxyServer(settings) as server:
        store = server.runtime.credits.keys
        assert store is not None
        yield server, {who: server.call(store.create(f"{who}-user", f"tenant-{who}")).plaintext for who in "ab"}


def test_each_tenant_s_langchain_store_is_its_own(keyed: tuple[ProxyServer, dict[str, str]],
                                                  qdrant_shim: QdrantShim) -> None:
    server, keys = keyed
    embedding = fake.DeterministicFakeEmbedding(size=16)
    stores = {}
    with warnings.catch_warnings():  # "Api key is used with an insecure connection": loopback, on purpose
        warnings.simplefilter("ignore")
        for who in "ab":
            stores[who] = langchain_qdrant.QdrantVectorStore.from_texts(
                TEXTS[who], embedding, url=server.url, api_key=keys[who], collection_name="kb",
                metadatas=[{"who": who}] * len(TEXTS[who]))
        again = langchain_qdrant.QdrantVectorStore.from_existing_collection(
            embedding=embedding, collection_name="kb", url=server.url, api_key=keys["a"])
    for who, store in stores.items():
        found = store.similarity_search(TEXTS[who][0], k=5)
        assert sorted(doc.page_content for doc in found) == sorted(TEXTS[who])
        assert {doc.metadata["who"] for doc in found} == {who}
    assert again.similarity_search_with_score(TEXTS["a"][1], k=1)[0][0].page_content == TEXTS["a"][1]
    ids = [doc.metadata["_id"] for doc in stores["a"].similarity_search(TEXTS["a"][0], k=5)]
    assert stores["a"].delete(ids=ids[:1])
    assert len(stores["a"].similarity_search(TEXTS["a"][0], k=5)) == 1
    assert len(stores["b"].similarity_search(TEXTS["b"][0], k=5)) == 1
    upstream = {c.name for c in qdrant_shim.client.get_collections().collections}
    assert upstream == {namespace_of("tenant-a") + "kb", namespace_of("tenant-b") + "kb"}
