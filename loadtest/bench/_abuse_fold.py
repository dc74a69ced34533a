"""Folding (``bench abuse``): can a variant that changes a question's meaning get another user's exact hit?

A replica of its own (embedded, API keys, exact cache on, L2 off so that only the exact key answers; credits off)
in front of a fake LLM of its own. For each pair of :data:`loadtest.fold_pairs.MEANING_CHANGES` one user of a
tenant asks the first question and another user the second: a ``HIT`` is a wrong answer (``fold_wrong_hits``).
For each pair of :data:`loadtest.fold_pairs.KEEPS_MEANING` the second should be a ``HIT``
(``fold_kept_hit_share``, 1.0 wanted).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from loadtest.bench._tally import CHAT, Tally, chat, send
from loadtest.fold_pairs import KEEPS_MEANING, MEANING_CHANGES
from loadtest.harness import keyed_replica, new_key
from upstream_doubles.llm_server import FakeLLM

TENANT = "fold-tenant"


async def fold_variants(data_dir: Path, tally: Tally) -> dict[str, Any]:
    """Both lists of pairs through the exact cache: the wrong hits and the share of kept-meaning hits."""
    with FakeLLM() as llm, keyed_replica(llm.url, data_dir, semantic=False) as (url, admin):
        first, second = (new_key(admin, user, TENANT) for user in ("asker", "other-user"))
        async with httpx.AsyncClient(base_url=url) as client:
            async def statuses(pairs: list[tuple[str, str]]) -> list[str]:
                seen = []
                for one, other in pairs:
                    await send(client, tally, "fold_variants", "POST", CHAT, json=chat(one), headers=first)
                    reply = await send(client, tally, "fold_variants", "POST", CHAT, json=chat(other),
                                       headers=second)
                    seen.append(reply.headers.get("X-Cache-Status", "") if reply is not None else "")
                return seen

            changed = await statuses(MEANING_CHANGES)
            kept = await statuses(KEEPS_MEANING)
    return {"meaning_changes": len(changed), "wrong_hits": changed.count("HIT"),
            "keeps_meaning": len(kept), "kept_hit_share": round(kept.count("HIT") / len(kept), 3)}

