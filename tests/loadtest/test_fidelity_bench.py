"""The fidelity benchmark's parts: clusters, the mix, the upstream double and its sampled answers, the hindsight
oracle, trivial variants."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import openai
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from loadtest.bench.fidelity import RAG_SYSTEM, ClusterAnswerUpstream, Tally, cluster_answer, run_shared
from loadtest.fidelity_traffic import (
    best_at,
    clusters,
    oracle_curve,
    oracle_population_curve,
    same,
    sample_mix,
    trivial_variants,
)
from loadtest.sampled_answers import SampledAnswers, cluster_points, topic
from normalizer.text import fold_question
from tiers.labelled_pairs import LabelledPair

PAIRS = [LabelledPair("a", "b", True), LabelledPair("b", "c", True), LabelledPair("d", "e", False),
         LabelledPair("a", "d", False)]


def test_clusters_are_connected_components_of_same_answer_pairs() -> None:
    found = clusters(PAIRS)
    assert found["a"] == found["b"] == found["c"]
    assert len({found["a"], found["d"], found["e"]}) == 3
    assert cluster_answer(1) == cluster_answer(1) != cluster_answer(2)


def test_the_mix_draws_the_share_asked_for() -> None:
    pairs = [LabelledPair(f"q{i}", f"r{i}", i % 3 == 0) for i in range(300)]
    found = clusters(pairs)
    drawn = sample_mix(pairs, found, 0.8, 100, seed=1)
    assert len(drawn) == 100 and sum(same(p, found) for p in drawn) == 80
    assert drawn != sample_mix(pairs, found, 0.8, 100, seed=2)
    with pytest.raises(ValueError, match="same-answer"):
        sample_mix(pairs, found, 0.95, 200, seed=1)


async def test_the_upstream_double_answers_by_cluster_on_the_openai_wire() -> None:
    for varied in (None, SampledAnswers(1)):
        server = TestServer(ClusterAnswerUpstream(clusters(PAIRS), varied).app())
        await server.start_server()
        try:
            client = openai.AsyncOpenAI(base_url=str(server.make_url("/v1")), api_key="test")
            answers = [(await client.chat.completions.create(model="m", messages=[{"role": "user", "content": q}]))
                       .choices[0].message.content for q in ("a", "a", "c", "d")]
            await client.close()
        finally:
            await server.close()
        if varied is None:
            assert answers[0] == answers[1] == answers[2] != answers[3]
        else:
            assert len(set(answers)) == 4, "a sampling model words every answer anew"


def test_sampled_answers_make_a_clusters_points_in_new_words() -> None:
    sampler = SampledAnswers(7)
    first = sampler.answer("What is the best way to learn Python?", 1)
    second = sampler.answer("How can I learn Python quickly?", 1)
    other = sampler.answer("What is the best way to learn Haskell?", 2)
    assert first != second
    for point in cluster_points(1):
        assert point.obj in first and point.obj in second, "the cluster's points, whatever the wording"
    assert "learn haskell" in other and not all(point.obj in other for point in cluster_points(1))
    assert topic("What is the best way to learn Python?") == "learn python"


def test_the_oracle_is_the_best_fixed_threshold_within_the_bound() -> None:
    vectors = {q: np.array(v, dtype=np.float32) for q, v in
               {"a": [1, 0], "b": [0.99, 0.141], "c": [0.6, 0.8], "d": [0.995, 0.0998], "e": [0, 1]}.items()}
    found = clusters(PAIRS)
    rows = {row["threshold"]: row for row in oracle_curve(PAIRS, vectors, found, lambda a, b: False)}
    assert rows[0.98]["recall"] == 0.5 and rows[0.98]["wrong_hit_share"] == 0.5, "a-b right, a-d wrong"
    guarded = {row["threshold"]: row for row in oracle_curve(PAIRS, vectors, found, lambda a, b: "d" in a + b)}
    assert guarded[0.98]["wrong_hit_share"] == 0.0 and guarded[0.98]["recall"] == 0.5
    assert best_at(list(rows.values()), 0.05) is None
    best = best_at(list(guarded.values()), 0.05)
    assert best is not None and (best["threshold"], best["recall"]) == (0.70, 1.0), "b-c (0.707) is right too"
    population = {row["threshold"]: row for row in oracle_population_curve(PAIRS, vectors, found, lambda a, b: False)}
    # firsts a, b (hits a at 0.99: not stored), d (hits a, wrong: not counted); seconds c (0.6) and e miss
    assert population[0.98]["hits"] == 0 and population[0.98]["recall"] == 0.0


def test_trivial_variants_differ_only_in_what_folding_removes() -> None:
    rng = random.Random(5)
    question = "What's the best way to learn Python?"
    variants = trivial_variants(question, 3, rng)
    assert len(set(variants)) == 3 and question not in variants
    for _ in range(200):
        for variant in trivial_variants(question, 3, rng):
            assert fold_question(variant) == fold_question(question), repr(variant)


def test_the_offline_replay_serves_and_compares_as_the_proxy_does() -> None:
    """``loadtest.calibration_replay``: a second question at or above the threshold is served (wrong when its pair
    needs two answers); below it, or vetoed, it is forwarded, and compared once the answer check can judge."""
    from loadtest.calibration_replay import replay
    from tiers.calibration import Calibrator

    cosines = {"p0": 0.95, "p1": 0.96, "p2": 0.5, "p3": 0.8, "p4": 0.97}
    pairs = [LabelledPair(f"{name}a", f"{name}b", name != "p1") for name in cosines]
    vectors = {}
    for name, cosine in cosines.items():
        vectors[f"{name}a"] = np.array([1.0, 0.0])
        vectors[f"{name}b"] = np.array([cosine, np.sqrt(1 - cosine * cosine)])
    found = clusters(pairs)
    fixed = replay(pairs, found, vectors, Calibrator(0.05, fixed=0.9), lambda a, b: a == "p4b", 0.4, seed=1)
    assert (fixed.hits, fixed.wrong, fixed.recalled, fixed.wanted, fixed.first_hit) == (2, 1, 1, 4, 1)
    calibrating = Calibrator(0.05)
    nothing = replay(pairs * 6, found, vectors, calibrating, lambda a, b: False, 0.4, seed=1)
    assert nothing.hits == 0 and nothing.threshold > 1
    assert calibrating.operating("default").observations == 6 * 4, "held until 20 answers, then judged"


async def test_one_system_prompt_applies_without_documents() -> None:
    """``--rag-prompt one`` without ``--rag``: the app's shape without documents (the RAG loop's denominator)."""
    systems: list[str] = []
    double = ClusterAnswerUpstream(clusters(PAIRS))

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        systems.extend(m["content"] for m in body["messages"] if m["role"] == "system")
        assert "ragproxy" not in body
        answer = double.answer(body["messages"][-1]["content"])
        return web.json_response({"choices": [{"message": {"role": "assistant", "content": answer}}]})

    for one_prompt, expected in ((True, {RAG_SYSTEM}), (False, {"pair 0", "pair 1"})):
        systems.clear()
        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        server = TestServer(app)
        await server.start_server()
        try:
            await run_shared(str(server.make_url("")).rstrip("/"), PAIRS[:2],
                             Tally(clusters(PAIRS), one_prompt=one_prompt))
        finally:
            await server.close()
        assert set(systems) == expected and len(systems) == 5


def test_extra_labels_join_clusters_for_the_answers_and_the_wrong_count(tmp_path: Path) -> None:
    """``--extra-labels``: a cross-question pair labelled 1 joins two clusters (one answer from the double, a hit
    across them is right), one labelled 0 keeps two apart; the use is counted."""
    from loadtest.bench.fidelity import identity

    pairs = tmp_path / "pairs.csv"
    pairs.write_text("question1,question2,is_duplicate,same_answer\n"
                     "How do I learn Go?,How can I learn Go?,1,1\n"
                     "What is Go used for?,Why learn Go?,0,0\n"
                     "How should I learn Go?,Where is Go taught?,0,0\n", encoding="utf-8")
    extra = tmp_path / "extra.csv"
    extra.write_text("question1,question2,same_answer\n"
                     "How can I learn Go?,How should I learn Go?,1\n"
                     "What is Go used for?,How do I learn Go?,0\n"
                     "Why learn Go?,Where is Go taught?,0\n", encoding="utf-8")
    plain, none = identity(pairs, "same_answer", None)
    joined, use = identity(pairs, "same_answer", extra)
    assert none is None and plain["How do I learn Go?"] != plain["How should I learn Go?"]
    assert joined["How do I learn Go?"] == joined["How should I learn Go?"] != joined["What is Go used for?"]
    assert use is not None and (use.read, use.joined, use.apart, use.conflicting) == (3, 1, 2, 0)
    double = ClusterAnswerUpstream(joined)
    assert double.answer("How do I learn Go?") == double.answer("How should I learn Go?")
    for by_question, wrong in ((plain, 1), (joined, 0)):
        tally = Tally(dict(by_question))
        tally.record("How do I learn Go?", "answer one", "MISS")
        tally.record("How should I learn Go?", "answer one", "SEMANTIC_HIT")
        tally.judge("How should I learn Go?", "answer one", "SEMANTIC_HIT", 0.01, False, 1)
        assert tally.wrong == wrong and len(tally.served_across) == wrong


def test_cross_pairs_are_the_nearest_earlier_question_of_another_cluster(tmp_path: Path) -> None:
    from loadtest.cross_pairs import nearest_cross, write_cross

    vectors = {q: np.array(v, dtype=np.float32) for q, v in
               {"a": [1, 0], "b": [0.99, 0.141], "c": [0.98, 0.199], "d": [0, 1]}.items()}
    by_question = {"a": 0, "b": 0, "c": 1, "d": 2}
    found = nearest_cross(["a", "b", "c", "d", "c"], vectors, by_question)
    assert found == [("b", "c")], "c's nearest of another cluster; a-b share one; d is far from all"
    out = tmp_path / "cross.csv"
    assert write_cross(out, [*found, ("c", "b"), ("a", "a")]) == 1
    assert out.read_text(encoding="utf-8").splitlines() == ["question1,question2", "b,c"]
