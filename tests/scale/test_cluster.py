"""Three replicas sharing a 3-master Redis Cluster: cross-replica hits and invalidation (keys on every master,
the bus on sharded pub/sub)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.scale.replicas import shared_replicas
from tests.scale.test_replicas import CHAT, ask, sdk
from tests.support.redis_cluster import RedisClusterProcesses, cluster_available
from upstream_doubles.llm_server import FakeLLM


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisClusterProcesses]:
    if not cluster_available():
        pytest.skip("redis-server/redis-cli are not installed")
    with RedisClusterProcesses(masters=3) as started:
        yield started


def test_replicas_share_one_cache_on_a_cluster(fake_llm_thread: FakeLLM, cluster: RedisClusterProcesses) -> None:
    overrides = {"redis.cluster": True, "cache.expose_key": True}
    with shared_replicas(3, fake_llm_thread.url, cluster.plain_url, **overrides) as servers:
        clients = [sdk(s) for s in servers]
        questions = [f"clustered {n}" for n in range(12)]  # keys spread over the three masters
        keys = [ask(clients[n % 3], q)[1] for n, q in enumerate(questions)]
        assert all(key is not None for key in keys)
        for n, question in enumerate(questions):
            assert ask(clients[(n + 1) % 3], question)[0] == "HIT"
            assert ask(clients[(n + 2) % 3], question)[0] == "HIT"
        reply = httpx.post(servers[0].admin_url + "/admin/invalidate", json={"keys": keys[:6]}, timeout=10)
        assert reply.status_code == 200, reply.text
        for n, question in enumerate(questions):
            expected = "MISS" if n < 6 else "HIT"
            assert ask(clients[(n + 1) % 3], question)[0] == expected, question
        bump = httpx.post(servers[1].admin_url + "/admin/versions/bump",
                          json={"tenant": "anonymous", "namespace": "default"}, timeout=10)
        assert bump.status_code == 200, bump.text
        assert {s.runtime.versions.current("anonymous", "default") for s in servers} == {"1"}
        assert ask(clients[2], questions[-1])[0] == "MISS"
    assert fake_llm_thread.log.count(CHAT) == 12 + 6 + 1
