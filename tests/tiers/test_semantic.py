"""The semantic tier: real model, both vector stores, real guards."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from normalizer.documents import Document
from normalizer.evidence import evidence
from normalizer.signature import context_signature
from proxy.upstream.client import UpstreamClient
from tiers.answer_check import MIN_ANSWERS
from tiers.embedders.cached import CachedEmbedder
from tiers.embedders.local import LocalEmbedder
from tiers.embedders.minilm import MiniLMEncoder
from tiers.semantic import (
    MAX_UNJUDGED,
    SemanticMatch,
    SemanticScope,
    SemanticTier,
    choose_match,
    partition_of,
)
from tiers.vectors.base import VectorHit, VectorStore
from tiers.vectors.hnsw import HnswVectorStore
from tiers.vectors.qdrant import QdrantVectorStore
from upstream_doubles.qdrant_shim import QdrantShim

ACME = SemanticScope("acme", "docs")


@pytest.fixture(scope="module")
def encoder() -> MiniLMEncoder:
    return MiniLMEncoder()


@pytest.fixture(params=["hnsw", "qdrant"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[VectorStore]:
    if request.param == "hnsw":
        instance = HnswVectorStore(384, tmp_path)
        yield instance
        await instance.close()
        return
    client = UpstreamClient(connect_timeout=2, read_timeout=10, pool_size=4)
    with QdrantShim() as shim:  # Qdrant's REST API over qdrant-client's local mode
        yield QdrantVectorStore(client, shim.url, 384)
    await client.close()


@pytest.fixture
async def tier(encoder: MiniLMEncoder, store: VectorStore) -> AsyncIterator[SemanticTier]:
    embedder = CachedEmbedder(LocalEmbedder(encoder=encoder), case_insensitive=True)
    yield SemanticTier(embedder, store, threshold=0.85)
    await embedder.close()


def signature(system: str = "You are helpful.") -> str:
    body = {
        "model": "m",
        "temperature": 0,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "q"}],
    }
    sig = context_signature(body)
    assert sig is not None
    return sig.digest


async def test_a_rephrased_question_hits_the_cached_entry(tier: SemanticTier) -> None:
    await tier.add(ACME, signature(), "what is the capital of France", "l1:france")
    match = await tier.lookup(ACME, signature(), "What's the capital of France?")
    assert match is not None
    assert match.key == "l1:france" and match.question == "what is the capital of France"
    assert match.similarity >= 0.85
    assert (tier.stats.lookups, tier.stats.hits) == (1, 0), "a hit is counted when it is served (by the stage)"


async def test_an_unrelated_question_misses(tier: SemanticTier) -> None:
    await tier.add(ACME, signature(), "what is the capital of France", "l1:france")
    assert await tier.lookup(ACME, signature(), "how do volcanoes form") is None
    assert tier.stats.below_threshold == 1


async def test_matches_never_cross_contexts_tenants_or_namespaces(tier: SemanticTier) -> None:
    await tier.add(ACME, signature(), "what is the capital of France", "l1:france")
    question = "what is the capital of France"
    assert await tier.lookup(ACME, signature("You are terse."), question) is None
    assert await tier.lookup(SemanticScope("globex", "docs"), signature(), question) is None
    assert await tier.lookup(SemanticScope("acme", "wiki"), signature(), question) is None
    assert await tier.lookup(ACME, signature(), question) is not None


async def test_guards_veto_a_close_question_with_another_number(encoder: MiniLMEncoder, store: VectorStore) -> None:
    embedder = LocalEmbedder(encoder=encoder)
    unguarded = SemanticTier(embedder, store, threshold=0.9, guards=())
    guarded = SemanticTier(embedder, store, threshold=0.9, guards=("numbers", "dates"))
    await guarded.add(ACME, signature(), "how many people lived in Tokyo in 2020", "l1:2020")
    question = "how many people lived in Tokyo in 2021"
    assert await unguarded.lookup(ACME, signature(), question) is not None
    assert await guarded.lookup(ACME, signature(), question) is None
    assert set(guarded.stats.vetoes) == {"numbers"}


async def test_deleted_entries_are_no_longer_found(tier: SemanticTier) -> None:
    await tier.add(ACME, signature(), "what is the capital of France", "l1:france")
    assert await tier.delete(["l1:france", "l1:other"]) == 1
    assert await tier.lookup(ACME, signature(), "what is the capital of France") is None
    await tier.add(ACME, signature(), "what is the capital of France", "l1:france")
    assert await tier.delete_context(ACME, signature()) == 1
    assert await tier.lookup(ACME, signature(), "what is the capital of France") is None


async def test_thresholds_are_per_namespace(encoder: MiniLMEncoder, store: VectorStore) -> None:
    tier = SemanticTier(LocalEmbedder(encoder=encoder), store, threshold=0.5, namespace_thresholds={"docs": 0.999})
    await tier.add(ACME, signature(), "how tall is the eiffel tower", "k1")
    await tier.add(SemanticScope("acme", "wiki"), signature(), "how tall is the eiffel tower", "k2")
    question = "tell me how tall the eiffel tower is"
    assert await tier.lookup(ACME, signature(), question) is None
    match = await tier.lookup(SemanticScope("acme", "wiki"), signature(), question)
    assert match is not None and match.key == "k2"


async def test_comparisons_before_the_answer_check_is_ready_are_judged_once_it_is(encoder: MiniLMEncoder,
                                                                                     store: VectorStore) -> None:
    """A new namespace's first comparisons come before the check has seen enough answers to judge: they are held,
    not lost, and count as evidence as soon as it has (the oldest dropped beyond :data:`MAX_UNJUDGED`)."""
    tier = SemanticTier(LocalEmbedder(encoder=encoder), store)
    probe = SemanticMatch("k1", 0.93, "how do I reset my password")
    answer = "Open the security settings, choose reset, and follow the emailed link within an hour."
    for _ in range(MAX_UNJUDGED + 3):
        assert tier.compare(ACME, probe, answer, answer, "how can I reset my password") is None
    assert tier.calibrator.operating("docs", "acme").observations == 0
    assert tier.stats.unjudged == MAX_UNJUDGED + 3 and tier.stats.unjudged_dropped == 3
    for i in range(MIN_ANSWERS):
        tier.learn_answer(f"Answer {i}: water the fern {i} times a week and keep it out of direct sunlight.")
    assert tier.calibrator.operating("docs", "acme").observations == MAX_UNJUDGED
    assert tier.compare(ACME, probe, answer, answer, "how can I reset my password") is True
    assert tier.calibrator.operating("docs", "acme").observations == MAX_UNJUDGED + 1


async def test_unknown_guard_names_fail_at_construction(encoder: MiniLMEncoder, store: VectorStore) -> None:
    with pytest.raises(ValueError):
        SemanticTier(LocalEmbedder(encoder=encoder), store, guards=("numbers", "astrology"))


def test_partitions_separate_each_part() -> None:
    assert partition_of(SemanticScope("a", "b c"), "d") != partition_of(SemanticScope("a b", "c"), "d")


def _veto_digits(a: str, b: str, guards: Iterable[str]) -> str | None:
    """A stand-in guard for the pure choice: vetoes when the digit characters differ."""
    digits = [sorted(c for c in text if c.isdigit()) for text in (a, b)]
    return None if digits[0] == digits[1] else "digits: differ"


def test_a_vetoed_nearest_neighbour_does_not_hide_the_next_one() -> None:
    hits = [
        VectorHit("k2020", 0.97, {"question": "pop in 2020"}),
        VectorHit("k2021", 0.95, {"question": "pop in 2021"}),
    ]
    reasons: list[str] = []
    match = choose_match("population in 2021", hits, 0.9, ["x"], _veto_digits, reasons.append)
    assert match is not None and match.key == "k2021"
    assert reasons == ["digits: differ"]
    assert choose_match("population in 2021", hits, 0.96, ["x"], _veto_digits) is None


@given(
    similarities=st.lists(st.floats(-1, 1), max_size=6),
    threshold=st.floats(0, 1),
    guarded=st.booleans(),
)
def test_choice_is_the_best_unvetoed_candidate_above_threshold(
    similarities: list[float], threshold: float, guarded: bool
) -> None:
    hits = [VectorHit(f"k{i}", s, {"question": f"q{i % 2}"}) for i, s in enumerate(similarities)]
    match = choose_match("q0", hits, threshold, ["x"] if guarded else [], _veto_digits)
    allowed = [h for h in hits if h.similarity >= threshold and (not guarded or h.payload["question"] == "q0")]
    if not allowed:
        assert match is None
    else:
        assert match is not None
        assert match.similarity == max(h.similarity for h in allowed)


async def test_a_second_source_is_searched_only_when_the_index_cannot_serve(encoder: MiniLMEncoder,
                                                                            tmp_path: Path) -> None:
    """One decision over both sources: the cold tier's candidates pass the same threshold, guards and verification
    draw as the index's, and are asked for only when the index has nothing to serve."""
    embedder = CachedEmbedder(LocalEmbedder(encoder=encoder), case_insensitive=True)
    asked: list[int] = []

    async def cold(vector: object) -> list[VectorHit]:
        asked.append(1)
        return [VectorHit("l3:ethanol", 0.97, {"question": "what is the boiling point of ethanol", "source": "l3"}),
                VectorHit("l3:methanol", 0.99, {"question": "what is the boiling point of methanol", "source": "l3"})]

    def veto(a: str, b: str, guards: Iterable[str]) -> str | None:
        return "entities: differ" if ("methanol" in a) != ("methanol" in b) else None

    tier = SemanticTier(embedder, HnswVectorStore(384, tmp_path), threshold=0.85, veto=veto)
    await tier.add(ACME, signature(), "what is the capital of France", "l1:france")
    served = await tier.decide(ACME, signature(), "What's the capital of France?", cold)
    assert served.match is not None and served.match.source == "l2" and not asked, "the index served: L3 not asked"
    found = await tier.decide(ACME, signature(), "boiling point of ethanol, please", cold)
    assert found.match is not None and (found.match.key, found.match.source) == ("l3:ethanol", "l3")
    assert asked and tier.stats.vetoes == {"entities": 1}, "the vetoed closer candidate did not hide the next"
    assert found.vector is not None, "the question's embedding goes along (the cold tier keeps it with the answer)"
    checking = SemanticTier(embedder, HnswVectorStore(384, tmp_path / "other"), threshold=0.85, verify_fraction=1.0,
                            veto=veto)
    drawn = await checking.decide(ACME, signature(), "boiling point of ethanol, please", cold)
    assert drawn.match is None and drawn.probe is not None and drawn.probe.source == "l3", "verified like any hit"
    assert checking.stats.verified == 1
    await embedder.close()


async def test_two_answers_are_compared_without_their_citations(encoder: MiniLMEncoder, store: VectorStore) -> None:
    """Answers grounded in the same document cite it alike: a shared citation is not agreement (it made a child's
    and an adult's dose agree), and citing different documents is not disagreement."""
    tier = SemanticTier(LocalEmbedder(encoder=encoder), store)
    for i in range(MIN_ANSWERS):
        tier.learn_answer(f"Answer {i}: water the fern {i} times a week and keep it out of direct sunlight [{i}].")
    cite = " [Dosage chart, pediatric weight table, poison control hotline]"
    probe = SemanticMatch("k1", 0.9, "how much paracetamol for a child")
    child, adult = "Give children paracetamol by weight every six hours", "Adults take ibuprofen with food twice daily"
    assert tier.compare(ACME, probe, child + cite, adult + cite, "how much ibuprofen for an adult") is False
    same = "Open the security settings, choose reset, and follow the emailed link within an hour"
    assert tier.compare(ACME, probe, same + " [doc-12]", same + " [Source 3]", "how can I reset my password") is True


async def test_with_documents_candidates_serve_only_by_the_evidence_read_from_their_entries(
        tier: SemanticTier) -> None:
    """The index keeps questions only: what a candidate's answer rests on comes from its entry, and a candidate whose
    evidence cannot be read (no reader, or its answer gone) never serves a question that carries documents."""
    novel = Document("novel", "Pride and Prejudice is an 1813 novel by Jane Austen.")
    await tier.add(ACME, signature(), "who wrote the novel pride and prejudice", "l1:austen")
    [hit] = await tier.store.search(partition_of(ACME, signature()), (await tier.embedder.embed(["x"]))[0], k=1)
    assert hit.payload == {"question": "who wrote the novel pride and prejudice"}
    question = "Tell me who wrote the novel Pride and Prejudice?"
    entries = {"l1:austen": evidence("It was Jane Austen [1].", [novel])}

    async def read(hits: Sequence[VectorHit]) -> list[VectorHit]:
        return [VectorHit(h.id, h.similarity, {**h.payload, "evidence": entries[h.id]})
                for h in hits if h.id in entries]

    assert (await tier.decide(ACME, signature(), question, documents=[novel])).match is None, "no reader"
    assert (await tier.decide(ACME, signature(), question, documents=[novel], evidence=read)).match is not None
    other = Document("novel", "Pride and Prejudice was written by someone else.")
    assert (await tier.decide(ACME, signature(), question, documents=[other], evidence=read)).match is None
    entries.clear()  # the answer left every tier
    assert (await tier.decide(ACME, signature(), question, documents=[novel], evidence=read)).match is None
