"""Which requests skip the cache entirely, and which responses may be stored.

:func:`bypass_reason` looks at a request body and answers ``None`` (cacheable) or a short reason the route
logs and reports with ``X-Cache-Status: BYPASS``. Rules, in the order they are checked:

1. the body is not a JSON object — the upstream gives its own error;
1a. Responses API (:data:`RESPONSE_RULES`): the answer depends on state kept upstream that the key cannot see
    (:func:`normalizer.responses.state_reason`), or the response is stored upstream and ``cache_stored_responses``
    is off (it is on by default: an exact repeat is answered with the stored original, see
    :mod:`normalizer.responses`);
2. ``n > 1`` — several sampled choices are asked for; replaying one stored set would fix the sample for
   everyone and defeat the point of asking for many;
3. ``logprobs`` / ``top_logprobs`` (legacy ``logprobs`` as a number) — the client inspects the sampling;
4. unknown top-level fields (not in :data:`normalizer.canonical.KNOWN_FIELDS` for the endpoint — for Responses
   :data:`normalizer.responses.RESPONSE_KNOWN_FIELDS`, for rerankers :data:`normalizer.rerank.RERANK_KNOWN_FIELDS`
   — nor in ``BypassSettings.extra_known_fields``): with ``unknown_fields="bypass"`` (default) the request is not
   cached, because the proxy cannot judge whether the field changes the answer. With ``"ignore"`` the proxy
   does not judge it either but caches anyway; the field still goes into the key verbatim (canonical
   ``extra``), so "ignore" never merges requests that differ in it — it costs hit rate, never correctness.
   Backend extensions such as vLLM's ``top_k``/``min_p`` are best declared in ``extra_known_fields``;
4a. a reranker request (:data:`RERANK_RULES`) of more than ``rerank_max_documents`` documents (1,000): it goes
    upstream and its answer back as they are, not cached document by document. Caching a document means parsing
    the reranker's answer, encoding the reply and storing an entry per document, and the parsing and encoding are
    single calls that hold the event loop for the whole answer, which every other tenant's requests wait for:
    under a millisecond at 1,000 documents on the project's 2-core machine, 5-9 ms for parsing alone at 10,000
    (``limits.rerank_documents``), 130-330 ms at 100,000 (``python -m loadtest.bench abuse``, BENCHMARKS.md).
    The bound also keeps one request from replacing up to 10,000 of other tenants' cached answers in L1;
5. sampled requests (temperature > 0, the provider default of 1 included) when caching them is switched off
   for the namespace or model (see below);
6. tools present when ``cache_tool_calls`` is off;
7. audio output (``modalities`` containing ``"audio"`` or an ``audio`` parameter) — the reply references
   provider-side audio by an id that expires, so a replay could hand out a dead reference.

Temperature > 0 rule. Default: **cached**. A request with temperature > 0 asks for *an* answer drawn from
the model's distribution, not for a fresh draw each time; a stored answer is such a draw, and the mainstream
caches (LiteLLM, Portkey, Cloudflare AI Gateway, GPTCache) cache regardless of temperature. Applications
that want a new draw on purpose (a "regenerate" button) send ``Cache-Control: no-cache`` or switch the rule
off where it matters: ``cache_sampled_by_namespace`` (checked first) and ``cache_sampled_by_model`` map
names or ``fnmatch`` patterns (first match in mapping order) to ``True``/``False``; otherwise
``cache_sampled`` applies. Temperature is part of the exact key either way, so 0.2 and 0.9 never share an
entry.

Tools (including ``parallel_tool_calls``) are cached by default: the tool list, ``tool_choice`` and
``parallel_tool_calls`` are all in the key, a tool-call reply is an ordinary assistant message, and the
tools run on the client side after it — replaying the call runs nothing by itself.

Responses: :func:`unstorable_reason` is the storage-side rule. Only a ``200`` response is storable; a
streamed response only once it ended normally (the terminating ``data: [DONE]`` after a finish chunk, i.e.
the route's ``Reply.finish(ok=True)``); an aborted stream (client gone, upstream reset, timeout) or a
``200`` whose body or stream carried an ``error`` object is never stored, so a partial or failed answer
cannot become a cached one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any, Literal

from normalizer.canonical import EXCLUDED_FIELDS, KNOWN_FIELDS
from normalizer.rerank import RERANK_KNOWN_FIELDS, document_count
from normalizer.responses import RESPONSE_KNOWN_FIELDS, state_reason, stores

UnknownFieldPolicy = Literal["bypass", "ignore"]


@dataclass(frozen=True, slots=True)
class BypassSettings:
    """Configurable parts of the bypass rules (defaults documented in the module docstring)."""

    unknown_fields: UnknownFieldPolicy = "bypass"
    extra_known_fields: frozenset[str] = frozenset()
    cache_sampled: bool = True
    cache_sampled_by_model: Mapping[str, bool] = field(default_factory=dict)
    cache_sampled_by_namespace: Mapping[str, bool] = field(default_factory=dict)
    cache_tool_calls: bool = True
    cache_stored_responses: bool = True
    rerank_max_documents: int = 1000


def _first_match(patterns: Mapping[str, bool], name: str | None) -> bool | None:
    if name is None:
        return None
    if name in patterns:
        return patterns[name]
    for pattern, allowed in patterns.items():
        if fnmatchcase(name, pattern):
            return allowed
    return None


def sampled_caching_allowed(settings: BypassSettings, model: str | None, namespace: str | None) -> bool:
    """Whether temperature > 0 answers are cached here (namespace rule first, then model, then default)."""
    for patterns, name in (
        (settings.cache_sampled_by_namespace, namespace),
        (settings.cache_sampled_by_model, model),
    ):
        decision = _first_match(patterns, name)
        if decision is not None:
            return decision
    return settings.cache_sampled


def _temperature(body: Mapping[str, Any]) -> float:
    value = body.get("temperature")
    if value is None:
        return 1.0
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 1.0  # malformed; judged as sampled so a disabled namespace stays disabled
    return float(value)


def chat_logprobs(body: Mapping[str, Any]) -> str | None:
    """``logprobs`` / ``top_logprobs`` asked for (Chat Completions, and the default)."""
    if body.get("logprobs"):
        return "logprobs requested"
    if body.get("top_logprobs") is not None:
        return "top_logprobs requested"
    return None


def completion_logprobs(body: Mapping[str, Any]) -> str | None:
    """Legacy Completions: ``logprobs`` is a number of alternatives, any of them asked for."""
    return "logprobs requested" if body.get("logprobs") is not None else None


def response_logprobs(body: Mapping[str, Any]) -> str | None:
    """The Responses API: chat's rules, and the log probabilities named in ``include``."""
    include = body.get("include")
    if body.get("logprobs") or (isinstance(include, list) and "message.output_text.logprobs" in include):
        return "logprobs requested"
    return chat_logprobs(body)


def response_state(body: Mapping[str, Any], settings: BypassSettings) -> str | None:
    """Rule 1a: state kept upstream that the key cannot see, or a stored response not to be cached."""
    if not settings.cache_stored_responses and stores(body):
        return "store: the response is stored upstream (store defaults to true) and cache.cache_stored_responses is off"
    return state_reason(body)


@dataclass(frozen=True, slots=True)
class BypassRules:
    """What an endpoint's bodies are judged by (the rules of the module docstring), named by its endpoint row."""

    known: frozenset[str]
    """The top-level fields the proxy understands (rule 4)."""
    logprobs: Callable[[Mapping[str, Any]], str | None] = chat_logprobs
    """Rule 3: the sampling inspected."""
    state: Callable[[Mapping[str, Any], BypassSettings], str | None] | None = None
    """Rule 1a: state kept upstream (the Responses API)."""
    documents: Callable[[Mapping[str, Any]], int] | None = None
    """Rule 4a: the documents counted against ``rerank_max_documents`` (rerankers)."""
    sampled: bool = True
    """Rules 5-7 apply: the answer is sampled from a model (not embeddings, nor a reranker's scores)."""


CHAT_RULES = BypassRules(KNOWN_FIELDS["chat"])
COMPLETION_RULES = BypassRules(KNOWN_FIELDS["completion"], logprobs=completion_logprobs)
RESPONSE_RULES = BypassRules(RESPONSE_KNOWN_FIELDS, logprobs=response_logprobs, state=response_state)
EMBEDDING_RULES = BypassRules(KNOWN_FIELDS["embedding"], sampled=False)
RERANK_RULES = BypassRules(RERANK_KNOWN_FIELDS | EXCLUDED_FIELDS.keys(), documents=document_count, sampled=False)


def bypass_reason(
    body: Any,
    settings: BypassSettings | None = None,
    *,
    rules: BypassRules = CHAT_RULES,
    namespace: str | None = None,
) -> str | None:
    """Why this request (judged by its endpoint's ``rules``) must not be served from or stored in the cache, or
    ``None`` when it may be."""
    settings = settings or BypassSettings()
    if not isinstance(body, dict):
        return "body is not a JSON object"
    if rules.state is not None and (state := rules.state(body, settings)):
        return state
    n = body.get("n")
    if isinstance(n, int | float) and not isinstance(n, bool) and n > 1:
        return f"n={n}: several sampled choices requested"
    logprobs = rules.logprobs(body)
    if logprobs:
        return logprobs
    known = rules.known | settings.extra_known_fields
    unknown = sorted(key for key in body if key not in known)
    if unknown and settings.unknown_fields == "bypass":
        return "unknown field(s): " + ", ".join(unknown)
    if rules.documents is not None and (documents := rules.documents(body)) > settings.rerank_max_documents:
        return f"{documents} documents: more than {settings.rerank_max_documents} are not cached one by one"
    if not rules.sampled:
        return None
    temperature = _temperature(body)
    model = body.get("model") if isinstance(body.get("model"), str) else None
    if temperature > 0 and not sampled_caching_allowed(settings, model, namespace):
        return f"sampled request (temperature={temperature:g}) not cached for this model/namespace"
    if body.get("tools") and not settings.cache_tool_calls:
        return "tool use not cached (cache_tool_calls is off)"
    modalities = body.get("modalities")
    if body.get("audio") is not None or (isinstance(modalities, list) and "audio" in modalities):
        return "audio output references provider-side audio that expires"
    return None


def unstorable_reason(status: int, *, complete: bool, carried_error: bool = False) -> str | None:
    """Why an upstream response must not be stored, or ``None`` when it may be (rule in the module docstring).

    ``complete`` is false for an aborted stream; ``carried_error`` is true when a ``200`` body or stream event
    held an ``error`` object.
    """
    if status != 200:
        return f"upstream status {status}"
    if not complete:
        return "response did not complete (aborted stream)"
    if carried_error:
        return "response carried an error object"
    return None
