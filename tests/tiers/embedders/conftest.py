"""One loaded all-MiniLM-L6-v2 shared by the embedder tests (loading takes about a second)."""

from __future__ import annotations

import pytest

from tiers.embedders.minilm import MiniLMEncoder


@pytest.fixture(scope="session")
def encoder() -> MiniLMEncoder:
    return MiniLMEncoder()
