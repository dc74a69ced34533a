"""The header attacks of ``bench abuse``, derived from the rows (:mod:`._abuse_rows`): every served path, sent as it
should be by tenant B (on B's own stored response where the row names one), with each header that rewrites a
request on servers that honour it, or claims an address or a host (:func:`header_sets`): towards tenant A's stored
response (``cross_tenant_reads``, ``cross_tenant_deletes``), towards a model run (an unbilled upstream call), or
only to be forwarded (``forwarded_override_headers``, counted over the whole run's upstream log). Sent one at a
time, the deleting ones last, so that one attack's effect never hides another's.
"""

from __future__ import annotations

from typing import Any

from loadtest.bench._abuse_rows import Attack, Findings, Row, Victim, json_bytes, run, stored

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


def attacks(rows: list[Row], owns: list[str], victim: Victim) -> list[Attack]:
    """Every row with every header set, as tenant B, grouped by header set (the deleting ones come last); a row
    naming a stored response names the next of ``owns``."""
    fresh = iter(owns)
    return [Attack("header", "other", row.method, row.path(next(fresh) if row.names_response else None), headers,
                   json_bytes(row.body))
            for headers in header_sets(victim) for row in rows]


async def header_attacks(url: str, rows: list[Row], auth: dict[str, dict[str, str]], own: str, victim: Victim,
                         log: Any, tally: Any) -> dict[str, Any]:
    """Run :func:`attacks` against ``url`` (``own``: kept for the signature the attack families share; each attack
    gets a stored response of B's of its own)."""
    needed = len(header_sets(victim)) * sum(row.names_response for row in rows)
    owns = [made.response for n in range(needed)
            if (made := await stored(url, auth["other"], f"tenant B's response {n}")) is not None]
    if len(owns) < needed:
        return {"stored_responses_created": False}
    findings = Findings()
    await run(url, attacks(rows, owns, victim), auth, log, victim, findings, tally, concurrency=1)
    return findings.as_dict()
