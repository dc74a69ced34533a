"""Hints to the backend about prefix reuse, and reading back what the backend reused.

What each backend kind gets in the body is its adapter's (:mod:`proxy.kv.kinds`); every kind gets the headers
``X-Prefix-Docs`` (comma-separated doc ids of the prefix, in order, each percent-encoded; the leading ids that fit
in :data:`MAX_PREFIX_DOCS_BYTES`, :func:`prefix_docs_header`) and ``X-Prefix-Hash`` (hash of the path), for routers
and gateways that understand them (:func:`proxy.kv.kinds.base.build_hints`):

==============  ==========================================================================================
kind            body hint
==============  ==========================================================================================
``llamacpp``    ``cache_prompt: true``; ``id_slot`` as the request starts, to the slot the proxy's table
                chose (:class:`SlotTable` explains when); ``n_cache_reuse`` under the ``shift`` order policy
                (:mod:`proxy.kv.order`)
``vllm``        ``cache_salt`` = hash of the tenant: prefix-cache isolation between tenants
``sglang``      same as ``vllm``
``openai``      ``prompt_cache_key`` = hash of the tree path (system prompt key + documents in order)
``generic``     nothing (any other OpenAI-compatible server)
==============  ==========================================================================================

``/v1/responses`` gets the same body hints as chat (vLLM's and SGLang's ``ResponsesRequest`` take ``cache_salt``;
llama.cpp's server turns a Responses body into a chat body keeping every other field) except ``prompt_cache_key``:
the API takes it, but its response object echoes it, so the client would see the proxy's key instead of its own.

Read back: :func:`reported_cached_tokens` takes a reply body (or the last SSE events of a stream) and returns
``usage.prompt_tokens_details.cached_tokens`` (Responses: ``usage.input_tokens_details.cached_tokens``, streamed
in the ``response.completed`` event; :func:`usage_object` finds either) or llama.cpp's ``timings.cache_n``;
:func:`reported_prompt_tokens` the prompt's length in the backend's tokens (to convert reports into the tree's
estimated tokens);
:func:`reported_prefill`
returns llama.cpp's ``(prompt_n, cache_n, prompt_ms)`` for the prefill-time model, :func:`reported_decode_s` its
time generating after the first token (what a reply that was not streamed spent beyond its first token).
:func:`capacity_from_slots` reads the KV capacity of a llama.cpp server from its ``/slots`` answer.
"""

from __future__ import annotations

import hashlib
import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import orjson

from normalizer.prompt_plan import Segment
from proxy.core.sse import last_json_events
from proxy.core.usage import reply_object
from proxy.upstream.settings import LLMBackend

_KV_CAPACITY_TOKENS: int = LLMBackend.model_fields["kv_capacity_tokens"].default  # the default, defined once there

MAX_PREFIX_DOCS_BYTES = 1024
"""Longest ``X-Prefix-Docs`` value: the headers the proxy adds stay far below the 8 KB that servers accept in all."""


def prefix_docs_header(document_keys: Sequence[str]) -> str:
    """The ``X-Prefix-Docs`` value: the leading doc ids (percent-encoded, so any id is header-safe and comma-free)
    that fit in :data:`MAX_PREFIX_DOCS_BYTES` (a leading run still names a prefix)."""
    kept: list[str] = []
    size = -1
    for key in document_keys:
        encoded = quote(key, safe="")
        size += len(encoded) + 1
        if size > MAX_PREFIX_DOCS_BYTES:
            break
        kept.append(encoded)
    return ",".join(kept)


def prefix_hashes(keys: Sequence[str]) -> list[str]:
    """Cumulative hashes of a path's segment keys: entry ``i`` names the prefix ``keys[0..i]`` (the keys under which
    proxy replicas share what each backend probably holds)."""
    hashes: list[str] = []
    digest = hashlib.blake2b(digest_size=12)
    for key in keys:
        digest.update(key.encode())
        digest.update(b"\x00")
        hashes.append(digest.copy().hexdigest())
    return hashes


def path_hash(keys: Sequence[str]) -> str:
    """Stable 32-hex-digit hash of a tree path (segment keys in order)."""
    return hashlib.blake2b("\x1f".join(keys).encode("utf-8"), digest_size=16).hexdigest()


@dataclass(slots=True)  # not frozen: built per request, and frozen fields cost about 5 times more to set
class Hints:
    body: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Lost:
    """What a server lost when a slot started a request: ``path``'s segments beyond its first ``kept_tokens``
    (truncated in the slot, and held by no other slot nor the host prompt cache)."""

    path: tuple[Segment, ...]
    kept_tokens: int


@dataclass(frozen=True, slots=True)
class SlotChoice:
    """The slot a request will use, whether to send ``id_slot``, and ``reused``: what the server will reuse of the
    prompt by the table's account (:meth:`SlotTable.reused`)."""

    slot: int
    pin: bool
    reused: int


class SlotTable:
    """What each slot of a llama.cpp server last held (its prompt path), to choose ``id_slot``.

    A llama.cpp slot holds only its last prompt. Without ``id_slot`` the server takes the idle slot whose prompt
    shares the largest fraction of the new one, if above ``--slot-prompt-similarity`` (``similarity``, 0.1),
    else its least recently used idle slot (the last such slot on a tie). With its host-memory prompt cache
    (``--cache-ram``, on by default in current llama.cpp: ``prompt_cache``), before it reuses a slot by LRU, or
    one that would lose more than half of its prompt, it saves that prompt in host memory and restores the stored
    prompt that shares the longest prefix with the new one. A request *with* ``id_slot`` gets that slot, saved and
    restored the same way when it would keep less than half of its prompt (the vendored server's
    ``get_available_slot``). Hence :meth:`choose`:

    * with the server's prompt cache, a request is pinned to the slot the table chooses whenever that slot holds
      a prompt, so the server does what the table records: left to itself, the server chooses when each request
      reaches it, and requests that start together reach it in either order (measured under load: the table and
      the server disagreed on half the slots). A pinned slot is saved and restored by the same rules as the
      server's own choice, except an empty one, which restores nothing (``f_keep`` is 0/0 there): an empty slot
      is left to the server. The slot chosen is the server's own rule's (the longest shared prefix if similar,
      else the least recently used). But the server restores from its prompt cache only when the slot would keep
      less than half of its prompt (``f_keep < 0.5``): a slot that keeps more is reused as it is, and a longer
      prefix in the prompt cache (``cached_tokens``, the knowledge tree's estimate) is not restored. Then the
      request goes to another idle slot that would keep less than half of its (non-empty) prompt, which makes the
      server save that prompt and restore the longer one. :meth:`reused` says what the server reuses in the
      chosen slot;
    * without one (``prompt_cache=False``) an overwritten prompt is gone, so every request is pinned: to the
      idle slot sharing more than ``similarity`` of the prompt and more than its first segment (the system
      prompt every request shares; the longest), else to the idle slot whose
      prompt is worth least — empty first, then the lowest ``value`` (the caller's measure of how much later
      requests reuse it, from the knowledge tree), then the least recently used — so a popular prefix is not
      overwritten by a one-off prompt while a cheaper slot is free (RAGCache's PGDSF, applied to slots).
    """

    def __init__(
        self,
        slots: int,
        *,
        similarity: float = 0.1,
        prompt_cache: bool = True,
        cache_tokens: int = _KV_CAPACITY_TOKENS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if slots < 1:
            raise ValueError("slots must be at least 1")
        self.similarity = similarity
        self.cache_tokens = cache_tokens
        """The most the table's account of the host cache holds: like the server (``--cache-ram``), it drops the
        oldest stored prompts to fit a new one (the replica's KV capacity stands for the server's bytes)."""
        self.prompt_cache = prompt_cache
        self._paths: list[tuple[Segment, ...]] = [() for _ in range(slots)]
        self._sizes: list[int] = [0] * slots
        """Each slot's whole prompt in tokens (its path and what followed it), when known."""
        self._used: list[float] = [float("-inf")] * slots
        self._busy: list[int] = [0] * slots
        self._clock = clock
        self._prompt_ids = itertools.count(1)
        self._ids: list[int] = [0] * slots
        """Which prompt each slot holds (0: none), so a prompt saved twice is one entry of the host cache."""
        self._saved: list[tuple[int, tuple[Segment, ...], int]] = []
        """The server's host prompt cache as far as this table saw it: ``(prompt id, path, tokens)``, oldest
        first, within ``cache_tokens``."""
        self.held_tokens = 0
        """Tokens of the prompts in that account."""

    def __len__(self) -> int:
        return len(self._paths)

    def resize(self, slots: int) -> None:
        """Follow the server's real number of slots (``GET /slots``); what known slots hold is kept."""
        if slots < 1:
            raise ValueError("slots must be at least 1")
        extra = max(0, slots - len(self._paths))
        self._paths = self._paths[:slots] + [() for _ in range(extra)]
        self._sizes = self._sizes[:slots] + [0] * extra
        self._used = self._used[:slots] + [float("-inf")] * extra
        self._busy = self._busy[:slots] + [0] * extra
        self._ids = self._ids[:slots] + [0] * extra

    def best(self, path: Sequence[Segment]) -> tuple[int, int]:
        """``(slot, matching prefix tokens)``: longest shared prefix among idle slots, then least recent."""
        ranked = sorted(
            range(len(self._paths)),
            key=lambda s: (self._busy[s] > 0, -_common_tokens(self._paths[s], path), self._used[s]),
        )
        slot = ranked[0]
        return slot, _common_tokens(self._paths[slot], path)

    def choose(
        self,
        path: Sequence[Segment],
        total_tokens: int,
        value: Callable[[Sequence[Segment]], float] | None = None,
        cached_tokens: int = 0,
    ) -> SlotChoice:
        """The slot for a prompt of ``total_tokens`` whose prefix is ``path``; ``cached_tokens``: how much of it the
        server's prompt cache probably holds (see the class docs)."""
        slot = self._slot(path, total_tokens, value, cached_tokens)
        pin = bool(self._ids[slot]) or not self.prompt_cache  # an empty slot is left to the server (class docs)
        return SlotChoice(slot, pin, self.reused(slot, path, total_tokens))

    def _slot(
        self,
        path: Sequence[Segment],
        total_tokens: int,
        value: Callable[[Sequence[Segment]], float] | None,
        cached_tokens: int,
    ) -> int:
        """The slot for :meth:`choose` (the class docs say which)."""
        slot, shared = self.best(path)
        similar = self._similar(shared, total_tokens)
        idle = [s for s in range(len(self._paths)) if not self._busy[s]] or list(range(len(self._paths)))
        if self.prompt_cache:
            if similar:
                if not self._keeps_half(slot, shared) or cached_tokens <= shared:
                    return slot  # the server saves the slot's prompt and restores, or reuses it as it is
                other = [s for s in idle if s != slot and self._paths[s]
                         and not self._keeps_half(s, _common_tokens(self._paths[s], path))]
                if not other:
                    return slot
                return min(other, key=lambda s: (value(self._paths[s]) if value is not None else 0.0, self._used[s]))
            return min(idle, key=lambda s: (self._used[s], -s))
        if similar and shared > (path[0].tokens if path else 0):  # more than the system prompt all share
            return slot

        def worth(s: int) -> tuple[bool, float, float]:
            held = self._paths[s]
            return bool(held), (value(held) if value is not None and held else 0.0), self._used[s]

        return min(idle, key=worth)

    def reused(self, slot: int, path: Sequence[Segment], total_tokens: int) -> int:
        """Tokens of ``path`` the server reuses when ``slot`` takes it (the rules of :meth:`assign`): the slot's
        shared prefix when it is reused as it is (always, without a prompt cache), else the longer of that and
        the prefix of the stored prompt the server restores."""
        shared = _common_tokens(self._paths[slot], path)
        if not self.prompt_cache or (self._similar(shared, total_tokens) and self._keeps_half(slot, shared)):
            return shared
        entry = self._restored(slot, path, total_tokens)
        return shared if entry is None else _common_tokens(self._saved[entry][1], path)

    def _similar(self, shared: int, total_tokens: int) -> bool:
        """Whether the server would take a slot sharing ``shared`` tokens of the prompt for its similarity."""
        return shared > self.similarity * max(1, total_tokens)

    def _keeps_half(self, slot: int, shared: int) -> bool:
        """Whether a slot reused for a prompt sharing ``shared`` tokens keeps at least half of what it holds (so
        the server restores nothing)."""
        held = self._sizes[slot] or sum(segment.tokens for segment in self._paths[slot])
        return held > 0 and shared >= 0.5 * held

    def assign(self, slot: int, path: Sequence[Segment], total_tokens: int = 0) -> Lost | None:
        """``slot`` now holds a prompt of ``total_tokens`` (0: its path's) whose prefix is ``path``.

        With the server's prompt cache, this follows what the server does as the request starts (the vendored
        ``get_available_slot`` and ``--cache-idle-slots``, on by default): a slot that keeps less than half of its
        prompt (or shares too little of the new one) is saved to the host cache, and the stored prompt the server
        picks is restored into it and leaves the cache; then every idle slot's prompt is saved. The prompt the
        slot continues from (its own, kept as it is, or the restored one) is truncated to the prefix it shares
        with the new prompt; returns what of it is now held nowhere (:class:`Lost`, for the knowledge tree to
        forget), ``None`` when nothing is."""
        path = tuple(path)
        lost = self._start(slot, path, total_tokens) if self.prompt_cache else None
        self._paths[slot] = path
        self._sizes[slot] = total_tokens
        self._ids[slot] = next(self._prompt_ids)
        self._used[slot] = self._clock()
        self._busy[slot] += 1
        if self.prompt_cache:
            for other in range(len(self._paths)):
                if other != slot and not self._busy[other]:
                    self._save(other)
        return lost

    def _start(self, slot: int, path: tuple[Segment, ...], total_tokens: int) -> Lost | None:
        """Save and restore as the server does when ``slot`` takes a prompt; what the slot then truncates and
        nobody else holds."""
        shared = _common_tokens(self._paths[slot], path)
        source = self._paths[slot]
        if not (self._similar(shared, total_tokens) and self._keeps_half(slot, shared)):
            self._save(slot)  # the slot's own prompt is kept in host memory
            entry = self._restored(slot, path, total_tokens)
            if entry is None:
                return None
            _, source, size = self._saved.pop(entry)
            self.held_tokens -= size
        elif self._ids[slot] in {saved[0] for saved in self._saved}:
            return None  # kept as it is, but saved before (an idle slot when another request started)
        held = max([_common_tokens(source, path)]
                   + [_common_tokens(source, self._paths[s]) for s in range(len(self._paths)) if s != slot]
                   + [_common_tokens(source, saved[1]) for saved in self._saved])
        if held >= sum(segment.tokens for segment in source):
            return None
        return Lost(source, held)

    def _save(self, slot: int) -> None:
        """The server saves ``slot``'s prompt in its host cache (once: a prompt already stored is skipped; the
        oldest go to make room, and a prompt larger than the whole cache is not stored)."""
        prompt = self._ids[slot]
        size = self._sizes[slot] or sum(segment.tokens for segment in self._paths[slot])
        if not prompt or size > self.cache_tokens or any(saved[0] == prompt for saved in self._saved):
            return
        while self._saved and self.held_tokens + size > self.cache_tokens:
            self.held_tokens -= self._saved.pop(0)[2]
        self._saved.append((prompt, self._paths[slot], size))
        self.held_tokens += size

    def _restored(self, slot: int, path: Sequence[Segment], total_tokens: int) -> int | None:
        """Index in the host cache of the prompt the server restores into ``slot`` for ``path``, ``None`` for
        none (``server_prompt_cache::load``: a stored prompt that would keep at least a quarter of itself and
        beats the best so far on both the share of it kept and the share of the new prompt covered; oldest
        first)."""
        total = max(1, total_tokens or sum(segment.tokens for segment in path))
        own = _common_tokens(self._paths[slot], path)
        held = self._sizes[slot] or sum(segment.tokens for segment in self._paths[slot])
        keep_best, cover_best = (own / held if held else -1.0), own / total
        best = None
        for index, (_, saved, size) in enumerate(self._saved):
            common = _common_tokens(saved, path)
            keep = common / max(1, size or sum(segment.tokens for segment in saved))
            if keep >= 0.25 and keep > keep_best and common / total > cover_best:
                keep_best, cover_best, best = keep, common / total, index
        return best

    def release(self, slot: int) -> None:
        self._busy[slot] = max(0, self._busy[slot] - 1)


def _common_tokens(a: Sequence[Segment], b: Sequence[Segment]) -> int:
    tokens = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        tokens += x.tokens
    return tokens


# --- reading back ------------------------------------------------------------------------------------------


LAST_EVENTS = 4
"""How many trailing SSE data events are read for usage and timings (they ride on the last one or two)."""

Reported = Mapping[str, Any] | bytes | list[dict[str, Any]]
"""A reply as the ``reported_*`` readers take it: raw bytes, one parsed object, or :func:`reply_objects`' list."""


def reports_cache(body: bytes) -> bool:
    """Whether ``body`` may hold a cache report (``cached_tokens`` or llama.cpp ``timings``): a byte search is far
    cheaper than parsing a reply that reports nothing. (``find``, not ``in``: CPython's ``bytes in bytes`` first
    tries the operand as an integer and raises and clears a TypeError on every call.)"""
    return body.find(b'"cached_tokens"') >= 0 or body.find(b'"timings"') >= 0


def reply_objects(reply: Reported) -> list[dict[str, Any]]:
    """The JSON objects of a reply to read reports from (parse once, then pass the list to each reader)."""
    if isinstance(reply, bytes):
        return _last_json_objects(reply)
    if isinstance(reply, list):
        return reply
    return [dict(reply)]


def _last_json_objects(raw: bytes) -> list[dict[str, Any]]:
    """The JSON object of a complete body, or the last :data:`LAST_EVENTS` data events of an SSE stream (last
    first)."""
    raw = raw.strip()
    if raw.startswith(b"{"):
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return []
        return [value] if isinstance(value, dict) else []
    return last_json_events(raw, LAST_EVENTS)


def usage_object(obj: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``usage`` object of a reply or stream event (:func:`proxy.core.usage.reply_object`)."""
    usage = reply_object(obj).get("usage")
    return usage if isinstance(usage, dict) else None


def reported_cached_tokens(reply: Reported) -> int | None:
    """Cached prompt tokens the backend reported (``prompt_tokens_details.cached_tokens``, or the Responses API's
    ``input_tokens_details.cached_tokens``), or ``None`` when it did not say."""
    objects = reply_objects(reply)
    for obj in objects:
        usage = usage_object(obj)
        if usage is not None:
            details = usage.get("prompt_tokens_details", usage.get("input_tokens_details"))
            if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
                return int(details["cached_tokens"])
        timings = obj.get("timings")
        if isinstance(timings, dict) and isinstance(timings.get("cache_n"), int):
            return int(timings["cache_n"])
    return None


def reported_prompt_tokens(reply: Reported) -> int | None:
    """The prompt's length in the backend's own tokens (``usage.prompt_tokens`` or ``input_tokens``, or llama.cpp's
    ``timings.prompt_n + cache_n``), or ``None`` when it did not say."""
    objects = reply_objects(reply)
    for obj in objects:
        usage = usage_object(obj)
        prompt = usage.get("prompt_tokens", usage.get("input_tokens")) if usage is not None else None
        if isinstance(prompt, int) and prompt > 0:
            return prompt
        timings = obj.get("timings")
        if isinstance(timings, dict) and isinstance(timings.get("prompt_n"), int):
            return int(timings["prompt_n"]) + int(timings.get("cache_n") or 0)
    return None


def reported_prefill(reply: Reported) -> tuple[int, int, float] | None:
    """llama.cpp's ``(prompt_n, cache_n, prompt_ms)``: tokens computed, tokens reused, prefill time."""
    objects = reply_objects(reply)
    for obj in objects:
        timings = obj.get("timings")
        if isinstance(timings, dict) and {"prompt_n", "cache_n", "prompt_ms"} <= timings.keys():
            return int(timings["prompt_n"]), int(timings["cache_n"]), float(timings["prompt_ms"])
    return None


def reported_decode_s(reply: Reported) -> float | None:
    """llama.cpp's time generating after the first token (``timings.predicted_ms``, in seconds), or ``None``."""
    for obj in reply_objects(reply):
        timings = obj.get("timings")
        if isinstance(timings, dict) and isinstance(timings.get("predicted_ms"), int | float):
            return float(timings["predicted_ms"]) / 1000
    return None


def capacity_from_slots(slots: Sequence[Mapping[str, Any]]) -> tuple[int, int]:
    """``(number of slots, total KV capacity in tokens)`` from a llama.cpp ``GET /slots`` answer."""
    n_ctx = sum(int(s.get("n_ctx", 0)) for s in slots)
    return len(slots), n_ctx
