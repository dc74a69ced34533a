"""Test doubles of ragproxy's upstreams, shipped so that ``ragproxy demo`` and the load tests run from an installed
wheel; the tests use them too. Never imported by the data plane or the admin API (``tests/test_layers.py``).

- :mod:`upstream_doubles.llm_server`: ``FakeLLM``, an OpenAI-wire inference server with faults, latency and a log;
- :mod:`upstream_doubles.idle_closing_llm`: ``IdleClosingLLM``, a chat server that closes idle keep-alive connections;
- :mod:`upstream_doubles.kv_cache`: ``KVCacheModel`` and ``SlotSchedule``, a pure model of a prefix KV cache;
- :mod:`upstream_doubles.qdrant_shim`: ``QdrantShim``, a TEST-ONLY Qdrant REST shim over qdrant-client local mode;
- :mod:`upstream_doubles.rerankers`: reranker servers (vLLM, TEI, Cohere shapes);
- ``ragproxy demo`` serves ``FakeLLM`` (with its own canned answers) and ``QdrantShim`` (:mod:`commands.demo`);
- pytest fixtures over them (``fake_llm``, ``fake_llm_thread``, ``qdrant_shim``): ``tests/support/doubles_fixtures.py``.
"""
