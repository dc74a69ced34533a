"""The requests ``ragproxy demo`` sends through the proxy, each printed with its cache status and whether the test
upstream was called, and the curl lines ``--serve`` suggests.

Each step states the status it expects; a step that gets another one is printed as such and makes the demo exit 1.
With ``auth.mode=keys`` the tour makes itself an API key (and, with credits on, tops it up) through the admin API
and prints the credits each request was charged.
"""

from __future__ import annotations

import asyncio
import shlex
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.assembly.config import Settings
from proxy.assembly.startup_report import http_url
from proxy.cache_tiers.semantic import SemanticCacheTier
from proxy.core.outcome import CacheStatus
from proxy.upstream.client import UpstreamClient
from upstream_doubles.request_log import RequestLog

MODEL = "demo-model"
COLLECTION = "demo"
QUESTION = "Who wrote the novel Pride and Prejudice?"
PARAPHRASE = "Tell me who wrote the novel Pride and Prejudice"
POINTS = [{"id": 1, "vector": [0.9, 0.1, 0.0, 0.0], "payload": {"text": "Jane Austen wrote Pride and Prejudice."}},
          {"id": 2, "vector": [0.1, 0.9, 0.0, 0.0], "payload": {"text": "Paris is the capital of France."}},
          {"id": 3, "vector": [0.0, 0.1, 0.9, 0.0], "payload": {"text": "Qdrant stores vectors."}}]
QUERY = [0.8, 0.2, 0.0, 0.0]
NEARBY = [0.8, 0.2, 0.002, 0.0]  # cosine distance about 3e-6 from QUERY: within the search cache's tolerance


class DemoAnswers:
    """What the test LLM answers in the demo (its ``answer``: a transcript in, text out): ``Demo answer #N to:
    <question>``, the question being the last user message and N counting the answers given, so that a cached
    answer shows which call produced it."""

    def __init__(self) -> None:
        self.given = 0

    def __call__(self, prompt: str) -> str:
        self.given += 1
        question = prompt.rsplit("\nuser: ", 1)[-1].removeprefix("user: ")
        return f"Demo answer #{self.given} to: {question}"


@dataclass(frozen=True)
class Step:
    what: str
    method: str
    path: str
    body: dict[str, Any]
    expect: CacheStatus | None  # the X-Cache-Status it should get; None: not cacheable (a write)


def chat(question: str) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": question}]}


def llm_steps(semantic: bool) -> list[Step]:
    ask = "/v1/chat/completions"
    steps = [Step(f'chat "{QUESTION}"', "POST", ask, chat(QUESTION), CacheStatus.MISS),
             Step("the same chat again", "POST", ask, chat(QUESTION), CacheStatus.HIT)]
    if semantic:
        steps.append(Step(f'a paraphrase: "{PARAPHRASE}"', "POST", ask, chat(PARAPHRASE), CacheStatus.SEMANTIC_HIT))
    return steps


def search(vector: list[float]) -> dict[str, Any]:
    return {"query": vector, "limit": 2, "with_payload": True}


def qdrant_steps() -> list[Step]:
    base = f"/collections/{COLLECTION}"
    query = f"{base}/points/query"
    return [Step(f"create collection {COLLECTION!r} (4 dimensions, cosine)", "PUT", base,
                 {"vectors": {"size": 4, "distance": "Cosine"}}, None),
            Step("upsert 3 points", "PUT", f"{base}/points?wait=true", {"points": POINTS}, None),
            Step(f"vector search {QUERY}", "POST", query, search(QUERY), CacheStatus.MISS),
            Step("the same search again", "POST", query, search(QUERY), CacheStatus.HIT),
            Step(f"a nearby vector {NEARBY}", "POST", query, search(NEARBY), CacheStatus.SEMANTIC_HIT)]


def gist(body: bytes) -> str:
    """What an answer says, in a few words: the chat answer's text, or the best search hit's payload."""
    try:
        data = orjson.loads(body)
        if "choices" in data:
            return repr(data["choices"][0]["message"]["content"])
        best = data["result"]["points"][0]
        return f"best point {best['id']} (score {best['score']:.4f}): {best['payload']['text']!r}"
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError) as exc:
        return f"(unexpected answer: {exc.__class__.__name__}) {body[:120]!r}"


class Tour:
    """Sends the steps through the proxy at ``settings.server`` and prints one line per step."""

    def __init__(self, settings: Settings, semantic: SemanticCacheTier | None, llm: RequestLog,
                 qdrant: RequestLog) -> None:
        """``llm``, ``qdrant``: what the test upstreams received (a step's upstream was called when a request to
        its path reached it)."""
        self.settings = settings
        self.semantic = semantic
        self.upstreams = {"/v1": llm, "/collections": qdrant}
        self.base = http_url(settings.server.host, settings.server.port)
        self.admin = http_url(settings.admin.host, settings.admin.port)
        token = settings.admin.token
        self.admin_headers = {"Authorization": f"Bearer {token.get_secret_value()}"} if token else {}
        self.api_key: str | None = None
        self.failures = 0
        self.width = max(len(step.what) for step in (*llm_steps(True), *qdrant_steps()))

    async def run(self, client: UpstreamClient, semantic_off: str) -> bool:
        """Every step (``semantic_off``: why there is no paraphrase step, when there is no semantic tier); True
        when each got the cache status it should."""
        if self.settings.auth.mode == "keys" and self.settings.admin.enabled:  # (without it: 401s, shown as such)
            await self._make_key(client)
        print("LLM requests (the test upstream answers 'Demo answer #N to: <question>'):")
        for step in llm_steps(self.semantic is not None):
            await self._send(client, step)
            if step.expect == CacheStatus.MISS and self.semantic is not None:
                await self._index_learned(self.semantic)
        if self.semantic is None:
            print(f"  (no paraphrase step: L2 semantic {semantic_off})")
        print("Qdrant requests (the search cache reuses results for equal or nearby query vectors):")
        for step in qdrant_steps():
            await self._send(client, step)
        return self.failures == 0

    async def _make_key(self, client: UpstreamClient) -> None:
        headers = {"Content-Type": "application/json", **self.admin_headers}
        made = await client.fetch("POST", f"{self.admin}/admin/keys", headers=headers,
                                  body=orjson.dumps({"user": "demo"}))
        self.api_key = made.json()["key"]
        if self.settings.credits.enabled:
            topped = await client.fetch("POST", f"{self.admin}/admin/credits/demo", headers=headers,
                                        body=orjson.dumps({"amount": 10}))
            if topped.status >= 400:
                raise RuntimeError(f"adding credits answered HTTP {topped.status}")
        topped_up = " (and 10 credits added)" if self.settings.credits.enabled else ""
        print(f"API key of user 'demo', made through the admin API{topped_up}: {self.api_key}")

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    async def _send(self, client: UpstreamClient, step: Step) -> None:
        upstream = next(log for prefix, log in self.upstreams.items() if step.path.startswith(prefix))
        path = step.path.partition("?")[0]
        before = _calls(upstream, path)
        response = await client.fetch(step.method, self.base + step.path, body=orjson.dumps(step.body),
                                      headers={"Content-Type": "application/json", **self.headers()})
        status = response.headers.get("X-Cache-Status", "-")
        tier = response.headers.get("X-Cache-Tier", "")
        charged = response.headers.get("X-Credits-Charged")
        code = response.status
        called = ("upstream called" if _calls(upstream, path) > before else "upstream not called") \
            if step.expect is not None else "forwarded"
        verdict = "" if step.expect in (None, status) else f"   <-- expected {step.expect}"
        if verdict or code >= 400:
            self.failures += 1
        shown = f"{status} {tier}".strip() if step.expect is not None else f"HTTP {code}"
        credits = f", {charged} credits" if charged else ""
        print(f"  {step.what:<{self.width}}  {shown:<23} {called}{credits}{verdict}")
        if step.expect is not None:
            print(f"      -> {gist(response.body)}")

    @staticmethod
    async def _index_learned(tier: SemanticCacheTier) -> None:
        """The semantic index learns a question just after its answer was sent; wait for that (a few ms)."""
        for _ in range(200):
            if await tier.semantic.store.count() > 0:
                return
            await asyncio.sleep(0.025)


def _calls(log: RequestLog, path: str) -> int:
    """Requests the upstream got for ``path``: a Qdrant collection's under whatever name the tenant's namespace gives
    it upstream (with a key, ``demo`` is ``ragproxy_t_<token>_demo`` there)."""
    if not path.startswith("/collections/"):
        return log.count(path)
    rest = path.split("/")[3:]
    return sum(1 for entry in log.entries
               if entry.path.startswith("/collections/") and entry.path.split("/")[3:] == rest)


def curl_lines(settings: Settings, api_key: str | None) -> list[str]:
    """Copy-paste commands against the running demo."""
    base = http_url(settings.server.host, settings.server.port)
    admin = http_url(settings.admin.host, settings.admin.port)
    auth = f" -H {shlex.quote('Authorization: Bearer ' + api_key)}" if api_key else ""
    admin_auth = " -H 'Authorization: Bearer <admin.token>'" if settings.admin.token else ""
    question = chat("What does ragproxy cache?")
    search = {"query": [0.0, 0.1, 0.9, 0.0], "limit": 1, "with_payload": True}
    json = " -H 'Content-Type: application/json'"
    lines = [
        "# ask twice: the first is a MISS, the second a HIT (look at X-Cache-Status)",
        f"curl -si -w '\\n' {base}/v1/chat/completions{json}{auth} -d {shlex.quote(orjson.dumps(question).decode())}",
        "# the same question streamed: the cached answer is replayed as server-sent events",
        f"curl -siN {base}/v1/chat/completions{json}{auth} "
        f"-d {shlex.quote(orjson.dumps({**question, 'stream': True}).decode())}",
        "# a vector search through the search cache (run it twice)",
        f"curl -si -w '\\n' {base}/collections/{COLLECTION}/points/query{json}{auth} "
        f"-d {shlex.quote(orjson.dumps(search).decode())}",
    ]
    if settings.admin.enabled:
        lines += ["# hit ratios per tier, then the dashboard in a browser",
                  f"curl -s -w '\\n'{admin_auth} {admin}/admin/stats", f"# {admin}/admin/ui"]
    return lines
