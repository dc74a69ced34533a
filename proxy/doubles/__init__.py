"""Test doubles of ragproxy's upstreams (test-only; never imported by the product).

- :mod:`tests.fakes.llm_server`: ``FakeLLM``, an OpenAI-wire inference server with faults, latency and a log;
- :mod:`tests.fakes.kv_cache`: ``KVCacheModel`` and ``SlotSchedule``, a pure model of a prefix KV cache;
- :mod:`tests.fakes.qdrant_shim`: ``QdrantShim``, a TEST-ONLY Qdrant REST shim over qdrant-client local mode;
- :mod:`tests.fakes.fixtures`: pytest fixtures ``fake_llm``, ``fake_llm_thread``, ``qdrant_shim``.
"""
