"""The fidelity benchmark's parts: clusters, the cluster-answer upstream, the plain-cosine frontier."""

from __future__ import annotations

import numpy as np
import openai
import pytest
from aiohttp.test_utils import TestServer

from loadtest.bench.fidelity import (
    ClusterAnswerUpstream,
    at_recall,
    cluster_answer,
    clusters,
    frontier_pairwise,
    frontier_population,
)
from proxy.calibrate import LabelledPair

PAIRS = [LabelledPair("a", "b", True), LabelledPair("b", "c", True), LabelledPair("d", "e", False),
         LabelledPair("a", "d", False)]


def test_clusters_are_connected_components_of_duplicates() -> None:
    found = clusters(PAIRS)
    assert found["a"] == found["b"] == found["c"]
    assert len({found["a"], found["d"], found["e"]}) == 3
    assert cluster_answer(1) == cluster_answer(1) != cluster_answer(2)


async def test_the_upstream_double_answers_by_cluster_on_the_openai_wire() -> None:
    server = TestServer(ClusterAnswerUpstream(clusters(PAIRS)).app())
    await server.start_server()
    try:
        client = openai.AsyncOpenAI(base_url=str(server.make_url("/v1")), api_key="test")
        answers = [(await client.chat.completions.create(model="m", messages=[{"role": "user", "content": q}]))
                   .choices[0].message.content for q in ("a", "c", "d")]
        await client.close()
    finally:
        await server.close()
    assert answers[0] == answers[1] != answers[2]


def test_frontiers_count_recall_and_wrong_hits() -> None:
    vectors = {q: np.array(v, dtype=np.float32) for q, v in
               {"a": [1, 0], "b": [0.99, 0.141], "c": [0.6, 0.8], "d": [0.995, 0.0998], "e": [0, 1]}.items()}
    found = clusters(PAIRS)
    rows = {row["threshold"]: row for row in frontier_pairwise(PAIRS, vectors, found)}
    assert rows[0.98] == {"threshold": 0.98, "recall": 0.5, "wrong_hit_share": 0.5}, "a-b right, a-d wrong"
    population = {row["threshold"]: row for row in frontier_population(PAIRS, vectors, found)}
    # priming: b and d hit a's answer, so only a is stored; then c (0.6 to a) and e miss
    assert (population[0.98]["recall"], population[0.98]["wrong_hit_share"]) == (0.0, 0.0)
    assert at_recall([{"recall": 0.2, "wrong_hit_share": 0.1}, {"recall": 0.4, "wrong_hit_share": 0.3}], 0.3) \
        == pytest.approx(0.2)
    assert at_recall([{"recall": 0.2, "wrong_hit_share": 0.1}], 0.5) is None
