"""What ``bench abuse`` attacks without a scenario of its own: every row the data plane serves
(:data:`proxy.core.endpoints.ROWS`, each at each of its paths) and every pattern of the LLM pass-through
(``upstreams.llm_passthrough``), read from the rows themselves, so a new row is attacked as soon as it exists.

A row's example request is derived from what it declares: its method, its path template (a stored response's id
filled with the one the attack needs), and a body of the shape its kind of API takes (:func:`example_body`). The
attacks (:mod:`._abuse_paths`, :mod:`._abuse_headers`, :mod:`._abuse_bodies`) each send their requests with an
``X-Request-ID`` of their own, and then read the upstream's log for that id: the upstream is a
:class:`~upstream_doubles.lenient_llm.LenientFakeLLM`, which reads a request the way common stacks do, so its log says
what a real upstream behind such a stack would have acted on. :func:`judge` turns that into findings:

* ``free_paths``: a request of the user without credits that reached the upstream, or was answered 2xx;
* ``cross_tenant_reads``: tenant B's request answered 2xx after the upstream acted on tenant A's stored response or
  items (its id in the path read, or its ``previous_response_id`` or an item reference in the body read);
* ``cross_tenant_deletes``: tenant B's request that made the upstream delete tenant A's stored response.

Two more are read from the whole log at the end of the run: ``forwarded_override_headers`` (upstream requests that
carry a header only a client could have written: :data:`OVERRIDE_HEADERS`) and ``unparsed_bodies_forwarded``
(upstream requests whose body the proxy's strict reader refuses, or that is not declared JSON).
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson

from normalizer.json_body import BodyProblem, read_body
from normalizer.paths import PathAllowList, PathTemplate
from proxy.core.endpoints import ROWS, Endpoint, RerankEndpoint, Resource
from upstream_doubles.lenient_llm import lenient_json
from upstream_doubles.request_log import LoggedRequest

MODEL = "fake-model"
OVERRIDE_HEADERS = ("X-Original-URL", "X-Rewrite-URL", "X-HTTP-Method-Override", "X-HTTP-Method",
                    "X-Method-Override", "X-Real-IP", "X-Forwarded-Prefix", "X-Forwarded-Host", "Forwarded",
                    "X-Original-Host", "Idempotency-Key")
"""Headers an upstream must never get from a client: they rewrite the request on servers that honour them, claim
an address or a host, or (``Idempotency-Key``) would be shared by every tenant under the proxy's key."""
_ids = itertools.count()


@dataclass(frozen=True)
class Row:
    """One served path of a row, as the attacks use it."""

    route: str
    method: str
    template: PathTemplate
    body: dict[str, Any] | None
    """An example body of the row's shape (``None``: it takes none)."""
    names_response: bool
    """Its path names a stored response."""
    refers: bool
    """Its body may name stored responses and items."""

    def path(self, response_id: str | None = None) -> str:
        return self.template.example({"response_id": response_id} if response_id else None)


def example_body(row: Endpoint | Resource) -> dict[str, Any] | None:
    """A body of the shape a row's kind of API takes."""
    if isinstance(row, Resource):
        return {"model": MODEL, "input": "count or compact this"} if row.body else None
    if isinstance(row, RerankEndpoint):
        return ({"model": "fake-reranker", "text_1": "q", "text_2": ["a passage"]} if row.score else
                {"model": "fake-reranker", "query": "q", "documents": ["a passage", "another"]})
    return {"chat": {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "free answer?"}]},
            "completion": {"model": MODEL, "max_tokens": 16, "prompt": "free answer?"},
            "response": {"model": MODEL, "max_output_tokens": 16, "store": False, "input": "free answer?"},
            "embedding": {"model": MODEL, "input": ["free vectors"]},
            }.get(row.kind, {"model": MODEL, "input": "x"})


def rows(passthrough: list[str]) -> list[Row]:
    """Every row at each of its paths, then each pass-through pattern (its ``*`` segments filled)."""
    served = [Row(row.route, row.method, template, example_body(row),
                  isinstance(row, Resource) and row.names is not None,
                  (isinstance(row, Resource) and row.refers) or (isinstance(row, Endpoint) and row.owned is not None))
              for row in ROWS for template in row.templates]
    allowed = [Row("llm_passthrough", "GET" if method == "*" else method, template, None, False, False)
               for method, template in PathAllowList(passthrough).patterns]
    return served + allowed


@dataclass(frozen=True)
class Victim:
    """Tenant A's stored objects: a response and its output items."""

    response: str
    items: tuple[str, ...]

    def named_in(self, entry: LoggedRequest) -> bool:
        """Whether the upstream acted on one of them in ``entry`` (as read: its path, or its body leniently)."""
        if self.response in entry.path or any(item in entry.path for item in self.items):
            return True
        try:
            body = lenient_json(entry.body) if entry.body else None
        except ValueError:
            return False
        if not isinstance(body, dict):
            return False
        named = {body.get("previous_response_id")}
        items = body.get("input")
        for item in items if isinstance(items, list) else ():
            if isinstance(item, dict):
                named.add(item.get("id"))
        return bool(named & {self.response, *self.items})


@dataclass
class Attack:
    """One request an attack sends as written (over a raw socket: a client library would clean it up)."""

    family: str
    user: str
    """``broke`` (no credits) or ``other`` (tenant B)."""
    method: str
    target: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    content_type: str | None = "application/json"
    request_id: str = field(default_factory=lambda: f"abuse-row-{next(_ids)}")


@dataclass
class Findings:
    """What an attack family found (see the module docstring)."""

    tried: int = 0
    free_paths: int = 0
    cross_tenant_reads: int = 0
    cross_tenant_deletes: int = 0
    reached_upstream: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"tried": self.tried, "free_paths": self.free_paths, "cross_tenant_reads": self.cross_tenant_reads,
                "cross_tenant_deletes": self.cross_tenant_deletes, "reached_upstream": self.reached_upstream,
                "statuses": dict(self.statuses), "examples": self.examples[:8]}


async def stored(url: str, headers: dict[str, str], question: str) -> Victim | None:
    """A new stored response of the user behind ``headers``, with its output items; ``None`` if it failed."""
    async with httpx.AsyncClient(headers=headers, timeout=60.0) as client:
        try:
            made = await client.post(url + "/v1/responses", json={"model": MODEL, "store": True, "input": question})
        except httpx.HTTPError:
            return None
    if not made.is_success:
        return None
    body = made.json()
    return Victim(body["id"], tuple(item["id"] for item in body["output"]))


async def send(url: str, attack: Attack, auth: dict[str, str]) -> int | None:
    """Send ``attack`` with ``target`` exactly as written; its status, ``None`` without an answer in 60 s."""
    parts = urlsplit(url)
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(parts.hostname, parts.port), 10.0)
    except (OSError, TimeoutError):
        return None
    try:
        headers = {"Host": parts.netloc, "Connection": "close", **auth, "X-Request-ID": attack.request_id,
                   **({"Content-Type": attack.content_type} if attack.content_type else {}), **attack.headers,
                   "Content-Length": str(len(attack.body))}
        head = [f"{attack.method} {attack.target} HTTP/1.1", *(f"{name}: {value}" for name, value in headers.items())]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + attack.body)
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), 60.0)
        return int(status_line.split()[1]) if status_line.startswith(b"HTTP/1.") else None
    except (OSError, TimeoutError, ValueError, IndexError):
        return None
    finally:
        writer.close()


def judge(findings: Findings, attack: Attack, status: int | None, entries: list[LoggedRequest],
          victim: Victim) -> None:
    """Count what ``attack`` got (``entries``: what the upstream acted on under its request id)."""
    findings.tried += 1
    findings.statuses[str(status)] += 1
    answered = status is not None and 200 <= status < 300
    findings.reached_upstream += int(bool(entries))
    found = []
    if attack.user == "broke" and (entries or answered):
        findings.free_paths += 1
        found.append("free")
    if attack.user == "other":
        acted = [entry for entry in entries if victim.named_in(entry)]
        if any(entry.method == "DELETE" for entry in acted):
            findings.cross_tenant_deletes += 1
            found.append("delete")
        elif acted and answered:
            findings.cross_tenant_reads += 1
            found.append("read")
    if found:
        seen = ", ".join(f"{entry.method} {entry.path}" for entry in entries) or "nothing upstream"
        findings.examples.append(f"{'/'.join(found)}: {attack.method} {attack.target} "
                                 f"{' '.join(attack.headers)} -> {status}; upstream read {seen}")


async def run(url: str, attacks: list[Attack], auth: dict[str, dict[str, str]], log: Any, victim: Victim,
              findings: Findings, tally: Any, concurrency: int = 8) -> list[tuple[Attack, int | None]]:
    """Send every attack (``auth``: headers per user), ``concurrency`` at a time, and judge each by the upstream's
    ``log`` (a :class:`~upstream_doubles.request_log.RequestLog`); each attack with its status."""
    gate = asyncio.Semaphore(concurrency)
    sent: list[tuple[Attack, int | None]] = []

    async def one(attack: Attack) -> None:
        async with gate:
            sent.append((attack, await send(url, attack, auth[attack.user])))

    await asyncio.gather(*(one(attack) for attack in attacks))
    await asyncio.sleep(0.2)  # what is still being logged upstream
    for attack, status in sent:
        tally.requests += 1
        tally.unanswered += int(status is None)
        tally.server_errors += int(status is not None and status >= 500)
        judge(findings, attack, status, log.with_request_id(attack.request_id), victim)
    return sent


def forwarded_override_headers(entries: list[LoggedRequest]) -> int:
    """Upstream requests carrying a header only a client could have written (:data:`OVERRIDE_HEADERS`)."""
    names = {name.lower() for name in OVERRIDE_HEADERS}
    return sum(1 for entry in entries if names & {name.lower() for name in entry.headers})


def unparsed_bodies_forwarded(entries: list[LoggedRequest]) -> int:
    """Upstream requests whose body is not declared JSON or is refused by the proxy's strict reader."""
    count = 0
    for entry in entries:
        if not entry.body:
            continue
        declared = entry.headers.get("Content-Type", "").partition(";")[0].strip().lower()
        try:
            read_body(entry.body)
        except BodyProblem:
            count += 1
            continue
        count += int(declared != "application/json")
    return count


def json_bytes(body: dict[str, Any] | None) -> bytes:
    return b"" if body is None else orjson.dumps(body)
