"""Locust scenarios for ragproxy: RAG users that embed, search Qdrant and ask the LLM through the proxy.

One task is one RAG turn (scenario logic in :mod:`loadtest.rag_users`):

1. ``embed``: ``POST /v1/embeddings`` for the question (Zipf-popular topic, sometimes paraphrased; a paraphrase
   is embedded together with the usual phrasing);
2. ``search``: ``POST /collections/{c}/points/search`` with the question's vector (for a paraphrase: the usual
   phrasing's vector moved slightly, as a sentence embedder would place it), payload text of the top passages;
3. ``chat`` or ``chat_stream`` (a ``--rag-stream-share`` of turns): ``POST /v1/chat/completions`` with the
   passages as context;
4. sometimes ``chat_followup``: the same conversation with the answer and a follow-up question.

Each user holds one of several tenants' API keys (``Authorization: Bearer``; the proxy's ``auth.mode: open``
ignores them). Every response's ``X-Cache-Status``/``X-Cache-Tier`` and ``X-Credits-Charged`` go into a
:class:`~loadtest.rag_users.CacheTally` (merged from workers in distributed runs); at exit, ``--rag-report FILE``
receives Locust's per-kind statistics (requests, failures, requests/s, p50/p95/p99) and the tally as JSON.
``chat_stream`` times are Locust's for ``stream=True``: until the response headers, not the last chunk.

Only loopback hosts are accepted (``--host http://127.0.0.1:PORT``): anything else stops Locust at start-up
with exit code 2. ``loadtest/run_locust.py`` starts the test doubles and the proxy and runs this file headless.
"""

from __future__ import annotations

import ipaddress
import itertools
import json
import logging
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from locust import HttpUser, between, events, task
from locust.env import Environment
from locust.event import EventHook
from locust.runners import MasterRunner, WorkerRunner

from loadtest.rag_users import (
    FOLLOW_UPS,
    CacheTally,
    Credential,
    Topic,
    ZipfSampler,
    credentials,
    load_topics,
    paraphrase_vector,
    phrase,
    rag_messages,
)

log = logging.getLogger("ragproxy.locust")

TALLY = CacheTally()
_TOPICS: list[Topic] = []
_CREDENTIALS: list[Credential] = []
_USER_NUMBERS = itertools.count()


def _add_options(parser: Any) -> None:
    group = parser.add_argument_group("ragproxy RAG users")
    group.add_argument("--rag-collection", default="passages", help="Qdrant collection to search")
    group.add_argument("--rag-model", default="fake-model", help="model name sent to the LLM and embeddings")
    group.add_argument("--rag-topics", type=int, default=200, help="distinct NQ-open questions")
    group.add_argument("--rag-zipf", type=float, default=1.1, help="Zipf exponent of topic popularity")
    group.add_argument("--rag-paraphrase-share", type=float, default=0.4, help="share of paraphrased questions")
    group.add_argument("--rag-stream-share", type=float, default=0.3, help="share of streamed chat turns")
    group.add_argument("--rag-followup-share", type=float, default=0.3, help="share of turns with a follow-up")
    group.add_argument("--rag-top-k", type=int, default=3, help="passages retrieved per question")
    group.add_argument("--rag-tenants", type=int, default=3)
    group.add_argument("--rag-keys-per-tenant", type=int, default=2)
    group.add_argument("--rag-seed", type=int, default=0)
    group.add_argument("--rag-keys-file", default="",
                       help="JSON list of {tenant, api_key} to use instead of synthetic keys (auth.mode keys)")
    group.add_argument("--rag-report", default="", help="write the JSON report here at exit")


def is_loopback(host: str | None) -> bool:
    hostname = urlsplit(host or "").hostname or ""
    if hostname == "localhost":
        return True
    try:
        return ipaddress.ip_address(hostname).is_loopback
    except ValueError:
        return False


def _on_init(environment: Environment, **_: Any) -> None:
    if not is_loopback(environment.host):
        log.error("refusing to load %r: only loopback hosts (http://127.0.0.1:PORT) are allowed", environment.host)
        sys.exit(2)
    options = environment.parsed_options
    if options is None:  # used as a library, without Locust's command line
        return
    _TOPICS[:] = load_topics(options.rag_topics)
    if options.rag_keys_file:
        issued = json.loads(Path(options.rag_keys_file).read_text(encoding="utf-8"))
        _CREDENTIALS[:] = [Credential(item["tenant"], item["api_key"]) for item in issued]
    else:
        _CREDENTIALS[:] = credentials(options.rag_tenants, options.rag_keys_per_tenant)


def _to_master(client_id: str, data: dict[str, Any]) -> None:
    data["rag_cache"] = TALLY.to_dict()
    TALLY.kinds.clear()


def _from_worker(client_id: str, data: dict[str, Any]) -> None:
    TALLY.merge(data.get("rag_cache", {}))


def _write_report(environment: Environment, **_: Any) -> None:
    path = environment.parsed_options.rag_report if environment.parsed_options else ""
    if not path or isinstance(environment.runner, WorkerRunner):
        return
    Path(path).write_text(json.dumps(report(environment)), encoding="utf-8")


def _listen(hook: EventHook, listener: Callable[..., None]) -> None:
    hook.add_listener(listener)  # type: ignore[no-untyped-call]  # locust's EventHook is not annotated


for _hook, _listener in ((events.init_command_line_parser, _add_options), (events.init, _on_init),
                         (events.report_to_master, _to_master), (events.worker_report, _from_worker),
                         (events.quitting, _write_report)):
    _listen(_hook, _listener)


def failure_text(status: int, body: str) -> str:
    """``status <code> <error type>``: one Locust error row per kind of failure, not per message."""
    try:
        error = json.loads(body).get("error") or json.loads(body).get("status") or {}
    except (ValueError, AttributeError):
        error = {}
    kind = error.get("type") or error.get("code") if isinstance(error, dict) else None
    return f"status {status} {kind or body[:80]}"


def report(environment: Environment) -> dict[str, Any]:
    """Locust's statistics per request kind plus the cache tally, as plain data."""
    stats = environment.stats
    kinds = {}
    for entry in stats.entries.values():
        kinds[entry.name] = {
            "requests": entry.num_requests, "failures": entry.num_failures, "rps": entry.total_rps,
            "p50_ms": entry.get_response_time_percentile(0.5), "p95_ms": entry.get_response_time_percentile(0.95),
            "p99_ms": entry.get_response_time_percentile(0.99), "avg_ms": entry.avg_response_time,
        }
    total = stats.total
    duration = max(total.last_request_timestamp - total.start_time, 0.0) if total.last_request_timestamp else 0.0
    return {
        "duration_s": duration,
        "requests": total.num_requests,
        "failures": total.num_failures,
        "rps": total.total_rps,
        "kinds": kinds,
        "errors": [{"name": e.name, "error": str(e.error), "occurrences": e.occurrences}
                   for e in stats.errors.values()],
        "cache": TALLY.to_dict(),
        "distributed": isinstance(environment.runner, MasterRunner),
    }


class RagUser(HttpUser):
    """A user of a RAG application that talks to ragproxy as its OpenAI and Qdrant endpoint."""

    wait_time = between(0.05, 0.3)

    def on_start(self) -> None:
        options = self.environment.parsed_options
        number = next(_USER_NUMBERS)
        self.rng = random.Random(options.rag_seed * 1_000_003 + number)
        self.credential = _CREDENTIALS[number % len(_CREDENTIALS)]
        self.topics = ZipfSampler(len(_TOPICS), options.rag_zipf, self.rng)
        self.options = options

    def _post(self, path: str, body: dict[str, Any], name: str) -> dict[str, Any] | None:
        with self.client.post(path, json=body, headers=self.credential.headers, name=name,
                              catch_response=True) as response:
            TALLY.record(name, response.headers)
            if response.status_code != 200:
                response.failure(failure_text(response.status_code, response.text))
                return None
            try:
                data: dict[str, Any] = response.json()
            except ValueError:
                response.failure("answer is not JSON")
                return None
            return data

    def _stream_chat(self, body: dict[str, Any], name: str) -> str | None:
        with self.client.post("/v1/chat/completions", json={**body, "stream": True}, headers=self.credential.headers,
                              name=name, catch_response=True, stream=True) as response:
            TALLY.record(name, response.headers)
            if response.status_code != 200:
                response.failure(failure_text(response.status_code, response.text))
                return None
            pieces: list[str] = []
            done = False
            for line in response.iter_lines(decode_unicode=True):
                if not line or not line.startswith("data: "):
                    continue
                payload = line[len("data: "):]
                if payload == "[DONE]":
                    done = True
                    break
                for choice in json.loads(payload).get("choices") or ():
                    pieces.append((choice.get("delta") or {}).get("content") or "")
            if not done:
                response.failure("stream ended without [DONE]")
                return None
            return "".join(pieces)

    def _chat(self, messages: list[dict[str, str]], name: str, stream: bool) -> str | None:
        body = {"model": self.options.rag_model, "messages": messages, "temperature": 0, "max_tokens": 48}
        if stream:
            return self._stream_chat(body, name)
        data = self._post("/v1/chat/completions", body, name)
        if data is None:
            return None
        return str(data["choices"][0]["message"]["content"])

    @task
    def rag_turn(self) -> None:
        topic = _TOPICS[self.topics.sample()]
        question = phrase(topic.question, self.rng, self.options.rag_paraphrase_share)
        # A paraphrase is embedded together with its question's usual phrasing and searched near the latter's
        # vector (see rag_users.paraphrase_vector: the fake LLM's embeddings are hashes, not semantics).
        texts = [question] if question == topic.question else [question, topic.question]
        embedded = self._post("/v1/embeddings", {"model": self.options.rag_model, "input": texts}, "embed")
        if embedded is None:
            return
        vectors = [item["embedding"] for item in sorted(embedded["data"], key=lambda item: item["index"])]
        vector = vectors[0] if len(vectors) == 1 else paraphrase_vector(vectors[1], question)
        search = {"vector": vector, "limit": self.options.rag_top_k, "with_payload": True}
        found = self._post(f"/collections/{self.options.rag_collection}/points/search", search, "search")
        if found is None:
            return
        passages = [str((point.get("payload") or {}).get("text", "")) for point in found["result"]]
        messages = rag_messages(question, passages)
        stream = self.rng.random() < self.options.rag_stream_share
        answer = self._chat(messages, "chat_stream" if stream else "chat", stream)
        if answer is None or self.rng.random() >= self.options.rag_followup_share:
            return
        follow_up = [*messages, {"role": "assistant", "content": answer},
                     {"role": "user", "content": self.rng.choice(FOLLOW_UPS)}]
        self._chat(follow_up, "chat_followup", stream=False)
