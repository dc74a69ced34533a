"""lz4 dictionary compression: round trips, versioning, damage detection, and the response generator it is
trained and measured on (validated with the official openai SDK's types)."""

from __future__ import annotations

import os
import statistics
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from loadtest.responses import DEFAULT_QUESTIONS, QA, ResponseGenerator, load_questions
from tiers.compression import MAX_DICTIONARY, Compressor, CorruptBlob, ratio, train_dictionary

SAMPLE_PAIRS = [
    QA("who wrote the declaration of independence", ("Thomas Jefferson",)),
    QA("when did the first man walk on the moon", ("20 July 1969", "1969")),
    QA("what is the capital city of australia", ("Canberra",)),
    QA("how many bones are in the adult human body", ("206",)),
]


@pytest.fixture(scope="module")
def questions() -> Path:
    """The project's copy of the Natural Questions file."""
    if not DEFAULT_QUESTIONS.exists():
        pytest.skip(f"{DEFAULT_QUESTIONS} is missing")
    return DEFAULT_QUESTIONS


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=5000), st.integers(0, 12))
def test_round_trip_without_dictionary(data: bytes, level: int) -> None:
    compressor = Compressor(level=level)
    assert compressor.decompress(compressor.compress(data)) == data


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=3000), st.binary(min_size=1, max_size=MAX_DICTIONARY))
def test_round_trip_with_any_dictionary(data: bytes, dictionary: bytes) -> None:
    compressor = Compressor({7: dictionary}, active=7)
    assert compressor.decompress(compressor.compress(data)) == data


def test_incompressible_data_is_stored_raw() -> None:
    data = os.urandom(1000)
    blob = Compressor().compress(data)
    assert blob[0] == 0x00 and len(blob) == 1001


def test_old_blobs_stay_readable_after_a_new_dictionary() -> None:
    responses = list(ResponseGenerator(SAMPLE_PAIRS, seed=1).many(60))
    compressor = Compressor()
    compressor.add_dictionary(1, train_dictionary(responses[:30]))
    old = compressor.compress(responses[40])
    compressor.add_dictionary(2, train_dictionary(responses[30:]))
    new = compressor.compress(responses[41])
    assert (old[1], new[1]) == (1, 2)  # the header names the dictionary
    assert compressor.decompress(old) == responses[40]
    assert compressor.decompress(new) == responses[41]
    with pytest.raises(ValueError):
        compressor.add_dictionary(1, b"different content")


def test_damaged_blobs_raise_corrupt_blob() -> None:
    data = ResponseGenerator(SAMPLE_PAIRS).completion_bytes()
    compressor = Compressor({1: train_dictionary([data] * 3)}, active=1)
    blob = compressor.compress(data)
    for damaged in (b"", b"\x07" + blob[1:], blob[:3], blob[: len(blob) // 2], b"\x01\x09\x05abc"):
        with pytest.raises(CorruptBlob):
            compressor.decompress(damaged)
    with pytest.raises(CorruptBlob):
        Compressor().decompress(blob)  # dictionary 1 unknown here


def test_trained_dictionary_beats_plain_lz4_on_unseen_responses(questions: Path) -> None:
    pairs = load_questions(questions)
    half = len(pairs) // 2
    training = list(ResponseGenerator(pairs[:half], seed=1).many(300))
    unseen = list(ResponseGenerator(pairs[half:], seed=2).many(200))  # other questions, other seed
    dictionary = train_dictionary(training)
    assert 0 < len(dictionary) <= MAX_DICTIONARY
    plain, trained = Compressor(), Compressor({1: dictionary}, active=1)
    plain_ratio = statistics.mean(ratio(r, plain.compress(r)) for r in unseen)
    trained_ratio = statistics.mean(ratio(r, trained.compress(r)) for r in unseen)
    assert trained_ratio > 2 * plain_ratio


def test_generated_responses_parse_with_the_openai_sdk(questions: Path) -> None:
    generator = ResponseGenerator(questions, seed=5)
    for _ in range(50):
        body = generator.completion()
        parsed = ChatCompletion.model_validate(body)
        assert parsed.choices[0].message.content
        chunks = [ChatCompletionChunk.model_validate(c) for c in generator.chunks(body)]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == body["choices"][0]["message"]["content"]
        assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == body["usage"]["total_tokens"]
    assert generator.sse().endswith(b"data: [DONE]\n\n")


def test_generator_is_seeded(questions: Path) -> None:
    pairs = load_questions(questions)
    assert list(ResponseGenerator(pairs, seed=3).many(5)) == list(ResponseGenerator(pairs, seed=3).many(5))
    assert list(ResponseGenerator(pairs, seed=3).many(5)) != list(ResponseGenerator(pairs, seed=4).many(5))
