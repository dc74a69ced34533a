"""What the stores of API keys, idempotency keys and credits share, below those features: the SQLite worker thread,
the Redis client helpers (bounded connections, retries across a restart, failures as
:class:`~proxy.stores.unavailable.StoreUnavailable`), the watch for a Redis that lost its data, and the one "store
unavailable" every store raises and the pipeline answers with 503."""
