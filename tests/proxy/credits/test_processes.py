"""Credit stores shared by OS processes: three replicas racing one balance; a replica killed mid-request."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from proxy.credits.reaper import ReservationReaper
from proxy.credits.store import ChargeDetails, CreditStore, LedgerFilter, ledger_entries
from tests.proxy.credits.conftest import make_credit_store

ROOT = Path(__file__).resolve().parents[3]
CREDIT = 1_000_000


def replica(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.proxy.credits.proxy_process", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )


def target_of(backend: str, tmp_path: Path, redis_url: str) -> str:
    return str(tmp_path / "credits.sqlite3") if backend == "sqlite" else redis_url


async def ledger_sum(store: CreditStore, user: str) -> int:
    return sum([entry.amount async for entry in ledger_entries(store, LedgerFilter(user=user))])


async def test_three_processes_share_one_balance(backend: str, tmp_path: Path, redis_url: str) -> None:
    store = make_credit_store(backend, tmp_path, redis_url)
    target = target_of(backend, tmp_path, redis_url)
    try:
        await store.top_up("ann", 100 * CREDIT)
        start_at = time.time() + 1.5  # all three start their burst together, after their imports
        procs = [replica("burst", backend, target, "ann", str(n), str(start_at)) for n in (167, 167, 166)]
        outputs = [proc.communicate(timeout=60)[0] for proc in procs]
        assert [proc.returncode for proc in procs] == [0, 0, 0]
        succeeded = sum(int(out.strip()) for out in outputs)
        assert succeeded == 100
        account = await store.balance("ann")
        assert (account.available, account.held) == (0, 0)
        assert await ledger_sum(store, "ann") == account.balance
        charges = [e async for e in ledger_entries(store, LedgerFilter(user="ann", kind="charge"))]
        assert len(charges) == 100 and len({e.request_id for e in charges}) == 100
    finally:
        await store.close()


async def test_a_killed_replica_s_reservation_is_reaped_and_never_charged_twice(
    backend: str, tmp_path: Path, redis_url: str
) -> None:
    store = make_credit_store(backend, tmp_path, redis_url)
    target = target_of(backend, tmp_path, redis_url)
    try:
        await store.top_up("ann", 10 * CREDIT)
        proc = replica("hold", backend, target, "ann", "doomed")
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "held"
        proc.kill()
        proc.wait(timeout=10)
        account = await store.balance("ann")
        assert (account.available, account.held) == (7 * CREDIT, 3 * CREDIT)

        assert await store.reap_expired(now=time.time() + 30) == 0  # not yet due
        reaper = ReservationReaper(store)
        store_clock_later = time.time() + 61
        assert await store.reap_expired(now=store_clock_later) == 1
        assert await reaper.reap_once() == 0  # nothing left for the periodic reaper
        account = await store.balance("ann")
        assert (account.available, account.held) == (10 * CREDIT, 0)

        # The request did finish somewhere after all: its settlement arrives late, and arrives twice.
        first = await store.settle("doomed", "ann", CREDIT, ChargeDetails(model="m"))
        second = await store.settle("doomed", "ann", CREDIT, ChargeDetails(model="m"))
        assert (first.outcome, second.outcome) == ("late", "duplicate")
        account = await store.balance("ann")
        assert (account.available, account.held) == (9 * CREDIT, 0)
        assert await ledger_sum(store, "ann") == account.balance
    finally:
        await store.close()
