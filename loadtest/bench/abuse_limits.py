"""Rate limits, budgets and key lifetimes: can a client get past its limits, spend another's allowance, or break the
admin inputs that set them? A scenario of ``bench abuse`` (16), and a benchmark of its own:
``python -m loadtest.bench abuse_limits [--json]`` (with a redis-server of its own).

Against two ``ragproxy serve`` replicas of their own on the run's Redis (shared mode, API keys, credits, caching on,
a fake LLM of their own so their upstream calls stay apart from the other scenarios'):

* **admin inputs**: limits, budgets, periods, expiry and names of the wrong types, sizes and signs, on key creation,
  ``PATCH /admin/keys/{id}`` and ``PUT``/``PATCH /admin/users|tenants/{name}``; each must be a 4xx
  (``limit_admin_inputs_accepted``: those answered 2xx);
* **request flood**: one key with ``rpm_limit`` L sends 4L concurrent copies of one question (a cache hit after the
  first: a hit is a request too) through both replicas, while a victim in the same tenant sends L of its own; and a
  user with a limit of its own floods through three keys. ``rate_limit_overshoot``: answers beyond what the limit
  allows in the flood's time (L plus what drained meanwhile), ``rate_limit_victim_refusals``: the victim's 429s,
  ``rate_limit_answers_without_headers``: 429s without ``Retry-After`` and ``x-ratelimit-*``;
* **token flood**: a key with a ``tpm_limit`` sends 8 concurrent requests each asking for a quarter of it (at most 3
  fit beside their prompts), and one asking for more than all of it (refused with ``x-should-retry: false``);
* **budget**: a key with a budget for a day spends it; every request after the one that spent it is refused
  (``budget_overshoot``: answers after a refusal);
* **expiry**: a key made to last one second, used after it (``expired_key_accepted``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from loadtest.bench._tally import CHAT, Tally, chat, send
from loadtest.bench.chaos import Redis
from loadtest.harness import free_port, ledger_charges, proxy_child

SCENARIO = "rate_limits"
USERS = ("limit-flooder", "limit-victim", "limit-user", "limit-tokens", "limit-budget", "limit-short")
"""The users the scenario makes keys for (their charges are in its own replicas' ledger)."""
LIMIT = 20
"""Requests per minute of the flooding key, the victim and the flooding user."""


def _env(llm_url: str, redis_url: str, data_dir: Path, admin_port: int) -> dict[str, str]:
    return {"RAGPROXY_ADMIN__PORT": str(admin_port), "RAGPROXY_UPSTREAMS__LLM": json.dumps([{"url": llm_url}]),
            "RAGPROXY_REDIS__URL": redis_url, "RAGPROXY_AUTH__MODE": "keys", "RAGPROXY_CREDITS__ENABLED": "true",
            "RAGPROXY_CACHE__ENABLED": "true", "RAGPROXY_CACHE__L2__ENABLED": "false",
            "RAGPROXY_AUTH__KEY_SYNC_S": "0.2", "RAGPROXY_DATA_DIR": str(data_dir),
            "RAGPROXY_LOGGING__FORMAT": "text"}


def bad_inputs(key_id: str) -> list[tuple[str, str, Any]]:
    """Admin calls that must be refused: ``(method, path, JSON body)``."""
    limits: list[dict[str, Any]] = [
        {"rpm_limit": 0}, {"rpm_limit": -1}, {"rpm_limit": "5"}, {"rpm_limit": 1.5}, {"rpm_limit": True},
        {"rpm_limit": 10**10}, {"rpm_limit": 2**64}, {"tpm_limit": 10**13}, {"tpm_limit": []},
        {"max_budget": "abc"}, {"max_budget": -1}, {"max_budget": 0}, {"max_budget": "NaN"},
        {"max_budget": "Infinity"}, {"max_budget": 10**10}, {"max_budget": "1e999999"}, {"max_budget": {}},
        {"budget_duration": "1y"}, {"budget_duration": "0d"}, {"budget_duration": ""},
        {"budget_duration": "1d; DROP TABLE"}, {"budget_duration": "99999d"}, {"budget_duration": 1},
        {"budget_duration": "1d"}, {"limits": {"rpm_limit": 1}}, {"rpm_limit": 1, "unknown": 1}]
    keys: list[dict[str, Any]] = [
        {"expires_at": -5}, {"expires_at": 1e20}, {"expires_at": "tomorrow"}, {"duration": "forever"},
        {"duration": "0s"}, {"expires_at": time.time() + 60, "duration": "1d"}, {"name": "n" * 10_000}]
    attempts: list[tuple[str, str, Any]] = [("POST", "/admin/keys", {"user": "limit-admin", "expires_at": 1.0})]
    for body in [*limits, *keys]:  # (a PATCH to a past expires_at is allowed: it ends a key)
        attempts.append(("POST", "/admin/keys", {"user": "limit-admin", **body}))
        attempts.append(("PATCH", f"/admin/keys/{key_id}", body))
    for body in limits:
        attempts += [("PUT", "/admin/users/limit-admin", body), ("PATCH", "/admin/tenants/limit-tenant", body)]
    attempts += [("PUT", "/admin/users/" + "u" * 201, {"rpm_limit": 1}), ("PATCH", "/admin/users/x", []),
                 ("PATCH", "/admin/users/x", "x"), ("PUT", "/admin/tenants/x", {"a": {"b": [[[[[]]]]]}}),
                 ("POST", "/admin/keys", {"user": "u" * 201}), ("PATCH", "/admin/keys/key_nope", {"rpm_limit": 1})]
    return attempts


async def _admin_attack(admin: httpx.AsyncClient, key_id: str, tally: Tally) -> dict[str, Any]:
    accepted: list[str] = []
    for method, path, body in bad_inputs(key_id):
        reply = await send(admin, tally, SCENARIO, method, path, json=body)
        if reply is not None and reply.is_success:
            accepted.append(f"{method} {path[:40]} {json.dumps(body)[:80]}")
    return {"sent": len(bad_inputs(key_id)), "accepted": accepted}


def _headers(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def _flood(clients: list[httpx.AsyncClient], keys: list[str], count: int, tally: Tally,
                 question: str) -> tuple[list[httpx.Response | None], float]:
    """``count`` concurrent copies of one question, spread over ``clients`` and ``keys``; their answers and how long
    the flood took."""
    started = time.monotonic()
    replies = await asyncio.gather(*(send(clients[n % len(clients)], tally, SCENARIO, "POST", CHAT,
                                          headers=_headers(keys[n % len(keys)]), json=chat(question))
                                     for n in range(count)))
    return list(replies), time.monotonic() - started


def _overshoot(replies: list[httpx.Response | None], seconds: float) -> int:
    """Answers beyond what a limit of :data:`LIMIT` per minute allows in ``seconds``."""
    allowed = LIMIT + math.ceil(seconds * LIMIT / 60)
    return max(0, sum(1 for r in replies if r is not None and r.is_success) - allowed)


def _without_headers(replies: list[httpx.Response | None]) -> int:
    return sum(1 for r in replies if r is not None and r.status_code == 429 and not (
        "Retry-After" in r.headers and "x-ratelimit-limit-requests" in r.headers))


async def rate_limits(work: Path, redis_url: str, tally: Tally) -> dict[str, Any]:
    """The scenario (see the module docstring)."""
    from upstream_doubles.llm_server import FakeLLM

    admin_port = free_port()
    with FakeLLM() as llm, proxy_child(_env(llm.url, redis_url, work / "a", admin_port)) as (url_a, _), \
            proxy_child(_env(llm.url, redis_url, work / "b", free_port())) as (url_b, _):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{admin_port}", timeout=60) as admin, \
                httpx.AsyncClient(base_url=url_a, timeout=60) as a, httpx.AsyncClient(base_url=url_b, timeout=60) as b:
            async def key(user: str, **limits: Any) -> dict[str, Any]:
                created = (await admin.post("/admin/keys", json={"user": user, "tenant": "limit-tenant",
                                                                 **limits})).json()
                await admin.post(f"/admin/credits/{user}", json={"amount": 1000, "tenant": "limit-tenant"})
                return dict(created)

            flooder, victim = await key("limit-flooder", rpm_limit=LIMIT), await key("limit-victim", rpm_limit=LIMIT)
            attack = await _admin_attack(admin, flooder["key_id"], tally)
            (flood, flood_s), (mine, _) = await asyncio.gather(
                _flood([a, b], [flooder["key"]], 4 * LIMIT, tally, "the same question, over and over"),
                _flood([b, a], [victim["key"]], LIMIT, tally, "the victim's own question"))
            user_keys = [(await key("limit-user"))["key"] for _ in range(3)]
            await admin.put("/admin/users/limit-user", json={"rpm_limit": LIMIT})
            await asyncio.sleep(0.6)  # the change feed
            across, across_s = await _flood([a, b], user_keys, 4 * LIMIT, tally, "one user, three keys")

            tokens_key = (await key("limit-tokens", tpm_limit=4000))["key"]
            llm.latency_s = 0.5  # all in flight together: none has settled its estimate yet
            token_flood = await asyncio.gather(*(send([a, b][n % 2], tally, SCENARIO, "POST", CHAT,
                                                      headers=_headers(tokens_key),
                                                      json=chat(f"tokens {n}", max_tokens=1000)) for n in range(8)))
            llm.latency_s = 0.0
            too_large = await send(b, tally, SCENARIO, "POST", CHAT, headers=_headers(tokens_key),
                                   json=chat("too large", max_tokens=5000))

            budget_key = (await key("limit-budget", max_budget="0.00002", budget_duration="1d"))["key"]
            budget_answers: list[int | None] = []
            for n in range(8):
                reply = await send([a, b][n % 2], tally, SCENARIO, "POST", CHAT, headers=_headers(budget_key),
                                   json=chat(f"spend {n}"))
                budget_answers.append(reply.status_code if reply is not None else None)
                await asyncio.sleep(0.2)  # the spend is counted once the answer settles
            refused_at = next((n for n, status in enumerate(budget_answers) if status == 429), len(budget_answers))

            short = (await key("limit-short", duration="1s"))["key"]
            await asyncio.sleep(1.5)
            expired = await send(a, tally, SCENARIO, "POST", CHAT, headers=_headers(short), json=chat("late"))
            charges = await asyncio.to_thread(_charges, admin_port)
    return {
        "charges": charges,
        "admin_inputs_sent": attack["sent"], "admin_inputs_accepted": attack["accepted"],
        "flood": {"sent": len(flood), "admitted": sum(1 for r in flood if r is not None and r.is_success),
                  "seconds": round(flood_s, 2), "limit_per_minute": LIMIT},
        "victim": {"sent": len(mine), "refused": sum(1 for r in mine if r is None or not r.is_success)},
        "user_across_keys": {"sent": len(across), "keys": len(user_keys),
                             "admitted": sum(1 for r in across if r is not None and r.is_success)},
        "overshoot": _overshoot(flood, flood_s) + _overshoot(across, across_s),
        "answers_without_headers": _without_headers(flood) + _without_headers(across),
        "token_flood": {"sent": len(token_flood), "tpm_limit": 4000, "max_tokens_each": 1000,
                        "admitted": sum(1 for r in token_flood if r is not None and r.is_success)},
        "too_large": {"status": too_large.status_code if too_large is not None else None,
                      "x_should_retry": too_large.headers.get("x-should-retry") if too_large is not None else None},
        "budget": budget_answers,
        "budget_overshoot": sum(1 for status in budget_answers[refused_at:] if status == 200),
        "expired_key_status": expired.status_code if expired is not None else None,
    }


def _charges(admin_port: int) -> list[dict[str, Any]]:
    """Every charge of the scenario's users, from its own replicas' ledger, once the last answers have settled."""
    time.sleep(1.0)
    with httpx.Client(base_url=f"http://127.0.0.1:{admin_port}", timeout=60) as admin:
        return [charge for user in USERS for charge in ledger_charges(admin, user)]


def figures(result: dict[str, Any]) -> dict[str, Any]:
    """The scenario's headline figures (each must be 0)."""
    return {"limit_admin_inputs_accepted": len(result["admin_inputs_accepted"]),
            "rate_limit_overshoot": result["overshoot"],
            "rate_limit_victim_refusals": result["victim"]["refused"],
            "rate_limit_answers_without_headers": result["answers_without_headers"],
            "budget_overshoot": result["budget_overshoot"],
            "expired_key_accepted": int(result["expired_key_status"] != 401)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench abuse_limits", description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    args = parser.parse_args(argv)
    if shutil.which("redis-server") is None:
        raise SystemExit("redis-server is not installed")
    work = Path(tempfile.mkdtemp(prefix="ragproxy-abuse-limits-"))
    (work / "redis").mkdir()
    redis, tally = Redis(work / "redis"), Tally()
    try:
        redis.start()
        result = asyncio.run(rate_limits(work, redis.url, tally))
    finally:
        redis.kill()
        shutil.rmtree(work, ignore_errors=True)
    charged = {str(charge["request_id"]) for charge in result.pop("charges")}
    summary = {**figures(result), "answers_without_charge": len(set(tally.ledger_ids) - charged),
               "server_errors": tally.server_errors, "unanswered_requests": tally.unanswered,
               "requests": tally.requests, "statuses": dict(tally.statuses[SCENARIO]), **result}
    for name, value in summary.items():
        print(f"{name:>36}: {json.dumps(value) if isinstance(value, dict | list) else value}")
    if args.json:
        print(json.dumps(summary))
    return 0
