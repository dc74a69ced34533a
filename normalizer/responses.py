"""OpenAI Responses API requests (``POST /v1/responses``): the canonical form the exact key is built from, the
requests that bypass the cache, and the prompt as chat-like messages (documents, the semantic tier's question).

Equivalences applied on top of :mod:`normalizer.canonical`'s (JSON encoding, ``null`` = omitted everywhere), each
answer-preserving by the API's own definitions:

- ``input`` as a string is one user message holding one ``input_text`` part with that string;
- a message item's ``type`` defaults to ``"message"`` (the API's "easy input message" omits it), and its
  ``content`` as a string is one ``input_text`` part with that string (several parts stay a list, in order);
- an ``input_image`` part's ``detail`` defaults to ``"auto"``;
- defaults filled in: ``temperature`` 1, ``top_p`` 1, ``truncation`` ``"disabled"``, ``parallel_tool_calls``
  true, ``tool_choice`` ``"auto"`` with tools and ``"none"`` without, ``text.format`` ``{"type": "text"}``
  (a ``text`` holding only that default is no ``text`` at all), ``reasoning: {}`` is no ``reasoning``;
- ``include`` is a set of extra outputs: sorted and de-duplicated, an empty list is none;
- a JSON Schema (a function tool's ``parameters``, ``text.format.schema``) keeps the order of its
  ``properties`` (it is rendered, and decoded, in that order; :func:`normalizer.canonical_json.canonical_schema`).

Kept verbatim although they might look cosmetic: item ids, ``call_id``s and ``arguments`` strings, the order of
input items, tools and content parts, output items given back as input (reasoning, function calls and their
outputs), hosted tools (``web_search``, ``file_search``...), ``service_tier``, ``max_tool_calls``. A function
tool's ``strict`` is not defaulted (only ``null`` = omitted). Fields the proxy does not know go into the key
verbatim under ``extra``; whether such a request is cached at all is :func:`normalizer.bypass.bypass_reason`'s
decision (``cache.unknown_fields``), as for chat. Excluded fields are listed with their reason in
:data:`RESPONSE_EXCLUDED_FIELDS`.

Requests answered from state kept upstream that the key cannot see never take part (:func:`state_reason`,
reported in ``X-Cache-Bypass-Reason``): ``conversation`` (a conversation grows with every response added to it,
so a repeat under the same id asks something new), ``prompt`` (a template stored upstream, changeable under the
same id), ``background`` (the answer is fetched later by id), ``item_reference`` input items (an item stored
upstream).

``previous_response_id`` is in the key: a stored response does not change, so the same input after the same
response is the same request (who may name a response id is :mod:`proxy.stored.stages`' decision,
taken before any cache tier).

Stored responses (``store``, which the API defaults to **true**, so every SDK call that does not say otherwise).
A stored response is a resource upstream: its id can be fetched, deleted, listed and continued with
``previous_response_id``. An exact repeat of a stored request is answered from the cache with the **stored
original**: same id, same object, so fetching it or continuing from it works upstream as it would have. For that,
the key of a stored request holds everything the stored object records of the request — ``metadata``, ``user``,
``safety_identifier``, ``prompt_cache_key`` — under ``stored`` (a request not stored has no ``stored`` part, so
the two never share an entry: a store-false answer's id names nothing upstream). A stored answer is never shared
across tenants and never a semantic match (:func:`semantic_question`: a stored object made for another input
would be handed out as if made for this one). ``cache.cache_stored_responses: false`` bypasses stored requests
instead. A store-false hit echoes the request's own ``store``, ``metadata``, ``user``, ``safety_identifier`` and
``prompt_cache_key`` (:func:`echo_request`), keeping the original's id.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from normalizer.canonical import EXCLUDED_FIELDS, _model, _number, _require_dict
from normalizer.canonical_json import CanonicalizationError, JSONValue, canonical_schema, canonical_value
from normalizer.documents import DocumentRegistry, PromptDocuments, content_text, read_prompt
from normalizer.repeated_blocks import RepeatedBlocks

RESPONSE_KEYED_FIELDS = frozenset(
    {
        "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "text", "reasoning",
        "temperature", "top_p", "max_output_tokens", "max_tool_calls", "truncation", "include", "service_tier",
        "top_logprobs", "previous_response_id",
    }
)  # fmt: skip

RESPONSE_EXCLUDED_FIELDS: Mapping[str, str] = {
    **{name: EXCLUDED_FIELDS[name] for name in ("stream", "user", "safety_identifier", "metadata",
                                                  "prompt_cache_key", "cache", "ragproxy")},
    "stream_options": "transport only: include_obfuscation pads streamed deltas with random characters",
    "prompt_cache_retention": "how long the provider keeps its prompt cache; changes latency, not the answer",
    "store": "whether the provider keeps the response; not seen by the model (a stored request's key says so: "
             "see above)",
}
"""Top-level fields that never enter a Responses key, with the reason each cannot change the answer."""

STATE_FIELDS = frozenset({"conversation", "prompt", "background"})
"""Fields that make the answer depend on state kept upstream that the key cannot see: known, never cached."""

RESPONSE_KNOWN_FIELDS = RESPONSE_KEYED_FIELDS | RESPONSE_EXCLUDED_FIELDS.keys() | STATE_FIELDS

ECHOED_FIELDS = ("store", "metadata", "user", "safety_identifier", "prompt_cache_key")
"""Request fields outside the key that a response object repeats: a hit echoes the request's own."""

_DEFAULTS: Mapping[str, JSONValue] = {"temperature": 1, "top_p": 1, "truncation": "disabled",
                                      "parallel_tool_calls": True}
_TEXT_DEFAULT_FORMAT = {"type": "text"}
_SYSTEM_ROLES = frozenset({"system", "developer"})


def stores(body: Mapping[str, Any]) -> bool:
    """Whether the upstream keeps the response (``store`` defaults to true)."""
    return body.get("store") is not False


def continued_response(body: Mapping[str, Any]) -> str | None:
    """The id of the stored response this request continues (``previous_response_id``), or ``None``."""
    previous = body.get("previous_response_id")
    return previous if isinstance(previous, str) else None


def referenced_items(body: Mapping[str, Any]) -> list[Any]:
    """The ids of stored items a Responses body (``/v1/responses``, ``input_tokens``, ``compact``) has the upstream
    read from its store: each ``item_reference`` input item's ``id``, and the ``id`` of a reasoning item given
    without its ``encrypted_content`` (the upstream fills it in from the stored item). Other items carry their own
    content; their ``id`` only labels it. Returned as found (a non-string id is the caller's to refuse)."""
    items = body.get("input")
    if not isinstance(items, list):
        return []
    found: list[Any] = []
    for item in items:
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "item_reference" or (kind == "reasoning" and item.get("encrypted_content") is None
                                        and item.get("id") is not None):
            found.append(item.get("id"))
    return found


UPSTREAM_OBJECTS = "conversations, prompt templates, files, vector stores or containers"
"""What a Responses body may name that is stored upstream under the proxy's own key, with no API of the proxy's
to make one: :func:`unowned_reference`."""


def unowned_reference(body: Mapping[str, Any]) -> tuple[str, str] | None:
    """The parameter of a Responses body that names an object stored upstream which no tenant can have made through
    the proxy (it serves no API that makes one), and what that object is; ``None`` when there is none. Such an
    object is the proxy's key's, not a tenant's: its owner cannot be checked, so the request is refused.

    ``conversation``; ``prompt`` (a template stored upstream); a ``file_id`` anywhere in ``input`` or ``tools``
    (files); a tool's ``vector_store_ids`` (file search); a tool's ``container`` given by id (code interpreter)."""
    if body.get("conversation") is not None:
        return "conversation", "a conversation"
    if body.get("prompt") is not None:
        return "prompt", "a prompt template"
    tools = body.get("tools")
    for tool in tools if isinstance(tools, list) else ():
        if not isinstance(tool, dict):
            continue
        if tool.get("vector_store_ids"):
            return "tools", "vector stores"
        if isinstance(tool.get("container"), str):
            return "tools", "a container"
        if names_file(tool):
            return "tools", "a file"
    if names_file(body.get("input")):
        return "input", "a file"
    return None


def names_file(value: Any) -> bool:
    """Whether a ``file_id`` (not ``null``) appears anywhere in ``value`` (a file stored upstream)."""
    pending = [value]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            if node.get("file_id") is not None:
                return True
            pending.extend(child for child in node.values() if isinstance(child, dict | list))
        elif isinstance(node, list):
            pending.extend(child for child in node if isinstance(child, dict | list))
    return False


def state_reason(body: Mapping[str, Any]) -> str | None:
    """Why a Responses request depends on state kept upstream that its key cannot see (so it is never cached),
    or ``None``."""
    if body.get("conversation") is not None:
        return "conversation: the answer continues a conversation that grows upstream with every response"
    if body.get("prompt") is not None:
        return "prompt: the request uses a prompt template stored upstream"
    if body.get("background"):
        return "background: the answer is fetched later from upstream by its id"
    items = body.get("input")
    if isinstance(items, list) and any(isinstance(i, dict) and i.get("type") == "item_reference" for i in items):
        return "input item_reference: the input refers to an item stored upstream"
    return None


def one_replica_reason(body: Mapping[str, Any]) -> str | None:
    """Why a Responses request must be answered by one particular LLM replica — the one holding the state it
    builds on — rather than routed: :func:`state_reason`, or the response it continues."""
    if continued_response(body) is not None:
        return "previous_response_id: the response it continues is stored on the replica that made it"
    return state_reason(body)


def _part(part: Any) -> JSONValue:
    fields = _require_dict(part, "a content part")
    kind = fields.get("type")
    if kind in ("input_text", "output_text") and not isinstance(fields.get("text"), str):
        raise CanonicalizationError(f"an {kind} part needs a string `text`")
    if kind == "input_image":
        fields.setdefault("detail", "auto")
    return canonical_value(fields)


def _content(content: Any) -> JSONValue:
    if isinstance(content, str):
        return [{"type": "input_text", "text": content}]
    if isinstance(content, list):
        return [_part(part) for part in content]
    raise CanonicalizationError("message content must be a string or a list of parts")


def _item(item: Any) -> JSONValue:
    fields = _require_dict(item, "an input item")
    if "role" not in fields or fields.get("type", "message") != "message":
        return canonical_value(fields)
    if not isinstance(fields["role"], str):
        raise CanonicalizationError("a message needs a string role")
    fields["type"] = "message"
    fields["content"] = _content(fields.get("content", ""))
    return canonical_value(fields)


def malformed_input(items: list[Any]) -> str | None:
    """What makes a list of input items one the proxy cannot read (``None``: nothing), for a 400 before anything
    reads it: a message item (one with a ``role``, of type ``message`` or none) whose role is not a string, whose
    content is neither a string nor a list of parts (objects), or whose text part has no string ``text``. Other
    items are the upstream's to judge."""
    for item in items:
        if "role" not in item or item.get("type", "message") != "message":
            continue
        if not isinstance(item["role"], str):
            return "a message's `role` must be a string"
        content = item.get("content")
        if content is None or isinstance(content, str):
            continue
        if not isinstance(content, list) or not all(isinstance(part, dict) for part in content):
            return "a message's `content` must be a string or a list of content parts (objects)"
        for part in content:
            if part.get("type") in ("input_text", "output_text") and not isinstance(part.get("text"), str):
                return f"an {part['type']} part needs a string `text`"
    return None


def canonical_input(value: Any) -> list[JSONValue]:
    """``input`` as a list of canonical items (a string is one user message)."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": value}]}]
    if isinstance(value, list) and value:
        return [_item(item) for item in value]
    raise CanonicalizationError("input must be a string or a non-empty list of items")


def _tool(tool: Any) -> JSONValue:
    fields = _require_dict(tool, "a tool")
    if fields.get("type") == "function" and "parameters" in fields:
        return {key: canonical_schema(value) if key == "parameters" else canonical_value(value)
                for key, value in fields.items()}
    return canonical_value(fields)


def _text(value: Any) -> JSONValue | None:
    fields = _require_dict(value, "text")
    fmt = _require_dict(fields.get("format", _TEXT_DEFAULT_FORMAT), "text.format")
    if fmt.get("type") == "json_schema" and "schema" in fmt:
        fields["format"] = {key: canonical_schema(item) if key == "schema" else canonical_value(item)
                            for key, item in fmt.items()}
    else:
        fields["format"] = canonical_value(fmt)
    if fields == {"format": _TEXT_DEFAULT_FORMAT}:
        return None
    return {key: item if key == "format" else canonical_value(item) for key, item in fields.items()}


def _include(value: Any) -> list[str] | None:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise CanonicalizationError("include must be a list of strings")
    return sorted(set(value)) or None


def canonical_response(body: Mapping[str, Any]) -> dict[str, JSONValue]:
    """The canonical form of a ``/v1/responses`` body; :class:`CanonicalizationError` if malformed."""
    fields = _require_dict(body, "the request body")
    out: dict[str, JSONValue] = {"model": _model(fields), "input": canonical_input(fields.get("input"))}
    if "instructions" in fields:
        out["instructions"] = canonical_value(fields["instructions"])
    for name, default in _DEFAULTS.items():
        value = fields.get(name, default)
        out[name] = _number(value, name) if name in ("temperature", "top_p") else canonical_value(value)
    tools = fields.get("tools") or []
    if not isinstance(tools, list):
        raise CanonicalizationError("tools must be a list")
    if tools:
        out["tools"] = [_tool(tool) for tool in tools]
    out["tool_choice"] = canonical_value(fields.get("tool_choice", "auto" if tools else "none"))
    if "text" in fields and (text := _text(fields["text"])) is not None:
        out["text"] = text
    if "reasoning" in fields and (reasoning := _require_dict(fields["reasoning"], "reasoning")):
        out["reasoning"] = canonical_value(reasoning)
    for name in ("max_output_tokens", "max_tool_calls", "top_logprobs"):
        if name in fields:
            out[name] = _number(fields[name], name)
    if "include" in fields and (include := _include(fields["include"])) is not None:
        out["include"] = include
    if "service_tier" in fields:
        out["service_tier"] = canonical_value(fields["service_tier"])
    if fields.get("previous_response_id") is not None:
        if not isinstance(fields["previous_response_id"], str):
            raise CanonicalizationError("previous_response_id must be a string")
        out["previous_response_id"] = fields["previous_response_id"]
    if stores(fields):
        out["stored"] = _stored(fields)
    extra = {key: canonical_value(value) for key, value in fields.items() if key not in RESPONSE_KNOWN_FIELDS}
    if extra:
        out["extra"] = extra
    return out


def _stored(fields: Mapping[str, Any]) -> JSONValue:
    """What a stored object records of the request outside the answer-changing fields (``null`` and ``{}``
    metadata are none)."""
    recorded = {name: fields[name] for name in ECHOED_FIELDS if name != "store" and fields.get(name) is not None}
    if recorded.get("metadata") == {}:
        del recorded["metadata"]
    return canonical_value(recorded)


def prompt_messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The prompt as chat-like messages with text content, for reading documents and the final question:
    ``instructions`` as a system message, then one message per input item (an item that is not a message becomes
    a text-less entry named by its ``type``, so positions stay those of the input)."""
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    items = body.get("input")
    if isinstance(items, str):
        return [*messages, {"role": "user", "content": items}]
    for item in items if isinstance(items, list) else ():
        if isinstance(item, dict) and isinstance(item.get("role"), str) and item.get("type", "message") == "message":
            messages.append({"role": item["role"], "content": content_text(item.get("content"))})
        else:
            messages.append({"role": str(item.get("type")) if isinstance(item, dict) else "item"})
    return messages


def read_response_prompt(body: Mapping[str, Any], documents_field: Any = None,
                         registry: DocumentRegistry | None = None,
                         repeated: RepeatedBlocks | None = None) -> PromptDocuments:
    """The documents of a Responses body: registered documents recognised in its instructions or input text.

    Documents sent apart (``ragproxy.documents``) are refused with :class:`ValueError`: the proxy renders them into
    a chat prompt only, and dropping them silently would change the question.
    """
    if documents_field is not None:
        raise ValueError("ragproxy.documents is not supported on /v1/responses; put the documents in the input")
    return read_prompt({"messages": prompt_messages(body)}, None, registry, repeated)


def final_input_question(body: Mapping[str, Any], prompt: PromptDocuments) -> str | None:
    """The text of the last input item when it is a user message (recognised documents cut out), else ``None``."""
    messages = prompt_messages(body)
    items = body.get("input")
    if not messages or not (isinstance(items, str) or (isinstance(items, list) and items)):
        return None
    last = messages[-1]
    if last.get("role") != "user":
        return None
    detected = prompt.detected
    if detected is not None and detected.message == len(messages) - 1:
        return detected.without_documents() or None
    return str(last.get("content") or "") or None


def semantic_question(body: Mapping[str, Any], prompt: PromptDocuments) -> str | None:
    """The question the semantic tier compares: :func:`final_input_question` of a request that is not stored;
    ``None`` for a stored one (its answer is a resource made for exactly its input)."""
    return None if stores(body) else final_input_question(body, prompt)


def split_prompt(canonical: Mapping[str, JSONValue]) -> tuple[JSONValue, JSONValue, dict[str, JSONValue]]:
    """A canonical request's system part (instructions and leading system/developer items), its history (the
    items between those and the final one) and its final item."""
    items: list[dict[str, JSONValue]] = list(canonical["input"])
    final = items.pop()
    leading = 0
    while leading < len(items) and items[leading].get("role") in _SYSTEM_ROLES:
        leading += 1
    system = {"instructions": canonical.get("instructions"), "items": items[:leading]}
    return system, items[leading:], final


def echo_request(response: dict[str, Any], body: Mapping[str, Any]) -> bool:
    """Make a stored response object repeat this request's own :data:`ECHOED_FIELDS` (those it already has);
    ``True`` when something changed. ``store`` and ``metadata`` take the API's defaults when not sent."""
    changed = False
    defaults: dict[str, Any] = {"store": True, "metadata": {}}
    for name in ECHOED_FIELDS:
        if name not in response:
            continue
        value = body.get(name, defaults.get(name))
        if response[name] != value:
            response[name] = value
            changed = True
    return changed
