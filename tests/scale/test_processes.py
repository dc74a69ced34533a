"""Three ``ragproxy serve`` processes configured only through ``RAGPROXY_REDIS__URL`` act as one cache."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from urllib.parse import quote

import httpx
import pytest

from tests.scale.test_replicas import CHAT, ask
from tests.support.proxy_server import ProxyProcess
from upstream_doubles.llm_server import FakeLLM


@pytest.fixture
def processes(fake_llm_thread: FakeLLM, redis_url: str) -> Iterator[list[ProxyProcess]]:
    env = {"RAGPROXY_REDIS__URL": redis_url, "RAGPROXY_UPSTREAMS__LLM": f"[{{url: '{fake_llm_thread.url}'}}]",
           "RAGPROXY_CACHE__EXPOSE_KEY": "true", "RAGPROXY_CACHE__L3__ENABLED": "false",
           # a loaded test machine can delay heartbeats past the default lease (then replicas fail safe: misses)
           "RAGPROXY_REDIS__BUS_LEASE_S": "15"}
    with ExitStack() as stack:
        yield [stack.enter_context(ProxyProcess(dict(env))) for _ in range(3)]


def _stored(process: ProxyProcess, key: str) -> None:
    """An answer is stored just after it was sent; wait until another replica can read it."""
    admin = f"http://127.0.0.1:{process.env['RAGPROXY_ADMIN__PORT']}"
    deadline = time.monotonic() + 30  # a failure bound only: the loop ends with the event
    while httpx.get(f"{admin}/admin/entries/{quote(key, safe='')}", timeout=5).status_code != 200:
        assert time.monotonic() < deadline, "the entry never reached the shared store"
        time.sleep(0.05)


@pytest.mark.long
def test_three_processes_are_one_cache(fake_llm_thread: FakeLLM, processes: list[ProxyProcess]) -> None:
    import openai

    clients = [openai.OpenAI(base_url=p.url + "/v1", api_key="unused", max_retries=0) for p in processes]
    status, key, _ = ask(clients[0], "across processes")
    assert status == "MISS" and key is not None
    _stored(processes[1], key)
    assert [ask(c, "across processes")[0] for c in clients[1:]] == ["HIT", "HIT"]
    admin = f"http://127.0.0.1:{processes[0].env['RAGPROXY_ADMIN__PORT']}"
    assert httpx.post(admin + "/admin/invalidate", json={"keys": [key]}, timeout=10).status_code == 200
    assert ask(clients[1], "across processes")[0] == "MISS"
    _stored(processes[2], key)
    assert ask(clients[2], "across processes")[0] == "HIT"
    assert fake_llm_thread.log.count(CHAT) == 2
