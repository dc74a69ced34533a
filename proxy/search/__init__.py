"""The Qdrant side of the data plane.

- :mod:`proxy.search.routes` — the table of Qdrant routes the proxy serves, and the upstream path built from a row;
- :mod:`proxy.search.tenancy` — which collections a tenant reaches, under which upstream names;
- :mod:`proxy.search.bodies` — request bodies with the collections they name mapped;
- :mod:`proxy.search.answers` — answers with the names in them mapped back;
- :mod:`proxy.search.requests` — the stage that builds every Qdrant request from these;
- :mod:`proxy.search.stages` — the search cache's stages (lookup, invalidation, documents);
- :mod:`proxy.search.tier` — the search cache as a cache tier (registered by :mod:`proxy.cache_tiers`), and its build;
- :mod:`proxy.search.settings` — its settings, ``cache.retrieval``.
"""
