"""``POST /admin/invalidate`` with a semantic radius, through HTTP, once the runtime has a semantic tier.

The runtime does not build ``rt.semantic`` yet (integration pending), so the test attaches a real
:class:`~tiers.semantic.SemanticTier` (hnswlib vector store, TEST-DOUBLE bag-of-words embedder: no model files
here) as ``rt.semantic``, the attribute the admin API looks for. Removed keys also leave the semantic index.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from tests.admin.conftest import Admin, ask, only_key, record_documents
from tests.support.proxy_server import ProxyServer
from tiers.semantic import SemanticScope, SemanticTier
from tiers.vectors.hnsw import HnswVectorStore

WORDS = ["capital", "france", "paris", "weather", "today", "city"]


class BagOfWordsEmbedder:
    """TEST DOUBLE of an embedder: one dimension per known word, rows of unit length."""

    dim = len(WORDS)
    name = "bag-of-words-test-double"

    async def close(self) -> None:
        return None

    async def embed(self, texts: list[str]) -> npt.NDArray[np.float32]:
        rows = np.full((len(texts), self.dim), 1e-3, dtype=np.float32)
        for i, text in enumerate(texts):
            for word in text.lower().replace("?", "").split():
                if word in WORDS:
                    rows[i, WORDS.index(word)] += 1.0
        rows /= np.linalg.norm(rows, axis=1, keepdims=True)
        return rows


def test_semantic_radius_invalidates_neighbours(admin_proxy: ProxyServer, admin: Admin) -> None:
    semantic = SemanticTier(BagOfWordsEmbedder(), HnswVectorStore(len(WORDS)), guards=())
    setattr(admin_proxy.runtime, "semantic", semantic)  # noqa: B010 - the attribute integration adds
    questions = {"ns-1": "capital of france", "ns-2": "capital city of France", "ns-3": "weather today"}
    keys = {}
    for namespace, question in questions.items():
        ask(admin_proxy, question, namespace=namespace)
        keys[namespace] = only_key(admin, namespace=namespace)
        record_documents(admin_proxy, keys[namespace], [], question)
        admin_proxy.call(semantic.add(SemanticScope("anonymous", namespace), "sig", question, keys[namespace]))
    result = admin.post("/admin/invalidate", json={"near": {"text": "What is the capital of France?",
                                                            "radius": 0.3}}).json()
    assert result["removed"] == {"l1": 2, "semantic": 2}
    assert ask(admin_proxy, questions["ns-1"], namespace="ns-1").headers["X-Cache-Status"] == "MISS"
    assert ask(admin_proxy, questions["ns-2"], namespace="ns-2").headers["X-Cache-Status"] == "MISS"
    assert ask(admin_proxy, questions["ns-3"], namespace="ns-3").headers["X-Cache-Status"] == "HIT"
    assert admin_proxy.call(semantic.store.count()) == 1
    narrowed = admin.post("/admin/invalidate", json={"near": {"text": "weather today", "radius": 0.1},
                                                     "namespace": "ns-1"}).json()
    assert narrowed["total"] == 0, "AND with the namespace: nothing in ns-1 is near the weather"
