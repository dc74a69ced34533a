"""OpenAI's hosted API: ``prompt_cache_key`` names the prefix, so requests sharing one reach the same cache machine
(chat only: a Responses object echoes the request's ``prompt_cache_key``, so the client would see the proxy's)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.kv.kinds.base import BackendKind, HintRequest


class OpenAIKind(BackendKind):
    name = "openai"

    def body_hints(self, request: HintRequest) -> Mapping[str, Any]:
        # no key without a prefix: one key shared by every one-message prompt would send them all to one machine
        return {"prompt_cache_key": request.path_digest} if request.path_digest and not request.responses else {}
