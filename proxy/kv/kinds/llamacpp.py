"""llama.cpp's server: ``cache_prompt``, ``id_slot`` when a slot is pinned as the request starts
(:class:`~proxy.kv.hints.SlotTable` explains when), ``n_cache_reuse`` under the ``shift`` order policy; slots read
from ``GET /slots``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.kv.kinds.base import BackendKind, HintRequest


class LlamaCppKind(BackendKind):
    name = "llamacpp"
    tracks_slots = True

    def body_hints(self, request: HintRequest) -> Mapping[str, Any]:
        body: dict[str, Any] = {"cache_prompt": True}
        if request.shift_min_tokens > 0:
            body["n_cache_reuse"] = request.shift_min_tokens
        return body

    def slot_hint(self, slot: int) -> Mapping[str, Any]:
        return {"id_slot": slot}
