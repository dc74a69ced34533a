"""Rate limits and budgets per API key, user and tenant: the pure decisions and headers
(:mod:`~proxy.rate_limits.decisions`), the counters in SQLite, memory or Redis (:mod:`~proxy.rate_limits.counters`)
and the pipeline stage (:mod:`~proxy.rate_limits.stage`). The limits are set through the admin API and kept with the
keys (:mod:`proxy.auth`); a budget is counted in credits (:mod:`proxy.credits.pricing`)."""
