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
CITES = ("auto", "position", "id", "source-id", "title", "none")
"""How the bench's upstream cites its first document (:func:`first_source`); ``auto``: by id when the documents came
structured, by position when pasted."""
BY_ID = ("id", "source-id", "title")
"""Citation forms that need the document's id or title: structured documents only."""
RENDERED = re.compile(r'<document id="([^"]+)"(?: title="([^"]*)")?')
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

    titled: bool = False
    """Each document sent with a title (:func:`title_of`)."""

    async def top_k(self, session: aiohttp.ClientSession, question: str) -> list[dict[str, str]]:
        """``question``'s ``k`` nearest documents as returned, best first, as ``ragproxy.documents`` entries."""
        body = {"vector": [float(x) for x in self.vectors[question]], "limit": self.k, "with_payload": True}
        async with session.post(f"{self.url}/collections/{COLLECTION}/points/search", json=body) as response:
            payload = await response.json()
            if response.status != 200:
                raise RuntimeError(f"search answered {response.status}: {payload}")
            self.searches += 1
            self.cached += response.headers.get("X-Cache-Status", "MISS") != "MISS"
        return [{"id": point["payload"]["doc_id"], "text": point["payload"]["text"],
                 **({"title": title_of(point["payload"]["doc_id"])} if self.titled else {})}
                for point in payload["result"]]


def title_of(doc_id: str) -> str:
    """A document's title in the bench's corpus: its number spelled as an entry of a knowledge base."""
    return f"Knowledge base entry {doc_id.removeprefix('doc-')}"


def inline_message(question: str, documents: Sequence[Mapping[str, str]]) -> str:
    """The user message of an app that pastes what it retrieved: numbered sources, then the question."""
    sources = "\n\n".join(f"[{i}] {document['text']}" for i, document in enumerate(documents, 1))
    return f"Sources:\n\n{sources}\n\nQuestion: {question}"


def asked(user_message: str) -> str:
    """The question of a user message (the question itself, or the one :func:`inline_message` wraps)."""
    match = _INLINE_QUESTION.search(user_message)
    return match.group(1) if match else user_message


def first_source(system: str, user_message: str, cite: str = "auto") -> str | None:
    """How the bench's upstream cites the first document it was given (``cite``, one of :data:`CITES`): for a
    document rendered into the system message ``[id]`` (``auto``, ``id``), ``[1]`` (``position``), ``[source: id]``
    (``source-id``) or ``(from "title")`` (``title``); for numbered sources in the user message ``[1]``; nothing
    with ``none`` or without documents."""
    match = RENDERED.search(system)
    if cite == "none" or (match is None and not user_message.startswith("Sources:")):
        return None
    if match is None or cite == "position":
        return "[1]"
    doc_id, title = match.group(1), match.group(2)
    if cite == "title":
        return f'(from "{title}")' if title else None
    return f"[source: {doc_id}]" if cite == "source-id" else f"[{doc_id}]"


def first_words(system: str, user_message: str, n: int) -> str | None:
    """The first ``n`` words of the first document the upstream was given (rendered or pasted), or ``None``."""
    rendered = re.search(r'<document id="[^"]*"[^>]*>\n(.*?)\n</document>', system, re.DOTALL)
    pasted = re.search(r"^\[1\] (.*?)(?:\n\n|\Z)", user_message, re.MULTILINE | re.DOTALL)
    text = rendered.group(1) if rendered else pasted.group(1) if pasted else None
    return " ".join(text.split()[:n]) if text and n > 0 else None
