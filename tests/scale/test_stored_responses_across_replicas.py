"""Stored Responses across proxy replicas sharing one Redis: whichever replica a tenant reaches knows its
responses, and no replica serves them to another tenant."""

from __future__ import annotations

import asyncio

import openai
import pytest

from proxy.auth.redis_keys import RedisKeyStore
from tests.scale.replicas import shared_replicas, wait_stored
from upstream_doubles.llm_server import FakeLLM

MODEL = "fake-model"


def _keys(url: str) -> tuple[str, str]:
    async def create() -> tuple[str, str]:
        keys = RedisKeyStore.from_url(url)
        try:
            return (await keys.create("ann", "acme")).plaintext, (await keys.create("bob", "globex")).plaintext
        finally:
            await keys.close()

    return asyncio.run(create())


def test_every_replica_knows_whose_a_response_is(fake_llm_thread: FakeLLM, redis_url: str) -> None:
    ann_key, bob_key = _keys(redis_url)
    with shared_replicas(2, fake_llm_thread.url, redis_url, **{"auth.mode": "keys", "cache.expose_key": True}) \
            as servers:
        ann = [openai.OpenAI(base_url=s.url + "/v1", api_key=ann_key, max_retries=0) for s in servers]
        bob = openai.OpenAI(base_url=servers[1].url + "/v1", api_key=bob_key, max_retries=0)
        raw = ann[0].responses.with_raw_response.create(model=MODEL, input="Made on replica 0")
        made = raw.parse()
        assert ann[1].responses.retrieve(made.id).id == made.id
        with pytest.raises(openai.NotFoundError):
            bob.responses.retrieve(made.id)
        with pytest.raises(openai.BadRequestError):
            bob.responses.create(model=MODEL, input="Go on", previous_response_id=made.id)
        wait_stored(servers[0], raw.headers["X-Cache-Key"])
        again = ann[1].responses.with_raw_response.create(model=MODEL, input="Made on replica 0")
        assert again.headers["X-Cache-Status"] == "HIT" and again.parse().id == made.id
        ann[1].responses.delete(made.id)
        after = ann[0].responses.with_raw_response.create(model=MODEL, input="Made on replica 0")
        assert after.headers["X-Cache-Status"] == "MISS", "the delete on replica 1 invalidated replica 0's copy"
        with pytest.raises(openai.NotFoundError):
            ann[0].responses.retrieve(made.id)
