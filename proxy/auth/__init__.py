"""Who a request is: API keys and their limits (:mod:`~proxy.auth.keys`, the contract, with its SQLite and Redis
backends :mod:`~proxy.auth.sqlite_keys` and :mod:`~proxy.auth.redis_keys`), the keys a replica has verified lately,
kept true by the key store's change feed (:mod:`~proxy.auth.known_keys`), and the pipeline stage that puts the key's
user, tenant and quota on the context (:mod:`~proxy.auth.identify`)."""
