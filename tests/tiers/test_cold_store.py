"""Cold store beyond the shared contract: crash safety with a killed writer, restart, corruption, eviction by
bytes, dictionaries, vectors, warm-up and off-loop I/O."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from tiers.cold import ColdStore
from tiers.cold.database import FILENAME, SAMPLE_BYTES, ColdDatabase, checksum
from tiers.policies.base import Decision
from tiers.policies.lru import LRUPolicy

ROOT = Path(__file__).resolve().parents[2]

WRITER = """
import asyncio, hashlib, sys
from tiers.cold import ColdStore

def value_of(key):
    seed = hashlib.sha256(key.encode()).digest()
    return seed * (1 + seed[0] * 16)   # 32 B .. 130 KB

async def main(directory):
    store = await ColdStore(directory, train_after=50).opened()
    i = 0
    while True:
        key = f"{sys.argv[2]}-{i}"
        await store.put(key, value_of(key), tags=[f"round:{sys.argv[2]}"], vector=[float(i % 7), 1.0, 2.0])
        print(key, flush=True)
        i += 1

asyncio.run(main(sys.argv[1]))
"""


def value_of(key: str) -> bytes:
    seed = hashlib.sha256(key.encode()).digest()
    return seed * (1 + seed[0] * 16)


def run_and_kill_writer(directory: Path, round_name: str, acknowledged: int) -> list[str]:
    """Start a writer, SIGKILL it once it has acknowledged ``acknowledged`` puts; the acknowledged keys."""
    process = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(directory), round_name],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    keys: list[str] = []
    try:
        for line in process.stdout:
            keys.append(line.strip())
            if len(keys) >= acknowledged:
                break
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == -signal.SIGKILL
    return keys


async def test_killed_writer_never_corrupts_the_store(tmp_path: Path) -> None:
    directory = tmp_path / "cold"
    acknowledged: list[str] = []
    for round_name in ("r0", "r1", "r2"):
        acknowledged += run_and_kill_writer(directory, round_name, acknowledged=120)
        with sqlite3.connect(directory / FILENAME) as raw:
            assert raw.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    store = await ColdStore(directory).opened()
    try:
        for key in acknowledged:
            assert await store.get(key) == value_of(key), key
        assert store.counters.corrupt == 0
        assert len(await store.keys_with_tag("round:r1")) >= 120
        assert len(await store.vectors()) >= len(acknowledged)
    finally:
        await store.close()


async def test_restart_serves_entries_tags_ttls_and_dictionary(tmp_path: Path) -> None:
    now = [1_000_000.0]
    store = await ColdStore(tmp_path, clock=lambda: now[0], train_after=20).opened()
    values = {f"k{i}": b'{"object":"chat.completion","content":"answer number %d"}' % i for i in range(40)}
    for key, value in values.items():
        await store.put(key, value, tags=["tenant:a"], ttl=100 if key == "k0" else None)
    await asyncio.sleep(0)
    for _ in range(100):  # the first dictionary trains in the background
        if 1 in store._db.compressor.dictionary_ids:
            break
        await asyncio.sleep(0.05)
    await store.put("after-dictionary", values["k1"])
    await store.close()

    now[0] += 50
    reopened = await ColdStore(tmp_path, clock=lambda: now[0]).opened()
    try:
        for key, value in values.items():
            assert await reopened.get(key) == value
        assert await reopened.get("after-dictionary") == values["k1"]
        assert len(await reopened.keys_with_tag("tenant:a")) == 40
        now[0] += 100
        assert await reopened.get("k0") is None
        assert (await reopened.stats()).entries == 40
    finally:
        await reopened.close()


async def test_old_entries_stay_readable_after_retraining(tmp_path: Path) -> None:
    store = await ColdStore(tmp_path, train_after=10**9).opened()
    try:
        first = {f"a{i}": b'{"model":"m","content":"first generation %d"}' % i for i in range(30)}
        for key, value in first.items():
            await store.put(key, value)
        first_id = await store.retrain_dictionary()
        await store.put("b", b'{"model":"m","content":"second generation"}')
        second_id = await store.retrain_dictionary()
        assert second_id > first_id
        await store.put("c", b'{"model":"m","content":"third generation"}')
        for key, value in first.items():
            assert await store.get(key) == value
        assert await store.get("b") == b'{"model":"m","content":"second generation"}'
    finally:
        await store.close()
    reopened = await ColdStore(tmp_path).opened()
    try:
        assert await reopened.get("c") == b'{"model":"m","content":"third generation"}'
        assert await reopened.get("a3") == first["a3"]
    finally:
        await reopened.close()


@pytest.mark.parametrize(
    "damage",
    [
        "UPDATE entries SET blob = substr(blob, 1, length(blob) / 2) WHERE key = 'victim'",
        "UPDATE entries SET blob = randomblob(length(blob)) WHERE key = 'victim'",
        "UPDATE entries SET crc = crc + 1 WHERE key = 'victim'",
        "UPDATE entries SET blob = X'01FF' WHERE key = 'victim'",
    ],
    ids=["truncated", "bit-rot", "bad-checksum", "bad-header"],
)
async def test_corrupt_entry_is_a_counted_miss_and_deleted(tmp_path: Path, damage: str) -> None:
    store = await ColdStore(tmp_path).opened()
    await store.put("victim", b"precious " * 100, tags=["t"])
    await store.put("bystander", b"fine " * 100, tags=["t"])
    await store.close()
    with sqlite3.connect(tmp_path / FILENAME) as raw:
        raw.execute(damage)
    reopened = await ColdStore(tmp_path).opened()
    try:
        assert await reopened.get("victim") is None
        assert reopened.counters.corrupt == 1
        assert await reopened.keys_with_tag("t") == ["bystander"]
        assert await reopened.get("bystander") == b"fine " * 100
        assert (await reopened.stats()).entries == 1
    finally:
        await reopened.close()


async def test_a_file_that_is_no_database_is_set_aside(tmp_path: Path) -> None:
    (tmp_path / FILENAME).write_bytes(b"this is not sqlite" * 100)
    store = await ColdStore(tmp_path).opened()
    try:
        assert store.counters.reset_files == 1
        await store.put("k", b"v")
        assert await store.get("k") == b"v"
        assert any(name.startswith(FILENAME + ".corrupt-") for name in os.listdir(tmp_path))
    finally:
        await store.close()


async def test_bounded_by_bytes_with_lru_eviction(tmp_path: Path) -> None:
    store = await ColdStore(tmp_path, policy=LRUPolicy(capacity=3000), compression_level=0).opened()
    try:
        noise = [np.random.default_rng(i).bytes(900) for i in range(4)]  # incompressible: ~900 B stored each
        for i in range(3):
            await store.put(f"k{i}", noise[i])
        assert await store.get("k0") == noise[0]  # k1 is now least recently used
        await store.put("k3", noise[3])
        assert await store.get("k1") is None
        assert await store.get("k0") == noise[0]
        assert store.counters.evicted == 1
        assert (await store.stats()).bytes <= 3000
    finally:
        await store.close()
    smaller = await ColdStore(tmp_path, policy=LRUPolicy(capacity=1000), compression_level=0).opened()
    try:
        assert (await smaller.stats()).entries == 1  # a reopen under a smaller bound evicts down to it
    finally:
        await smaller.close()


async def test_declined_entry_is_not_stored(tmp_path: Path) -> None:
    store = await ColdStore(tmp_path, policy=LRUPolicy(capacity=100), compression_level=0).opened()
    try:
        assert await store.put("big", np.random.default_rng(0).bytes(500)) is False
        assert await store.get("big") is None
        assert store.counters.rejected == 1
    finally:
        await store.close()


async def test_nearest_searches_vectors_within_a_tag(tmp_path: Path) -> None:
    store = await ColdStore(tmp_path).opened()
    try:
        await store.put("cats", b"1", tags=["tenant:a"], vector=[1.0, 0.0, 0.0])
        await store.put("dogs", b"2", tags=["tenant:a"], vector=[0.8, 0.6, 0.0])
        await store.put("other-tenant-cats", b"3", tags=["tenant:b"], vector=[1.0, 0.0, 0.0])
        await store.put("no-vector", b"4", tags=["tenant:a"])
        found = await store.nearest([0.99, 0.05, 0.0], k=2, tag="tenant:a")
        assert [key for key, _ in found] == ["cats", "dogs"]
        assert found[0][1] == pytest.approx(0.9987, abs=1e-2)
        assert {k for k, _ in await store.nearest([1.0, 0.0, 0.0], k=5)} == {
            "cats",
            "dogs",
            "other-tenant-cats",
        }
        await store.delete("cats")
        assert [k for k, _ in await store.nearest([1.0, 0.0, 0.0], k=1, tag="tenant:a")] == ["dogs"]
        stored = dict(await store.vectors())
        assert np.frombuffer(stored["dogs"], dtype="<f2").tolist() == pytest.approx([0.8, 0.6, 0.0], abs=1e-3)
    finally:
        await store.close()


async def test_hottest_returns_most_read_entries_with_metadata(tmp_path: Path) -> None:
    store = await ColdStore(tmp_path).opened()
    try:
        for i in range(5):
            await store.put(f"k{i}", f"v{i}".encode(), tags=[f"n:{i}"], ttl=300, vector=[1.0, float(i)])
        for key, reads in (("k3", 5), ("k1", 3), ("k4", 1)):
            for _ in range(reads):
                await store.get(key)
        hot = await store.hottest(2)
        assert [e.key for e in hot] == ["k3", "k1"]
        assert hot[0].value == b"v3" and hot[0].tags == frozenset({"n:3"}) and hot[0].hits == 5
        assert hot[0].ttl is not None and 0 < hot[0].ttl <= 300
        assert hot[0].vector is not None
    finally:
        await store.close()


class ThreadRecordingPolicy(LRUPolicy):
    """LRU that records which thread consulted it (a test double around the real policy)."""

    threads: set[str]

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.threads = set()

    def insert(self, key: str, size: int, cost: float) -> Decision:
        self.threads.add(threading.current_thread().name)
        return super().insert(key, size, cost)

    def hit(self, key: str) -> None:
        self.threads.add(threading.current_thread().name)
        super().hit(key)


async def test_disk_work_runs_off_the_event_loop(tmp_path: Path) -> None:
    policy = ThreadRecordingPolicy(1 << 20)
    store = await ColdStore(tmp_path, policy=policy).opened()
    try:
        await store.put("k", b"v")
        assert await store.get("k") == b"v"
        assert policy.threads and all(name.startswith("ragproxy-cold") for name in policy.threads)
        assert threading.current_thread().name not in policy.threads
    finally:
        await store.close()


async def test_get_entry_carries_what_promotion_needs(tmp_path: Path) -> None:
    now = [5_000.0]
    store = await ColdStore(tmp_path, clock=lambda: now[0]).opened()
    try:
        await store.put("k", b"v", tags=["tenant:a", "ns:x"], ttl=60, cost=3.5, vector=[0.0, 2.0])
        now[0] += 10
        await store.get("k")
        entry = await store.get_entry("k")
        assert entry is not None
        assert (entry.value, entry.tags, entry.ttl, entry.cost, entry.hits) == (
            b"v",
            frozenset({"tenant:a", "ns:x"}),
            50.0,
            3.5,
            2,
        )
        assert entry.vector is not None and np.frombuffer(entry.vector, dtype="<f2").tolist() == [0.0, 1.0]
        assert await store.get_entry("absent") is None
    finally:
        await store.close()


class InsertCountingPolicy(LRUPolicy):
    """LRU that notes how many entries it knew when the first read hit (a test double around the real policy)."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.inserted = 0
        self.known_at_first_hit: int | None = None

    def insert(self, key: str, size: int, cost: float) -> Decision:
        self.inserted += 1
        return super().insert(key, size, cost)

    def hit(self, key: str) -> None:
        if self.known_at_first_hit is None:
            self.known_at_first_hit = self.inserted
        super().hit(key)


async def test_restart_serves_reads_while_the_policy_is_still_rebuilt(tmp_path: Path) -> None:
    store = await ColdStore(tmp_path).opened()
    await store.close()
    count = 12_000
    with sqlite3.connect(tmp_path / FILENAME) as raw:  # a big store, written fast
        raw.executemany(
            "INSERT INTO entries(key, blob, crc, expires_at, cost, stored_at, accessed_at, hits, vector)"
            " VALUES (?, ?, ?, NULL, 1.0, ?, ?, 0, NULL)",
            ((f"k{i}", b"\x00v", checksum(f"k{i}", b"\x00v", None), i, i) for i in range(count)),
        )
    policy = InsertCountingPolicy(1 << 30)
    reopened = await ColdStore(tmp_path, policy=policy).opened()
    try:
        assert await reopened.get("k11999") == b"v"
        assert policy.known_at_first_hit is not None and policy.known_at_first_hit < count
        await reopened.put("new", b"n")  # waits for the rebuild
        assert policy.inserted == count + 1
        assert (await reopened.stats()).entries == count + 1
    finally:
        await reopened.close()


async def test_writes_sweep_expired_entries_nobody_reads(tmp_path: Path) -> None:
    now = [1_000.0]
    store = await ColdStore(tmp_path, clock=lambda: now[0]).opened()
    try:
        for i in range(70):
            await store.put(f"old{i}", b"x" * 100, ttl=5, tags=["t"])
        now[0] += 10
        for i in range(64):  # one sweep runs every 64 writes
            await store.put(f"new{i}", b"y")
        assert store.counters.expired == 64
        assert store.counters.misses == 0  # nothing was read
        assert (await store.stats()).entries == 64  # stats sweeps the rest
        assert store.counters.expired == 70
        assert await store.keys_with_tag("t") == []
    finally:
        await store.close()


def test_dictionary_samples_keep_only_each_values_head(tmp_path: Path) -> None:
    """Until the first dictionary is trained, answers are sampled: large ones must not be held whole."""
    db = ColdDatabase(tmp_path, LRUPolicy(10**9), train_after=20)
    try:
        for i in range(20):
            db.put(f"k{i}", b"x" * (1024 * 1024), tags=(), ttl=None, cost=1.0)
        samples = db.take_training_samples()
        assert samples is not None and len(samples) == 20
        assert all(len(sample) == SAMPLE_BYTES for sample in samples)
    finally:
        db.close()
