"""The APIs the proxy serves and caches, one :class:`Endpoint` row each: Chat Completions, legacy Completions, the
Responses API, embeddings, rerankers and vLLM's score API.

A row owns everything the assembly and the stages would otherwise branch on: where it is served (``paths``, the
``dialect`` of its errors), the shape its bodies must have (``shape``, :mod:`normalizer.limits`), the bypass rules
they are judged by (``rules``, :mod:`normalizer.bypass`), how a body is keyed (``kind``, ``canonical``), which cache
stages serve it (``cache``), how it is priced (``pricing``), and for the LLM APIs how its prompt's documents are
read, the final question stored with an answer, the semantic reading, what a complete answer is (a streamed one
assembled, a Responses object only when ``completed`` or ``incomplete``), how a cached answer is replayed (JSON,
chat chunks, or Responses typed events), whether a request makes a stored object of its own (Responses ``store``)
and how the KV layer plans it. :func:`proxy.assembly.pipelines.build_pipelines` builds one pipeline per row and
hands the row to the stages it builds; :class:`proxy.assembly.app.DataPlane` serves each at its paths. No stage
compares route or kind names.

One vocabulary: an endpoint is named by its route (``chat``, ``completions``, ``responses``, ``embeddings``,
``rerank``, ``score``: ``ctx.route``, metric labels and the ``route:`` tag). :attr:`Endpoint.kind` is the name the
cache layer keeps for it (``chat``, ``completion``, ``response``, ``embedding``, ``rerank``): it is hashed into every
exact key and written into every stored entry, so it keeps its values for the entries earlier versions persisted in
L3 and Redis; :func:`for_entry` finds an entry's endpoint by it (the first row defined with that kind).

**Adding a cacheable JSON endpoint** is a row (and, for a new body, its canonicaliser): see
``tests/proxy/test_new_endpoint.py``.

**Requests are built from rows.** Every row names its method, exact path templates (no prefixes) and the typed
query parameters it takes (:mod:`normalizer.paths`); the upstream's path and query are rebuilt from those
(:func:`normalizer.paths.upstream_target`), never copied from the client. Besides the cached APIs
(:class:`Endpoint`), the requests about state an upstream keeps are rows of their own (:class:`Resource`, in
:data:`RESOURCES`): ``GET``/``DELETE /v1/responses/{response_id}``, ``GET /v1/responses/{response_id}/input_items``,
``POST /v1/responses/{response_id}/cancel``, ``POST /v1/responses/input_tokens`` and ``/compact``, each with its
price, its body and limits, and the ids it names, each owner-checked (:mod:`proxy.stored.stages`). :data:`ROWS` is
every row: what the data plane serves under ``/v1`` besides the operator's pass-through, and what ``bench abuse``
attacks.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import orjson

from normalizer.bypass import (
    CHAT_RULES,
    COMPLETION_RULES,
    EMBEDDING_RULES,
    RERANK_RULES,
    RESPONSE_RULES,
    BypassRules,
)
from normalizer.canonical import RequestKind, canonical_completion
from normalizer.canonical_request import Canonicaliser, chat_request, response_request
from normalizer.documents import PromptDocuments, read_prompt
from normalizer.limits import Shape, chat_shape, embedding_shape, rerank_shape, response_shape, score_shape
from normalizer.paths import ITEM_ID, NO_QUERY, RESPONSE_ID, Parameter, PathTemplate, Query, QueryParameter
from normalizer.prompt_plan import PromptPlan, plan_request, plan_response
from normalizer.responses import echo_request, final_input_question, one_replica_reason, read_response_prompt, stores
from normalizer.signature import CHAT_READING, RESPONSE_READING, PromptReading, final_question
from proxy.core.errors import Dialect
from proxy.core.prompt import PromptReader
from proxy.core.response_events import assemble_response, replay_response
from proxy.core.sse import StreamShape, assemble_stream, replay
from proxy.core.usage import client_asked_for_usage
from tiers.entry import CachedResponse

QuestionReader = Callable[[Mapping[str, Any], PromptDocuments], "str | None"]
"""Reads the final user question of a body (kept in a stored entry's ``meta``)."""
Planner = Callable[..., "PromptPlan | None"]
"""``(body, prompt, *, chars_per_token)`` → the KV plan of a request (:mod:`normalizer.prompt_plan`)."""
NO_USAGE = "no_usage"
"""Entry metadata: the answer was assembled from a stream that reported no usage."""
Answer = bytes | list[bytes]
"""A cached answer as sent: the JSON body, or the events of a replayed stream."""


class Cache(Enum):
    """Which cache stages serve an endpoint (:mod:`proxy.assembly.pipelines`)."""

    ANSWERS = "answers"
    """Whole answers under the exact key of ``canonical``: the cache tiers, coalescing, stale answers; L2 and the KV
    stages too when the row reads a prompt."""
    EMBEDDING_ITEMS = "embedding_items"
    """Each input of an embeddings body under its own key (:mod:`proxy.items.embeddings`)."""
    RERANK_ITEMS = "rerank_items"
    """Each (query, document) pair of a reranker body under its own key (:mod:`proxy.items.rerank`)."""


class Pricing(Enum):
    """How credits price an endpoint's requests (the credit stage of each: :mod:`proxy.assembly.pipelines`)."""

    TOKENS = "tokens"
    """The tokens of the prompt and of the answer, its output bounded by ``max_tokens``."""
    RESPONSE = "response"
    """As ``TOKENS``, the output bounded by ``max_output_tokens`` (the Responses API)."""
    RERANK = "rerank"
    """A price per document (rerankers)."""
    REQUEST = "request"
    """``credits.request_price`` per request, whatever its body and answer (a request that runs no model)."""


API_VERSION = QueryParameter(("api-version",), Parameter("an API version", re.compile(r"[A-Za-z0-9._-]{1,32}"),
                                                         "2024-06-01"))
"""The one query parameter the cached APIs take (Azure-style servers answer by it; it is part of the cache key)."""
LLM_QUERY = Query((API_VERSION,))


@dataclass(frozen=True, slots=True, eq=False)
class Endpoint:
    """One API the proxy serves, as one row; its LLM behaviour in the Chat Completions family's conventions
    (``choices``; a stream of ``chat.completion.chunk`` or ``text_completion`` chunks, assembled into one object and
    replayed in the upstream's own stream shape). Rows compare and hash by identity (pipelines are keyed by them)."""

    route: str
    """The route's name: ``ctx.route``, the pipeline's, the metric label, the ``route:`` tag of stored entries."""
    kind: RequestKind
    """The cache layer's name: part of every exact key and of every stored entry (persisted: never renamed)."""
    paths: tuple[str, ...]
    """Where the data plane serves it (``POST``)."""
    rules: BypassRules
    """What its bodies are judged by before they are cached (:func:`normalizer.bypass.bypass_reason`)."""
    canonical: Canonicaliser | None = None
    """A body → the canonical request its answer is keyed by (``cache`` ``ANSWERS``; ``None``: keyed item by item)."""
    shape: Shape | None = None
    """What its bodies must be, checked before anything reads them (:func:`normalizer.limits.check_llm`)."""
    cache: Cache = Cache.ANSWERS
    pricing: Pricing = Pricing.TOKENS
    dialect: Dialect = Dialect.OPENAI
    """The shape of its errors."""
    read_prompt: PromptReader | None = None
    """How the prompt's documents are read (``None``: the endpoint has no prompt stage)."""
    read_question: QuestionReader = final_question
    reading: PromptReading | None = None
    """How the semantic tier reads its requests (``None``: not looked up by meaning)."""
    owned: Callable[[Mapping[str, Any]], bool] | None = None
    """Whether a request makes a stored object of its own upstream (its answer is private to its tenant)."""
    plan: Planner = plan_request
    """The KV layer's plan of a request."""
    usage_on_request: bool = True
    """Whether a stream reports its token usage only when ``stream_options.include_usage`` asks for it (the proxy
    asks for it when it bills the request or may store its answer: :mod:`proxy.core.stream_usage`)."""
    forwarded_as_sent: bool = False
    """Whether the body goes upstream as the client wrote it, never re-rendered from the KV plan: its documents keep
    the order sent, and only the hints its API takes are added to it."""
    query: Query = LLM_QUERY
    """The query parameters it takes (anything else is refused, 400)."""
    templates: tuple[PathTemplate, ...] = field(init=False, repr=False)
    """``paths`` as exact templates (what the upstream path is built from)."""

    method = "POST"
    """Every cached API is a ``POST``."""

    def assemble(self, raw: bytes) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """A finished stream as one answer object, and the entry metadata its replay needs (``no_usage`` when the
        stream reported no usage); ``None`` if unusable."""
        assembled = assemble_stream(raw)
        if assembled is None:
            return None
        answer, shape = assembled
        return answer, {"stream": shape.as_meta(), **({} if "usage" in answer else {NO_USAGE: True})}

    def carries(self, entry: CachedResponse, request: Mapping[str, Any], stream: bool) -> bool:
        """Whether ``entry`` holds what ``request`` asks of its answer: a JSON answer, or a stream with
        ``stream_options.include_usage``, carries its usage, so an answer assembled from a stream that reported
        none does not serve them (the request goes upstream, and its answer replaces the entry)."""
        if not entry.meta.get(NO_USAGE):
            return True
        return stream and not client_asked_for_usage(request)

    def finished(self, answer: Mapping[str, Any]) -> bool:
        """Whether a JSON answer without an error is a final answer, worth storing."""
        return True

    def answer(self, entry: CachedResponse, request: Mapping[str, Any], stream: bool) -> Answer:
        """A cached entry as this request gets it: its body, or replayed as a stream when the request asked."""
        if not stream:
            return entry.body
        shape = StreamShape.from_meta(entry.meta.get("stream"))
        return replay(orjson.loads(entry.body), include_usage=client_asked_for_usage(request), shape=shape)

    def stored_id(self, request: Mapping[str, Any], body: bytes) -> str | None:
        """The id of the object the upstream keeps for this answer (``None``: it keeps none)."""
        return None

    def lifetime(self, retention_s: float) -> Callable[[Mapping[str, Any]], float | None] | None:
        """What bounds a stored answer's cache lifetime beyond the request's own (``None``: nothing)."""
        return None

    def __post_init__(self) -> None:
        object.__setattr__(self, "templates", tuple(PathTemplate(path) for path in self.paths))
        _BY_KIND.setdefault(self.kind, self)


@dataclass(frozen=True, slots=True, eq=False)
class RerankEndpoint(Endpoint):
    """A reranker API, cached pair by pair (:mod:`proxy.items.rerank`)."""

    score: bool = False
    """Its bodies are vLLM's score API's (``text_1``/``text_2``), not a query and documents."""


@dataclass(frozen=True, slots=True, eq=False)
class ResponsesEndpoint(Endpoint):
    """The Responses API: a response object with a ``status``, typed stream events, requests that make stored
    responses (``store``) and continue them, and bodies forwarded in their own shape."""

    def assemble(self, raw: bytes) -> tuple[dict[str, Any], dict[str, Any]] | None:
        response = assemble_response(raw)
        return None if response is None else (response, {})

    def finished(self, answer: Mapping[str, Any]) -> bool:
        return answer.get("status") in ("completed", "incomplete")  # not failed, queued or running (background)

    def answer(self, entry: CachedResponse, request: Mapping[str, Any], stream: bool) -> Answer:
        """The request's own fields outside the key are echoed (:func:`normalizer.responses.echo_request`); a stream
        is replayed as typed events (:mod:`proxy.core.response_events`)."""
        response = orjson.loads(entry.body)
        echoed = echo_request(response, request)
        if stream:
            return replay_response(response)
        return orjson.dumps(response) if echoed else entry.body

    def stored_id(self, request: Mapping[str, Any], body: bytes) -> str | None:
        if not stores(request):
            return None
        try:
            response = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
        identifier = response.get("id") if isinstance(response, dict) else None
        return identifier if isinstance(identifier, str) else None

    def lifetime(self, retention_s: float) -> Callable[[Mapping[str, Any]], float | None] | None:
        """A stored response lives upstream for ``retention_s`` at most: its cached answer no longer."""
        return lambda body: retention_s if stores(body) else None


def plan_stateless_response(body: Mapping[str, Any], prompt: PromptDocuments, *,
                            chars_per_token: float = 4.0) -> PromptPlan | None:
    """A Responses request's plan, from its chat view (:func:`~normalizer.prompt_plan.plan_response`); none
    when its state lives on one replica (pinned, or the first healthy one:
    :func:`normalizer.responses.one_replica_reason`)."""
    if one_replica_reason(body) is not None:
        return None
    return plan_response(body, prompt, chars_per_token=chars_per_token)


_BY_KIND: dict[str, Endpoint] = {}
"""The first row defined of each kind: what a stored entry of that kind is read as."""

CHAT = Endpoint("chat", "chat", ("/v1/chat/completions",), CHAT_RULES, chat_request, chat_shape,
                read_prompt=read_prompt, reading=CHAT_READING)
COMPLETIONS = Endpoint("completions", "completion", ("/v1/completions",), COMPLETION_RULES, canonical_completion)
RESPONSES = ResponsesEndpoint("responses", "response", ("/v1/responses",), RESPONSE_RULES, response_request,
                              response_shape, pricing=Pricing.RESPONSE, read_prompt=read_response_prompt,
                              read_question=final_input_question, reading=RESPONSE_READING, owned=stores,
                              plan=plan_stateless_response, usage_on_request=False, forwarded_as_sent=True)
EMBEDDINGS = Endpoint("embeddings", "embedding", ("/v1/embeddings",), EMBEDDING_RULES, shape=embedding_shape,
                      cache=Cache.EMBEDDING_ITEMS, usage_on_request=False)
RERANK = RerankEndpoint("rerank", "rerank", ("/v1/rerank", "/v2/rerank", "/rerank"), RERANK_RULES,
                        shape=rerank_shape, cache=Cache.RERANK_ITEMS, pricing=Pricing.RERANK, usage_on_request=False)
SCORE = RerankEndpoint("score", "rerank", ("/v1/score", "/score"), RERANK_RULES, shape=score_shape,
                       cache=Cache.RERANK_ITEMS, pricing=Pricing.RERANK, usage_on_request=False, score=True)
ENDPOINTS: tuple[Endpoint, ...] = (CHAT, COMPLETIONS, RESPONSES, EMBEDDINGS, RERANK, SCORE)
"""Every API the data plane serves as a row (Cohere/Jina/vLLM/TEI rerankers at ``/v1/rerank``, ``/v2/rerank``,
``/rerank``; vLLM's score API at ``/v1/score``, ``/score``)."""


INCLUDABLE = Parameter("an includable field (e.g. message.output_text.logprobs)",
                       re.compile(r"[a-z_]{1,64}(\.[a-z_]{1,64}){0,6}"), "message.output_text.logprobs")
_INCLUDE = QueryParameter(("include", "include[]"), INCLUDABLE, repeated=True)
RETRIEVE_QUERY = Query((_INCLUDE, QueryParameter(("include_obfuscation",), Parameter(
    "true or false", re.compile(r"true|false"), "false"))))
"""What ``GET /v1/responses/{id}`` takes: ``include``, ``include_obfuscation`` (``stream`` and ``starting_after``
resume a background response's stream: ``background`` is refused, so they are not taken)."""
INPUT_ITEMS_QUERY = Query((
    _INCLUDE, QueryParameter(("limit",), Parameter("an integer from 1 to 100", re.compile(r"100|[1-9][0-9]?"), "20")),
    QueryParameter(("order",), Parameter("asc or desc", re.compile(r"asc|desc"), "desc")),
    QueryParameter(("after",), ITEM_ID), QueryParameter(("before",), ITEM_ID)))
"""What ``GET /v1/responses/{id}/input_items`` takes: a page of at most 100 items in either order, from a cursor."""
INPUT_TOKENS_MAX_BODY = 1024 * 1024
"""The largest body ``POST /v1/responses/input_tokens`` takes (about 250,000 tokens of text): it is priced per
request, so its body is bounded apart from ``server.max_body_bytes``."""


@dataclass(frozen=True, slots=True, eq=False)
class Resource:
    """A request about state an upstream keeps (a stored response, its items; counting or compacting input that
    may continue one), never cached: one method at one exact path template with typed parameters, the typed query
    it takes, and what it declares — its price, its body and the limit on it, and the ids it names (each
    owner-checked: :class:`proxy.stored.stages.StoredResponseRequests`). Rows compare and hash by identity."""

    route: str
    """Its name: ``ctx.route``, the pipeline's, the metric label."""
    method: str
    path: PathTemplate
    pricing: Pricing
    query: Query = NO_QUERY
    body: bool = False
    """It takes a JSON object body (else none: an empty object at most, never forwarded)."""
    shape: Shape | None = None
    """What its body must be (:func:`normalizer.limits.check_llm`)."""
    max_body_bytes: int | None = None
    """Its body's limit when below ``server.max_body_bytes``."""
    names: str | None = None
    """The path parameter naming the stored response it is about: its owner is checked, and it goes to the replica
    that keeps it."""
    refers: bool = False
    """Its body may name stored responses and items (``previous_response_id``, item references), each checked as
    its caller's (:func:`normalizer.responses.references`)."""
    deletes: bool = False
    """A success deletes the named response: its owner and every cached copy are forgotten."""
    dialect: Dialect = Dialect.OPENAI

    @property
    def templates(self) -> tuple[PathTemplate, ...]:
        return (self.path,)


_RESPONSE = {"response_id": RESPONSE_ID}
RESPONSE_RETRIEVE = Resource("response_retrieve", "GET", PathTemplate("/v1/responses/{response_id}", _RESPONSE),
                             Pricing.REQUEST, RETRIEVE_QUERY, names="response_id")
RESPONSE_DELETE = Resource("response_delete", "DELETE", PathTemplate("/v1/responses/{response_id}", _RESPONSE),
                           Pricing.REQUEST, names="response_id", deletes=True)
RESPONSE_INPUT_ITEMS = Resource("response_input_items", "GET",
                                PathTemplate("/v1/responses/{response_id}/input_items", _RESPONSE), Pricing.REQUEST,
                                INPUT_ITEMS_QUERY, names="response_id")
RESPONSE_CANCEL = Resource("response_cancel", "POST", PathTemplate("/v1/responses/{response_id}/cancel", _RESPONSE),
                           Pricing.REQUEST, names="response_id")
INPUT_TOKENS = Resource("response_input_tokens", "POST", PathTemplate("/v1/responses/input_tokens"), Pricing.REQUEST,
                        body=True, shape=response_shape, max_body_bytes=INPUT_TOKENS_MAX_BODY, refers=True)
COMPACT = Resource("response_compact", "POST", PathTemplate("/v1/responses/compact"), Pricing.RESPONSE, body=True,
                   shape=response_shape, refers=True)
"""Runs a model on the input (and the response it continues): reserved and charged as model work."""
RESOURCES: tuple[Resource, ...] = (RESPONSE_RETRIEVE, RESPONSE_DELETE, RESPONSE_INPUT_ITEMS, RESPONSE_CANCEL,
                                   INPUT_TOKENS, COMPACT)
"""Every request about upstream state the data plane serves; any other path under ``/v1/responses/`` is a 404."""
ROWS: tuple[Endpoint | Resource, ...] = (*ENDPOINTS, *RESOURCES)
"""Every row (method, exact paths, typed query, price): what is served under ``/v1`` besides the pass-through."""


def for_kind(kind: str) -> Endpoint:
    """The endpoint the cache layer names ``kind``."""
    return _BY_KIND[kind]


def for_entry(entry: CachedResponse) -> Endpoint:
    """The endpoint whose answer a stored entry holds (by its kind, as stored)."""
    return _BY_KIND[entry.kind]
