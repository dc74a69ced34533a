"""The header attacks of ``bench abuse``, derived from the rows (:mod:`._abuse_rows`): every served path, sent as it
should be by tenant B (on B's own stored response where the row names one), with each header that rewrites a
request on servers that honour it, or claims an address or a host (:func:`header_sets`): towards tenant A's stored
response (``cross_tenant_reads``, ``cross_tenant_deletes``), towards a model run (an unbilled upstream call), or
only to be forwarded (``forwarded_override_headers``, counted over the whole run's upstream log). Sent one at a
time, the deleting ones last, so that one attack's effect never hides another's.
"""

from __future__ import annotations

from typing import Any

from loadtest.bench._abuse_rows import Attack, Findings, Row, Victim, json_bytes, run

CHAT = "/v1/chat/completions"


def header_sets(victim: Victim) -> list[dict[str, str]]:
    """The headers of each attack, the ones that would delete last."""
    theirs = f"/v1/responses/{victim.response}"
    return [{"X-Original-URL": theirs}, {"X-Rewrite-URL": theirs}, {"X-Original-URL": CHAT},
            {"X-Rewrite-URL": CHAT}, {"X-HTTP-Method-Override": "GET"}, {"X-Real-IP": "10.0.0.1"},
            {"X-Forwarded-Prefix": "/internal"}, {"X-Forwarded-Host": "evil.example"},
            {"Forwarded": "for=10.0.0.1;host=evil.example"}, {"Host": "evil.example"},
            {"Idempotency-Key": "one-key-for-every-tenant"}, {"X-Method-Override": "PATCH"},
            {"X-HTTP-Method": "PUT"}, {"X-Original-URL": theirs, "X-HTTP-Method-Override": "DELETE"},
            {"X-Rewrite-URL": theirs, "X-Method-Override": "DELETE"}]


def attacks(rows: list[Row], own: str, victim: Victim) -> list[Attack]:
    """Every row with every header set, as tenant B (grouped by header set, so the deleting ones come last)."""
    return [Attack("header", "other", row.method, row.path(own), headers, json_bytes(row.body))
            for headers in header_sets(victim) for row in rows]


async def header_attacks(url: str, rows: list[Row], auth: dict[str, dict[str, str]], own: str, victim: Victim,
                         log: Any, tally: Any) -> dict[str, Any]:
    findings = Findings()
    await run(url, attacks(rows, own, victim), auth, log, victim, findings, tally, concurrency=1)
    return findings.as_dict()
