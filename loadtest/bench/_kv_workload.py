"""The kv benchmarks' workloads and how a request of one is sent: a corpus of documents with Zipf-distributed
popularity; each request has one system prompt, its documents in retrieval order, and a fresh question.

Two workloads (``--workload``):

- ``synthetic`` (:func:`make_workload`): syllable words, top-k 3-5 in a retrieval order drawn at random per request
  (see :mod:`loadtest.bench.kv`);
- ``zipf-rag`` (:mod:`loadtest.bench._kv_rag`): 40 documents of ~150 words of real prose, the top 5 of a Zipf(1.1)
  popularity in the order drawn, a unique question, streamed.

Three presentations (``--present``), how an app puts the documents in its prompt: ``structured`` (the proxy's sides
send them apart, ``ragproxy.documents``; the sides without the proxy send the proxy's own rendering in retrieval
order, :func:`normalizer.documents.render`), ``pasted`` (every side sends the same prompt: the documents as
numbered passages ``[1] ...`` in the user message, before the question, which is how most apps send them) and
``joined`` (the same, but the documents joined by blank lines only, ``"\n\n".join(texts)``: no shape to read, so
the proxy recognises them only as they move between requests, :mod:`normalizer.repeated_blocks`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Literal

from normalizer.documents import Document, render

Present = Literal["structured", "pasted", "joined"]
PRESENTS: tuple[Present, ...] = ("structured", "pasted", "joined")

SYLLABLES = ["ka", "lo", "mi", "ne", "su", "ta", "ri", "po", "ve", "da", "gu", "he", "zo", "fi", "ba", "ly"]


@dataclass(frozen=True, slots=True)
class Workload:
    system: str
    documents: list[Document]
    requests: list[tuple[list[int], str]]
    """Per request: indices of its documents in retrieval order, and its question."""
    present: Present = "structured"
    """How the documents are sent (see the module)."""
    stream: bool = False
    """Requests ask for a streamed answer (TTFT is then the first chunk's arrival)."""

    @property
    def in_prompt(self) -> bool:
        """The documents are in the prompt's text (``pasted`` or ``joined``): every side sends the same prompt."""
        return self.present != "structured"


def make_workload(*, docs: int, requests: int, doc_words: int, seed: int, zipf_s: float = 1.1,
                  present: Present = "structured") -> Workload:
    rnd = random.Random(seed)
    words = ["".join(rnd.choice(SYLLABLES) for _ in range(rnd.randint(1, 3))) for _ in range(600)]

    def sentence(n: int) -> str:
        return " ".join(rnd.choice(words) for _ in range(n)).capitalize() + "."

    system = "You answer questions using only the documents below. Cite them. " + " ".join(
        sentence(12) for _ in range(6)
    )
    corpus = [
        Document(
            f"doc-{i}", " ".join(sentence(rnd.randint(8, 16)) for _ in range(doc_words // 12)), f"Doc {i}"
        )
        for i in range(docs)
    ]
    weights = [1 / (r + 1) ** zipf_s for r in range(docs)]
    reqs = []
    for i in range(requests):
        k = min(rnd.randint(3, 5), docs)  # (a corpus under 5 documents would never fill a top-5)
        chosen: list[int] = []
        while len(chosen) < k:
            pick = rnd.choices(range(docs), weights)[0]
            if pick not in chosen:
                chosen.append(pick)
        rnd.shuffle(chosen)
        reqs.append((chosen, f"Question {i}: " + sentence(10)))
    return Workload(system, corpus, reqs, present=present)


def pasted_passages(documents: list[Document], question: str, *, joined: bool = False) -> str:
    """The user message of an app that pastes its documents: ``[n] text`` one per line (``joined``: each text as
    one paragraph, blank lines between them), a blank line, the question."""
    if joined:
        passages = "\n\n".join(" ".join(d.text.split()) for d in documents)
    else:
        passages = "\n".join(f"[{n}] {' '.join(d.text.split())}" for n, d in enumerate(documents, 1))
    return f"{passages}\n\nQuestion: {question}"


def app_messages(work: Workload, index: int) -> list[dict[str, Any]]:
    """Request ``index``'s messages as an app sends them without the proxy (documents in retrieval order)."""
    indices, question = work.requests[index]
    documents = [work.documents[j] for j in indices]
    if work.in_prompt:
        return [{"role": "system", "content": work.system},
                {"role": "user", "content": pasted_passages(documents, question, joined=work.present == "joined")}]
    return render(work.system, documents, question)


def structured_parts(work: Workload, index: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Request ``index`` with its documents sent apart: ``(messages without them, ragproxy.documents)``."""
    indices, question = work.requests[index]
    documents = [{"id": d.id, "text": d.text, "title": d.title} for d in (work.documents[j] for j in indices)]
    return [{"role": "system", "content": work.system}, {"role": "user", "content": question}], documents
