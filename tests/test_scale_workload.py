"""The scale benchmark's workload: real questions, a long-tail trace, and equal total memory in both setups."""

from __future__ import annotations

from loadtest.responses import load_questions
from loadtest.scale_workload import HEAD_HEAVY, Shape, build
from tests.support.nq_open import needs_nq_open
from tiers.entry import CachedResponse

pytestmark = needs_nq_open


def test_default_workload_is_every_nq_open_question_asked_with_a_long_tail() -> None:
    workload = build(Shape(), 3)
    real = {pair.question for pair in load_questions()}
    assert set(workload.questions) == real and len(workload.questions) == len(real)
    assert len(workload.trace) == len(real)
    assert 0.5 < workload.asked_once_share < 0.7, "most distinct questions are asked once (Zipf 0.7)"
    assert build(Shape(), 3).trace == workload.trace, "deterministic"


def test_both_setups_get_the_same_total_memory() -> None:
    workload = build(Shape(), 3)
    entries = [workload.entry(index) for index in workload.distinct_seen]
    assert workload.working_set_bytes == sum(len(e.response.encode()) for e in entries)
    total = 3 * workload.replica_bytes
    assert abs(total - workload.working_set_bytes * Shape.memory_share) <= 3
    assert 3 * workload.near_bytes + workload.redis_bytes == total
    assert workload.near_bytes == int(workload.replica_bytes * Shape.near_share)


def test_entries_look_like_the_proxys() -> None:
    workload = build(HEAD_HEAVY, 3)
    assert len(workload.questions) == 4000 and workload.questions[3610].endswith("(#1)")
    entry = workload.entry(0)
    assert CachedResponse.decode(entry.response.encode()).body.startswith(b'{"id":"chatcmpl-')
    assert entry.key.startswith("v1:t:anonymous:default:0:chat:") and "all" in entry.tags
    assert workload.entry(1).key != entry.key
    assert workload.replica_bytes == 64 * 1024 * 1024
