"""Idempotency bytes: a keyed flood of large answers against the byte budgets of the idempotency store.

Part of ``python -m loadtest.bench abuse``; alone: ``python -m loadtest.bench abuse_idempotency [--quick] [--json]``.

Two proxies over the given fake LLM, caching off: one embedded (its store in process memory) and one in shared mode
(its store in Redis, under its own prefix), each with ``idempotency.max_bytes`` = ``BUDGET`` and
``idempotency.max_bytes_per_user`` = ``BUDGET`` / 4. Six users each send keyed embedding calls whose answers are
about 3.8 MB (1,000 inputs of 180 dimensions, under the default 4 MiB ``max_response_bytes``: every one is kept),
four at a time, every key new. The embedded proxy's RSS is sampled every 50 ms; its baseline is its peak RSS
during the same calls without a key, so what serving the answers in flight costs is in the baseline. Redis's
``used_memory`` is read before, right after and 2 s after (its clients' query buffers, which held answers on their
way in, shrunk by then).

Figures: ``idempotency_bytes_peak`` (the embedded proxy's peak RSS growth over its baseline, bytes),
``..._ratio_to_budget`` (the goal: at most 1.1), ``idempotency_redis_bytes`` (Redis's growth, 2 s after) and its
ratio, ``..._right_after``, the bytes the flood's answers would hold unbounded, how many users' key 0 (the last each
sent) still replays, and the statuses seen.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx

from loadtest.harness import free_port, proxy_child

BUDGET = 64 * 1024**2
USERS, CONCURRENCY = 6, 4
INPUTS, DIMENSIONS = 1_000, 180


def _rss(pid: int) -> int:
    """Resident bytes of a process (Linux ``/proc``)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def _env(llm_url: str, data_dir: Path, **settings: str) -> dict[str, str]:
    return {"RAGPROXY_UPSTREAMS__LLM": json.dumps([{"url": llm_url}]), "RAGPROXY_AUTH__MODE": "keys",
            "RAGPROXY_CREDITS__ENABLED": "true", "RAGPROXY_CACHE__ENABLED": "false",
            "RAGPROXY_DATA_DIR": str(data_dir), "RAGPROXY_LOGGING__FORMAT": "text",
            "RAGPROXY_IDEMPOTENCY__MAX_BYTES": str(BUDGET),
            "RAGPROXY_IDEMPOTENCY__MAX_BYTES_PER_USER": str(BUDGET // 4),
            **{f"RAGPROXY_{k.upper()}": v for k, v in settings.items()}}


def _users(admin: httpx.Client) -> list[dict[str, str]]:
    headers = []
    for n in range(USERS):
        user = f"idem-flooder-{n}"
        key = admin.post("/admin/keys", json={"user": user, "tenant": "idem-flood"}).json()["key"]
        admin.post(f"/admin/credits/{user}", json={"amount": 1_000_000, "tenant": "idem-flood"}).raise_for_status()
        headers.append({"Authorization": f"Bearer {key}"})
    return headers


def _body(n: int) -> dict[str, Any]:
    return {"model": "text-embedding-3-small", "dimensions": DIMENSIONS,
            "input": [f"flood {n} item {i}" for i in range(INPUTS)]}


async def _flood(url: str, users: list[dict[str, str]], calls: int, keyed: bool, statuses: Counter[int],
                 sizes: list[int]) -> None:
    """``calls`` embedding calls per user, ``CONCURRENCY`` at a time, each with a new key when ``keyed``."""
    queue = [(user, n) for n in range(calls) for user in range(len(users))]
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        async def worker() -> None:
            while queue:
                user, n = queue.pop()
                headers = {**users[user], **({"Idempotency-Key": f"flood-{user}-{n}"} if keyed else {})}
                reply = await client.post("/v1/embeddings", json=_body(n * USERS + user), headers=headers)
                statuses[reply.status_code] += 1
                sizes.append(len(reply.content))

        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))


async def _replayed(url: str, users: list[dict[str, str]], n: int) -> int:
    """How many users' key ``n`` is answered by a replay (its answer was kept)."""
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        replies = [await client.post("/v1/embeddings", json=_body(n * USERS + user),
                                     headers={**users[user], "Idempotency-Key": f"flood-{user}-{n}"})
                   for user in range(len(users))]
    return sum(reply.headers.get("Idempotent-Replayed") == "true" for reply in replies)


async def _peak_rss(pid: int, work: Any) -> int:
    """The highest RSS of ``pid`` while ``work`` runs."""
    task = asyncio.ensure_future(work)
    peak = _rss(pid)
    while not task.done():
        peak = max(peak, _rss(pid))
        await asyncio.sleep(0.05)
    await task
    return max(peak, _rss(pid))


def _redis_used(redis_url: str) -> int:
    import redis

    with redis.Redis.from_url(redis_url) as r:
        return int(r.info("memory")["used_memory"])


def flood(llm_url: str, redis_url: str, quick: bool) -> dict[str, Any]:
    """Run the flood against an embedded and a shared-mode proxy; the figures named in the module docstring."""
    calls = 12 if quick else 30
    work = Path(tempfile.mkdtemp(prefix="ragproxy-idem-flood-"))
    statuses: Counter[int] = Counter()
    sizes: list[int] = []
    try:
        with ExitStack() as stack:
            envs = [_env(llm_url, work / "embedded", ADMIN__PORT=str(free_port())),
                    _env(llm_url, work / "shared", ADMIN__PORT=str(free_port()), REDIS__URL=redis_url,
                         REDIS__PREFIX="idem-flood")]
            (embedded_url, embedded), (shared_url, _) = [stack.enter_context(proxy_child(env)) for env in envs]
            admins = [stack.enter_context(httpx.Client(base_url=f"http://127.0.0.1:{env['RAGPROXY_ADMIN__PORT']}",
                                                       timeout=30)) for env in envs]
            embedded_users, shared_users = _users(admins[0]), _users(admins[1])
            baseline = asyncio.run(_peak_rss(embedded.pid, _flood(embedded_url, embedded_users, 2, False,
                                                                  Counter(), [])))
            peak = asyncio.run(_peak_rss(embedded.pid, _flood(embedded_url, embedded_users, calls, True, statuses,
                                                              sizes)))
            replayed = asyncio.run(_replayed(embedded_url, embedded_users, 0))
            redis_before = _redis_used(redis_url)
            asyncio.run(_flood(shared_url, shared_users, calls, True, statuses, sizes))
            redis_right_after = _redis_used(redis_url)
            time.sleep(2.0)  # Redis shrinks its clients' query buffers (each held a 3.8 MB answer) in its cron
            redis_after = _redis_used(redis_url)
            replayed += asyncio.run(_replayed(shared_url, shared_users, 0))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    grown, redis_grown = peak - baseline, redis_after - redis_before
    return {"idempotency_bytes_peak": grown, "idempotency_bytes_peak_ratio_to_budget": round(grown / BUDGET, 3),
            "idempotency_redis_bytes": redis_grown,
            "idempotency_redis_bytes_ratio_to_budget": round(redis_grown / BUDGET, 3),
            "idempotency_redis_bytes_right_after": redis_right_after - redis_before,
            "budget_bytes": BUDGET, "rss_baseline_peak_bytes": baseline,
            "unbounded_bytes": sum(sizes) // 2, "answer_bytes": max(sizes, default=0),
            "replayed_last_keys": f"{replayed}/{2 * USERS}", "statuses": dict(statuses)}


@contextmanager
def _upstream_and_redis() -> Iterator[tuple[str, str]]:
    from loadtest.bench.chaos import Redis
    from upstream_doubles.llm_server import FakeLLM

    if shutil.which("redis-server") is None:
        raise SystemExit("redis-server is not installed")
    work = Path(tempfile.mkdtemp(prefix="ragproxy-idem-redis-"))
    (work / "redis").mkdir()
    redis = Redis(work / "redis")
    try:
        redis.start()
        with FakeLLM() as llm:
            yield llm.url, redis.url
    finally:
        redis.kill()
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench abuse_idempotency",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="12 calls per user instead of 30")
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    args = parser.parse_args(argv)
    with _upstream_and_redis() as (llm_url, redis_url):
        result = flood(llm_url, redis_url, args.quick)
    for name, value in result.items():
        print(f"{name:>40}: {json.dumps(value) if isinstance(value, dict) else value}")
    if args.json:
        print(json.dumps(result))
    return 0
