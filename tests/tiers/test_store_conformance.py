"""The definition of "a backend works": one suite, parameterized over every ``KeyValueStore`` backend.

Adding a backend = adding a factory to ``BACKENDS``. A factory returns the store and an ``advance(seconds)``
coroutine that moves the backend's time forward (an injected clock where the backend takes one, real sleep for
Redis, whose expiry runs on the server's clock).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tiers.cold import ColdStore
from tiers.invalidation_bus import InvalidationBus
from tiers.memory import MemoryStore
from tiers.near_cache import NearCachedStore
from tiers.policies.lru import LRUPolicy
from tiers.redis_store import RedisStore
from tiers.storage import KeyValueStore, StoreStats


class FakeClock:
    """An injectable clock that moves only when told to."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


@dataclass
class Backend:
    store: KeyValueStore
    advance: Callable[[float], Awaitable[None]]
    exact_bytes: bool
    close: Callable[[], Awaitable[None]] | None = None
    """What else the backend runs (an invalidation bus), closed after the store."""


def _clock_advancer(clock: FakeClock) -> Callable[[float], Awaitable[None]]:
    async def advance(seconds: float) -> None:
        clock.now += seconds

    return advance


async def _memory(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    clock = FakeClock()
    store = MemoryStore(LRUPolicy(1 << 30), max_entries=None, clock=clock)
    return Backend(store, _clock_advancer(clock), exact_bytes=True)


async def _redis(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    url = request.getfixturevalue("redis_url")
    return Backend(RedisStore(url, prefix="conformance"), asyncio.sleep, exact_bytes=True)


async def _cold(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    clock = FakeClock()
    store = await ColdStore(tmp_path / "cold", clock=clock).opened()
    return Backend(store, _clock_advancer(clock), exact_bytes=False)


async def _near(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """Shared mode's L1: near copies in memory in front of Redis, kept coherent by the invalidation bus."""
    url = request.getfixturevalue("redis_url")
    bus = InvalidationBus(url, prefix="conformance")
    assert await bus.start(), "the invalidation bus did not come up"
    shared = RedisStore(url, prefix="conformance:l1", keep_evicted_s=31.0)
    store = NearCachedStore(MemoryStore(LRUPolicy(1 << 30), max_entries=None), shared, bus, near_ttl_s=30.0)
    return Backend(store, asyncio.sleep, exact_bytes=True, close=bus.stop)


BACKENDS: dict[str, Callable[[pytest.FixtureRequest, Path], Awaitable[Backend]]] = {
    "memory": _memory,
    "redis": _redis,
    "cold": _cold,
    "near+redis": _near,
}


@pytest.fixture(params=sorted(BACKENDS))
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    made = await BACKENDS[request.param](request, tmp_path)
    yield made
    await made.store.close()
    if made.close is not None:
        await made.close()


async def test_is_a_key_value_store(backend: Backend) -> None:
    assert isinstance(backend.store, KeyValueStore)
    assert backend.store.name


async def test_missing_key_is_none(backend: Backend) -> None:
    assert await backend.store.get("absent") is None
    assert await backend.store.delete("absent") is False


@pytest.mark.parametrize(
    "value",
    [b"", b"x", bytes(range(256)), b"\x00" * 1000, random.Random(7).randbytes(2 * 1024 * 1024)],
    ids=["empty", "one", "all-bytes", "zeros", "2MiB-random"],
)
async def test_binary_values_round_trip(backend: Backend, value: bytes) -> None:
    assert await backend.store.put("k", value) is True
    assert await backend.store.get("k") == value


@pytest.mark.parametrize("key", ["", "{braces}", "a}b{c", "ключ", "tenant:acme/ns:docs/" + "x" * 500])
async def test_unusual_keys(backend: Backend, key: str) -> None:
    await backend.store.put(key, b"v", tags=["t"])
    assert await backend.store.get(key) == b"v"
    assert await backend.store.keys_with_tag("t") == [key]
    assert await backend.store.delete(key) is True
    assert await backend.store.get(key) is None


async def test_overwrite_replaces_value_and_tags(backend: Backend) -> None:
    store = backend.store
    await store.put("k", b"first", tags=["old", "both"])
    await store.put("k", b"second", tags=["new", "both"])
    assert await store.get("k") == b"second"
    assert await store.keys_with_tag("old") == []
    assert await store.keys_with_tag("new") == ["k"]
    assert await store.keys_with_tag("both") == ["k"]
    assert (await store.stats()).entries == 1


async def test_delete(backend: Backend) -> None:
    store = backend.store
    await store.put("a", b"1", tags=["t"])
    await store.put("b", b"2", tags=["t"])
    assert await store.delete("a") is True
    assert await store.delete("a") is False
    assert await store.get("a") is None
    assert await store.get("b") == b"2"
    assert await store.keys_with_tag("t") == ["b"]


async def test_ttl_expiry(backend: Backend) -> None:
    store = backend.store
    await store.put("short", b"s", ttl=0.2, tags=["t"])
    await store.put("long", b"l", ttl=60, tags=["t"])
    await store.put("forever", b"f", tags=["t"])
    assert await store.get("short") == b"s"
    await backend.advance(0.35)
    assert await store.get("short") is None
    assert await store.get("long") == b"l"
    assert await store.get("forever") == b"f"
    assert sorted(await store.keys_with_tag("t")) == ["forever", "long"]
    assert (await store.stats()).entries == 2
    assert await store.delete("short") is False


async def test_overwrite_resets_ttl(backend: Backend) -> None:
    store = backend.store
    await store.put("k", b"1", ttl=0.2)
    await store.put("k", b"2")
    await backend.advance(0.35)
    assert await store.get("k") == b"2"


async def test_non_positive_ttl_is_rejected(backend: Backend) -> None:
    for ttl in (0, -1.0):
        with pytest.raises(ValueError):
            await backend.store.put("k", b"v", ttl=ttl)


async def test_tags_and_delete_tag(backend: Backend) -> None:
    store = backend.store
    await store.put("a", b"1", tags=["tenant:x", "doc:1"])
    await store.put("b", b"2", tags=["tenant:x", "doc:2"])
    await store.put("c", b"3", tags=["tenant:y", "doc:1"])
    assert sorted(await store.keys_with_tag("tenant:x")) == ["a", "b"]
    assert sorted(await store.keys_with_tag("doc:1")) == ["a", "c"]
    assert await store.keys_with_tag("unknown") == []
    assert await store.delete_tag("doc:1") == 2
    assert await store.get("a") is None and await store.get("c") is None
    assert await store.get("b") == b"2"
    assert await store.keys_with_tag("tenant:x") == ["b"]
    assert await store.keys_with_tag("tenant:y") == []
    assert await store.delete_tag("doc:1") == 0


async def test_clear_and_stats(backend: Backend) -> None:
    store = backend.store
    assert await store.stats() == StoreStats(entries=0, bytes=0)
    values = {f"k{i}": bytes([i]) * (i * 10 + 1) for i in range(20)}
    for key, value in values.items():
        await store.put(key, value, tags=["all"])
    stats = await store.stats()
    assert stats.entries == 20
    if backend.exact_bytes:
        assert stats.bytes == sum(len(v) for v in values.values())
    else:
        assert stats.bytes > 0
    await store.delete("k0")
    assert (await store.stats()).entries == 19
    assert await store.clear() == 19
    assert await store.stats() == StoreStats(entries=0, bytes=0)
    assert await store.keys_with_tag("all") == []
    assert await store.get("k5") is None


async def test_concurrent_puts_and_gets(backend: Backend) -> None:
    store = backend.store
    keys = [f"key-{i}" for i in range(200)]
    assert all(await asyncio.gather(*(store.put(k, k.encode() * 3, tags=["c"]) for k in keys)))
    found = await asyncio.gather(*(store.get(k) for k in keys))
    assert found == [k.encode() * 3 for k in keys]

    async def writer(i: int) -> None:
        await store.put("hot", f"v{i}".encode())

    async def reader() -> bytes | None:
        return await store.get("hot")

    results = await asyncio.gather(*(writer(i) for i in range(50)), *(reader() for _ in range(50)))
    reads = [r for r in results if r is not None]
    assert all(isinstance(r, bytes) and r.startswith(b"v") for r in reads)
    assert (await store.get("hot") or b"").startswith(b"v")
    assert len(await store.keys_with_tag("c")) == 200


async def test_random_operations_match_a_dict_model(backend: Backend) -> None:
    """A seeded random mix of operations gives the same answers as a plain dict."""
    store = backend.store
    rng = random.Random(2024)
    model: dict[str, tuple[bytes, frozenset[str]]] = {}
    keys = [f"k{i}" for i in range(12)]
    tags = ["t0", "t1", "t2"]
    for _ in range(150):
        op = rng.random()
        key = rng.choice(keys)
        if op < 0.45:
            value = rng.randbytes(rng.randrange(0, 64))
            entry_tags = frozenset(rng.sample(tags, rng.randrange(0, 3)))
            await store.put(key, value, tags=entry_tags)
            model[key] = (value, entry_tags)
        elif op < 0.75:
            expected = model.get(key)
            assert await store.get(key) == (None if expected is None else expected[0])
        elif op < 0.9:
            assert await store.delete(key) == (key in model)
            model.pop(key, None)
        else:
            tag = rng.choice(tags)
            doomed = {k for k, (_, t) in model.items() if tag in t}
            assert await store.delete_tag(tag) == len(doomed)
            for k in doomed:
                del model[k]
    for tag in tags:
        assert sorted(await store.keys_with_tag(tag)) == sorted(k for k, (_, t) in model.items() if tag in t)
    assert (await store.stats()).entries == len(model)
