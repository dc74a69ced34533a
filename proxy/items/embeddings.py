"""Per-item caching of ``/v1/embeddings``: a batch with some cached inputs forwards only the missing ones.

Each input item has its own exact key (model, dimensions, the item, the request's variant: query string and keyed
headers; the encoding format is not part of it because the vector is stored raw, as little-endian float32, and
rendered as the client asked: a float list or base64). The
answer is assembled in the original order with the original indices. Keys live in the request's scope
(:meth:`~proxy.answers.cache_policy.Canonicalize.scope`: tenant, namespace, knowledge version, and the user in a
private namespace or for ``Cache-Control: private``).

Usage: an item's stored token count is its share of the upstream batch's ``prompt_tokens`` (split by input length;
exact when it was forwarded alone). A partly cached batch reports the upstream usage plus the stored counts of the
cached items, so ``usage`` stays the cost of the whole batch.

The answer keeps the upstream's shape: each item's fields the proxy does not know (an item's ``encoding_format``
then names the encoding the client asked for) and the answer's own (vLLM's ``id`` and ``created``, the other
``usage`` fields) are stored with the items and answered on hits.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import orjson
from multidict import CIMultiDict

from normalizer.bypass import bypass_reason
from normalizer.canonical import canonical_embedding_items, embedding_inputs
from normalizer.canonical_json import CanonicalizationError
from proxy.answers.replies import entry_tags
from proxy.core.context import Reply, RequestContext
from proxy.core.outcome import CacheStatus, Matched, Outcome
from proxy.core.pipeline import Next
from proxy.items.cache import ItemsCache
from tiers.entry import CachedResponse


def _vector(item: dict[str, Any]) -> bytes:
    embedding = item["embedding"]
    if isinstance(embedding, str):
        return base64.b64decode(embedding)
    return np.asarray(embedding, dtype="<f4").tobytes()


def _render(vector: bytes, encoding: str) -> Any:
    if encoding == "base64":
        return base64.b64encode(vector).decode()
    return np.frombuffer(vector, dtype="<f4").tolist()


_ITEM = {"object": "embedding", "index": None, "embedding": None}


def _item(entry: CachedResponse, index: int, encoding: str) -> dict[str, Any]:
    """One item of the answer, in the field order and with the extra fields the upstream sent it."""
    shape = entry.meta.get("item") or _ITEM
    rendered = {"index": index, "embedding": _render(entry.body, encoding), "encoding_format": encoding}
    return {key: rendered.get(key, value) for key, value in shape.items()}


def _usage(envelope: dict[str, Any], tokens: int) -> dict[str, Any]:
    usage = envelope.get("usage")
    return {**(usage if isinstance(usage, dict) else {}), "prompt_tokens": tokens, "total_tokens": tokens}


class EmbeddingItemsCache(ItemsCache):
    """Serve cached items, forward the missing ones in one upstream call, store them, assemble in order."""

    name = "embedding_items"
    gives = frozenset({"user_scope", "key_scope", "key_variant", "outcome"})

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        body = ctx.body or {}
        policy = ctx.cache_policy
        if policy is None:
            return await self.bypassed(ctx, None, call_next)
        reason = bypass_reason(body, self.bypass, rules=self.endpoint.rules, namespace=ctx.namespace)
        if reason is not None:
            return await self.bypassed(ctx, reason, call_next)
        try:
            inputs = embedding_inputs(body)
            keys = await self.keys(ctx, canonical_embedding_items({**body, "encoding_format": "float"}))
        except CanonicalizationError as exc:
            return await self.bypassed(ctx, f"not canonicalizable: {exc}", call_next)
        found = await self.lookup(keys, policy)
        missing = [i for i, entry in enumerate(found) if entry is None]
        encoding = body.get("encoding_format") or "float"
        model = body.get("model")
        upstream_usage = 0
        upstream_reply: Reply | None = None
        envelope: dict[str, Any] = {"object": "list", "data": None, "model": model}
        if missing:
            asked = [inputs[i] for i in missing]
            ctx.patch("embedding_items.missing",
                      lambda sent: {**sent, "input": asked, "encoding_format": "base64"})
            reply = upstream_reply = await call_next(ctx)
            if reply.status != 200 or reply.body is None:
                return reply
            answer = orjson.loads(reply.body)
            data = sorted(answer.get("data") or [], key=lambda item: item.get("index", 0))
            if len(data) != len(missing):
                return reply
            model = answer.get("model", model)
            envelope = {**answer, "data": None}
            upstream_usage = int((answer.get("usage") or {}).get("prompt_tokens") or 0)
            lengths = [max(1, len(str(inputs[i]))) for i in missing]
            total_length = sum(lengths)
            for position, i in enumerate(missing):
                tokens = round(upstream_usage * lengths[position] / total_length)
                item = {key: None if key in ("index", "embedding") else value
                        for key, value in data[position].items()}
                entry = CachedResponse(body=_vector(data[position]), kind="embedding",
                                       model=model if isinstance(model, str) else None,
                                       cost=(ctx.upstream_seconds or 1.0) / len(missing),
                                       meta={"tokens": tokens, "item": item, "envelope": envelope})
                found[i] = entry
                if policy.may_store and policy.ttl != 0:
                    await self.tier.put(keys[i], entry, ttl=policy.ttl, tags=entry_tags(ctx, entry.model))
        forwarded = set(missing)
        cached_tokens = sum(int(entry.meta.get("tokens", 0)) for i, entry in enumerate(found)
                            if entry is not None and i not in forwarded)
        if not missing and found and found[0] is not None:
            envelope = found[0].meta.get("envelope") or envelope
        result = {**envelope,
                  "data": [_item(entry, i, encoding) for i, entry in enumerate(found) if entry is not None],
                  "model": model, "usage": _usage(envelope, upstream_usage + cached_tokens)}
        hits = len(keys) - len(missing)
        status = CacheStatus.HIT if not missing else CacheStatus.MISS
        ctx.outcome = Outcome(status, self.tier.name, Matched.EXACT) if hits else Outcome(status)
        headers: CIMultiDict[str] = CIMultiDict({"Content-Type": "application/json",
                                                 "X-Cache-Hits": f"{hits}/{len(keys)}"})
        answer = Reply(status=200, headers=headers, body=orjson.dumps(result))
        return answer.take_over(upstream_reply) if upstream_reply is not None else answer
