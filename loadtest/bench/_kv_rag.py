"""The ``zipf-rag`` workload of the kv benchmarks: a RAG app's traffic on a corpus of real prose.

A corpus of ``docs`` (40) documents of about ``doc_words`` (150) words: passages of the Python standard library's
docstrings (:func:`loadtest.corpus.stdlib_passages`), text no rule of the proxy was written from. Each request
holds the top ``top_k`` (5) documents of a Zipf(``zipf_s`` 1.1) popularity over the corpus, in the order drawn
(its retrieval order: the most relevant first), and a unique question: by default the first sentence of another
docstring passage turned into a question, or the questions of a file given with ``--questions`` (one JSON object
per line with a ``question``, e.g. NQ-open; read by the bench only). Requests are streamed.

:func:`rag_workload` is pure (texts in, requests out); :func:`load_rag_workload` reads the texts.
"""

from __future__ import annotations

import argparse
import random
import re
from collections.abc import Sequence
from pathlib import Path

import orjson

from loadtest.bench._kv_workload import Present, Workload, make_workload
from loadtest.corpus import sample, stdlib_passages
from normalizer.documents import Document

SYSTEM = (
    "You are a helpful assistant for a software team. Answer the question using only the numbered passages "
    "the user gives. Cite every passage you use by its number, and say so when the passages do not hold the "
    "answer."
)


def rag_workload(
    texts: Sequence[str],
    questions: Sequence[str],
    *,
    requests: int,
    seed: int,
    top_k: int = 5,
    zipf_s: float = 1.1,
    present: Present = "pasted",
) -> Workload:
    """``len(texts)`` documents; ``requests`` requests, request ``i`` asking ``questions[i]`` (made unique with its
    number when the questions run out) about the top ``top_k`` of a Zipf(``zipf_s``) draw, in the order drawn.
    The sequence for more requests extends the one for fewer (same seed: same first requests)."""
    if len(texts) < top_k:
        raise ValueError(f"a top-{top_k} needs at least {top_k} documents, got {len(texts)}")
    if not questions:
        raise ValueError("no questions")
    rnd = random.Random(seed)
    documents = [Document(f"doc-{i}", " ".join(text.split()), None) for i, text in enumerate(texts)]
    weights = [1 / (rank + 1) ** zipf_s for rank in range(len(documents))]
    reqs: list[tuple[list[int], str]] = []
    for i in range(requests):
        chosen: list[int] = []
        while len(chosen) < top_k:
            pick = rnd.choices(range(len(documents)), weights)[0]
            if pick not in chosen:
                chosen.append(pick)
        question = questions[i % len(questions)]
        if i >= len(questions):
            question = f"{question} (case {i // len(questions) + 1})"
        reqs.append((chosen, question))
    return Workload(SYSTEM, documents, reqs, present=present, stream=True)


def _question_from(text: str) -> str:
    """A question about a passage's first sentence (``module.name: text`` as :mod:`loadtest.corpus` writes it)."""
    source, _, body = text.partition(": ")
    sentence = re.split(r"(?<=[.!?])\s", " ".join(body.split()), maxsplit=1)[0].rstrip(".")
    return f"Which passage explains how {source} works, where its documentation says: {sentence}?"


def read_questions(path: Path) -> list[str]:
    """The ``question`` of every JSON line of ``path``, in file order, without repeats."""
    seen: dict[str, None] = {}
    for line in path.read_bytes().splitlines():
        if line.strip():
            question = orjson.loads(line).get("question")
            if isinstance(question, str) and question.strip():
                seen.setdefault(question.strip().rstrip("?") + "?", None)
    return list(seen)


def load_rag_workload(
    *, docs: int, doc_words: int, requests: int, seed: int, present: Present, questions_path: Path | None = None
) -> Workload:
    """:func:`rag_workload` on ``docs`` stdlib docstring passages of ``doc_words`` +-20% words, and the questions
    of ``questions_path`` or of other passages."""
    low, high = round(doc_words * 0.8), round(doc_words * 1.2)
    long = [p for p in stdlib_passages(min_words=low, max_words=high) if len(p.text.split()) >= low]
    texts = [p.text for p in sample(long, docs)]
    if questions_path is not None:
        questions = read_questions(questions_path)
    else:
        chosen = set(texts)
        questions = list(
            dict.fromkeys(_question_from(p.text) for p in sample(stdlib_passages(), None) if p.text not in chosen)
        )
        random.Random(seed).shuffle(questions)
    return rag_workload(texts, questions, requests=requests, seed=seed, present=present)


def chosen_workload(args: argparse.Namespace, *, docs: int | None, requests: int) -> Workload:
    """The workload of ``--workload`` and ``--present`` with ``requests`` requests (``docs`` and ``--doc-words``
    default to the workload's own: synthetic 200 words, zipf-rag 40 documents of 150 words)."""
    present: Present = args.present
    if args.workload == "zipf-rag":
        return load_rag_workload(
            docs=docs or 40,
            doc_words=args.doc_words or 150,
            requests=requests,
            seed=args.seed,
            present=present,
            questions_path=args.questions,
        )
    assert docs is not None
    return make_workload(docs=docs, requests=requests, doc_words=args.doc_words or 200, seed=args.seed, present=present)
