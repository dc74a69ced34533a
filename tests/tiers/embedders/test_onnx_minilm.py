"""The int8 onnxruntime graph of all-MiniLM-L6-v2: built from the package's weights, cached, and close to the
float numpy pass it replaces."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from loadtest.responses import DEFAULT_QUESTIONS
from tests.support.nq_open import needs_nq_open
from tiers.embedders import onnx_minilm
from tiers.embedders.minilm import MiniLMEncoder
from tiers.embedders.onnx_minilm import OnnxMiniLMEncoder, int8_model_path

pytestmark = [pytest.mark.skipif(not onnx_minilm.onnx_available(), reason="needs onnxruntime and onnx"), needs_nq_open]

QUESTIONS = [json.loads(line)["question"] for line in
             DEFAULT_QUESTIONS.read_text(encoding="utf-8").splitlines()[:200]] if DEFAULT_QUESTIONS.exists() else []


@pytest.fixture(scope="module")
def graph_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


def test_int8_embeddings_agree_with_the_float_pass(graph_dir: Path, encoder: MiniLMEncoder) -> None:
    int8 = OnnxMiniLMEncoder(graph_dir).encode(QUESTIONS)
    exact = encoder.encode(QUESTIONS)
    assert int8.shape == exact.shape == (len(QUESTIONS), 384)
    assert np.allclose(np.linalg.norm(int8, axis=1), 1.0, atol=1e-5)
    cosine = (int8 * exact).sum(axis=1)
    assert cosine.mean() > 0.99 and cosine.min() > 0.98, (cosine.mean(), cosine.min())
    # and it still tells questions apart: each one is nearest to its own float embedding
    assert (np.argmax(int8 @ exact.T, axis=1) == np.arange(len(QUESTIONS))).all()


def test_the_graph_is_built_once_and_rebuilt_for_a_new_builder(graph_dir: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    first = int8_model_path(graph_dir)
    written = first.stat().st_mtime_ns
    assert int8_model_path(graph_dir) == first and first.stat().st_mtime_ns == written
    monkeypatch.setattr(onnx_minilm, "GRAPH_VERSION", onnx_minilm.GRAPH_VERSION + "-next")
    assert int8_model_path(graph_dir) != first
    assert sorted(p.name for p in graph_dir.iterdir() if p.suffix == ".onnx") == sorted(
        [first.name, int8_model_path(graph_dir).name])


def test_no_texts_is_an_empty_matrix(graph_dir: Path) -> None:
    assert OnnxMiniLMEncoder(graph_dir).encode([]).shape == (0, 384)
