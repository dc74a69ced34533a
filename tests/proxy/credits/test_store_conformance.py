"""What every credit store must do (run against SQLite and Redis): the definition of "a backend works"."""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import random

import pytest

from proxy.credits.store import (
    ANY_ENTRY,
    ChargeDetails,
    CreditStore,
    InsufficientCredit,
    LedgerEntry,
    LedgerFilter,
    RequestClosed,
    Reservation,
    export_ledger_csv,
    ledger_entries,
)

CREDIT = 1_000_000
T0 = 1_800_000_000.0


async def all_entries(store: CreditStore, where: LedgerFilter = ANY_ENTRY) -> list[LedgerEntry]:
    return [entry async for entry in ledger_entries(store, where, page_size=7)]


async def assert_books_balance(store: CreditStore, user: str) -> None:
    """Ledger sum equals the account's balance (accounts start at 0), each balance_after follows, none < 0."""
    account = await store.balance(user)
    assert account.available >= 0 and account.held >= 0
    entries = await all_entries(store, LedgerFilter(user=user))
    assert sum(entry.amount for entry in entries) == account.balance
    running = 0
    for entry in entries:
        running += entry.amount
        assert entry.balance_after == running
        assert entry.balance_after >= 0


def details(**fields: object) -> ChargeDetails:
    return ChargeDetails(**{"tenant": "acme", "model": "m", **fields})  # type: ignore[arg-type]


async def test_unknown_user_has_nothing_and_cannot_reserve(credit_store: CreditStore) -> None:
    account = await credit_store.balance("nobody")
    assert (account.available, account.held) == (0, 0)
    answer = await credit_store.reserve("r1", "nobody", 1, 60, now=T0)
    assert answer == InsufficientCredit("nobody", 0, 1)


async def test_top_up_adds_and_is_in_the_ledger(credit_store: CreditStore) -> None:
    assert await credit_store.top_up("ann", 5 * CREDIT, tenant="acme", note="welcome") == 5 * CREDIT
    assert await credit_store.top_up("ann", 2 * CREDIT) == 7 * CREDIT
    account = await credit_store.balance("ann")
    assert (account.tenant, account.available, account.held) == ("acme", 7 * CREDIT, 0)
    entries = await all_entries(credit_store)
    assert [(e.kind, e.amount, e.tenant) for e in entries] == [
        ("top_up", 5 * CREDIT, "acme"),
        ("top_up", 2 * CREDIT, "acme"),
    ]
    assert entries[0].note == "welcome"
    with pytest.raises(ValueError):
        await credit_store.top_up("ann", 0)


async def test_reserve_holds_and_settle_refunds_the_rest(credit_store: CreditStore) -> None:
    await credit_store.top_up("ann", 10 * CREDIT)
    held = await credit_store.reserve("r1", "ann", 4 * CREDIT, 60, now=T0)
    assert isinstance(held, Reservation)
    assert (held.amount, held.available_after, held.expires_at) == (4 * CREDIT, 6 * CREDIT, T0 + 60)
    account = await credit_store.balance("ann")
    assert (account.available, account.held) == (6 * CREDIT, 4 * CREDIT)

    done = await credit_store.settle(
        "r1",
        "ann",
        CREDIT,
        details(prompt_tokens=10, completion_tokens=5, cached_tokens=3, tier="l1"),
        now=T0 + 1,
    )
    assert (done.outcome, done.charged, done.available, done.shortfall) == ("settled", CREDIT, 9 * CREDIT, 0)
    account = await credit_store.balance("ann")
    assert (account.available, account.held) == (9 * CREDIT, 0)
    charge = (await all_entries(credit_store, LedgerFilter(kind="charge")))[0]
    assert (charge.request_id, charge.user, charge.tenant, charge.model, charge.tier) == (
        "r1",
        "ann",
        "acme",
        "m",
        "l1",
    )
    assert (charge.prompt_tokens, charge.completion_tokens, charge.cached_tokens) == (10, 5, 3)
    assert (charge.amount, charge.cost, charge.time) == (-CREDIT, CREDIT, T0 + 1)
    await assert_books_balance(credit_store, "ann")


async def test_insufficient_credit_names_balance_and_need(credit_store: CreditStore) -> None:
    await credit_store.top_up("ann", 3 * CREDIT)
    assert isinstance(await credit_store.reserve("r1", "ann", 2 * CREDIT, 60), Reservation)
    answer = await credit_store.reserve("r2", "ann", 2 * CREDIT, 60)
    assert answer == InsufficientCredit("ann", CREDIT, 2 * CREDIT)


async def test_settle_is_idempotent(credit_store: CreditStore) -> None:
    await credit_store.top_up("ann", 10 * CREDIT)
    await credit_store.reserve("r1", "ann", 4 * CREDIT, 60)
    first = await credit_store.settle("r1", "ann", 3 * CREDIT, details())
    again = await credit_store.settle("r1", "ann", 3 * CREDIT, details())
    assert (first.outcome, again.outcome, again.charged) == ("settled", "duplicate", 3 * CREDIT)
    assert (await credit_store.balance("ann")).available == 7 * CREDIT
    assert len(await all_entries(credit_store, LedgerFilter(kind="charge"))) == 1
    with pytest.raises(RequestClosed):
        await credit_store.reserve("r1", "ann", CREDIT, 60)
    await assert_books_balance(credit_store, "ann")


async def test_reserve_is_idempotent_while_open(credit_store: CreditStore) -> None:
    await credit_store.top_up("ann", 10 * CREDIT)
    await credit_store.reserve("r1", "ann", 4 * CREDIT, 60)
    again = await credit_store.reserve("r1", "ann", 4 * CREDIT, 60)
    assert isinstance(again, Reservation) and again.amount == 4 * CREDIT
    assert (await credit_store.balance("ann")).held == 4 * CREDIT


async def test_release_returns_everything_and_closes_the_id(credit_store: CreditStore) -> None:
    await credit_store.top_up("ann", 10 * CREDIT)
    await credit_store.reserve("r1", "ann", 4 * CREDIT, 60)
    assert await credit_store.release("r1", "ann") is True
    assert await credit_store.release("r1", "ann") is False
    account = await credit_store.balance("ann")
    assert (account.available, account.held) == (10 * CREDIT, 0)
    after = await credit_store.settle("r1", "ann", CREDIT, details())
    assert (after.outcome, after.charged) == ("duplicate", 0)
    assert (await credit_store.balance("ann")).available == 10 * CREDIT
    await assert_books_balance(credit_store, "ann")


async def test_cost_above_the_reservation_draws_on_the_balance_but_never_below_zero(
    credit_store: CreditStore,
) -> None:
    await credit_store.top_up("ann", 5 * CREDIT)
    await credit_store.reserve("r1", "ann", CREDIT, 60)
    over = await credit_store.settle("r1", "ann", 2 * CREDIT, details())
    assert (over.charged, over.available, over.shortfall) == (2 * CREDIT, 3 * CREDIT, 0)
    await credit_store.reserve("r2", "ann", CREDIT, 60)
    capped = await credit_store.settle("r2", "ann", 9 * CREDIT, details())
    assert (capped.charged, capped.available, capped.shortfall) == (3 * CREDIT, 0, 6 * CREDIT)
    entry = (await all_entries(credit_store, LedgerFilter(kind="charge")))[-1]
    assert (entry.amount, entry.shortfall) == (-3 * CREDIT, 6 * CREDIT)
    await assert_books_balance(credit_store, "ann")


async def test_expired_reservations_are_reaped_and_a_late_settle_charges_once(
    credit_store: CreditStore,
) -> None:
    await credit_store.top_up("ann", 10 * CREDIT)
    await credit_store.top_up("bob", 10 * CREDIT)
    await credit_store.reserve("old", "ann", 4 * CREDIT, 10, now=T0)
    await credit_store.reserve("new", "ann", 2 * CREDIT, 1000, now=T0)
    await credit_store.reserve("bobs", "bob", 3 * CREDIT, 5, now=T0)
    assert await credit_store.reap_expired(now=T0 + 4) == 0
    assert await credit_store.reap_expired(now=T0 + 11) == 2
    assert await credit_store.reap_expired(now=T0 + 12) == 0
    ann, bob = await credit_store.balance("ann"), await credit_store.balance("bob")
    assert (ann.available, ann.held, bob.available, bob.held) == (8 * CREDIT, 2 * CREDIT, 10 * CREDIT, 0)

    late = await credit_store.settle("old", "ann", CREDIT, details(), now=T0 + 20)
    assert (late.outcome, late.charged, late.available) == ("late", CREDIT, 7 * CREDIT)
    retried = await credit_store.settle("old", "ann", CREDIT, details(), now=T0 + 21)
    assert (retried.outcome, (await credit_store.balance("ann")).available) == ("duplicate", 7 * CREDIT)
    on_time = await credit_store.settle("new", "ann", CREDIT, details(), now=T0 + 22)
    assert (on_time.outcome, on_time.available) == ("settled", 8 * CREDIT)
    for user in ("ann", "bob"):
        await assert_books_balance(credit_store, user)


async def test_a_settle_without_a_reservation_is_charged_late_capped_at_the_balance_and_once(
    credit_store: CreditStore,
) -> None:
    """The path a settlement journaled during an outage takes when it is replayed (it was never reserved)."""
    await credit_store.top_up("ann", 3 * CREDIT)
    await credit_store.reserve("open", "ann", CREDIT, 1000, now=T0)
    late = await credit_store.settle("unreserved", "ann", CREDIT, details(tier="l1"), now=T0 + 5)
    assert (late.outcome, late.charged, late.available, late.shortfall) == ("late", CREDIT, CREDIT, 0)
    again = await credit_store.settle("unreserved", "ann", CREDIT, details(), now=T0 + 6)
    assert (again.outcome, again.charged, again.available) == ("duplicate", CREDIT, CREDIT)
    capped = await credit_store.settle("too-big", "ann", 5 * CREDIT, details(), now=T0 + 7)
    assert (capped.outcome, capped.charged, capped.available, capped.shortfall) == ("late", CREDIT, 0, 4 * CREDIT)
    broke = await credit_store.settle("nothing-left", "ann", CREDIT, details(), now=T0 + 8)
    assert (broke.outcome, broke.charged, broke.available, broke.shortfall) == ("late", 0, 0, CREDIT)
    account = await credit_store.balance("ann")
    assert (account.available, account.held) == (0, CREDIT), "the open hold is untouched"
    with pytest.raises(RequestClosed):
        await credit_store.reserve("unreserved", "ann", 0, 60, now=T0 + 9)
    charges = await all_entries(credit_store, LedgerFilter(user="ann", kind="charge"))
    assert [(e.request_id, e.amount, e.shortfall, e.time) for e in charges] == [
        ("unreserved", -CREDIT, 0, T0 + 5),
        ("too-big", -CREDIT, 4 * CREDIT, T0 + 7),
        ("nothing-left", 0, CREDIT, T0 + 8),
    ]
    assert charges[0].tier == "l1"
    await assert_books_balance(credit_store, "ann")


async def test_settle_for_an_account_that_does_not_exist(credit_store: CreditStore) -> None:
    done = await credit_store.settle("r1", "ghost", CREDIT, details())
    assert (done.outcome, done.charged) == ("no_account", 0)


async def test_user_ids_with_awkward_characters(credit_store: CreditStore) -> None:
    for user in ("a{b}c", "x:y z", "ünï/cøde", "{}"):
        await credit_store.top_up(user, CREDIT)
        assert isinstance(await credit_store.reserve(f"r-{user}", user, CREDIT, 60, now=T0), Reservation)
        assert await credit_store.reap_expired(now=T0 + 61) == 1
        assert (await credit_store.balance(user)).available == CREDIT


async def test_ledger_filters_and_pages(credit_store: CreditStore) -> None:
    for user, tenant in (("ann", "acme"), ("bob", "acme"), ("cy", "zeta")):
        await credit_store.top_up(user, 100 * CREDIT, tenant=tenant)
    for i in range(12):
        user = ("ann", "bob", "cy")[i % 3]
        await credit_store.reserve(f"r{i}", user, CREDIT, 60, now=T0 + i)
        await credit_store.settle(f"r{i}", user, 1000 + i, details(tenant=user + "-t", model=f"m{i % 2}"), now=T0 + i)
    everything = await all_entries(credit_store)
    assert len(everything) == 15
    assert [e.user for e in everything] == sorted(e.user for e in everything)  # grouped by user
    ids = [e.request_id for e in everything]
    assert len(set(ids)) == len(ids)
    assert {e.request_id for e in await all_entries(credit_store, LedgerFilter(user="bob", kind="charge"))} == {
        "r1",
        "r4",
        "r7",
        "r10",
    }
    assert len(await all_entries(credit_store, LedgerFilter(model="m1"))) == 6
    assert len(await all_entries(credit_store, LedgerFilter(tenant="cy-t"))) == 4
    window = await all_entries(credit_store, LedgerFilter(kind="charge", since=T0 + 3, until=T0 + 6))
    assert sorted(e.request_id for e in window) == ["r3", "r4", "r5"]
    page = await credit_store.ledger(LedgerFilter(), None, 4)
    assert len(page.entries) == 4 and page.next_cursor is not None


async def test_csv_export(credit_store: CreditStore) -> None:
    await credit_store.top_up("ann", 2 * CREDIT)
    await credit_store.reserve("r1", "ann", CREDIT, 60)
    await credit_store.settle("r1", "ann", 1250, details(prompt_tokens=7))
    text = "".join([piece async for piece in export_ledger_csv(credit_store)])
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [(r["kind"], r["amount"], r["balance_after"]) for r in rows] == [
        ("top_up", "2", "2"),
        ("charge", "-0.00125", "1.99875"),
    ]
    assert rows[1]["prompt_tokens"] == "7" and rows[1]["request_id"] == "r1"


async def test_500_concurrent_reservations_when_the_balance_covers_100(credit_store: CreditStore) -> None:
    await credit_store.top_up("ann", 100 * CREDIT)

    async def one(i: int) -> bool:
        held = await credit_store.reserve(f"r{i}", "ann", CREDIT, 60)
        if isinstance(held, InsufficientCredit):
            return False
        assert (await credit_store.balance("ann")).available >= 0
        await credit_store.settle(f"r{i}", "ann", CREDIT, details())
        return True

    results = await asyncio.gather(*(one(i) for i in range(500)))
    assert sum(results) == 100
    account = await credit_store.balance("ann")
    assert (account.available, account.held) == (0, 0)
    await assert_books_balance(credit_store, "ann")


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_random_operations_keep_the_books_balanced(credit_store: CreditStore, seed: int) -> None:
    rng = random.Random(seed)
    users = ["ann", "bob"]
    now = T0
    for step in range(150):
        now += rng.random() * 5
        user = rng.choice(users)
        rid = f"r{rng.randrange(40)}"
        action = rng.choice(["top_up", "reserve", "reserve", "settle", "settle", "release", "reap"])
        if action == "top_up":
            await credit_store.top_up(user, rng.randrange(1, 5 * CREDIT))
        elif action == "reserve":
            with contextlib.suppress(RequestClosed):
                await credit_store.reserve(rid, user, rng.randrange(0, 3 * CREDIT), rng.choice([1, 30]), now=now)
        elif action == "settle":
            await credit_store.settle(rid, user, rng.randrange(0, 4 * CREDIT), details(), now=now)
        elif action == "release":
            await credit_store.release(rid, user)
        else:
            await credit_store.reap_expired(now=now)
        if step % 10 == 0:
            for someone in users:
                await assert_books_balance(credit_store, someone)
    charged = [e.request_id for e in await all_entries(credit_store, LedgerFilter(kind="charge")) if e.user == "ann"]
    assert len(charged) == len(set(charged))  # no request charged twice
