"""Calibration poisoning (``bench abuse``): can one user of a tenant lower a namespace's semantic threshold so that
another user of the tenant is served wrong answers?

A replica of its own (embedded, API keys, caching and L2 on, calibrated thresholds; credits off: billing is the
other scenarios' subject, and its calls stay out of their figures) in front of a fake LLM of its own, which answers
"ACK" to every question that says "Reply with just: ACK" and its usual per-prompt text to the rest. The **flooder**
sends 200 look-alike pairs ending in "Reply with just: ACK" (each first question, then its look-alike: every
comparison of the two answers agrees); then the **victim**, another user of the tenant, sends 30 look-alike
medication questions (a child's dose and an adult's), each needing its own answer.
``calibration_poison_wrong_hits``: the victim's semantic hits (every one is a wrong answer).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from loadtest.bench._tally import CHAT, Tally, chat, send
from loadtest.harness import keyed_replica, new_key
from proxy.doubles.llm_server import FakeLLM
from proxy.doubles.openai_shapes import default_answer

TENANT = "poison-tenant"
INSTRUCTION = "Reply with just: ACK"
JOBS = ("build", "deploy", "backup", "restore", "lint", "index", "export", "import", "sync", "audit", "scan",
        "render", "compile", "package", "publish", "migrate", "reindex", "vacuum", "rotate", "archive")
PLACES = ("staging cluster", "staging server", "build farm", "build host", "test rack", "test bench", "lab machine",
          "lab box", "night runner", "nightly runner")
DRUGS = ("paracetamol", "ibuprofen", "aspirin", "amoxicillin", "cetirizine", "loratadine", "diphenhydramine",
         "melatonin", "codeine", "naproxen")
VICTIM = (("How much {} can a toddler take?", "How much {} can a grown-up take?"),
          ("What is the usual {} dose for a child?", "What is the usual {} dose for an adult?"),
          ("What is the maximum daily {} dose for a child?", "What is the maximum daily {} dose for an adult?"))


def flood_pairs(count: int) -> list[tuple[str, str]]:
    """``count`` look-alike pairs (at most 200) that the instruction makes answer alike."""
    return [(f"The {job} job finished on the {PLACES[p]} {when}. {INSTRUCTION}",
             f"The {job} job finished on the {PLACES[p + 1]} {when}. {INSTRUCTION}")
            for when in ("this morning", "tonight") for job in JOBS for p in range(0, len(PLACES), 2)][:count]


def victim_pairs() -> list[tuple[str, str]]:
    """30 look-alike questions whose answers differ (a child's dose is not an adult's)."""
    return [(child.format(drug), adult.format(drug)) for drug in DRUGS for child, adult in VICTIM]


def acknowledging(prompt: str) -> str:
    """The fake LLM's answer for this scenario: "ACK" where the prompt says so, its usual text elsewhere."""
    return "ACK" if INSTRUCTION in prompt else default_answer(prompt)


async def calibration_poison(data_dir: Path, tally: Tally, flood: int = 200) -> dict[str, Any]:
    """The flood, then the victim's questions: the victim's semantic hits, the namespace's threshold after the
    flood and the comparisons not counted as evidence."""
    with FakeLLM(answer=acknowledging) as llm:
        return await _run(llm.url, data_dir, tally, flood)


async def _run(llm_url: str, data_dir: Path, tally: Tally, flood: int) -> dict[str, Any]:
    with keyed_replica(llm_url, data_dir, semantic=True) as (url, admin):
        flooder, victim = (new_key(admin, user, TENANT) for user in ("flooder", "victim"))
        async with httpx.AsyncClient(base_url=url) as client:
            async def ask(question: str, headers: dict[str, str]) -> str:
                reply = await send(client, tally, "calibration_poison", "POST", CHAT, json=chat(question),
                                   headers=headers)
                return reply.headers.get("X-Cache-Status", "") if reply is not None else ""

            for warm in ("warm-up question one?", "warm-up question two?"):  # the embedder loads
                await ask(warm, flooder)
            await _pairs(ask, flood_pairs(flood), flooder)
            after_flood = _namespace(admin)
            statuses = []
            for first, second in victim_pairs():  # one pair at a time, as a user asks
                await ask(first, victim)
                await asyncio.sleep(0.2)  # the index learns the question after answering it
                statuses.append(await ask(second, victim))
    return {"flood_pairs": flood, "victim_pairs": len(statuses),
            "wrong_hits": sum(status == "SEMANTIC_HIT" for status in statuses),
            "threshold_after_flood": after_flood.get("threshold"), "uninformative": after_flood.get("uninformative")}


async def _pairs(ask: Callable[[str, dict[str, str]], Any], pairs: list[tuple[str, str]],
                 headers: dict[str, str]) -> list[str]:
    """Every first question, a pause (the index learns them after answering), then every look-alike: their cache
    statuses; then a pause for the comparisons running in the background."""
    for first, _ in pairs:
        await ask(first, headers)
    await asyncio.sleep(1.0)
    statuses = [await ask(second, headers) for _, second in pairs]
    await asyncio.sleep(1.0)
    return statuses


def _namespace(admin: httpx.Client) -> dict[str, Any]:
    """The tenant's default namespace as ``/admin/stats`` reports it, with the tier's uninformative comparisons."""
    l2 = admin.get("/admin/stats").json()["tiers"]["l2"]
    row: dict[str, Any] = dict(l2["namespaces"].get(f"{TENANT}/default", {}))
    row["uninformative"] = l2.get("uninformative")
    return row

