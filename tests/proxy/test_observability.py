"""Metrics and traces of the data plane."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from proxy.assembly.runtime import Runtime
from proxy.core.tracing import make_tracer
from tests.support.proxy_server import ProxyServer, proxy_settings
from upstream_doubles.llm_server import FakeLLM


def _eventually(check: Callable[[], bool], timeout: float = 3.0) -> None:
    """Accounting runs just after the last byte is sent; give it a moment."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


BODY = {"model": "fake-model", "messages": [{"role": "user", "content": "trace me"}]}
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_request_metrics_count_hits_and_misses(fake_llm_thread: FakeLLM, caching_proxy: ProxyServer) -> None:
    for _ in range(3):
        httpx.post(caching_proxy.url + "/v1/chat/completions", json=BODY)
    hits = 'ragproxy_requests_total{cache_status="HIT",route="chat",status="200"} 2.0'
    _eventually(lambda: hits in caching_proxy.runtime.metrics.exposition().decode())
    text = caching_proxy.runtime.metrics.exposition().decode()
    assert 'ragproxy_requests_total{cache_status="MISS",route="chat",status="200"} 1.0' in text
    assert "ragproxy_request_duration_seconds_bucket" in text


def test_spans_per_stage_and_propagation(fake_llm_thread: FakeLLM) -> None:
    exporter = InMemorySpanExporter()
    settings = proxy_settings(fake_llm_thread.url, **{"telemetry.tracing": True})
    runtime = Runtime(settings)
    runtime.tracer = make_tracer(None, "ragproxy", processor=SimpleSpanProcessor(exporter))
    with ProxyServer(settings, runtime) as server:
        httpx.post(server.url + "/v1/chat/completions", json=BODY, headers={"traceparent": TRACEPARENT})
        _eventually(lambda: any(s.name == "ragproxy chat" for s in exporter.get_finished_spans()))
    spans = exporter.get_finished_spans()
    names = {span.name for span in spans}
    assert {"ragproxy chat", "stage cache_control", "stage l1", "stage forward"} <= names
    assert all(span.context.trace_id == 0x0AF7651916CD43DD8448EB211C80319C for span in spans)
    forwarded = fake_llm_thread.log.for_path("/v1/chat/completions")[-1].headers["traceparent"]
    assert forwarded.split("-")[1] == "0af7651916cd43dd8448eb211c80319c"
    assert forwarded != TRACEPARENT, "the upstream's parent is the proxy's own span"


def test_spans_name_the_patches_of_the_body_sent_upstream(fake_llm_thread: FakeLLM) -> None:
    """An embeddings request half answered from the cache: the upstream is asked for the missing input only, and
    the spans say which stage changed the body."""
    exporter = InMemorySpanExporter()
    settings = proxy_settings(fake_llm_thread.url, **{"telemetry.tracing": True})
    runtime = Runtime(settings)
    runtime.tracer = make_tracer(None, "ragproxy", processor=SimpleSpanProcessor(exporter))
    with ProxyServer(settings, runtime) as server:
        for inputs in (["alpha"], ["alpha", "beta"]):
            httpx.post(server.url + "/v1/embeddings", json={"model": "fake-model", "input": inputs})
        _eventually(lambda: sum(s.name == "ragproxy embeddings" for s in exporter.get_finished_spans()) == 2)
    assert fake_llm_thread.log.for_path("/v1/embeddings")[-1].json()["input"] == ["beta"]
    patched = {span.name: span.attributes.get("ragproxy.body_patches") for span in exporter.get_finished_spans()
               if span.attributes is not None and "ragproxy.body_patches" in span.attributes}
    assert patched["ragproxy embeddings"] == patched["stage forward"] == ("embedding_items.missing",)
