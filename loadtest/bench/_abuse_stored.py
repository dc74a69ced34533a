"""Stored objects (``bench abuse``): can another tenant reach a tenant's stored objects, and is a deleted stored
response ever served again?

Against replica A of the abuse run (shared mode, caching off) and a replica of its own with caching on (embedded):

* ``stored_object_cross_reads``: tenant A stores a response and a chat completion (``store: true``); tenant B reads,
  lists and deletes them by id — responses, chat completions, their messages, conversations and their items, files
  (each 2xx is a cross read);
* ``deleted_served``: rounds of a stored response created, then exact repeats racing its ``DELETE``; every repeat
  sent after the ``DELETE`` returned that is still a ``HIT`` is a deleted object served. That replica has credits
  off, so it has a fake LLM of its own: its calls once counted as the run's unbilled upstream calls (20 in a quick
  run: the 10 rounds' creates and first repeats after the ``DELETE``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx

from loadtest.bench._tally import CHAT, RESPONSES, Tally, chat, send
from loadtest.harness import keyed_replica, new_key
from upstream_doubles.llm_server import FakeLLM

TENANT = "stored-tenant"


async def cross_reads(url: str, owner: dict[str, str], other: dict[str, str], tally: Tally) -> dict[str, Any]:
    """Tenant B at tenant A's stored objects: the statuses, and the 2xx among them."""
    async with httpx.AsyncClient(base_url=url, timeout=60.0) as client:
        created = await send(client, tally, "stored_objects", "POST", RESPONSES, headers=owner,
                             json={"model": "fake-model", "store": True, "input": "A's stored question"})
        completion = await send(client, tally, "stored_objects", "POST", CHAT, headers=owner,
                                json={**chat("A's stored chat"), "store": True})
        response_id = created.json()["id"] if created is not None and created.is_success else "resp_unknown"
        chat_id = completion.json().get("id", "chatcmpl_unknown") if completion is not None and \
            completion.is_success else "chatcmpl_unknown"
        attempts = [("GET", f"{RESPONSES}/{response_id}"), ("DELETE", f"{RESPONSES}/{response_id}"),
                    ("GET", f"{RESPONSES}/{response_id}/input_items"), ("GET", CHAT), ("GET", f"{CHAT}/{chat_id}"),
                    ("GET", f"{CHAT}/{chat_id}/messages"), ("DELETE", f"{CHAT}/{chat_id}"),
                    ("POST", f"{CHAT}/{chat_id}"), ("GET", "/v1/conversations/conv_1"),
                    ("GET", "/v1/conversations/conv_1/items"), ("GET", "/v1/files"), ("GET", "/v1/files/file-1")]
        statuses: dict[str, int | None] = {}
        reads = 0
        for method, path in attempts:
            reply = await send(client, tally, "stored_objects", method, path, headers=other,
                               json={"metadata": {"x": "y"}} if method == "POST" else None)
            statuses[f"{method} {path.replace(response_id, '{A response}').replace(chat_id, '{A chat}')}"] = \
                reply.status_code if reply is not None else None
            reads += int(reply is not None and reply.is_success)
        continued = await send(client, tally, "stored_objects", "POST", RESPONSES, headers=other,
                               json={"model": "fake-model", "input": "go on", "previous_response_id": response_id})
        reads += int(continued is not None and continued.is_success)
    tally.cross_tenant_reads += reads
    return {"cross_reads": reads, "statuses": statuses}


async def deleted_served(data_dir: Path, tally: Tally, rounds: int) -> dict[str, Any]:
    """``rounds`` of create, then repeats racing a ``DELETE``, then repeats after it: the hits after it returned
    (a replica and a fake LLM of its own: credits are off there, so its calls stay out of the billing figures)."""
    served = 0
    with FakeLLM() as llm, keyed_replica(llm.url, data_dir, semantic=False) as (url, admin):
        headers = new_key(admin, "owner", TENANT)
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60.0) as client:
            for n in range(rounds):
                body = {"model": "fake-model", "input": f"stored question {n}"}
                created = await send(client, tally, "deleted_served", "POST", RESPONSES, json=body)
                if created is None or not created.is_success:
                    continue
                racing = [asyncio.ensure_future(send(client, tally, "deleted_served", "POST", RESPONSES, json=body))
                          for _ in range(4)]
                await send(client, tally, "deleted_served", "DELETE", f"{RESPONSES}/{created.json()['id']}")
                await asyncio.gather(*racing)
                for _ in range(3):
                    after = await send(client, tally, "deleted_served", "POST", RESPONSES, json=body)
                    served += int(after is not None and after.headers.get("X-Cache-Status") == "HIT"
                                  and after.json().get("id") == created.json()["id"])
                    await asyncio.sleep(0.05)
    return {"rounds": rounds, "served_after_delete": served}
