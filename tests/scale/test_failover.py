"""A Redis Cluster master killed mid-load: the cluster fails its replica over, the proxies keep answering from
upstream while the cache is gone (fail open), credits answer 503 + Retry-After while the user's slot has no
master (fail closed: no outage allowance here; the allowance is tested in tests/proxy/credits), and both
recover."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import openai
import pytest

from tests.scale.replicas import provision_user, shared_replicas
from tests.scale.test_replicas import CREDIT, sdk
from tests.support.redis_cluster import RedisClusterProcesses, cluster_available
from upstream_doubles.llm_server import FakeLLM

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster() -> Iterator[RedisClusterProcesses]:
    if not cluster_available():
        pytest.skip("redis-server/redis-cli are not installed")
    # a node timeout of 4 s: the gap outlasts the clients' own retries, so requests do meet it
    with RedisClusterProcesses(masters=3, replicas_per_master=1, node_timeout_ms=4000) as started:
        yield started


class Load:
    """Requests in a loop on a thread; every outcome recorded as (phase, status, Retry-After)."""

    def __init__(self, client: openai.OpenAI, label: str) -> None:
        self.client, self.label = client, label
        self.phase = "before"
        self.outcomes: list[tuple[str, int, str | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            try:
                raw = self.client.chat.completions.with_raw_response.create(
                    model="fake-model", messages=[{"role": "user", "content": f"{self.label} {n % 15}"}])
                self.outcomes.append((self.phase, raw.status_code, None))
            except openai.APIStatusError as exc:
                self.outcomes.append((self.phase, exc.status_code, exc.response.headers.get("Retry-After")))
            time.sleep(0.02)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def test_master_killed_mid_load(fake_llm_thread: FakeLLM, cluster: RedisClusterProcesses) -> None:
    key = provision_user(cluster.plain_url, 1000 * CREDIT, cluster=True)
    common = {"redis.cluster": True, "credits.reservation_ttl_s": 30}
    with shared_replicas(2, fake_llm_thread.url, cluster.plain_url, **common) as cache_only, \
            shared_replicas(2, fake_llm_thread.url, cluster.plain_url,
                            **{**common, "auth.mode": "keys", "credits.enabled": True,
                               "credits.outage_allowance": 0}) as billed:
        loads = [Load(sdk(cache_only[0]), "cache"), Load(sdk(cache_only[1]), "cache"),
                 Load(sdk(billed[0], key), "billed"), Load(sdk(billed[1], key), "billed")]
        for load in loads:
            load.__enter__()
        try:
            time.sleep(1.5)
            victim = cluster.master_for("ragproxy:credits:{ann}:account")
            for load in loads:
                load.phase = "gap"
            cluster.kill(victim)
            cluster.wait_healthy(timeout=30)
            time.sleep(1.0)  # clients notice the new topology
            for load in loads:
                load.phase = "after"
            time.sleep(2.5)
        finally:
            for load in loads:
                load.__exit__()
    cache_outcomes = loads[0].outcomes + loads[1].outcomes
    billed_outcomes = loads[2].outcomes + loads[3].outcomes
    assert cache_outcomes and all(status == 200 for _, status, _ in cache_outcomes), \
        "caches fail open: every request was answered"
    assert {phase for phase, _, _ in cache_outcomes} == {"before", "gap", "after"}
    refused = [(status, retry) for phase, status, retry in billed_outcomes if status != 200]
    assert refused, "credits fail closed while the user's slot has no master"
    assert all(status == 503 and retry is not None and int(retry) >= 1 for status, retry in refused), refused
    after = [status for phase, status, _ in billed_outcomes if phase == "after"]
    assert after and after[-5:] == [200] * 5, "billing recovered after the failover"
