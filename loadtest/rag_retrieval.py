"""The fidelity bench's RAG loop (``--rag K``): each question embedded, searched through the proxy's own Qdrant
route, and asked with the top-k it retrieved, in the order returned.

The corpus is the questions of a development-split CSV (``question1,question2,...``; read at run time, never
shipped) that are not in the traffic, so no pair's own question is ever retrieved. It is loaded, with the proxy's
own embedder's vectors, into the TEST-ONLY Qdrant shim (:mod:`upstream_doubles.qdrant_shim`, qdrant-client's local
mode) behind the proxy; the searches go through the proxy, so its search cache and its document registry see them
as they see an app's.

Two ways apps send what they retrieved (``form``):

- ``structured``: ``ragproxy.documents`` entries ``{"id": "doc-N", "text": ...}``; the upstream renders them and
  the bench's upstream cites the first by id (``[doc-N]``);
- ``inline``: pasted into the user message, numbered (:func:`inline_message`); the proxy recognises them from its
  searches, and the bench's upstream cites the first by position (``[1]``).
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import numpy as np

COLLECTION = "rag-corpus"
FORMS = ("structured", "inline")
CITATION = re.compile(r'<document id="([^"]+)"')
_INLINE_QUESTION = re.compile(r"\n\nQuestion: (.*)\Z", re.DOTALL)


def corpus(path: Path, exclude: Iterable[str], limit: int) -> list[str]:
    """Up to ``limit`` distinct questions of the CSV at ``path``, in file order, none of them in ``exclude``."""
    excluded = set(exclude)
    texts: dict[str, None] = {}
    with path.open(newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            for text in (row["question1"], row["question2"]):
                if text and text not in excluded:
                    texts[text] = None
            if len(texts) >= limit:
                break
    return list(texts)[:limit]


async def load(session: aiohttp.ClientSession, qdrant_url: str, documents: Sequence[str],
               vectors: Mapping[str, np.ndarray]) -> None:
    """The corpus as a cosine collection of points ``i`` with payload ``{"text", "doc_id": "doc-i"}``, written
    to Qdrant directly (an app's indexing job, not its questions)."""
    dim = len(next(iter(vectors.values())))
    async with session.put(f"{qdrant_url}/collections/{COLLECTION}",
                           json={"vectors": {"size": dim, "distance": "Cosine"}}) as response:
        response.raise_for_status()
    for start in range(0, len(documents), 500):
        points = [{"id": i, "vector": [float(x) for x in vectors[documents[i]]],
                   "payload": {"text": documents[i], "doc_id": f"doc-{i}"}}
                  for i in range(start, min(start + 500, len(documents)))]
        async with session.put(f"{qdrant_url}/collections/{COLLECTION}/points?wait=true",
                               json={"points": points}) as response:
            response.raise_for_status()


@dataclass(slots=True)
class Retriever:
    """Searches through the proxy (``url``) for each question's top ``k``; counts searches and how many the proxy's
    search cache answered."""

    url: str
    k: int
    vectors: Mapping[str, np.ndarray]
    searches: int = 0
    cached: int = 0

    async def top_k(self, session: aiohttp.ClientSession, question: str) -> list[dict[str, str]]:
        """``question``'s ``k`` nearest documents as returned, best first, as ``ragproxy.documents`` entries."""
        body = {"vector": [float(x) for x in self.vectors[question]], "limit": self.k, "with_payload": True}
        async with session.post(f"{self.url}/collections/{COLLECTION}/points/search", json=body) as response:
            payload = await response.json()
            if response.status != 200:
                raise RuntimeError(f"search answered {response.status}: {payload}")
            self.searches += 1
            self.cached += response.headers.get("X-Cache-Status", "MISS") != "MISS"
        return [{"id": point["payload"]["doc_id"], "text": point["payload"]["text"]} for point in payload["result"]]


def inline_message(question: str, documents: Sequence[Mapping[str, str]]) -> str:
    """The user message of an app that pastes what it retrieved: numbered sources, then the question."""
    sources = "\n\n".join(f"[{i}] {document['text']}" for i, document in enumerate(documents, 1))
    return f"Sources:\n\n{sources}\n\nQuestion: {question}"


def asked(user_message: str) -> str:
    """The question of a user message (the question itself, or the one :func:`inline_message` wraps)."""
    match = _INLINE_QUESTION.search(user_message)
    return match.group(1) if match else user_message


def first_source(system: str, user_message: str) -> str | None:
    """How the bench's upstream cites the first document it was given: ``[id]`` of the first document rendered into
    the system message, else ``[1]`` for numbered sources in the user message, else nothing."""
    match = CITATION.search(system)
    if match:
        return f"[{match.group(1)}]"
    return "[1]" if user_message.startswith("Sources:") else None
