"""Backend kinds as adapters, looked up by the name configured as ``upstreams.llm[].kind``.

Every kind-specific choice the proxy makes lives in its adapter (:class:`~proxy.kv.kinds.base.BackendKind`): the
body hints, whether the proxy follows the server's slots, the reading of reports. Adding a kind is a module
here with a subclass, one line in :data:`KINDS` and its name in :data:`proxy.upstream.settings.BACKEND_KINDS`.
"""

from __future__ import annotations

from proxy.kv.kinds.base import BackendKind, build_hints
from proxy.kv.kinds.llamacpp import LlamaCppKind
from proxy.kv.kinds.openai import OpenAIKind
from proxy.kv.kinds.vllm import SGLangKind, VLLMKind

GENERIC, OPENAI, VLLM, SGLANG, LLAMACPP = BackendKind(), OpenAIKind(), VLLMKind(), SGLangKind(), LlamaCppKind()

KINDS: dict[str, BackendKind] = {kind.name: kind for kind in (
    OPENAI,  # hosted OpenAI-style APIs: prompt_cache_key
    VLLM,  # cache_salt per cache scope
    SGLANG,  # as vLLM
    LLAMACPP,  # cache_prompt, id_slot, n_cache_reuse; /slots
    GENERIC,  # any other OpenAI-compatible server: no body hints
)}
"""The registered kinds, by the name the configuration uses."""

__all__ = ["GENERIC", "KINDS", "LLAMACPP", "OPENAI", "SGLANG", "VLLM", "BackendKind", "build_hints"]
