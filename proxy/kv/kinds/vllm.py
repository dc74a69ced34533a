"""vLLM and SGLang: ``cache_salt`` per cache scope isolates their prefix caches between tenants (and users)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.kv.kinds.base import BackendKind, HintRequest, tenant_salt


class VLLMKind(BackendKind):
    name = "vllm"

    def body_hints(self, request: HintRequest) -> Mapping[str, Any]:
        return {"cache_salt": tenant_salt(request.tenant, request.salt_secret)}


class SGLangKind(VLLMKind):
    name = "sglang"
