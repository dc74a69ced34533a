"""Canonical requests: pure functions and dataclasses, no I/O.

- :mod:`normalizer.canonical_json` — one encoding per JSON value, hashing;
- :mod:`normalizer.canonical` — canonical OpenAI requests and exact-cache keys;
- :mod:`normalizer.bypass` — which requests skip the cache, which responses may be stored;
- :mod:`normalizer.cache_control` — per-request cache directives → ``CachePolicy``;
- :mod:`normalizer.text` — query-text normalization steps;
- :mod:`normalizer.signature` — context signatures and the final question (semantic tier);
- :mod:`normalizer.guards` — vetoes against false semantic matches;
- :mod:`normalizer.documents` — retrieved documents inside prompts;
- :mod:`normalizer.search_request` — canonical Qdrant search requests.
"""
