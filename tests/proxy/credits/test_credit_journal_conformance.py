"""The store the runtime hands the pipeline (a JournaledCreditStore around each backend) keeps the whole credit
store contract while its store is up: the conformance suite, run again through the wrapper."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from proxy.credits.journal import SettlementJournal
from proxy.credits.journaled_store import JournaledCreditStore
from proxy.credits.outage import OutageAllowance
from proxy.credits.store import CreditStore
from tests.proxy.credits.conftest import make_credit_store
from tests.proxy.credits.test_store_conformance import *  # noqa: F403  (the suite, collected again here)


@pytest.fixture
async def credit_store(backend: str, tmp_path: Path, redis_url: str) -> AsyncIterator[CreditStore]:
    store = JournaledCreditStore(make_credit_store(backend, tmp_path, redis_url),
                                 SettlementJournal(tmp_path / "credit-journal.sqlite3"), OutageAllowance(1_000_000))
    yield store
    assert store.journal.depth == 0, "nothing is journaled while the store is up"
    await store.close()
