"""The body attacks of ``bench abuse``, derived from the rows (:mod:`._abuse_rows`): every row that takes a body,
sent by tenant B with each content type (JSON, text, a form, none) and each body a lenient parser reads otherwise
than a strict one (``NaN``, a lone surrogate, a repeated key whose first value is tenant A's); a row whose body may
name stored objects carries tenant A's (``previous_response_id``, an ``item_reference`` to A's output item, a
reasoning item given by A's id). Findings: ``cross_tenant_reads`` (answered 2xx after the upstream read A's),
``unparsed_bodies_forwarded`` (over the whole run's upstream log), and ``background_unbilled``: ``background``
responses the upstream ran (their usage comes back only through a later, unbilled ``GET``).
"""

from __future__ import annotations

from typing import Any

import orjson

from loadtest.bench._abuse_rows import Attack, Findings, Row, Victim, run

CONTENT_TYPES = ("application/json", "text/plain", "application/x-www-form-urlencoded", None)


def _with(body: bytes, extra: bytes) -> bytes:
    """``body`` (a JSON object) with ``extra`` members written after its own."""
    return body[:-1] + b"," + extra + b"}"


def variants(row: Row, own: str, victim: Victim) -> dict[str, bytes]:
    """The bodies sent on ``row``, by name."""
    assert row.body is not None
    sent = orjson.dumps({**row.body, "previous_response_id": victim.response} if row.refers else row.body)
    found = {"json": sent, "nan": _with(sent, b'"temperature": NaN'),
             "lone_surrogate": _with(sent, b'"user": "\\ud800"')}
    if row.refers:  # the lenient parser keeps A's, the strict one B's own
        found["repeated_key"] = _with(orjson.dumps(row.body), b'"previous_response_id": "' + victim.response.encode()
                                      + b'", "previous_response_id": "' + own.encode() + b'"')
        for name, item in (("item_reference", {"type": "item_reference", "id": victim.items[0]}),
                           ("reasoning_by_id", {"type": "reasoning", "id": victim.items[0], "summary": []})):
            found[name] = orjson.dumps({**row.body, "input": [item, {"role": "user", "content": "go on"}]})
        if row.method == "POST" and row.route == "responses":
            found["background"] = orjson.dumps({**row.body, "store": True, "background": True})
    else:
        found["repeated_key"] = _with(sent, b'"model": "' + str(row.body.get("model")).encode() + b'"')
    return found


async def body_attacks(url: str, rows: list[Row], auth: dict[str, dict[str, str]], own: str, victim: Victim,
                       log: Any, tally: Any) -> dict[str, Any]:
    findings = Findings()
    sent = [(name, Attack("body", "other", row.method, row.path(own), body=body, content_type=content_type))
            for row in rows if row.body is not None for name, body in variants(row, own, victim).items()
            for content_type in CONTENT_TYPES]
    answered = await run(url, [attack for _, attack in sent], auth, log, victim, findings, tally, concurrency=1)
    statuses = {attack.request_id: status for attack, status in answered}
    background = sum(1 for name, attack in sent if name == "background"
                     and (status := statuses[attack.request_id]) is not None and 200 <= status < 300)
    return {**findings.as_dict(), "background_unbilled": background}
