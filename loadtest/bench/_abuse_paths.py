"""The ``path_bypass`` attack of ``bench abuse``: the LLM APIs' paths with every trick that some server resolves
(dot segments, repeated slashes, encoded dots and slashes), sent as a user without credits and, against another
tenant's stored response, as tenant B. A trick that is answered 2xx or reaches an upstream is a bypass.

Requests go out over raw sockets: httpx would resolve the dot segments itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson

from loadtest.bench._tally import CHAT, EMBEDDINGS, RESPONSES, Tally, chat


def tricks(path: str) -> list[str]:
    """``path`` as servers that resolve dot segments, merge slashes or decode ``%2e``/``%2f`` would read it."""
    head, _, rest = path[1:].partition("/")
    first, tail = "/" + head, "/" + rest if rest else ""
    return [f"{first}/.{tail}", f"{first}/x/..{tail}", f"{first}/%2e{tail}", f"{first}/x/%2E%2e{tail}",
            f"{first}//{rest}", f"/{path}", f"{first}%2f{rest}", f"{first}%5c{rest}", f"{first}\\{rest}"]


async def raw_request(url: str, method: str, target: str, headers: dict[str, str], body: bytes) -> int | None:
    """Send one request with ``target`` exactly as written; its status, ``None`` without an answer in 60 s."""
    parts = urlsplit(url)
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(parts.hostname, parts.port), 10.0)
    except (OSError, TimeoutError):
        return None
    try:
        head = [f"{method} {target} HTTP/1.1", f"Host: {parts.netloc}", "Connection: close",
                "Content-Type: application/json", f"Content-Length: {len(body)}",
                *(f"{name}: {value}" for name, value in headers.items())]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), 60.0)
        return int(status_line.split()[1]) if status_line.startswith(b"HTTP/1.") else None
    except (OSError, TimeoutError, ValueError, IndexError):
        return None
    finally:
        writer.close()


async def path_bypass(url: str, broke: dict[str, str], owner: dict[str, str], other: dict[str, str], tally: Tally,
                      upstream_requests: Callable[[], int]) -> dict[str, Any]:
    """Every trick on chat, embeddings and Responses as a user with no credits, and on ``GET``/``DELETE`` of the
    owner's stored response as another tenant; counts those answered 2xx or forwarded (``upstream_requests``:
    the upstream's count of requests other than its health probes)."""
    bodies = {CHAT: orjson.dumps(chat("free answer?")), RESPONSES: orjson.dumps({"model": "fake-model", "input": "x"}),
              EMBEDDINGS: orjson.dumps({"model": "fake-model", "input": [f"item {n}" for n in range(5000)]})}
    created = await raw_json(url, RESPONSES, owner, {"model": "fake-model", "store": True, "input": "A's question"})
    attempts: list[tuple[str, str, dict[str, str], bytes]] = [
        ("POST", target, broke, body) for path, body in bodies.items() for target in tricks(path)]
    if created is not None:
        stored = f"{RESPONSES}/{created}"
        attempts += [(method, target, other, b"") for method in ("GET", "DELETE") for target in tricks(stored)]
    bypasses, statuses = 0, dict[str, int]()
    for method, target, headers, body in attempts:
        before = upstream_requests()
        status = await raw_request(url, method, target, headers, body)
        tally.requests += 1
        tally.unanswered += int(status is None)
        tally.server_errors += int(status is not None and status >= 500)
        reached = upstream_requests() > before
        bypasses += int(reached or (status is not None and 200 <= status < 300))
        statuses[str(status)] = statuses.get(str(status), 0) + 1
    return {"tried": len(attempts), "bypasses": bypasses, "statuses": statuses,
            "stored_response_created": created is not None}


async def raw_json(url: str, path: str, headers: dict[str, str], body: dict[str, Any]) -> str | None:
    """POST ``body`` to ``path`` (no tricks); the answer's ``id``, ``None`` if it failed."""
    async with httpx.AsyncClient(headers=headers, timeout=60.0) as client:
        try:
            response = await client.post(url + path, json=body)
        except httpx.HTTPError:
            return None
    return str(response.json()["id"]) if response.is_success else None
