"""Per-user credit accounting: prices, reserve-then-settle with cache-hit discounts, the ledger.

Where to look: :mod:`~proxy.credits.pricing` (prices and the worst case, pure), :mod:`~proxy.core.usage`
and :mod:`~proxy.credits.streaming` (reading usage from replies), :mod:`~proxy.credits.store` (the store
contract and its semantics) with :mod:`~proxy.credits.sqlite_store` and :mod:`~proxy.credits.redis_store`,
:mod:`~proxy.credits.stages` (``Credits`` for the pipeline), :mod:`~proxy.credits.reaper` (returns the holds of dead
proxies) and, for outages of the store, :mod:`~proxy.credits.journaled_store` (the store the runtime uses) with
:mod:`~proxy.credits.outage` (the allowance, pure), :mod:`~proxy.credits.journal` (settlements kept on local disk)
and :mod:`~proxy.credits.replayer` (empties the journal into the store). Who pays comes from :mod:`proxy.auth`, rate
limits and budgets from :mod:`proxy.rate_limits`, the stores' shared plumbing from :mod:`proxy.stores`.
"""
