"""A stand-in for one proxy replica, run as a separate OS process by the multi-process credit tests.

``burst BACKEND TARGET USER COUNT START_AT``: at wall-clock ``START_AT``, run ``COUNT`` concurrent
reserve-then-settle requests of 1 credit each; print how many got their reservation.
``hold BACKEND TARGET USER REQUEST_ID``: reserve 3 credits for 60 s, print ``held``, then wait to be killed.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid

from proxy.credits.redis_store import RedisCreditStore
from proxy.credits.sqlite_store import SqliteCreditStore
from proxy.credits.store import ChargeDetails, CreditStore, Reservation

CREDIT = 1_000_000


def open_store(backend: str, target: str) -> CreditStore:
    return SqliteCreditStore(target) if backend == "sqlite" else RedisCreditStore.from_url(target, timeout_s=15.0)


async def burst(store: CreditStore, user: str, count: int, start_at: float) -> int:
    await asyncio.sleep(max(0.0, start_at - time.time()))
    tag = uuid.uuid4().hex[:8]

    async def one(i: int) -> bool:
        held = await store.reserve(f"{tag}-{i}", user, CREDIT, 60)
        if not isinstance(held, Reservation):
            return False
        await store.settle(held.request_id, user, CREDIT, ChargeDetails(model="m"))
        return True

    return sum(await asyncio.gather(*(one(i) for i in range(count))))


async def main(argv: list[str]) -> None:
    mode, backend, target, user = argv[:4]
    store = open_store(backend, target)
    try:
        if mode == "burst":
            print(await burst(store, user, int(argv[4]), float(argv[5])), flush=True)
        else:
            held = await store.reserve(argv[4], user, 3 * CREDIT, 60)
            assert isinstance(held, Reservation)
            print("held", flush=True)
            await asyncio.sleep(3600)
    finally:
        await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
