"""FakeLLM speaks what the official ``openai`` SDK parses: sync and async, streaming and not, plus faults and
log."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.support.processes import free_port, wait_for_port
from upstream_doubles.kv_cache import KVCacheModel
from upstream_doubles.llm_server import FakeLLM
from upstream_doubles.openai_shapes import default_answer, embedding_vector, prompt_of_messages

MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "system", "content": "You answer from the documents."},
    {"role": "user", "content": "What does the proxy cache?"},
]
EXPECTED = default_answer(prompt_of_messages(MESSAGES))
ROOT = Path(__file__).resolve().parents[2]


def async_client(llm: FakeLLM, timeout: float = 30.0) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=llm.base_url, api_key="sk-test", max_retries=0, timeout=timeout)


async def test_async_chat_non_streaming(fake_llm: FakeLLM) -> None:
    reply = await async_client(fake_llm).chat.completions.create(model="m1", messages=MESSAGES)
    assert reply.id.startswith("chatcmpl-")
    assert reply.object == "chat.completion"
    assert reply.model == "m1"
    assert reply.system_fingerprint
    assert reply.choices[0].message.content == EXPECTED
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
    assert reply.usage.completion_tokens == len(EXPECTED.split())
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    assert reply.usage.prompt_tokens_details.cached_tokens == 0


async def test_async_chat_streaming_matches_non_streaming(fake_llm: FakeLLM) -> None:
    client = async_client(fake_llm)
    stream = await client.chat.completions.create(
        model="m1", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == EXPECTED
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == len(EXPECTED.split())


async def test_async_stream_without_usage_has_no_usage_chunk(fake_llm: FakeLLM) -> None:
    stream = await async_client(fake_llm).chat.completions.create(model="m", messages=MESSAGES, stream=True)
    chunks = [chunk async for chunk in stream]
    assert all(c.choices for c in chunks)
    assert all(c.usage is None for c in chunks)


async def test_max_tokens_truncates_with_length(fake_llm: FakeLLM) -> None:
    reply = await async_client(fake_llm).chat.completions.create(model="m", messages=MESSAGES, max_tokens=2)
    assert reply.choices[0].finish_reason == "length"
    assert reply.choices[0].message.content == " ".join(EXPECTED.split()[:2])


async def test_answer_is_configurable_at_run_time(fake_llm: FakeLLM) -> None:
    fake_llm.answer = lambda prompt: f"{len(prompt)} chars"
    reply = await async_client(fake_llm).completions.create(model="m", prompt="four words right here")
    assert reply.choices[0].text == "21 chars"


async def test_async_embeddings_float_and_base64(fake_llm: FakeLLM) -> None:
    client = async_client(fake_llm)
    as_float = await client.embeddings.create(model="e", input=["alpha", "beta"], encoding_format="float")
    as_default = await client.embeddings.create(model="e", input=["alpha", "beta"])  # the SDK asks for base64
    assert fake_llm.log.for_path("/v1/embeddings")[-1].json()["encoding_format"] == "base64"
    for index, text in enumerate(["alpha", "beta"]):
        expected = embedding_vector(text, 16)
        assert np.allclose(as_float.data[index].embedding, expected, atol=1e-6)
        assert np.allclose(as_default.data[index].embedding, expected, atol=1e-6)
        assert abs(float(np.linalg.norm(expected)) - 1.0) < 1e-5
    assert as_float.data[0].embedding != as_float.data[1].embedding
    sized = await client.embeddings.create(model="e", input="alpha", dimensions=5, encoding_format="float")
    assert len(sized.data[0].embedding) == 5


def test_sync_client_all_routes(fake_llm_thread: FakeLLM) -> None:
    client = openai.OpenAI(base_url=fake_llm_thread.base_url, api_key="sk-test", max_retries=0)
    chat = client.chat.completions.create(model="m", messages=MESSAGES)
    assert chat.choices[0].message.content == EXPECTED
    streamed = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        if c.choices
    )
    assert streamed == EXPECTED
    completion = client.completions.create(model="m", prompt="say hello")
    assert completion.object == "text_completion" and completion.id.startswith("cmpl-")
    assert completion.choices[0].text == default_answer("say hello")
    pieces = list(
        client.completions.create(
            model="m", prompt="say hello", stream=True, stream_options={"include_usage": True}
        )
    )
    assert "".join(p.choices[0].text for p in pieces if p.choices) == default_answer("say hello")
    assert pieces[-1].usage is not None
    vectors = client.embeddings.create(model="e", input=[[1, 2, 3], [4, 5]])
    assert np.allclose(vectors.data[1].embedding, embedding_vector([4, 5], 16), atol=1e-6)
    assert [m.id for m in client.models.list()] == ["fake-model"]
    assert client.models.retrieve("fake-model").id == "fake-model"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")


async def test_injected_errors_surface_as_sdk_exceptions(fake_llm: FakeLLM) -> None:
    client = async_client(fake_llm)
    fake_llm.faults.fail_next(429, headers={"Retry-After": "1"})
    with pytest.raises(openai.RateLimitError) as rate:
        await client.chat.completions.create(model="m", messages=MESSAGES)
    assert rate.value.response.headers["retry-after"] == "1"
    fake_llm.faults.fail_next(503, times=2, message="overloaded")
    for _ in range(2):
        with pytest.raises(openai.InternalServerError, match="overloaded"):
            await client.completions.create(model="m", prompt="x")
    fake_llm.faults.fail_next(400, code="context_length_exceeded")
    with pytest.raises(openai.BadRequestError) as bad:
        await client.embeddings.create(model="e", input="x")
    assert bad.value.code == "context_length_exceeded"
    reply = await client.completions.create(model="m", prompt="x")  # faults used up
    assert reply.choices[0].text == default_answer("x")


# What a connection reset raises: openai wraps it as APIConnectionError, except mid-stream in some versions (2.54,
# 1.81 among them), where the transport's own error (httpx.ReadError, a TransportError) escapes the iteration.
RESET = (openai.APIConnectionError, httpx.TransportError)


async def test_reset_mid_stream_after_k_chunks(fake_llm: FakeLLM) -> None:
    client = async_client(fake_llm)
    fake_llm.faults.reset_after(3)
    received = []
    with pytest.raises(RESET):
        stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        async for chunk in stream:
            received.append(chunk)
    assert len(received) == 3
    fake_llm.faults.reset_after(0)
    with pytest.raises(openai.APIConnectionError):
        await client.chat.completions.create(model="m", messages=MESSAGES)


async def test_hang_until_client_times_out(fake_llm: FakeLLM) -> None:
    fake_llm.faults.hang_next()
    with pytest.raises(openai.APITimeoutError):
        await async_client(fake_llm, timeout=1.5).chat.completions.create(model="m", messages=MESSAGES)
    assert fake_llm.faults.pending == 0


async def test_request_log_counts_and_headers(fake_llm: FakeLLM) -> None:
    client = async_client(fake_llm)
    await client.chat.completions.create(model="m", messages=MESSAGES, extra_headers={"X-Trace": "abc"})
    await client.models.list()
    assert fake_llm.log.count("/v1/chat/completions") == 1
    assert fake_llm.log.counts() == {"/v1/chat/completions": 1, "/v1/models": 1}
    first = fake_llm.log.for_path("/v1/chat/completions")[0]
    assert first.headers["x-trace"] == "abc"
    assert first.headers["Authorization"] == "Bearer sk-test"
    assert "x-other" not in first.headers
    assert first.json()["messages"] == MESSAGES
    fake_llm.log.clear()
    assert fake_llm.log.count() == 0


async def test_bad_input_answers_openai_shaped_400(fake_llm: FakeLLM) -> None:
    async with httpx.AsyncClient(base_url=fake_llm.base_url) as http:
        malformed = await http.post("/chat/completions", content=b"{not json")
        missing = await http.post("/chat/completions", json={"model": "m"})
        unknown = await http.get("/files")
    assert malformed.status_code == 400 and malformed.json()["error"]["type"] == "invalid_request_error"
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "messages"
    assert unknown.status_code == 404 and "error" in unknown.json()


async def test_kv_model_reports_cached_tokens_and_timings() -> None:
    async with FakeLLM(kv=KVCacheModel(block_size=4, per_token_s=0.0, overhead_s=0.0)) as llm:
        client = async_client(llm)
        documents = " ".join(f"word{i}" for i in range(40))
        messages: list[ChatCompletionMessageParam] = [
            {"role": "system", "content": documents},
            {"role": "user", "content": "q1"},
        ]
        first = await client.chat.completions.create(model="m", messages=messages)
        messages[1] = {"role": "user", "content": "another question"}
        second = await client.chat.completions.create(model="m", messages=messages)
        bypass = await client.chat.completions.create(
            model="m", messages=messages, extra_body={"cache_prompt": False}
        )
        stream = await client.chat.completions.create(
            model="m", messages=messages, stream=True, stream_options={"include_usage": True}
        )
        chunks = [c async for c in stream]
    assert first.usage is not None and second.usage is not None and bypass.usage is not None
    assert first.usage.prompt_tokens_details is not None and second.usage.prompt_tokens_details is not None
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens == 40  # "system: " + 40 words, in 4-token blocks
    timings = (second.model_extra or {})["timings"]
    assert timings["cache_n"] == 40 and timings["prompt_n"] == second.usage.prompt_tokens - 40
    assert (
        bypass.usage.prompt_tokens_details is not None
        and bypass.usage.prompt_tokens_details.cached_tokens == 0
    )
    final = next(c for c in chunks if c.choices and c.choices[0].finish_reason)
    assert (final.model_extra or {})["timings"]["cache_n"] >= 40
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens_details is not None
    assert (chunks[-1].usage.prompt_tokens_details.cached_tokens or 0) >= 40


async def test_one_slot_queues_the_second_request() -> None:
    async with FakeLLM(kv=KVCacheModel(per_token_s=0.002, overhead_s=0.05), slots=1) as llm:
        client = async_client(llm)
        replies = await asyncio.gather(
            *(client.completions.create(model="m", prompt=f"prompt number {i}") for i in range(2))
        )
    queue_ms = sorted((r.model_extra or {})["timings"]["queue_ms"] for r in replies)
    assert queue_ms[1] > 0  # waited for the other request's 50 ms prefill, whichever went first


def test_runs_as_a_process() -> None:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "upstream_doubles.llm_server", "--port", str(port), "--kv-blocks", "64"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port, timeout=20)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0)
        reply = client.chat.completions.create(model="m", messages=MESSAGES)
        assert reply.choices[0].message.content == EXPECTED
        assert "timings" in (reply.model_extra or {})
    finally:
        process.terminate()
        process.wait(10)


async def test_client_disconnect_mid_stream_is_counted() -> None:
    async with FakeLLM(chunk_latency_s=0.05) as llm:
        async with httpx.AsyncClient(base_url=llm.base_url) as http:
            body = {"model": "m", "messages": MESSAGES, "stream": True}
            async with http.stream("POST", "/chat/completions", json=body) as response:
                async for _ in response.aiter_lines():
                    break
        for _ in range(100):  # bounded wait for the server to notice
            if llm.disconnects:
                break
            await asyncio.sleep(0.05)
        assert llm.disconnects == 1
        assert llm.in_flight == 0


async def test_slots_endpoint_with_kv_model() -> None:
    kv = KVCacheModel(capacity_blocks=64, block_size=16)
    async with FakeLLM(kv=kv, slots=2) as llm, httpx.AsyncClient(base_url=llm.url) as http:
        slots = (await http.get("/slots")).json()
    assert slots == [
        {"id": 0, "n_ctx": 512, "is_processing": False},
        {"id": 1, "n_ctx": 512, "is_processing": False},
    ]


async def test_id_slot_pins_requests_to_one_slot() -> None:
    async with FakeLLM(kv=KVCacheModel(per_token_s=0.002, overhead_s=0.05), slots=2) as llm:
        client = async_client(llm)
        replies = await asyncio.gather(
            *(
                client.completions.create(model="m", prompt=f"pinned {i}", extra_body={"id_slot": 1})
                for i in range(2)
            )
        )
    queue_ms = sorted((r.model_extra or {})["timings"]["queue_ms"] for r in replies)
    assert queue_ms[1] > 0  # the free slot 0 was not used


async def test_stored_responses_as_the_api_keeps_them(fake_llm: FakeLLM) -> None:
    client = async_client(fake_llm)
    first = await client.responses.create(model="m1", input=[{"role": "user", "content": "one"},
                                                             {"role": "user", "content": "two"},
                                                             {"role": "user", "content": "three"}])
    assert first.store is True and (await client.responses.retrieve(first.id)).id == first.id
    page = await client.responses.input_items.list(first.id, limit=2)
    assert [item.content[0].text for item in page.data] == ["three", "two"] and page.has_more  # type: ignore[union-attr]
    rest = await client.responses.input_items.list(first.id, after=page.data[-1].id, order="desc")
    assert [item.content[0].text for item in rest.data] == ["one"] and not rest.has_more  # type: ignore[union-attr]
    unstored = await client.responses.create(model="m1", input="not kept", store=False)
    with pytest.raises(openai.NotFoundError, match=f"Response with id '{unstored.id}' not found."):
        await client.responses.retrieve(unstored.id)
    with pytest.raises(openai.BadRequestError) as unknown:
        await client.responses.create(model="m1", input="go on", previous_response_id=unstored.id)
    assert unknown.value.code == "previous_response_not_found" and unknown.value.param == "previous_response_id"
    with pytest.raises(openai.BadRequestError):
        await client.responses.cancel(first.id)  # not made in background mode
    assert await client.responses.delete(first.id) is None
    with pytest.raises(openai.NotFoundError):
        await client.responses.delete(first.id)
    await client.close()
