"""The cold tier's synchronous core: one SQLite file in WAL mode holding lz4 blobs, tags, vectors,
dictionaries.

Everything here runs on one thread (``tiers.cold.store.ColdStore`` owns that thread); nothing is shared, so
there are no locks.

Layout (``<directory>/cold.sqlite3``)::

    entries(id INTEGER PRIMARY KEY, key TEXT UNIQUE, blob BLOB, crc INTEGER, expires_at REAL NULL, cost REAL,
            stored_at REAL, accessed_at REAL, hits INTEGER, vector BLOB NULL)
    indexes entries_by_expiry(expires_at), entries_by_access(accessed_at, id)
    tags(tag TEXT, key TEXT, PRIMARY KEY (tag, key)) WITHOUT ROWID, index tags_by_key(key)
    dictionaries(id INTEGER PRIMARY KEY, data BLOB, crc INTEGER)      -- every lz4 dictionary ever used

- ``blob`` is :mod:`tiers.compression`'s format (header names the dictionary). ``vector`` is float16 bytes.
- ``crc`` = CRC-32 of ``key, blob, vector``. A row whose CRC, header or lz4 payload does not check out is a
  miss, is deleted and counted (``counters.corrupt``).
- Times are wall-clock seconds (the store's ``clock``) so TTLs survive restarts.
- Durability: one transaction per write, ``journal_mode=WAL`` + ``synchronous=NORMAL``: a killed process never
  leaves a torn store (SQLite replays or discards the WAL tail on the next open) and loses nothing it
  committed; only an OS crash or power loss can drop the last transactions, which a cache may lose.
- Reads record hits in memory and write them (``hits``, ``accessed_at``) with the next write transaction or
  at most every ``hit_flush_interval`` seconds (a read writes at most once per interval); LRU order and
  ``hottest`` survive restarts approximately (hits of the last interval before a crash are lost).
- The byte bound applies to ``len(blob) + len(vector)`` (what the disk holds); the policy (LRU by default) is
  rebuilt from ``accessed_at`` order after open in steps (``rebuild_step``) between which reads are served.
"""

from __future__ import annotations

import sqlite3
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tiers.cold.vectors import VectorIndex
from tiers.compression import Compressor, CorruptBlob
from tiers.policies.base import EvictionPolicy
from tiers.storage import StoreStats, check_ttl

FILENAME = "cold.sqlite3"
SAMPLE_BYTES = 16 * 1024
"""The head of each value kept as a sample for the first compression dictionary: ``train_after`` samples hold at
most this much each (16 MB at the default 1,000, where whole answers could hold 4 GB), and a dictionary learns the
structure answers share, which their heads carry."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries(
    id INTEGER PRIMARY KEY,
    key TEXT NOT NULL UNIQUE,
    blob BLOB NOT NULL,
    crc INTEGER NOT NULL,
    expires_at REAL,
    cost REAL NOT NULL,
    stored_at REAL NOT NULL,
    accessed_at REAL NOT NULL,
    hits INTEGER NOT NULL DEFAULT 0,
    vector BLOB
);
CREATE INDEX IF NOT EXISTS entries_by_expiry ON entries(expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS entries_by_access ON entries(accessed_at, id);
CREATE TABLE IF NOT EXISTS tags(tag TEXT NOT NULL, key TEXT NOT NULL, PRIMARY KEY (tag, key)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS tags_by_key ON tags(key);
CREATE TABLE IF NOT EXISTS dictionaries(id INTEGER PRIMARY KEY, data BLOB NOT NULL, crc INTEGER NOT NULL);
"""


def checksum(key: str, blob: bytes, vector: bytes | None) -> int:
    crc = zlib.crc32(key.encode())
    crc = zlib.crc32(b"\x00" + blob, crc)
    return zlib.crc32(b"\x00" + (vector or b""), crc)


@dataclass
class ColdCounters:
    """Event counts since open."""

    hits: int = 0
    misses: int = 0
    puts: int = 0
    rejected: int = 0
    evicted: int = 0
    expired: int = 0
    corrupt: int = 0
    reset_files: int = 0


@dataclass(frozen=True, slots=True)
class ColdEntry:
    """One live entry with everything needed to warm an upper tier from it."""

    key: str
    value: bytes
    tags: frozenset[str]
    ttl: float | None
    cost: float
    hits: int
    vector: bytes | None


class ColdDatabase:
    """Synchronous cold store; call from one thread only."""

    def __init__(
        self,
        directory: Path | str,
        policy: EvictionPolicy,
        *,
        clock: Callable[[], float] = time.time,
        compression_level: int = 9,
        train_after: int = 1000,
        sweep_every: int = 64,
        hit_flush_interval: float = 5.0,
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / FILENAME
        self.policy = policy
        self.counters = ColdCounters()
        self.compressor = Compressor(level=compression_level)
        self.train_after = train_after
        self._clock = clock
        self._sweep_every = sweep_every
        self._hit_flush_interval = hit_flush_interval
        self._puts_since_sweep = 0
        self._pending_hits: dict[str, tuple[int, float]] = {}
        self._last_hit_flush = clock()
        self._samples: list[bytes] = []
        self._vectors: VectorIndex | None = None
        self._entries = 0
        self._bytes = 0
        self._rebuild_cursor: tuple[float, int] | None = (float("-inf"), -1)
        self.db = self._connect()
        self._load()

    # -- opening ---------------------------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        try:
            db = self._open_file()
        except sqlite3.DatabaseError:
            # Not a database any more (overwritten, truncated header): keep it aside, start empty.
            stamp = int(time.time())
            for suffix in ("", "-wal", "-shm"):
                damaged = self.path.with_name(self.path.name + suffix)
                if damaged.exists():
                    damaged.rename(damaged.with_name(f"{damaged.name}.corrupt-{stamp}"))
            self.counters.reset_files += 1
            db = self._open_file()
        return db

    def _open_file(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.executescript(_SCHEMA)
            db.execute("SELECT count(*) FROM entries").fetchone()
        except sqlite3.DatabaseError:
            db.close()
            raise
        return db

    def _load(self) -> None:
        for dict_id, data, crc in self.db.execute("SELECT id, data, crc FROM dictionaries ORDER BY id"):
            if zlib.crc32(data) == crc:
                self.compressor.add_dictionary(dict_id, data)
        entries, size = self.db.execute(
            "SELECT count(*), coalesce(sum(length(blob) + coalesce(length(vector), 0)), 0) FROM entries"
        ).fetchone()
        self._entries, self._bytes = int(entries), int(size)

    @property
    def rebuilding(self) -> bool:
        """Whether the policy still learns the resident entries (reads work; writes should wait)."""
        return self._rebuild_cursor is not None

    def rebuild_step(self, limit: int = 5000) -> bool:
        """Teach the policy the next ``limit`` resident entries in access order; ``True`` once all are known.

        Steps are separate jobs on the store's thread so that reads interleave with a long rebuild: a restart
        serves from the first millisecond, whatever the store's size.
        """
        if self._rebuild_cursor is None:
            return True
        rows = self.db.execute(
            "SELECT key, length(blob) + coalesce(length(vector), 0), cost, accessed_at, id FROM entries"
            " WHERE (accessed_at, id) > (?, ?) ORDER BY accessed_at, id LIMIT ?",
            (*self._rebuild_cursor, limit),
        ).fetchall()
        overflow: list[str] = []
        for key, size, cost, _, _ in rows:
            decision = self.policy.insert(key, size, cost)
            overflow.extend(decision.evicted)
            if not decision.admitted:
                overflow.append(key)
        if overflow:
            with self._transaction():
                for key in overflow:
                    if self._delete_row(key):
                        self.counters.evicted += 1
        if len(rows) < limit:
            self._rebuild_cursor = None
            return True
        self._rebuild_cursor = (float(rows[-1][3]), int(rows[-1][4]))
        return False

    def rebuild_policy(self) -> None:
        """All rebuild steps at once (for synchronous users)."""
        while not self.rebuild_step():
            pass

    # -- reads -----------------------------------------------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        entry = self.get_entry(key, with_tags=False)
        return None if entry is None else entry.value

    def get_entry(self, key: str, *, with_tags: bool = True) -> ColdEntry | None:
        """The live entry with its tags, remaining TTL and vector (what promotion into L1/L2 needs)."""
        row = self.db.execute(
            "SELECT blob, crc, expires_at, vector, cost, hits FROM entries WHERE key = ?", (key,)
        ).fetchone()
        if row is None:
            self.counters.misses += 1
            return None
        blob, crc, expires_at, vector, cost, hits = row
        now = self._clock()
        if expires_at is not None and expires_at <= now:
            self._drop(key, expired=True)
            self.counters.misses += 1
            return None
        value = self._decode(key, blob, crc, vector)
        if value is None:
            self.counters.misses += 1
            return None
        self.counters.hits += 1
        self.policy.hit(key)
        count, _ = self._pending_hits.get(key, (0, now))
        self._pending_hits[key] = (count + 1, now)
        if now - self._last_hit_flush >= self._hit_flush_interval:
            with self._transaction():
                pass
        tags = frozenset(self._tags_of(key)) if with_tags else frozenset()
        ttl = None if expires_at is None else expires_at - now
        return ColdEntry(key, value, tags, ttl, cost, hits + count + 1, vector)

    def _tags_of(self, key: str) -> list[str]:
        return [t for (t,) in self.db.execute("SELECT tag FROM tags WHERE key = ?", (key,))]

    def _decode(self, key: str, blob: bytes, crc: int, vector: bytes | None) -> bytes | None:
        """The value, or ``None`` after deleting and counting a corrupt row."""
        try:
            if checksum(key, blob, vector) != crc:
                raise CorruptBlob("checksum mismatch")
            return self.compressor.decompress(blob)
        except CorruptBlob:
            self.counters.corrupt += 1
            self._drop(key)
            return None

    def keys_with_tag(self, tag: str) -> list[str]:
        now = self._clock()
        rows = self.db.execute(
            "SELECT t.key, e.expires_at FROM tags t JOIN entries e ON e.key = t.key WHERE t.tag = ?", (tag,)
        ).fetchall()
        return [key for key, expires_at in rows if expires_at is None or expires_at > now]

    def stats(self) -> StoreStats:
        self._sweep(limit=None)
        return StoreStats(entries=self._entries, bytes=self._bytes)

    def hottest(self, n: int) -> list[ColdEntry]:
        """Up to ``n`` live entries with the most hits (most recently read first among equals)."""
        with self._transaction():
            pass  # flushes pending hits
        now = self._clock()
        rows = self.db.execute(
            "SELECT key, blob, crc, expires_at, cost, hits, vector FROM entries"
            " WHERE expires_at IS NULL OR expires_at > ? ORDER BY hits DESC, accessed_at DESC LIMIT ?",
            (now, n),
        ).fetchall()
        out: list[ColdEntry] = []
        for key, blob, crc, expires_at, cost, hits, vector in rows:
            value = self._decode(key, blob, crc, vector)
            if value is None:
                continue
            tags = frozenset(self._tags_of(key))
            ttl = None if expires_at is None else expires_at - now
            out.append(ColdEntry(key, value, tags, ttl, cost, hits, vector))
        return out

    def nearest(self, vector: bytes, k: int, tag: str | None = None) -> list[tuple[str, float]]:
        """Up to ``k`` (key, cosine similarity) of live entries with a vector, best first (``tag``'s only)."""
        index = self._vector_index()
        allowed = None if tag is None else self.keys_with_tag(tag)
        if tag is None:
            now = self._clock()
            expired = {key for (key,) in self.db.execute("SELECT key FROM entries WHERE expires_at <= ?", (now,))}
            found = index.nearest(vector, k + len(expired))
            return [pair for pair in found if pair[0] not in expired][:k]
        return index.nearest(vector, k, allowed)

    def vectors(self) -> Iterator[tuple[str, bytes]]:
        """(key, float16 bytes) of every entry stored with a vector."""
        yield from self.db.execute("SELECT key, vector FROM entries WHERE vector IS NOT NULL").fetchall()

    def _vector_index(self) -> VectorIndex:
        if self._vectors is None:
            index = VectorIndex()
            for key, vector in self.vectors():
                index.add(key, vector)
            self._vectors = index
        return self._vectors

    # -- writes ----------------------------------------------------------------------------------------------

    def put(
        self,
        key: str,
        value: bytes,
        *,
        ttl: float | None = None,
        tags: Iterable[str] = (),
        cost: float = 1.0,
        vector: bytes | None = None,
    ) -> bool:
        check_ttl(ttl)
        blob = self.compressor.compress(value)
        size = len(blob) + len(vector or b"")
        now = self._clock()
        with self._transaction():
            self._delete_row(key)
            decision = self.policy.insert(key, size, cost)
            for victim in decision.evicted:
                if self._delete_row(victim):
                    self.counters.evicted += 1
            if not decision.admitted:
                self.policy.remove(key)
                self.counters.rejected += 1
                return False
            self.db.execute(
                "INSERT INTO entries(key, blob, crc, expires_at, cost, stored_at, accessed_at, hits, vector)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, 0, ?)",
                (
                    key,
                    blob,
                    checksum(key, blob, vector),
                    None if ttl is None else now + ttl,
                    cost,
                    now,
                    now,
                    vector,
                ),
            )
            self.db.executemany("INSERT INTO tags(tag, key) VALUES (?, ?)", [(t, key) for t in set(tags)])
        self._entries += 1
        self._bytes += size
        self.counters.puts += 1
        if vector is not None and self._vectors is not None:
            self._vectors.add(key, vector)
        if self.compressor.active == 0 and len(self._samples) < self.train_after:
            self._samples.append(value[:SAMPLE_BYTES])
        self._puts_since_sweep += 1
        if self._puts_since_sweep >= self._sweep_every:
            self._puts_since_sweep = 0
            self._sweep(limit=self._sweep_every)
        return True

    def delete(self, key: str) -> bool:
        live = self._is_live(key)
        self._drop(key)
        return live

    def delete_tag(self, tag: str) -> int:
        keys = self.keys_with_tag(tag)
        stale = [k for (k,) in self.db.execute("SELECT key FROM tags WHERE tag = ?", (tag,))]
        with self._transaction():
            for key in stale:
                self._delete_row(key)
        return len(keys)

    def clear(self) -> int:
        now = self._clock()
        (live,) = self.db.execute(
            "SELECT count(*) FROM entries WHERE expires_at IS NULL OR expires_at > ?", (now,)
        ).fetchone()
        keys = [k for (k,) in self.db.execute("SELECT key FROM entries")]
        with self._transaction():
            self.db.execute("DELETE FROM entries")
            self.db.execute("DELETE FROM tags")
        for key in keys:
            self.policy.remove(key)
        if self._vectors is not None:
            self._vectors.clear()
        self._pending_hits.clear()
        self._entries = 0
        self._bytes = 0
        return int(live)

    @property
    def training_ready(self) -> bool:
        """Whether enough samples wait for a first dictionary (cheap; safe to read from another thread)."""
        return self.compressor.active == 0 and len(self._samples) >= self.train_after

    def take_training_samples(self) -> list[bytes] | None:
        """The samples for a first dictionary once enough were seen (then forgotten), else ``None``."""
        if self.compressor.active != 0 or len(self._samples) < self.train_after:
            return None
        samples, self._samples = self._samples, []
        return samples

    def recent_values(self, n: int) -> list[bytes]:
        """Up to ``n`` most recently stored values (training material for a new dictionary)."""
        rows = self.db.execute(
            "SELECT key, blob, crc, vector FROM entries ORDER BY stored_at DESC LIMIT ?", (n,)
        ).fetchall()
        values = [self._decode(key, blob, crc, vector) for key, blob, crc, vector in rows]
        return [v for v in values if v is not None]

    def add_dictionary(self, data: bytes) -> int:
        """Persist ``data`` as a new dictionary and compress new entries with it; its id."""
        with self._transaction():
            cursor = self.db.execute("INSERT INTO dictionaries(data, crc) VALUES (?, ?)", (data, zlib.crc32(data)))
        dict_id = int(cursor.lastrowid or 0)
        self.compressor.add_dictionary(dict_id, data)
        return dict_id

    def close(self) -> None:
        with self._transaction():
            pass
        self.db.close()

    # -- internals -------------------------------------------------------------------------------------------

    def _transaction(self) -> _Transaction:
        return _Transaction(self)

    def flush_hits(self) -> None:
        """Write pending hit counts (inside an open transaction)."""
        if self._pending_hits:
            self.db.executemany(
                "UPDATE entries SET hits = hits + ?, accessed_at = max(accessed_at, ?) WHERE key = ?",
                [(count, at, key) for key, (count, at) in self._pending_hits.items()],
            )
            self._pending_hits.clear()
        self._last_hit_flush = self._clock()

    def _is_live(self, key: str) -> bool:
        row = self.db.execute("SELECT expires_at FROM entries WHERE key = ?", (key,)).fetchone()
        return row is not None and (row[0] is None or row[0] > self._clock())

    def _drop(self, key: str, *, expired: bool = False) -> None:
        with self._transaction():
            removed = self._delete_row(key)
        if removed and expired:
            self.counters.expired += 1

    def _delete_row(self, key: str) -> bool:
        """Delete ``key``'s row and tags (inside a transaction); keeps counters and the policy in step."""
        row = self.db.execute(
            "DELETE FROM entries WHERE key = ? RETURNING length(blob) + coalesce(length(vector), 0)", (key,)
        ).fetchone()
        self.db.execute("DELETE FROM tags WHERE key = ?", (key,))
        self._pending_hits.pop(key, None)
        if row is None:
            return False
        self.policy.remove(key)
        self._entries -= 1
        self._bytes -= int(row[0])
        if self._vectors is not None:
            self._vectors.remove(key)
        return True

    def _sweep(self, limit: int | None) -> None:
        now = self._clock()
        query = "SELECT key FROM entries WHERE expires_at <= ?"
        params: tuple[float, ...] | tuple[float, int] = (now,)
        if limit is not None:
            query += " LIMIT ?"
            params = (now, limit)
        due = [k for (k,) in self.db.execute(query, params)]
        if due:
            with self._transaction():
                for key in due:
                    if self._delete_row(key):
                        self.counters.expired += 1


class _Transaction:
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` (rollback on error); flushes pending hits; nests as a no-op."""

    def __init__(self, owner: ColdDatabase) -> None:
        self._owner = owner
        self._outer = False

    def __enter__(self) -> None:
        db = self._owner.db
        if not db.in_transaction:
            self._outer = True
            db.execute("BEGIN IMMEDIATE")
            self._owner.flush_hits()

    def __exit__(self, kind: object, error: object, trace: object) -> None:
        if not self._outer:
            return
        if kind is None:
            self._owner.db.execute("COMMIT")
        else:
            self._owner.db.execute("ROLLBACK")
