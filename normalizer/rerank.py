"""Reranker requests in the shapes of the common servers, as (query, document) pairs each with its own exact key,
and their answers reassembled in the upstream's own shape. Pure: the cache stage is
:class:`proxy.items.rerank.RerankItemsCache`.

Shapes (``form``):

- ``rerank`` — Cohere/Jina-style, also vLLM's ``/v1/rerank`` and ``/v2/rerank`` and llama.cpp's ``/v1/rerank``:
  ``{model, query, documents, top_n, return_documents}``, a document a string or an object with ``text``;
  answers ``{..., results: [{index, relevance_score, document?}]}`` sorted by score, best first, cut to ``top_n``
  (none or 0: all);
- ``tei`` — Hugging Face text-embeddings-inference's ``POST /rerank``: ``{query, texts, raw_scores,
  return_text, truncate, truncation_direction}``; answers a list ``[{index, score, text?}]``, best first;
- ``score`` — vLLM's ``/v1/score``: ``{model, text_1, text_2}`` where ``text_1`` is one query for every
  ``text_2`` or a list paired with ``text_2`` item by item; answers ``{..., data: [{index, object, score}]}`` in
  the client's order.

A pair's key (kind ``rerank``, in the request's key scope) covers the form, the model, the query, the document
(a string and ``{"text": same string}`` are one document) and every other field of the request except
:data:`UNKEYED_FIELDS` (they order, cut or schedule the answer; they cannot change a score). ``return_documents``
and ``return_text`` are keyed: a stored result holds the document text exactly when the upstream sent it. Unknown
fields are keyed verbatim; whether such a request is cached at all follows ``cache.unknown_fields`` through
:func:`normalizer.bypass.bypass_reason`, as for every endpoint (:data:`RERANK_KNOWN_FIELDS`).

Reassembly: the results of cached pairs (stored as the upstream sent them, without their ``index``) and of the
pairs just scored are put together with indices into the client's own list, sorted by score (ties keep the
client's order, as a stable sort upstream does) and cut to ``top_n`` — after merging, since the upstream only saw
the missing documents. The envelope (``id``, ``model``, ``usage``, ``meta``...) is the upstream's answer's, or the
stored one when everything was cached; ``usage.prompt_tokens``/``total_tokens`` add each cached pair's share of
the batch it was scored in.

Work that grows with the number of documents is written as :data:`~normalizer.steps.Steps`, so that the proxy
gives its event loop a turn between documents: a request of 10,000 documents must not stop every other request for
the time its items take (:mod:`proxy.core.pacing`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from normalizer.canonical_json import CanonicalizationError, JSONValue, canonical_value
from normalizer.steps import Steps

RerankForm = Literal["rerank", "tei", "score"]

UNKEYED_FIELDS = frozenset({"top_n", "priority", "user", "cache", "ragproxy"})
"""Fields that cannot change a score: the cut of the answer, scheduling, end-user ids, the proxy's own options."""

_PAIR_FIELDS: Mapping[RerankForm, frozenset[str]] = {
    "rerank": frozenset({"query", "documents"}),
    "tei": frozenset({"query", "texts"}),
    "score": frozenset({"text_1", "text_2"}),
}
RERANK_KNOWN_FIELDS = frozenset(
    {
        "model", "query", "documents", "texts", "text_1", "text_2", "top_n", "return_documents", "return_text",
        "raw_scores", "truncate", "truncation_direction", "max_tokens_per_doc", "max_chunks_per_doc",
        "rank_fields", "truncate_prompt_tokens", "instruction", "use_activation", "priority", "user",
    }
)  # fmt: skip
"""Fields some reranker documents (the rest are unknown: keyed, and cached only as ``cache.unknown_fields`` says)."""

_SCORE_FIELD: Mapping[RerankForm, str] = {"rerank": "relevance_score", "tei": "score", "score": "score"}
_USAGE_COUNTS = ("prompt_tokens", "total_tokens")


@dataclass(frozen=True, slots=True)
class RerankRequest:
    """A reranker request read into pairs."""

    form: RerankForm
    pairs: tuple[tuple[JSONValue, JSONValue], ...]
    """(query, document) as the client sent them, in its order."""
    options: dict[str, JSONValue]
    """Everything a score may depend on besides the pair (the model included)."""
    top_n: int | None

    def items(self) -> Iterator[dict[str, JSONValue]]:
        """One canonical request per pair (each gets its own key), made as they are taken."""
        for query, document in self.pairs:
            yield {"form": self.form, "query": canonical_value(query), "document": _document(document),
                   "options": self.options}


def _document(document: JSONValue) -> JSONValue:
    if isinstance(document, dict) and set(document) == {"text"} and isinstance(document["text"], str):
        return document["text"]
    return canonical_value(document)


def _list(value: Any, field: str) -> list[Any]:
    if not isinstance(value, list) or not value:
        raise CanonicalizationError(f"{field} must be a non-empty list")
    return value


def read_rerank(body: Mapping[str, Any], score: bool) -> RerankRequest:
    """The pairs of a reranker body (``score``: sent to a score route, ``text_1``/``text_2``);
    :class:`CanonicalizationError` when it is in none of the shapes."""
    form: RerankForm = "score" if score else "tei" if "texts" in body else "rerank"
    if form == "score":
        first, second = body.get("text_1"), body.get("text_2")
        documents = _list(second, "text_2") if isinstance(second, list) else [second]
        queries = _list(first, "text_1") if isinstance(first, list) else [first] * len(documents)
        if len(queries) != len(documents) or not all(isinstance(q, str) for q in queries):
            raise CanonicalizationError("text_1 must be a string, or a list as long as text_2")
    else:
        query = body.get("query")
        if not isinstance(query, str):
            raise CanonicalizationError("query must be a string")
        documents = _list(body.get("texts" if form == "tei" else "documents"), "documents")
        queries = [query] * len(documents)
    if not all(isinstance(d, str) or (isinstance(d, dict) and isinstance(d.get("text"), str)) for d in documents):
        raise CanonicalizationError("each document must be a string or an object with a string `text`")
    top_n = body.get("top_n")
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 0):
        raise CanonicalizationError("top_n must be a non-negative integer")
    options = {key: canonical_value(value) for key, value in body.items()
               if key not in UNKEYED_FIELDS and key not in _PAIR_FIELDS[form] and value is not None}
    return RerankRequest(form, tuple(zip(queries, documents, strict=True)), options, top_n or None)


def upstream_body(body: Mapping[str, Any], request: RerankRequest, positions: Sequence[int]) -> dict[str, Any]:
    """The body that asks the upstream for the pairs at ``positions`` only, every one of them scored (no
    ``top_n``)."""
    out = {key: value for key, value in body.items() if key != "top_n"}
    documents = [request.pairs[i][1] for i in positions]
    if request.form == "score":
        out["text_2"] = documents
        if isinstance(body.get("text_1"), list):
            out["text_1"] = [request.pairs[i][0] for i in positions]
    else:
        out["texts" if request.form == "tei" else "documents"] = documents
    return out


@dataclass(frozen=True, slots=True)
class Scored:
    """One pair's result as the upstream sent it (without its ``index``), and its score."""

    result: dict[str, JSONValue]
    score: float


def read_answer(request: RerankRequest, answer: Any,
                count: int) -> Steps[tuple[list[Scored], dict[str, Any]] | None]:
    """The results of an upstream answer to ``count`` pairs, by position in what was sent, and its envelope (the
    answer without its results); ``None`` when the answer is not one result per pair."""
    if request.form == "tei":
        results, envelope = answer, {}
    elif isinstance(answer, dict):
        field = "data" if request.form == "score" else "results"
        results, envelope = answer.get(field), {k: v for k, v in answer.items() if k != field}
    else:
        return None
    if not isinstance(results, list) or len(results) != count:
        return None
    found: list[Scored | None] = [None] * count
    name = _SCORE_FIELD[request.form]
    for result in results:
        yield
        if not isinstance(result, dict):
            return None
        index, score = result.get("index"), result.get(name)
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count or found[index]:
            return None
        if isinstance(score, bool) or not isinstance(score, int | float):
            return None
        found[index] = Scored({k: v for k, v in result.items() if k != "index"}, float(score))
    return [scored for scored in found if scored is not None], envelope  # one per index: none missing, none twice


def render(request: RerankRequest, scored: Sequence[Scored], envelope: Mapping[str, Any], *,
           forwarded: bool, cached_tokens: int) -> Steps[JSONValue]:
    """The answer to the client's whole request, in the upstream's shape (see the module docstring).

    ``envelope`` is the upstream's answer's when ``forwarded``, else a stored one (its token counts are then
    not this request's: the reported usage is the cached pairs' ``cached_tokens`` alone)."""
    order = list(range(len(scored)))
    if request.form != "score":
        scores = [-item.score for item in scored]
        order.sort(key=scores.__getitem__)
        if request.top_n is not None:
            order = order[: request.top_n]
    results = []
    for i in order:
        yield
        results.append({"index": i, **scored[i].result})
    if request.form == "tei":
        return results
    out = {**envelope, "data" if request.form == "score" else "results": results}
    usage = envelope.get("usage")
    if isinstance(usage, dict):
        out["usage"] = {key: (value if forwarded else 0) + cached_tokens
                        if key in _USAGE_COUNTS and isinstance(value, int) else value for key, value in usage.items()}
    return out


def reported_tokens(envelope: Mapping[str, Any]) -> int:
    """The tokens an answer reports scoring (``usage.prompt_tokens``, else ``total_tokens``; 0 without usage)."""
    usage = envelope.get("usage")
    if not isinstance(usage, dict):
        return 0
    for key in _USAGE_COUNTS:
        value = usage.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return 0


def token_shares(request: RerankRequest, positions: Sequence[int], total: int) -> Steps[list[int]]:
    """``total`` tokens split among the pairs at ``positions`` by their length in UTF-8 bytes (largest remainders
    round, so the shares add up to ``total`` exactly: a full hit reports the batch's own usage)."""
    weights = []
    for i in positions:
        yield
        weights.append(len(orjson.dumps([request.pairs[i][0], request.pairs[i][1]])))
    whole = sum(weights)
    exact = [total * weight / whole for weight in weights]
    shares = [int(share) for share in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: shares[i] - exact[i])
    for i in by_remainder[: total - sum(shares)]:
        shares[i] += 1
    return shares


def document_count(body: Mapping[str, Any]) -> int:
    """How many documents a reranker body asks to score: the length of its list (0 when empty), else 1 (one
    document, or a multimodal object)."""
    for field in ("documents", "texts", "text_2"):
        value = body.get(field)
        if isinstance(value, list):
            return len(value)
    return 1


_TEXT_TYPES = frozenset({str, dict})
_OBJECT_FIELDS: Mapping[str, type] = {"text": str, "image": str, "content": list}
"""The fields that make an object a document, and their types: Cohere's and Jina's ``text``, Jina's ``image``,
vLLM's multimodal ``content`` (a list of parts)."""


def _object(value: dict[str, Any], *, ranked: bool) -> bool:
    """``value`` is a document object: its known fields of their types, at least one of them unless the request
    names ``rank_fields`` (Cohere's objects of any fields)."""
    known = [name for name in _OBJECT_FIELDS if name in value]
    return (ranked or bool(known)) and all(isinstance(value[name], _OBJECT_FIELDS[name]) for name in known)


def _texts(value: Any, *, single: bool, ranked: bool = False) -> bool:
    """``value`` is a list of strings and document objects (``single``: or one string or object)."""
    if isinstance(value, list):  # the types of parsed JSON are exact; compared at C speed (5x a generator's)
        kinds = set(map(type, value))
        return kinds <= _TEXT_TYPES and (dict not in kinds or all(
            _object(item, ranked=ranked) for item in value if type(item) is dict))
    return _object(value, ranked=ranked) if isinstance(value, dict) else single and isinstance(value, str)


def malformed(body: Mapping[str, Any], score: bool) -> str | None:
    """What makes a reranker body (``score``: of a score route) one that no reranker server accepts (``None``:
    nothing), for a 400 before
    anything reads it. Only the wrong types are refused, an object among them when it is no document (see
    :data:`_OBJECT_FIELDS`): absent or empty fields and unknown fields are the upstream's to judge."""
    if score:
        for field in ("text_1", "text_2"):
            if field in body and not _texts(body[field], single=True):
                return f"`{field}` must be a string, a document object, or a list of them"
        return None
    ranked = isinstance(body.get("rank_fields"), list)
    for field in ("documents", "texts"):
        if field in body and not _texts(body[field], single=False, ranked=ranked):
            return (f"`{field}` must be a list of strings or document objects (with a string `text` or `image`, "
                    "or a list `content`)")
    query = body.get("query")
    if query is not None and not isinstance(query, str | dict):
        return "`query` must be a string"
    top_n = body.get("top_n")
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 0):
        return "`top_n` must be a non-negative integer"
    return None
