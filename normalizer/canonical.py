"""Canonical OpenAI requests and the exact-cache keys built from them.

A canonical request keeps every field that can change the answer and drops every field that cannot, in one
encoding per meaning, so that equivalent requests share a key and different requests never do.

Equivalences applied (each provably answer-preserving):

- JSON encoding: key order, whitespace and number formatting (see :mod:`normalizer.canonical_json`);
- ``null`` is the same as an omitted field, everywhere (top level, messages, content parts, tools);
- provider defaults are filled in: ``temperature`` 1, ``top_p`` 1,
  ``presence_penalty``/``frequency_penalty`` 0, ``n`` 1, ``logprobs`` false, ``response_format`` ``{"type":
  "text"}``, ``tool_choice`` ``"auto"`` with tools and ``"none"`` without, ``parallel_tool_calls`` true, a
  function tool's ``strict`` false, an image part's ``detail`` ``"auto"``; for legacy completions
  ``max_tokens`` 16, ``echo`` false, ``best_of`` 1; for embeddings ``encoding_format`` ``"float"``;
- message content given as a string is the same as a list holding one text part with that string (a list of
  several text parts is kept as a list: backends join parts in template-specific ways);
- ``stop``: a string is the same as a one-element list; the list is a set (any sequence stops generation),
  so it is sorted and de-duplicated, and an empty list is no stop at all;
- ``max_completion_tokens`` and ``max_tokens`` are one limit (OpenAI deprecated the latter for the former;
  vLLM reads either); when both are given and differ, both are kept;
- ``logit_bias``: token ids as decimal strings, zero biases dropped (adding 0 to a logit is no change);
- legacy ``prompt``: a string is the same as a one-element list, a token list the same as a one-element list
  of it.

Kept although they might look cosmetic (they can change the answer): tool-call ids and ``arguments`` strings
(chat templates render them verbatim), the order of tools, messages and content parts, the order of a JSON
Schema's ``properties``, ``name`` on messages, ``service_tier``. Fields the proxy does not know are kept
verbatim under ``extra`` (whether such a request is cached at all is :mod:`normalizer.bypass`'s decision).

Excluded fields (they cannot change the answer) are listed with their reason in :data:`EXCLUDED_FIELDS`.

What is hashed (:func:`keyed_request`): the canonical body alone, or — when there is any — an object holding it
with the documents sent apart from the messages (``documents``) and the request's variant (``variant``,
:func:`request_variant`): the URL query string verbatim (``?api-version=…`` as Azure-style upstreams use) and the
values of the configured request headers the upstream may answer by (``cache.key_headers``: ``OpenAI-Organization``,
``OpenAI-Project``, ``OpenAI-Beta`` by default). Both are forwarded upstream, so two requests differing in them are
two requests.

Numbers: an integral float of magnitude 2**53 or more is not keyed (:class:`CanonicalizationError`, so the
request bypasses the cache): the JSON parser reads an integer literal beyond 64 bits as such a float, so
``"seed": 18446744073709551616`` and ``…617`` would share a key while an upstream that reads integers exactly
answers them differently. Integers within 64 bits stay exact ints.

Trivial variants of the question (:func:`fold_final_question`): the text of a final user message (chat) or input
item (Responses) made of one text part is folded by :func:`normalizer.text.fold_question` — only what cannot change
the answer: whitespace between words outside quotes and code, canonically equivalent Unicode (NFC) and trailing
question marks; letter case and other punctuation are kept. "What is RAG?", "What  is RAG" and " What is RAG " share
a key from the first repeat. Earlier messages, system prompts and multi-part content are keyed as written.

Key format (module :func:`cache_key`)::

    rp5:<tenant>:<namespace>:<knowledge_version>:<kind>:<hex BLAKE2b-256 of the canonical JSON bytes>

``rp5`` is the key-format version (bump it whenever canonicalization changes so old entries are never
misread; ``rp4`` keys also folded a run of trailing question marks, one after a space, and whitespace inside
unquoted technical text, ``rp3`` keys also folded letter case, compatibility forms and trailing ``! .``, ``rp2``
keys did not fold the final question's trivial variants, ``rp1`` keys did not cover the query string, the keyed
headers or beyond-64-bit integers). Each scope
component is percent-encoded (RFC 3986, nothing kept safe but ``A-Z a-z 0-9 _ . - ~``, and in the tenant
component not ``~`` either), so a ``:`` in a tenant id cannot forge another scope, and a
prefix such as ``rp5:acme:docs:`` selects exactly one tenant's namespace. ``kind`` is ``chat``,
``completion``, ``embedding`` (one key per embedding input item), ``response`` or ``rerank`` (one key per
scored document). The scope is a readable prefix rather
than hashed so stores can scan and drop a tenant, namespace or knowledge version by prefix. Namespaces shared
across tenants use :data:`SHARED_TENANT` as the tenant (the identity layer must never issue it).

User-scoped keys (private namespaces, ``cache.private_namespaces``, or a request's ``Cache-Control:
private``): the tenant component becomes ``<tenant>~<user digest>``, e.g. ``rp5:acme~3f…9a:docs:4:chat:…``,
where the digest is :func:`user_digest` (32 hex digits of BLAKE2b of the tenant and user id; user ids never
appear in keys, and equal ids in two tenants get different digests). A ``~`` in the tenant id itself is
written ``%7E``, so the first raw ``~`` always separates the digest and no tenant name can forge another
user's scope; split the component there to read it back. The tenant, namespace and knowledge version stay
the real ones: versions are looked up and bumped per tenant and namespace, and the entry's tags name the real
tenant and namespace, so invalidating a tenant or namespace also drops its user-scoped entries.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from urllib.parse import quote

from normalizer.canonical_json import (
    CanonicalizationError,
    JSONValue,
    canonical_number,
    canonical_schema,
    canonical_value,
    digest_hex,
    encode_canonical,
)
from normalizer.text import fold_question

RequestKind = str
"""The cache layer's name of the endpoint a body was sent to, hashed into its keys (``chat``, ``completion``,
``embedding``, ``response``, ``rerank``...: :attr:`proxy.core.endpoints.Endpoint.kind`)."""

KEY_FORMAT_VERSION = "rp5"
SHARED_TENANT = "*"
"""Tenant component for namespaces configured as shared across tenants (percent-encoded as ``%2A``)."""

EXCLUDED_FIELDS: Mapping[str, str] = {
    "stream": "transport only: streamed and non-streamed requests get the same answer, replayed either way",
    "stream_options": "transport only: include_usage adds a usage chunk, rebuilt from stored usage on replay",
    "user": "end-user id for the provider's abuse monitoring; not seen by the model",
    "safety_identifier": "successor of `user` (abuse monitoring); not seen by the model",
    "metadata": "tags for the provider's dashboards/stored completions; not seen by the model",
    "store": "whether the provider keeps the completion for its own dashboards; not seen by the model",
    "prompt_cache_key": "routing hint for the provider's prompt cache; changes latency, not the answer",
    "cache": "the proxy's own per-request cache controls (LiteLLM style); stripped before forwarding",
    "ragproxy": "the proxy's own per-request options; stripped before forwarding",
}
"""Top-level fields that never enter a key, with the reason each cannot change the answer."""

_SAMPLING_DEFAULTS: Mapping[str, int | float] = {
    "temperature": 1,
    "top_p": 1,
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "n": 1,
}

CHAT_KEYED_FIELDS = frozenset(
    {
        "model", "messages", "tools", "tool_choice", "parallel_tool_calls", "functions", "function_call",
        "response_format", "temperature", "top_p", "seed", "stop", "max_tokens", "max_completion_tokens",
        "presence_penalty", "frequency_penalty", "logit_bias", "n", "logprobs", "top_logprobs",
        "reasoning_effort", "modalities", "audio", "prediction", "service_tier", "verbosity",
        "web_search_options",
    }
)  # fmt: skip
COMPLETION_KEYED_FIELDS = frozenset(
    {
        "model", "prompt", "suffix", "echo", "best_of", "temperature", "top_p", "seed", "stop", "max_tokens",
        "presence_penalty", "frequency_penalty", "logit_bias", "n", "logprobs",
    }
)  # fmt: skip
EMBEDDING_KEYED_FIELDS = frozenset({"model", "input", "encoding_format", "dimensions"})

KNOWN_FIELDS: Mapping[RequestKind, frozenset[str]] = {
    "chat": CHAT_KEYED_FIELDS | EXCLUDED_FIELDS.keys(),
    "completion": COMPLETION_KEYED_FIELDS | EXCLUDED_FIELDS.keys(),
    "embedding": EMBEDDING_KEYED_FIELDS | EXCLUDED_FIELDS.keys(),
}
"""Per endpoint, the top-level fields the proxy understands (keyed or deliberately excluded)."""

_CHAT_SIMPLE_FIELDS = ("reasoning_effort", "modalities", "audio", "prediction", "service_tier", "verbosity",
                       "web_search_options")  # fmt: skip


def _present(obj: Mapping[str, Any]) -> dict[str, Any]:
    """``obj`` without its ``null`` fields (null means omitted in every OpenAI schema)."""
    return {key: value for key, value in obj.items() if value is not None}


def _require_dict(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise CanonicalizationError(f"{what} must be an object")
    return _present(value)


def _number(value: Any, field: str) -> int | float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CanonicalizationError(f"{field} must be a number")
    return canonical_number(value)


def _model(body: Mapping[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise CanonicalizationError("model must be a non-empty string")
    return model


def _stop(value: Any) -> list[str] | None:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return sorted(set(value)) or None
    raise CanonicalizationError("stop must be a string or a list of strings")


def _logit_bias(value: Any) -> dict[str, int | float] | None:
    if not isinstance(value, dict):
        raise CanonicalizationError("logit_bias must be an object")
    result: dict[str, int | float] = {}
    for token, bias in value.items():
        try:
            token_id = str(int(str(token)))
        except ValueError as exc:
            raise CanonicalizationError(f"logit_bias key {token!r} is not a token id") from exc
        number = _number(bias, "logit_bias value")
        if number != 0:
            result[token_id] = number
    return result or None


def _sampling(body: Mapping[str, Any], out: dict[str, JSONValue]) -> None:
    """Sampling fields shared by chat and legacy completions, defaults filled in."""
    for field, default in _SAMPLING_DEFAULTS.items():
        value = body.get(field)
        out[field] = default if value is None else _number(value, field)
    if body.get("seed") is not None:
        out["seed"] = _number(body["seed"], "seed")
    stop = _stop(body["stop"]) if body.get("stop") is not None else None
    if stop is not None:
        out["stop"] = stop
    bias = _logit_bias(body["logit_bias"]) if body.get("logit_bias") is not None else None
    if bias is not None:
        out["logit_bias"] = bias


def _max_tokens(body: Mapping[str, Any], out: dict[str, JSONValue]) -> None:
    legacy, current = body.get("max_tokens"), body.get("max_completion_tokens")
    if (
        legacy is not None
        and current is not None
        and _number(legacy, "max_tokens") != _number(current, "max_completion_tokens")
    ):
        out["max_tokens"] = _number(legacy, "max_tokens")
        out["max_completion_tokens"] = _number(current, "max_completion_tokens")
    elif current is not None or legacy is not None:
        out["max_tokens"] = _number(current if current is not None else legacy, "max_tokens")


def _content_part(part: Any) -> JSONValue:
    fields = _require_dict(part, "a content part")
    kind = fields.get("type")
    if kind == "image_url":
        image = fields.get("image_url")
        image = {"url": image} if isinstance(image, str) else _require_dict(image, "image_url")
        image.setdefault("detail", "auto")
        fields["image_url"] = image
    elif kind == "input_audio":
        fields["input_audio"] = _require_dict(fields.get("input_audio"), "input_audio")
    elif kind == "text" and not isinstance(fields.get("text"), str):
        raise CanonicalizationError("a text part needs a string `text`")
    return canonical_value(fields)


def canonical_content(content: Any) -> JSONValue:
    """Message content as a list of canonical parts (a string is one text part)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return [_content_part(part) for part in content]
    raise CanonicalizationError("message content must be a string or a list of parts")


def _tool_call(call: Any) -> JSONValue:
    fields = _require_dict(call, "a tool call")
    if isinstance(fields.get("function"), dict):
        fields["function"] = _present(fields["function"])
    return canonical_value(fields)


def canonical_message(message: Any) -> dict[str, JSONValue]:
    """One chat message: role, content parts, name, tool calls, tool-call id; other fields verbatim."""
    fields = _require_dict(message, "a message")
    role = fields.pop("role", None)
    if not isinstance(role, str):
        raise CanonicalizationError("every message needs a string role")
    out: dict[str, JSONValue] = {"role": role}
    if "content" in fields:
        out["content"] = canonical_content(fields.pop("content"))
    for field in ("name", "tool_call_id"):
        if field in fields:
            out[field] = canonical_value(fields.pop(field))
    calls = fields.pop("tool_calls", None)
    if calls:
        if not isinstance(calls, list):
            raise CanonicalizationError("tool_calls must be a list")
        out["tool_calls"] = [_tool_call(call) for call in calls]
    if fields:
        out["extra"] = canonical_value(fields)
    return out


def _function_definition(definition: Any) -> dict[str, JSONValue]:
    fields = _require_dict(definition, "a function definition")
    if "parameters" in fields:
        fields["parameters"] = canonical_schema(fields["parameters"])
    fields.setdefault("strict", False)
    return {key: value if key == "parameters" else canonical_value(value) for key, value in fields.items()}


def canonical_tool(tool: Any) -> dict[str, JSONValue]:
    """One tool definition; a function's parameter schema keeps its property order."""
    fields = _require_dict(tool, "a tool")
    is_function = fields.get("type") == "function"
    return {
        key: _function_definition(value) if is_function and key == "function" else canonical_value(value)
        for key, value in fields.items()
    }


def _response_format(value: Any) -> JSONValue | None:
    fields = _require_dict(value, "response_format")
    if fields.get("type") == "text" and len(fields) == 1:
        return None
    schema = fields.get("json_schema")
    if fields.get("type") == "json_schema" and isinstance(schema, dict):
        spec = _present(schema)
        spec.setdefault("strict", False)
        canonical = {key: canonical_value(item) for key, item in fields.items() if key != "json_schema"}
        canonical["json_schema"] = {
            key: canonical_schema(item) if key == "schema" else canonical_value(item)
            for key, item in spec.items()
        }
        return canonical
    return canonical_value(fields)


def _list(body: Mapping[str, Any], field: str) -> list[Any]:
    value = body.get(field)
    if value is None:
        return []
    if not isinstance(value, list):
        raise CanonicalizationError(f"{field} must be a list")
    return value


def _extra(body: Mapping[str, Any], keyed: frozenset[str]) -> dict[str, JSONValue] | None:
    extra = {k: canonical_value(v) for k, v in body.items() if k not in keyed and k not in EXCLUDED_FIELDS}
    return extra or None


def canonical_chat(body: Mapping[str, Any]) -> dict[str, JSONValue]:
    """The canonical form of a ``/v1/chat/completions`` body; :class:`CanonicalizationError` if malformed."""
    fields = _require_dict(body, "the request body")
    messages = _list(fields, "messages")
    if not messages:
        raise CanonicalizationError("messages must be a non-empty list")
    out: dict[str, JSONValue] = {
        "model": _model(fields),
        "messages": [canonical_message(message) for message in messages],
    }
    _sampling(fields, out)
    _max_tokens(fields, out)
    tools = [canonical_tool(tool) for tool in _list(fields, "tools")]
    if tools:
        out["tools"] = tools
    out["tool_choice"] = canonical_value(fields.get("tool_choice", "auto" if tools else "none"))
    out["parallel_tool_calls"] = canonical_value(fields.get("parallel_tool_calls", True))
    functions = [_function_definition(f) for f in _list(fields, "functions")]
    if functions:
        out["functions"] = functions
        out["function_call"] = canonical_value(fields.get("function_call", "auto"))
    elif fields.get("function_call") not in (None, "none"):
        out["function_call"] = canonical_value(fields["function_call"])
    if "response_format" in fields:
        response_format = _response_format(fields["response_format"])
        if response_format is not None:
            out["response_format"] = response_format
    if fields.get("logprobs"):
        out["logprobs"] = True
    if "top_logprobs" in fields:
        out["top_logprobs"] = _number(fields["top_logprobs"], "top_logprobs")
    for field in _CHAT_SIMPLE_FIELDS:
        if field in fields:
            out[field] = canonical_value(fields[field])
    extra = _extra(fields, CHAT_KEYED_FIELDS)
    if extra:
        out["extra"] = extra
    return out


def _text_items(value: Any, field: str) -> list[JSONValue]:
    """A ``prompt`` or ``input`` as a list of items: a string or a token list is a one-element list."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        if value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
            return [list(value)]
        if all(isinstance(item, str | list) for item in value):
            return [canonical_value(item) for item in value]
    raise CanonicalizationError(f"{field} must be a string, a token list, or a list of either")


def canonical_completion(body: Mapping[str, Any]) -> dict[str, JSONValue]:
    """The canonical form of a legacy ``/v1/completions`` body."""
    fields = _require_dict(body, "the request body")
    out: dict[str, JSONValue] = {"model": _model(fields)}
    if "prompt" in fields:
        out["prompt"] = _text_items(fields["prompt"], "prompt")
    _sampling(fields, out)
    out["max_tokens"] = _number(fields.get("max_tokens", 16), "max_tokens")
    out["echo"] = bool(fields.get("echo", False))
    out["best_of"] = _number(fields.get("best_of", 1), "best_of")
    if "suffix" in fields:
        out["suffix"] = canonical_value(fields["suffix"])
    if "logprobs" in fields:
        out["logprobs"] = _number(fields["logprobs"], "logprobs")
    extra = _extra(fields, COMPLETION_KEYED_FIELDS)
    if extra:
        out["extra"] = extra
    return out


def embedding_inputs(body: Mapping[str, Any]) -> list[JSONValue]:
    """The input items of an embeddings body in request order: strings or token-id lists."""
    return _text_items(body.get("input"), "input")


def canonical_embedding_items(body: Mapping[str, Any]) -> list[dict[str, JSONValue]]:
    """One canonical request per ``/v1/embeddings`` input item, in input order (each gets its own key)."""
    fields = _require_dict(body, "the request body")
    shared: dict[str, JSONValue] = {
        "model": _model(fields),
        "encoding_format": canonical_value(fields.get("encoding_format", "float")),
    }
    if "dimensions" in fields:
        shared["dimensions"] = _number(fields["dimensions"], "dimensions")
    extra = _extra(fields, EMBEDDING_KEYED_FIELDS)
    if extra:
        shared["extra"] = extra
    return [{**shared, "input": item} for item in embedding_inputs(fields)]


def fold_final_question(items: JSONValue, text_part: str) -> None:
    """Fold (:func:`normalizer.text.fold_question`) the text of a final user message or input item made of one text
    part (``text_part``: its type), in place (a canonical request is built afresh); anything else is left as it
    is."""
    final = items[-1] if isinstance(items, list) and items else None
    if isinstance(final, dict) and final.get("role") == "user":
        content = final.get("content")
        if isinstance(content, list) and len(content) == 1:
            part = content[0]
            if isinstance(part, dict) and part.get("type") == text_part and isinstance(text := part.get("text"), str):
                part["text"] = fold_question(text)


USER_SEPARATOR = "~"
"""Separates the tenant from the user digest in a user-scoped tenant component (``%7E`` inside a tenant id)."""


def user_digest(tenant: str, user: str) -> str:
    """32 hex digits naming one user of one tenant in user-scoped keys and partitions (no user id in clear)."""
    data = f"{tenant}\x1f{user}".encode()
    return hashlib.blake2b(data, digest_size=16, person=b"ragproxy-user").hexdigest()


@dataclass(frozen=True, slots=True)
class KeyScope:
    """Where a key lives: tenant, namespace inside it, the knowledge version it was answered under, and — for a
    user-scoped (private) answer — the :func:`user_digest` of the user it belongs to (``""``: the tenant's)."""

    tenant: str
    namespace: str = "default"
    knowledge_version: str = "0"
    user: str = ""

    def owner(self) -> str:
        """The tenant component of the key: the encoded tenant, then ``~<user digest>`` when user-scoped."""
        tenant = quote(self.tenant, safe="").replace(USER_SEPARATOR, "%7E")
        return f"{tenant}{USER_SEPARATOR}{self.user}" if self.user else tenant

    def prefix(self) -> str:
        """``rp5:<tenant>:<namespace>:<knowledge_version>:`` with each component percent-encoded."""
        return _prefix(self)


@lru_cache(maxsize=4096)
def _prefix(scope: KeyScope) -> str:
    """:meth:`KeyScope.prefix`, kept per scope: percent-encoding its three parts was a quarter of keying a one-message
    chat request, and a deployment has few scopes."""
    parts = (quote(scope.namespace, safe=""), quote(scope.knowledge_version, safe=""))
    return f"{KEY_FORMAT_VERSION}:{scope.owner()}:" + "".join(part + ":" for part in parts)


def request_digest(canonical: JSONValue) -> str:
    """Hex BLAKE2b-256 of the canonical JSON bytes of ``canonical``.

    ``canonical`` must come from one of the ``canonical_*`` functions here (already canonical; it is not
    normalized a second time, which would double the cost of keying a request).
    """
    return digest_hex(encode_canonical(canonical))


def cache_key(kind: RequestKind, canonical: JSONValue, scope: KeyScope) -> str:
    """The exact-cache key of one canonical request (format in the module docstring)."""
    return f"{scope.prefix()}{kind}:{request_digest(canonical)}"


def cache_keys(kind: RequestKind, canonicals: Iterable[JSONValue], scope: KeyScope) -> list[str]:
    """The keys of many canonical requests in one scope (its prefix encoded once: embeddings items)."""
    prefix = f"{scope.prefix()}{kind}:"
    return [prefix + request_digest(canonical) for canonical in canonicals]


DEFAULT_KEY_HEADERS = ("OpenAI-Organization", "OpenAI-Project", "OpenAI-Beta")
"""Request headers an OpenAI-compatible upstream may answer by (``cache.key_headers``)."""


def request_variant(query_string: str, headers: Mapping[str, str], keyed: Iterable[str]) -> JSONValue | None:
    """What besides the body the upstream may answer by: the query string verbatim and the values of the ``keyed``
    headers (names lower-cased, every value of a repeated header in order); ``None`` when there is neither. A header
    the request names in ``Connection`` is hop-by-hop for it: it never reaches the upstream, so it is no part of
    the variant either."""
    variant: dict[str, JSONValue] = {}
    if query_string:
        variant["query"] = query_string
    getall = getattr(headers, "getall", None)
    hop = _connection_names(headers, getall)
    found: dict[str, JSONValue] = {}
    for name in keyed:
        if name.lower() in hop:
            continue
        values = getall(name, []) if getall is not None else [v for v in [headers.get(name)] if v is not None]
        if values:
            found[name.lower()] = list(values)
    if found:
        variant["headers"] = found
    return variant or None


def _connection_names(headers: Mapping[str, str], getall: Any) -> frozenset[str]:
    """The header names the request's ``Connection`` header lists (lower-cased)."""
    values = getall("Connection", []) if getall is not None else [v for v in [headers.get("Connection")] if v]
    if not values:
        return frozenset()
    return frozenset(token.strip().lower() for value in values for token in value.split(",") if token.strip())


def keyed_request(canonical: JSONValue, *, documents: JSONValue | None = None,
                  variant: JSONValue | None = None) -> JSONValue:
    """What a key is hashed from: the canonical body, with the documents sent apart and the request's variant when
    there are any (see the module docstring)."""
    if documents is None and variant is None:
        return canonical
    keyed: dict[str, JSONValue] = {"request": canonical}
    if documents is not None:
        keyed["documents"] = documents
    if variant is not None:
        keyed["variant"] = variant
    return keyed
