"""What the ``abuse`` benchmark counts: every request sent, how it ended, the charges it points at."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

CHAT, EMBEDDINGS, RESPONSES = "/v1/chat/completions", "/v1/embeddings", "/v1/responses"
ANSWER_TIMEOUT_S = 60.0
LEDGER_ID = "X-Credits-Request-ID"


@dataclass
class Tally:
    """Every request sent and how it ended, per scenario; the ledger ids of the 2xx answers, per Idempotency-Key."""

    statuses: dict[str, Counter[str]] = field(default_factory=dict)
    ledger_ids: list[str] = field(default_factory=list)
    keyed: dict[str, set[str]] = field(default_factory=dict)
    """Idempotency-Key → the ledger ids its 2xx answers carry: more than one is a key charged twice."""
    requests: int = 0
    unanswered: int = 0
    server_errors: int = 0
    cross_tenant_reads: int = 0

    def seen(self, scenario: str, response: httpx.Response | None, key: str | None = None) -> None:
        self.requests += 1
        status = "no answer" if response is None else str(response.status_code)
        self.statuses.setdefault(scenario, Counter())[status] += 1
        if response is None:
            self.unanswered += 1
        elif response.status_code >= 500:
            self.server_errors += 1
        elif response.is_success and LEDGER_ID in response.headers:
            self.ledger_ids.append(response.headers[LEDGER_ID])
            if key is not None:
                self.keyed.setdefault(key, set()).add(response.headers[LEDGER_ID])

    @property
    def double_charges(self) -> int:
        """Charges beyond the first of every Idempotency-Key."""
        return sum(len(ids) - 1 for ids in self.keyed.values())


async def send(client: httpx.AsyncClient, tally: Tally, scenario: str, method: str, url: str,
               key: str | None = None, **kwargs: Any) -> httpx.Response | None:
    """One request (with ``Idempotency-Key: key`` when given), counted; ``None`` when no answer came in time."""
    if key is not None:
        kwargs["headers"] = {**kwargs.get("headers", {}), "Idempotency-Key": key}
    try:
        response = await client.request(method, url, timeout=ANSWER_TIMEOUT_S, **kwargs)
    except httpx.HTTPError:
        response = None
    tally.seen(scenario, response, key)
    return response


def chat(question: str, **extra: Any) -> dict[str, Any]:
    return {"model": "fake-model", "max_tokens": 32, "messages": [{"role": "user", "content": question}], **extra}
