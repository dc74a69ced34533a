"""The path attacks of ``bench abuse``, derived from the rows (:mod:`._abuse_rows`): every served path as a carrier,
followed by a climb back to the root spelled in each way some server resolves (:data:`CLIMBS`) and then another
row's path, so that a server reading the climb lands on that other row:

* as the user without credits, towards every row (``free_paths``: a model run, a count, a listing for nothing);
  every row is also sent as it is, plainly (a row without a price is a free path too);
* as tenant B, from B's own stored response towards every row that names a stored response, filled with tenant
  A's (``cross_tenant_reads``, ``cross_tenant_deletes``).

``path_bypass`` counts every path attack that reached the upstream or was answered 2xx.
"""

from __future__ import annotations

from typing import Any

from loadtest.bench._abuse_rows import Attack, Findings, Row, Victim, json_bytes, run

CLIMBS = {"plain": "..", "encoded": "%2e%2e", "double_encoded": "%252e%252e", "mixed": ".%252e",
          "semicolon": "..;", "overlong": "%c0%ae%c0%ae"}
"""``..`` as servers on the way may read it: as written, percent-encoded, encoded twice (decoded by a gateway and
again by a framework), half encoded, with a ``;`` path parameter (Tomcat, Spring), as an overlong UTF-8 sequence
(old Java and IIS decoders)."""
QUICK_CLIMBS = ("plain", "double_encoded", "semicolon", "overlong")


def climb(carrier: str, target: str, dots: str) -> str:
    """``carrier``, then ``dots`` once per segment of it, then ``target``: the root-relative ``target`` once
    resolved."""
    depth = len(carrier.strip("/").split("/"))
    return carrier + "/" + "/".join([dots] * depth) + target


def attacks(rows: list[Row], own: str, victim: Victim, quick: bool) -> list[Attack]:
    """Every row sent plainly and from every carrier with every climb (as the user without credits); every
    stored-response row reached with A's id from B's own (as tenant B)."""
    climbs = [CLIMBS[name] for name in (QUICK_CLIMBS if quick else CLIMBS)]
    carriers = list(dict.fromkeys(row.path() for row in rows))
    found = [Attack("path", "broke", row.method, row.path(), body=json_bytes(row.body)) for row in rows]
    found += [Attack("path", "broke", row.method, climb(carrier, row.path(), dots), body=json_bytes(row.body))
              for row in rows for carrier in carriers if carrier != row.path() for dots in climbs]
    own_carriers = list(dict.fromkeys(row.path(own) for row in rows if row.names_response))
    found += [Attack("path", "other", row.method, climb(carrier, row.path(victim.response), dots),
                     body=json_bytes(row.body))
              for row in rows if row.names_response for carrier in own_carriers for dots in climbs]
    return found


async def path_attacks(url: str, rows: list[Row], auth: dict[str, dict[str, str]], own: str, victim: Victim,
                       log: Any, tally: Any, quick: bool) -> dict[str, Any]:
    """Run :func:`attacks` against ``url``; the findings, and ``bypasses``: attacks that reached the upstream or
    were answered 2xx."""
    findings = Findings()
    sent = attacks(rows, own, victim, quick)
    plain = {(row.method, row.path()) for row in rows}
    answered = await run(url, sent, auth, log, victim, findings, tally)
    tricked = [(attack, status) for attack, status in answered if (attack.method, attack.target) not in plain]
    bypasses = sum(1 for attack, status in tricked
                   if log.with_request_id(attack.request_id) or (status is not None and 200 <= status < 300))
    return {**findings.as_dict(), "tricks": len(tricked), "bypasses": bypasses}
