"""Idempotency keys: a retried LLM call with the same ``Idempotency-Key`` is answered once and charged once. The
stage (:mod:`~proxy.idempotency.stage`), the records, their pure decisions and the store contract
(:mod:`~proxy.idempotency.records`), and the two stores: this process's memory
(:mod:`~proxy.idempotency.memory_store`) and Redis (:mod:`~proxy.idempotency.redis_store`)."""
