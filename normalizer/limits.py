"""Request limits: pure checks that a parsed request stays within what the proxy and its upstreams accept.

Every JSON request of a keyed route (chat, completions, Responses, embeddings, rerankers, Qdrant searches) is
checked before anything else reads it, so that an outsized or malformed request is answered at once with a 4xx in
the route's own error shape instead of costing seconds of event-loop time, failing deep inside a stage or being
forwarded for the upstream to answer with a 500:

========================  =======  ===========================================================================
limit (``limits.*``)      default  why this default
========================  =======  ===========================================================================
``json_depth``            128      Qdrant's JSON parser (serde_json) refuses deeper bodies; the proxy re-encodes a
                                   body at most 255 levels deep (orjson) and keys recurse over it → 400
``embedding_inputs``      2048     OpenAI's limit on the items of one embeddings ``input`` → 413
``search_batch``          1000     Qdrant sets no count by default (its bodies are bounded at 32 MB); each search
                                   costs the proxy about 0.3 ms of parsing and caching on its event loop → 413
``prefetch_depth``        64       Qdrant's own limit on nested ``prefetch`` in a query → 400
``rerank_documents``      10000    Cohere's limit on the documents of one rerank (vLLM and TEI set their own or
                                   none); each costs the proxy about 30 µs of keying, caching and reassembly,
                                   done in slices that leave the event loop to other requests → 413
========================  =======  ===========================================================================

Shapes refused with a 400 because no upstream of the route accepts them: a batch request's ``searches`` that is
not a list of JSON objects (it is what the proxy counts, bills and caches per item); a reranker body whose
documents, query or ``top_n`` have the wrong type (:func:`normalizer.rerank.malformed`); a chat or Responses
``tools`` that is not a list of objects, a Responses ``input`` that is neither a string nor a list of objects, any
other Responses field the proxy reads of another type than the API's (:data:`_RESPONSE_TYPES`), a message item of
``input`` the proxy cannot read (:func:`normalizer.responses.malformed_input`). A chat message naming a stored file
(``file_id``) is refused too: no tenant made one through the proxy, so its owner cannot be checked.
Depth is counted in containers (the body object is level 1); a body with fewer brackets than the limit is not
walked at all.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from normalizer.rerank import document_count, malformed
from normalizer.responses import malformed_input, names_file


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """The configured limits (``limits.*``)."""

    json_depth: int = 128
    embedding_inputs: int = 2048
    search_batch: int = 1000
    prefetch_depth: int = 64
    rerank_documents: int = 10_000


@dataclass(frozen=True, slots=True)
class Exceeded:
    """Why a request is refused: the status (400 or 413), a message for the client, an error code."""

    status: int
    message: str
    code: str


def json_depth(value: Any, stop_after: int) -> int:
    """Nesting depth of a parsed JSON value (a scalar is 0), counted up to ``stop_after + 1`` at most."""
    deepest = 0
    pending: list[tuple[Any, int]] = [(value, 1)] if isinstance(value, dict | list) else []
    while pending:
        node, depth = pending.pop()
        if depth > stop_after:
            return depth
        for child in node.values() if isinstance(node, dict) else node:
            if isinstance(child, dict | list):
                pending.append((child, depth + 1))
        deepest = max(deepest, depth)
    return deepest


def _too_deep(raw: bytes, body: Any, limit: int) -> Exceeded | None:
    if raw.count(b"{") + raw.count(b"[") <= limit:  # C-speed bound: fewer brackets than levels allowed
        return None
    if json_depth(body, limit) <= limit:
        return None
    return Exceeded(400, f"the request body nests deeper than {limit} levels", "nesting_too_deep")


def _embedding_items(body: Mapping[str, Any]) -> int:
    value = body.get("input")
    if not isinstance(value, list):
        return 1
    if value and all(isinstance(item, int) and not isinstance(item, bool) for item in value):
        return 1  # one token list
    return len(value)


def _prefetch_depth(query: Mapping[str, Any], stop_after: int) -> int:
    deepest = 0
    pending: list[tuple[Any, int]] = [(query.get("prefetch"), 1)]
    while pending and deepest <= stop_after:
        prefetch, depth = pending.pop()
        for item in prefetch if isinstance(prefetch, list) else [prefetch]:
            if isinstance(item, Mapping):
                deepest = max(deepest, depth)
                pending.append((item.get("prefetch"), depth + 1))
    return deepest


def _list_of_objects(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, dict) for item in value)


_NUMBER = (int, float)
_RESPONSE_TYPES: Mapping[str, tuple[tuple[type, ...], str]] = {
    "model": ((str,), "a string"), "previous_response_id": ((str,), "a string"), "instructions": ((str,), "a string"),
    "conversation": ((str, dict), "a string or an object"), "tool_choice": ((str, dict), "a string or an object"),
    "background": ((bool,), "a boolean"),
    "text": ((dict,), "an object"), "reasoning": ((dict,), "an object"), "metadata": ((dict,), "an object"),
    "store": ((bool,), "a boolean"), "stream": ((bool,), "a boolean"), "include": ((list,), "a list of strings"),
    **{name: (_NUMBER, "a number") for name in ("temperature", "top_p", "max_output_tokens", "max_tool_calls",
                                                 "top_logprobs")},
}  # fmt: skip
"""The Responses fields the proxy reads, and the JSON types it reads them as (``null`` is absent)."""


def _response_field(body: Mapping[str, Any]) -> str | None:
    """What makes a Responses body's field one of the wrong type (``None``: nothing)."""
    for name, (types, what) in _RESPONSE_TYPES.items():
        value = body.get(name)
        if value is None:
            continue
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            return f"`{name}` must be {what}"
    include = body.get("include")
    if isinstance(include, list) and not all(isinstance(item, str) for item in include):
        return "`include` must be a list of strings"
    return None


Shape = Callable[[Mapping[str, Any], RequestLimits], "Exceeded | None"]
"""What an endpoint's bodies must be besides not too deep: a check an endpoint row names (``None``: none)."""


def _invalid(wrong: str | None) -> Exceeded | None:
    return None if wrong is None else Exceeded(400, wrong, "invalid_type")


def _tools(body: Mapping[str, Any]) -> str | None:
    tools = body.get("tools")
    return None if tools is None or _list_of_objects(tools) else "`tools` must be a list of tool objects"


def chat_shape(body: Mapping[str, Any], limits: RequestLimits) -> Exceeded | None:
    """Chat Completions: ``tools``, when present, is a list of objects; no message's content names a file stored
    upstream (``file.file_id``): files live under the proxy's key, and the proxy serves no API that makes one, so
    none is a tenant's and its owner cannot be checked."""
    if "tools" in body and (wrong := _tools(body)) is not None:
        return _invalid(wrong)
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else ():
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list) and names_file(content):
            return Exceeded(400, "`file_id` names a file stored upstream under the proxy's key, where its owner cannot "
                            "be checked: send the file's content (file_data) instead", "unsupported_parameter")
    return None


def response_shape(body: Mapping[str, Any], limits: RequestLimits) -> Exceeded | None:
    """The Responses API: ``tools`` as chat's, ``input`` a string or a list of readable items, the fields the
    proxy reads of the API's types."""
    value = body.get("input")
    if (wrong := _tools(body)) is None:
        if "input" in body and not (isinstance(value, str) or _list_of_objects(value)):
            wrong = "`input` must be a string or a list of input items (objects)"
        else:
            wrong = _response_field(body) or (malformed_input(value) if isinstance(value, list) else None)
    return _invalid(wrong)


def embedding_shape(body: Mapping[str, Any], limits: RequestLimits) -> Exceeded | None:
    """Embeddings: at most ``embedding_inputs`` items in ``input``."""
    if _embedding_items(body) > limits.embedding_inputs:
        return Exceeded(413, f"'input' holds {_embedding_items(body)} items; at most {limits.embedding_inputs} are "
                        "accepted in one request", "too_many_inputs")
    return None


def _reranker(body: Mapping[str, Any], limits: RequestLimits, score: bool) -> Exceeded | None:
    wrong = malformed(body, score)
    if wrong is None and document_count(body) > limits.rerank_documents:
        return Exceeded(413, f"the request holds {document_count(body)} documents; at most "
                        f"{limits.rerank_documents} are accepted in one request", "too_many_documents")
    return _invalid(wrong)


def rerank_shape(body: Mapping[str, Any], limits: RequestLimits) -> Exceeded | None:
    """Rerankers (Cohere, Jina, vLLM, TEI): the types :func:`normalizer.rerank.malformed` reads, and at most
    ``rerank_documents`` documents."""
    return _reranker(body, limits, score=False)


def score_shape(body: Mapping[str, Any], limits: RequestLimits) -> Exceeded | None:
    """vLLM's score API (``text_1``/``text_2``): as :func:`rerank_shape`."""
    return _reranker(body, limits, score=True)


def check_llm(body: Mapping[str, Any], raw: bytes, limits: RequestLimits, shape: Shape | None) -> Exceeded | None:
    """The limits of an OpenAI-style request: its depth, then its endpoint's ``shape``."""
    too_deep = _too_deep(raw, body, limits.json_depth)
    if too_deep is not None:
        return too_deep
    return None if shape is None else shape(body, limits)


def check_search(batch: bool, body: Mapping[str, Any], raw: bytes, limits: RequestLimits) -> Exceeded | None:
    """The limits of a Qdrant search (``batch``: a ``/batch`` endpoint, whose body is ``{"searches": [...]}``)."""
    too_deep = _too_deep(raw, body, limits.json_depth)
    if too_deep is not None:
        return too_deep
    searches: Any = [body]
    if batch:
        searches = body.get("searches")
        if not isinstance(searches, list) or not all(isinstance(item, dict) for item in searches):
            return Exceeded(400, "'searches' must be a list of search objects", "invalid_batch")
        if len(searches) > limits.search_batch:
            return Exceeded(413, f"the batch holds {len(searches)} searches; at most {limits.search_batch} are "
                            "accepted in one request", "batch_too_large")
    for search in searches:
        if "prefetch" in search and _prefetch_depth(search, limits.prefetch_depth) > limits.prefetch_depth:
            return Exceeded(400, f"prefetch nests deeper than {limits.prefetch_depth} levels", "prefetch_too_deep")
    return None
