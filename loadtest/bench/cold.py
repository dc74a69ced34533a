"""``python -m loadtest.bench cold [--quick] [--json] [--questions PATH]``: the cold tier at store level.

Measured in one run on the same machine:

1. Compression ratio distribution (mean, p10, p50, p90, aggregate) of lz4 with a dictionary trained by
   ``tiers.compression.train_dictionary`` on responses built from one half of the questions, measured on
   responses built from the *other* half with another seed (no sentence of the measured set was seen in
   training). Printed next to plain lz4 and a naive dictionary (the last 64 KiB of the training responses).
2. Get latency p50/p99 of ``ColdStore`` (SQLite WAL + lz4, thread hop included) against an in-memory dict
   behind the same ``await`` (baseline) and a dict behind the same kind of thread hop, all on this process's
   event loop: the hop, not the disk, sets the tail on a busy machine.
3. Layout: the SQLite core's synchronous get against an append-only log with an in-memory offset index (a
   measurement prototype defined here, not product code), and the reopen time of each.

Responses come from ``loadtest.responses`` (``--questions``, default ``../shared/data/nq_open_dev.jsonl``).

Store level for now: ``hit_p99_ms`` is the store's get, not yet a request through HTTP (the proxy's L3 route
will add that). JSON keys: ``compression_ratio``, ``compression_ratio_p10``, ``compression_ratio_p50``,
``compression_ratio_p90``, ``plain_lz4_ratio``, ``naive_dictionary_ratio``, ``hit_p50_ms``, ``hit_p99_ms``,
``baseline_p50_ms``, ``baseline_p99_ms``, ``thread_hop_p99_ms``, ``log_get_p99_ms``, ``sqlite_get_p99_ms``, ``level``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import tempfile
import time
import zlib
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from loadtest.responses import DEFAULT_QUESTIONS, ResponseGenerator, load_questions
from tiers.cold import ColdStore
from tiers.cold.database import ColdDatabase
from tiers.compression import Compressor, train_dictionary
from tiers.policies.lru import LRUPolicy


def _percentiles(values: list[float]) -> dict[str, float]:
    array = np.asarray(values)
    return {
        "mean": float(array.mean()),
        "p10": float(np.percentile(array, 10)),
        "p50": float(np.percentile(array, 50)),
        "p90": float(np.percentile(array, 90)),
        "p99": float(np.percentile(array, 99)),
    }


def _ratios(compressor: Compressor, responses: list[bytes]) -> list[float]:
    return [len(r) / len(compressor.compress(r)) for r in responses]


async def _latencies(get: Callable[[str], Awaitable[bytes | None]], keys: list[str]) -> list[float]:
    out: list[float] = []
    for key in keys:
        start = time.perf_counter()
        value = await get(key)
        out.append((time.perf_counter() - start) * 1000)
        if value is None:
            raise RuntimeError(f"benchmark key {key} missing")
    return out


class AppendOnlyLog:
    """Measurement prototype: records ``len|crc|key|blob`` appended to one file, offsets indexed in memory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.index: dict[str, tuple[int, int]] = {}
        self.file = path.open("a+b")
        self.fd = self.file.fileno()

    def put(self, key: str, blob: bytes) -> None:
        raw = key.encode()
        record = len(raw).to_bytes(2, "little") + len(blob).to_bytes(4, "little") + raw + blob
        record += zlib.crc32(record).to_bytes(4, "little")
        offset = self.file.seek(0, os.SEEK_END)
        self.file.write(record)
        self.file.flush()
        self.index[key] = (offset + 6 + len(raw), len(blob))

    def get(self, key: str) -> bytes:
        offset, length = self.index[key]
        return os.pread(self.fd, length, offset)

    def reopen(self) -> float:
        """Rebuild the index by scanning the file (what a restart must do); seconds taken."""
        start = time.perf_counter()
        index: dict[str, tuple[int, int]] = {}
        data = self.path.read_bytes()
        pos = 0
        while pos + 6 <= len(data):
            key_len = int.from_bytes(data[pos : pos + 2], "little")
            blob_len = int.from_bytes(data[pos + 2 : pos + 6], "little")
            end = pos + 6 + key_len + blob_len
            if zlib.crc32(data[pos:end]) != int.from_bytes(data[end : end + 4], "little"):
                break
            index[data[pos + 6 : pos + 6 + key_len].decode()] = (pos + 6 + key_len, blob_len)
            pos = end + 4
        self.index = index
        return time.perf_counter() - start


async def run(quick: bool, questions: Path) -> dict[str, object]:
    pairs = load_questions(questions)
    half = len(pairs) // 2
    train_count, test_count, reads = (1000, 2000, 5000) if quick else (2000, 10000, 30000)
    training = list(ResponseGenerator(pairs[:half], seed=1).many(train_count))
    measured = list(ResponseGenerator(pairs[half:], seed=2).many(test_count))

    start = time.perf_counter()
    dictionary = train_dictionary(training)
    train_seconds = time.perf_counter() - start
    trained = _percentiles(_ratios(Compressor({1: dictionary}, active=1), measured))
    plain = _percentiles(_ratios(Compressor(), measured))
    naive = _percentiles(_ratios(Compressor({1: b"".join(training)[-65536:]}, active=1), measured))
    with_dictionary = Compressor({1: dictionary}, active=1)
    aggregate = sum(map(len, measured)) / sum(len(with_dictionary.compress(r)) for r in measured)

    rng = random.Random(3)
    keys = [f"chat:{i:08d}" for i in range(len(measured))]
    read_keys = [rng.choice(keys) for _ in range(reads)]
    with tempfile.TemporaryDirectory(prefix="ragproxy-bench-cold-") as directory:
        store = await ColdStore(directory, train_after=10**9).opened()
        for i, response in enumerate(training):
            await store.put(f"train:{i}", response)
        await store.retrain_dictionary(len(training))
        start = time.perf_counter()
        for key, response in zip(keys, measured, strict=True):
            await store.put(key, response, tags=["tenant:bench"])
        put_ms = (time.perf_counter() - start) * 1000 / len(measured)
        await _latencies(store.get, read_keys[:500])  # warm the page cache
        cold = _percentiles(await _latencies(store.get, read_keys))
        await store.close()

        table = dict(zip(keys, measured, strict=True))

        async def dict_get(key: str) -> bytes | None:
            return table.get(key)

        baseline = _percentiles(await _latencies(dict_get, read_keys))

        hop = ThreadPoolExecutor(max_workers=1)

        async def hop_get(key: str) -> bytes | None:
            return await asyncio.get_running_loop().run_in_executor(hop, table.get, key)

        hop_baseline = _percentiles(await _latencies(hop_get, read_keys))
        hop.shutdown()

        # Layout comparison: synchronous core of each design, same blobs.
        core = ColdDatabase(Path(directory) / "layout-sqlite", LRUPolicy(1 << 34), train_after=10**9)
        core.rebuild_policy()
        log = AppendOnlyLog(Path(directory) / "layout.log")
        compressor = Compressor({1: dictionary}, active=1)
        for key, response in zip(keys, measured, strict=True):
            core.put(key, response)
            log.put(key, compressor.compress(response))
        core.close()
        start = time.perf_counter()
        core = ColdDatabase(Path(directory) / "layout-sqlite", LRUPolicy(1 << 34), train_after=10**9)
        sqlite_reopen = time.perf_counter() - start
        core.rebuild_policy()
        sqlite_rebuild = time.perf_counter() - start - sqlite_reopen
        log_reopen = log.reopen()
        sqlite_gets, log_gets = [], []
        for key in read_keys:
            begin = time.perf_counter()
            core.get(key)
            sqlite_gets.append((time.perf_counter() - begin) * 1000)
            begin = time.perf_counter()
            compressor.decompress(log.get(key))
            log_gets.append((time.perf_counter() - begin) * 1000)
        core.close()
        log.file.close()
    sqlite_layout, log_layout = _percentiles(sqlite_gets), _percentiles(log_gets)

    return {
        "level": "store (ColdStore.get, not yet through HTTP)",
        "responses_measured": len(measured),
        "response_bytes_p50": float(np.percentile([len(r) for r in measured], 50)),
        "dictionary_bytes": len(dictionary),
        "dictionary_train_s": round(train_seconds, 2),
        "compression_ratio": round(trained["mean"], 3),
        "compression_ratio_p10": round(trained["p10"], 3),
        "compression_ratio_p50": round(trained["p50"], 3),
        "compression_ratio_p90": round(trained["p90"], 3),
        "compression_ratio_aggregate": round(aggregate, 3),
        "plain_lz4_ratio": round(plain["mean"], 3),
        "naive_dictionary_ratio": round(naive["mean"], 3),
        "naive_dictionary_ratio_p10": round(naive["p10"], 3),
        "put_ms_mean": round(put_ms, 4),
        "hit_p50_ms": round(cold["p50"], 4),
        "hit_p99_ms": round(cold["p99"], 4),
        "baseline_p50_ms": round(baseline["p50"], 4),
        "baseline_p99_ms": round(baseline["p99"], 4),
        "hit_p99_over_baseline": round(cold["p99"] / max(baseline["p99"], 1e-9), 1),
        "thread_hop_p50_ms": round(hop_baseline["p50"], 4),
        "thread_hop_p99_ms": round(hop_baseline["p99"], 4),
        "sqlite_get_p50_ms": round(sqlite_layout["p50"], 4),
        "sqlite_get_p99_ms": round(sqlite_layout["p99"], 4),
        "log_get_p50_ms": round(log_layout["p50"], 4),
        "log_get_p99_ms": round(log_layout["p99"], 4),
        "sqlite_reopen_ms": round(sqlite_reopen * 1000, 2),
        "sqlite_policy_rebuild_ms": round(sqlite_rebuild * 1000, 2),
        "log_reopen_ms": round(log_reopen * 1000, 2),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench cold")
    parser.add_argument("--quick", action="store_true", help="smaller run (under a minute)")
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    parser.add_argument("--questions", type=Path, default=DEFAULT_QUESTIONS, help="Natural Questions JSONL")
    args = parser.parse_args(argv)
    try:  # the proxy runs on uvloop where it is installed; measure on the same loop
        import uvloop

        result = uvloop.run(run(args.quick, args.questions))
    except ImportError:
        result = asyncio.run(run(args.quick, args.questions))
    print(
        f"compression (lz4 + trained dictionary, unseen responses): mean {result['compression_ratio']}"
        f"  p10 {result['compression_ratio_p10']}  p50 {result['compression_ratio_p50']}"
        f"  p90 {result['compression_ratio_p90']}  aggregate {result['compression_ratio_aggregate']}"
    )
    print(
        f"  vs plain lz4 mean {result['plain_lz4_ratio']},"
        f" naive dictionary mean {result['naive_dictionary_ratio']}"
        f" (p10 {result['naive_dictionary_ratio_p10']}); goal mean >= 5"
    )
    print(
        f"cold get (store level): p50 {result['hit_p50_ms']} ms  p99 {result['hit_p99_ms']} ms;"
        f" dict baseline p50 {result['baseline_p50_ms']} ms  p99 {result['baseline_p99_ms']} ms;"
        f" p99 ratio {result['hit_p99_over_baseline']}x; goal p99 <= 2 ms"
    )
    print(
        f"  dict behind the same thread hop (the cost of keeping disk I/O off the loop):"
        f" p50 {result['thread_hop_p50_ms']} ms  p99 {result['thread_hop_p99_ms']} ms"
    )
    print(
        f"layout: sqlite get p50 {result['sqlite_get_p50_ms']} / p99 {result['sqlite_get_p99_ms']} ms,"
        f" reopen {result['sqlite_reopen_ms']} ms (+{result['sqlite_policy_rebuild_ms']} ms policy rebuild"
        f" in the background); append-only log get p50 {result['log_get_p50_ms']}"
        f" / p99 {result['log_get_p99_ms']} ms, reopen (index scan) {result['log_reopen_ms']} ms"
    )
    http = http_hits(args.quick)
    result.update({f"http_{key}": round(value, 4) for key, value in http.items()})
    print(
        f"cold hits through HTTP (L1 lookups off, every hit from L3): p50 {http['hit_p50_ms']:.3f} ms"
        f"  p99 {http['hit_p99_ms']:.3f} ms; bare handler p50 {http['bare_p50_ms']:.3f} ms"
        f"  p99 {http['bare_p99_ms']:.3f} ms; rps {http['hit_rps']:.0f} vs {http['bare_rps']:.0f}"
    )
    if args.json:
        print(json.dumps(result))
    return 0


def http_hits(quick: bool) -> dict[str, float]:
    """L3 hits through a ``ragproxy serve`` process, against a bare handler in the same run."""
    import tempfile

    from loadtest.bench.l1 import run as run_hits

    env = {"RAGPROXY_CACHE__L1__ENABLED": "false", "RAGPROXY_CACHE__L2__ENABLED": "false",
           "RAGPROXY_DATA_DIR": tempfile.mkdtemp(prefix="ragproxy-bench-")}
    return run_hits(env, quick, "l3")
