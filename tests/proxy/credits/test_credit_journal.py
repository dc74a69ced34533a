"""The outage allowance (pure), the settlement journal (a real SQLite file) and the journaled store's replay.

A store that is down is a real :class:`RedisCreditStore` pointed at a port nobody listens on; a store that is up
is a real :class:`SqliteCreditStore`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from proxy.credits.journal import JournaledSettlement, SettlementJournal
from proxy.credits.journaled_store import JOURNALED, JournaledCreditStore
from proxy.credits.outage import OutageAllowance
from proxy.credits.redis_store import RedisCreditStore
from proxy.credits.replayer import JournalReplayer
from proxy.credits.sqlite_store import SqliteCreditStore
from proxy.credits.store import ChargeDetails, LedgerFilter, Reservation, ledger_entries
from proxy.stores.unavailable import StoreUnavailable
from tests.support.processes import refused_port

CREDIT = 1_000_000
T0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def dead_store() -> RedisCreditStore:
    return RedisCreditStore.from_url(f"redis://127.0.0.1:{refused_port()}/0", timeout_s=1.0)


def settlement(request_id: str, user: str = "ann", actual: int = CREDIT, at: float = T0) -> JournaledSettlement:
    return JournaledSettlement(request_id, user, actual, ChargeDetails(tenant="acme", model="m", prompt_tokens=7), at)


# -- the outage allowance --


def test_an_unknown_user_is_never_admitted() -> None:
    allowance = OutageAllowance(5 * CREDIT)
    assert allowance.admit("r1", "stranger", 1, 60) is None
    allowance.remember("ann", 10 * CREDIT)
    assert allowance.admit("r1", "stranger", 1, 60) is None


def test_admissions_stop_at_the_allowance_then_at_the_known_balance() -> None:
    allowance = OutageAllowance(3 * CREDIT)
    allowance.remember("ann", 10 * CREDIT)
    allowance.remember("bob", 2 * CREDIT)
    assert allowance.admit("a1", "ann", 2 * CREDIT, 60) == CREDIT
    assert allowance.admit("a2", "ann", 2 * CREDIT, 60) is None
    assert allowance.admit("a3", "ann", CREDIT, 60) == 0
    assert allowance.admit("b1", "bob", 2 * CREDIT, 60) == 0, "bob's balance is below the allowance"
    assert allowance.admit("b2", "bob", 1, 60) is None
    assert allowance.spent("ann") == 3 * CREDIT


def test_a_settlement_counts_its_cost_instead_of_its_worst_case_until_replayed() -> None:
    allowance = OutageAllowance(3 * CREDIT)
    allowance.remember("ann", 10 * CREDIT)
    allowance.admit("a1", "ann", 2 * CREDIT, 60)
    assert allowance.finish("a1") is not None
    allowance.journaled("ann", CREDIT // 2)
    assert allowance.spent("ann") == CREDIT // 2
    assert allowance.admit("a2", "ann", 2 * CREDIT + CREDIT // 2, 60) == 0
    assert allowance.finish("a2") is not None, "released: nothing charged"
    allowance.replayed("ann", CREDIT // 2)
    assert allowance.spent("ann") == 0


def test_a_zero_allowance_admits_nothing() -> None:
    allowance = OutageAllowance(0)
    allowance.remember("ann", 10 * CREDIT)
    assert allowance.admit("a1", "ann", 0, 60) is None


def test_known_balances_are_bounded_least_recent_first() -> None:
    allowance = OutageAllowance(CREDIT, known_users=2)
    allowance.remember("ann", CREDIT)
    allowance.remember("bob", CREDIT)
    allowance.remember("ann", CREDIT)
    allowance.remember("cy", CREDIT)
    assert (allowance.known("ann"), allowance.known("bob"), allowance.known("cy")) == (CREDIT, None, CREDIT)


def test_an_admission_that_never_finishes_stops_counting_after_its_ttl() -> None:
    clock = Clock()
    allowance = OutageAllowance(CREDIT, clock=clock)
    allowance.remember("ann", 10 * CREDIT)
    assert allowance.admit("stuck", "ann", CREDIT, 10) == 0
    clock.now += 11
    admitted = 0
    for i in range(300):  # the sweep runs every few hundred admissions
        if allowance.admit(f"r{i}", "ann", 1, 10) is not None:
            admitted += 1
            allowance.finish(f"r{i}")
    assert admitted > 0
    assert allowance.admitted("stuck") is None


# -- the journal file --


async def test_concurrent_appends_are_all_durable_and_a_request_id_is_kept_once(tmp_path: Path) -> None:
    journal = SettlementJournal(tmp_path / "journal.sqlite3")
    await asyncio.gather(*(journal.append(settlement(f"r{i}", actual=i)) for i in range(200)))
    await journal.append(settlement("r7", actual=999))
    assert journal.depth == 200
    await journal.close()

    reopened = SettlementJournal(tmp_path / "journal.sqlite3")
    rows = await reopened.oldest(500)
    assert [(r.request_id, r.actual) for r in rows] == [(f"r{i}", i) for i in range(200)]
    assert rows[0].details == ChargeDetails(tenant="acme", model="m", prompt_tokens=7)
    assert rows[0].time == T0
    assert await reopened.charges_by_user() == {"ann": sum(range(200))}
    await reopened.remove(rows[:150])
    assert reopened.depth == 50
    assert [r.request_id for r in await reopened.oldest(500)] == [f"r{i}" for i in range(150, 200)]
    await reopened.close()


async def test_a_journal_that_cannot_be_written_says_the_store_is_unavailable(tmp_path: Path) -> None:
    unwritable = SettlementJournal(tmp_path)  # a directory, not a database file
    store = JournaledCreditStore(dead_store(), unwritable, OutageAllowance(CREDIT))
    with pytest.raises(StoreUnavailable):
        await store.settle("r1", "ann", CREDIT, ChargeDetails())
    await store.close()


# -- the journaled store: journal while down, replay once up --


async def test_a_new_process_replays_what_the_previous_one_journaled(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    down = JournaledCreditStore(dead_store(), SettlementJournal(path), OutageAllowance(CREDIT))
    for i in range(3):
        answer = await down.settle(f"r{i}", "ann", (i + 1) * CREDIT, ChargeDetails(tenant="acme"), now=T0 + i)
        assert (answer.outcome, answer.charged) == (JOURNALED, (i + 1) * CREDIT)
    assert down.journal.depth == 3
    await down.close()  # the process ends with the store still down

    ledger = SqliteCreditStore(tmp_path / "credits.sqlite3")
    await ledger.top_up("ann", 10 * CREDIT)
    up = JournaledCreditStore(ledger, SettlementJournal(path), OutageAllowance(CREDIT))
    replayer = JournalReplayer(up, interval_s=0.05)
    await replayer.start()
    assert up.allowance.spent("ann") == 6 * CREDIT, "what the journal holds counts against the allowance"
    for _ in range(200):
        if up.journal.depth == 0:
            break
        await asyncio.sleep(0.05)
    await replayer.stop()
    charges = [e async for e in ledger_entries(ledger, LedgerFilter(user="ann", kind="charge"))]
    assert [(e.request_id, e.cost, e.time, e.tenant) for e in charges] == [
        (f"r{i}", (i + 1) * CREDIT, T0 + i, "acme") for i in range(3)
    ]
    assert (await ledger.balance("ann")).available == 4 * CREDIT
    assert up.replayed == {"late": 3}
    assert up.allowance.spent("ann") == 0
    await up.close()
    reopened = SettlementJournal(path)
    assert await reopened.oldest() == [], "confirmed rows are removed"
    await reopened.close()


async def test_replaying_a_settlement_twice_charges_it_once(tmp_path: Path) -> None:
    ledger = SqliteCreditStore(tmp_path / "credits.sqlite3")
    await ledger.top_up("ann", 10 * CREDIT)
    store = JournaledCreditStore(ledger, SettlementJournal(tmp_path / "journal.sqlite3"), OutageAllowance(CREDIT))
    await store.journal.append(settlement("r1", actual=2 * CREDIT))
    assert await store.replay_once() == 1
    # A crash between the store's answer and the row's removal: the row is replayed again.
    await store.journal.append(settlement("r1", actual=2 * CREDIT))
    assert await store.replay_once() == 1
    assert store.replayed == {"late": 1, "duplicate": 1}
    assert (await ledger.balance("ann")).available == 8 * CREDIT
    charges = [e async for e in ledger_entries(ledger, LedgerFilter(kind="charge"))]
    assert [e.request_id for e in charges] == ["r1"]
    assert store.journal.depth == 0
    await store.close()


async def test_replay_against_a_store_that_is_still_down_keeps_every_row(tmp_path: Path) -> None:
    store = JournaledCreditStore(dead_store(), SettlementJournal(tmp_path / "journal.sqlite3"), OutageAllowance(0))
    for i in range(5):
        await store.settle(f"r{i}", "ann", CREDIT, ChargeDetails())
    with pytest.raises(StoreUnavailable):
        await store.replay_once()
    assert await JournalReplayer(store).drain() == 0
    assert len(await store.journal.oldest()) == 5
    await store.close()


async def test_while_the_store_is_up_nothing_is_journaled_and_balances_are_learned(tmp_path: Path) -> None:
    ledger = SqliteCreditStore(tmp_path / "credits.sqlite3")
    store = JournaledCreditStore(ledger, SettlementJournal(tmp_path / "journal.sqlite3"), OutageAllowance(CREDIT))
    await store.top_up("ann", 10 * CREDIT)
    reservation = await store.reserve("r1", "ann", 3 * CREDIT, 60)
    assert isinstance(reservation, Reservation) and store.allowance.known("ann") == 7 * CREDIT
    done = await store.settle("r1", "ann", CREDIT, ChargeDetails())
    assert (done.outcome, done.available, store.allowance.known("ann")) == ("settled", 9 * CREDIT, 9 * CREDIT)
    assert store.journal.depth == 0 and store.journaled == 0
    await store.close()


async def test_a_hanging_store_costs_a_few_timeouts_then_the_breaker_sends_requests_around_it(tmp_path: Path) -> None:
    """A store that accepts connections and never answers (a black-hole TCP peer standing in for a hung Redis):
    after three timeouts the breaker opens and settlements go straight to the journal; the first replay that
    the store answers closes it again."""
    accepted: list[asyncio.StreamWriter] = []

    async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)

    black_hole = await asyncio.start_server(hang, "127.0.0.1", 0)
    port = black_hole.sockets[0].getsockname()[1]
    hung = RedisCreditStore.from_url(f"redis://127.0.0.1:{port}/0", timeout_s=0.3)
    store = JournaledCreditStore(hung, SettlementJournal(tmp_path / "journal.sqlite3"), OutageAllowance(CREDIT))
    waits = []
    for i in range(8):
        started = asyncio.get_running_loop().time()
        assert (await store.settle(f"r{i}", "ann", CREDIT, ChargeDetails())).outcome == JOURNALED
        waits.append(asyncio.get_running_loop().time() - started)
    assert all(wait >= 0.25 for wait in waits[:3]), waits
    assert all(wait < 0.1 for wait in waits[3:]), "the breaker answers at once while open"
    black_hole.close()

    ledger = SqliteCreditStore(tmp_path / "credits.sqlite3")
    await ledger.top_up("ann", 100 * CREDIT)
    store.store = ledger  # the store is back
    assert await store.replay_once() == 8
    reservation = await store.reserve("after", "ann", CREDIT, 60)
    assert isinstance(reservation, Reservation) and store.admitted == 0, "reserved in the store, not on allowance"
    await hung.close()
    await store.close()
