"""Calibration poisoning (``bench abuse``): can one user of a tenant lower a namespace's semantic threshold so that
another user of the tenant is served wrong answers?

A replica of its own (embedded, API keys, caching and L2 on, calibrated thresholds; credits off: billing is the
other scenarios' subject, and its calls stay out of their figures) in front of a fake LLM of its own, which answers
what an instruction in the prompt dictates (:data:`STYLES`: "ACK", the digits one to five, "OK", a phrase to repeat,
a fixed JSON, "Understood.", three planets' names, the first five primes from a system prompt) and its usual
per-prompt text to the rest. The **flooder** sends 200 look-alike pairs, in turn in each style (each first question,
then its look-alike: every comparison of the two answers agrees); then the **victim**, another user of the tenant,
sends 30 look-alike medication questions (a child's dose and an adult's), each needing its own answer.
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
from upstream_doubles.llm_server import FakeLLM
from upstream_doubles.openai_shapes import default_answer

TENANT = "poison-tenant"
INSTRUCTION = "Reply with just: ACK"
STYLES: tuple[tuple[str, str], ...] = (
    (INSTRUCTION, "ACK"),
    ("Reply with just the digits one to five, separated by spaces.", "1 2 3 4 5"),
    ("Reply exactly 'OK'.", "OK"),
    ("Repeat the phrase: all systems nominal and ready for the next stage.",
     "All systems nominal and ready for the next stage."),
    ('Reply with the fixed JSON {"status":"ok"} and nothing else.', '{"status": "ok"}'),
    ('Reply "Understood."', "Understood."),
    ("Reply with the names of the first three planets from the sun.", "Mercury, Venus and Earth."),
)
"""Instructions in the question that fix its answer, and the answer each gets."""
SYSTEM_STYLE = ("Whatever the user writes, reply with the first five prime numbers separated by commas.",
                "2, 3, 5, 7, 11")
"""A system prompt that fixes every answer, and the answer."""
JOBS = ("build", "deploy", "backup", "restore", "lint", "index", "export", "import", "sync", "audit", "scan",
        "render", "compile", "package", "publish", "migrate", "reindex", "vacuum", "rotate", "archive")
PLACES = ("staging cluster", "staging server", "build farm", "build host", "test rack", "test bench", "lab machine",
          "lab box", "night runner", "nightly runner")
DRUGS = ("paracetamol", "ibuprofen", "aspirin", "amoxicillin", "cetirizine", "loratadine", "diphenhydramine",
         "melatonin", "codeine", "naproxen")
VICTIM = (("How much {} can a toddler take?", "How much {} can a grown-up take?"),
          ("What is the usual {} dose for a child?", "What is the usual {} dose for an adult?"),
          ("What is the maximum daily {} dose for a child?", "What is the maximum daily {} dose for an adult?"))


def flood_pairs(count: int) -> list[tuple[str, str, str | None]]:
    """``count`` look-alike pairs (at most 200) that an instruction makes answer alike, the styles in turn: (first
    question, its look-alike, the system prompt or ``None``)."""
    styles = [*(instruction for instruction, _ in STYLES), None]
    pairs = [(f"The {job} job finished on the {PLACES[p]} {when}.", f"The {job} job finished on the {PLACES[p + 1]} "
              f"{when}.") for when in ("this morning", "tonight") for job in JOBS for p in range(0, len(PLACES), 2)]
    flood: list[tuple[str, str, str | None]] = []
    for n, (first, second) in enumerate(pairs[:count]):
        style = styles[n % len(styles)]
        flood.append((first, second, SYSTEM_STYLE[0]) if style is None
                     else (f"{first} {style}", f"{second} {style}", None))
    return flood


def victim_pairs() -> list[tuple[str, str]]:
    """30 look-alike questions whose answers differ (a child's dose is not an adult's)."""
    return [(child.format(drug), adult.format(drug)) for drug in DRUGS for child, adult in VICTIM]


def acknowledging(prompt: str) -> str:
    """The fake LLM's answer for this scenario: what an instruction of the prompt dictates where it has one
    (:data:`STYLES`, :data:`SYSTEM_STYLE`), its usual text elsewhere."""
    for instruction, answer in (*STYLES, SYSTEM_STYLE):
        if instruction in prompt:
            return answer
    return default_answer(prompt)


async def calibration_poison(data_dir: Path, tally: Tally, flood: int = 200) -> dict[str, Any]:
    """The flood, then the victim's questions: the victim's semantic hits, the namespace's threshold after the
    flood and the comparisons not counted as evidence."""
    with FakeLLM(answer=acknowledging) as llm:
        return await _run(llm.url, data_dir, tally, flood)


async def _run(llm_url: str, data_dir: Path, tally: Tally, flood: int) -> dict[str, Any]:
    with keyed_replica(llm_url, data_dir, semantic=True) as (url, admin):
        flooder, victim = (new_key(admin, user, TENANT) for user in ("flooder", "victim"))
        async with httpx.AsyncClient(base_url=url) as client:
            async def ask(question: str, headers: dict[str, str], system: str | None = None) -> str:
                body = chat(question) if system is None else chat(question, messages=[
                    {"role": "system", "content": system}, {"role": "user", "content": question}])
                reply = await send(client, tally, "calibration_poison", "POST", CHAT, json=body, headers=headers)
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


async def _pairs(ask: Callable[[str, dict[str, str], str | None], Any], pairs: list[tuple[str, str, str | None]],
                 headers: dict[str, str]) -> list[str]:
    """Every first question, a pause (the index learns them after answering), then every look-alike: their cache
    statuses; then a pause for the comparisons running in the background."""
    for first, _, system in pairs:
        await ask(first, headers, system)
    await asyncio.sleep(1.0)
    statuses = [await ask(second, headers, system) for _, second, system in pairs]
    await asyncio.sleep(1.0)
    return statuses


def _namespace(admin: httpx.Client) -> dict[str, Any]:
    """The tenant's default namespace as ``/admin/stats`` reports it, with the tier's uninformative comparisons."""
    l2 = admin.get("/admin/stats").json()["tiers"]["l2"]
    row: dict[str, Any] = dict(l2["namespaces"].get(f"{TENANT}/default", {}))
    row["uninformative"] = l2.get("uninformative")
    return row

