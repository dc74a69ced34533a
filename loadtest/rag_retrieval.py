"""Retrieval for the fidelity bench's RAG loop (``--rag K``): each question's own top-k documents.

The corpus is the questions of a development-split CSV (``question1,question2,...``; read at run time, never
shipped) that are not in the traffic, so no pair's own question is ever retrieved. Documents are ranked by cosine
of the proxy's own embedder's vectors (exact search over the whole corpus), best first, and sent in that order.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

CITATION = re.compile(r'<document id="([^"]+)"')


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


def top_k(questions: Mapping[str, np.ndarray], documents: Sequence[str], vectors: Mapping[str, np.ndarray],
          k: int) -> dict[str, list[dict[str, str]]]:
    """Each question's ``k`` nearest documents by cosine, best first, as ``ragproxy.documents`` entries."""
    matrix = np.stack([vectors[d] for d in documents]).astype(np.float32)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    found: dict[str, list[dict[str, str]]] = {}
    for question, vector in questions.items():
        scores = matrix @ (vector / np.linalg.norm(vector))
        best = np.argsort(-scores)[:k]
        found[question] = [{"id": f"doc-{int(i)}", "text": documents[int(i)]} for i in best]
    return found


def cited(answer: str) -> str | None:
    """The document id an answer of the bench's upstream cites (its trailing ``[id]``), if any."""
    match = re.search(r"\[(doc-\d+)\]$", answer)
    return match.group(1) if match else None


def first_document(system: str) -> str | None:
    """The id of the first document rendered into a system message, the one the bench's upstream cites."""
    match = CITATION.search(system)
    return match.group(1) if match else None
